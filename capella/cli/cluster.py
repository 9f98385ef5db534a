"""``capella cluster add|list|show|ping|drop``: manage external Capella clusters.

``cluster add`` has its own ``--url`` (the external cluster's) and ``--timeout`` (its request
timeout, a duration); the server's ``--url`` and ``--timeout`` go before ``cluster``.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from capella.cli.command import Command, Family, arg, drop, one_of
from capella.cli.output import created, error, print_fields, print_table
from capella.client import Client, Saved
from capella.wire.clusters import ClusterInfo, ClusterPing, Compression, NameCheck

COMPRESSIONS = get_args(Compression)


def save_cluster(args: argparse.Namespace, client: Client) -> Saved[ClusterInfo]:
    fields: dict[str, Any] = {"url": args.cluster_url}
    optional = {
        "username": args.username,
        "password_secret": args.password_secret,
        "token_secret": args.token_secret,
        "password": args.password,
        "token": args.token,
        "ca_file": args.ca_file,
        "timeout": args.cluster_timeout,
        "connect_timeout": args.connect_timeout,
        "compression": args.compression,
    }
    fields.update({key: value for key, value in optional.items() if value is not None})
    if not args.verify_tls:
        fields["verify_tls"] = False
    return client.save_cluster(args.name, **fields)


def print_saved(args: argparse.Namespace, saved: Saved[ClusterInfo]) -> None:
    info = saved.value
    print(f"cluster {info.name} {created(saved.created, 'replaced')}")
    check = info.name_check
    # A same-named far side is refused (409, printed as same_cluster_name); one that could
    # not be asked is saved, and the operator should ping it once it is reachable.
    if isinstance(check, NameCheck) and not check.checked:
        reason = f": {check.error.code}: {check.error.message}" if check.error else ""
        error(
            f"cluster {info.name}: its name could not be checked{reason}; "
            f"run `capella cluster ping {info.name}` later"
        )


def print_clusters(args: argparse.Namespace, clusters: list[ClusterInfo]) -> None:
    rows = []
    for info in clusters:
        credentials = info.credentials
        kind: str = "none" if credentials is None else credentials.kind
        if credentials is not None and credentials.username:
            kind += f" ({credentials.username})"
        source = "-" if credentials is None else credentials.source
        rows.append([info.name, info.url, kind, source, info.compression])
    print_table(["NAME", "URL", "CREDENTIALS", "SOURCE", "COMPRESSION"], rows)


def print_cluster(args: argparse.Namespace, info: ClusterInfo) -> None:
    credentials = info.credentials
    signed_in = "none"
    if credentials is not None:
        who = f" as {credentials.username}" if credentials.username else ""
        signed_in = f"{credentials.kind}{who}, {credentials.source}"
    print_fields(
        [
            ("name", info.name),
            ("url", info.url),
            ("credentials", signed_in),
            (
                "verify tls",
                ("yes" if info.tls.verify else "no")
                + (f", CA {info.tls.ca_file}" if info.tls.ca_file else ""),
            ),
            ("timeouts", f"connect {info.timeouts.connect:g} s, request {info.timeouts.request:g} s"),
            ("compression", info.compression),
        ]
    )


def print_ping(args: argparse.Namespace, result: ClusterPing) -> None:
    if result.ok:
        print(f"cluster {args.name} ok: {float(result.latency_ms or 0.0):.1f} ms")


def ping_exit(args: argparse.Namespace, result: ClusterPing) -> int:
    if result.ok:
        return 0
    failure = result.error
    if failure:
        error(f"cluster {args.name}: {failure.code}: {failure.message}")
    else:
        error(f"cluster {args.name} is not ready")
    return 1


CLUSTER = Family(
    "cluster",
    "add, list, show, ping and drop external clusters",
    (
        # Not the common options: their --url and --timeout would clash with the cluster's own.
        Command(
            "add",
            "add an external cluster, or replace its definition",
            save_cluster,
            text=print_saved,
            json=lambda args, saved: saved.value,
            description="The server's own --url and --timeout go before `cluster`.",
            args=(
                arg("name"),
                arg(
                    "--url",
                    dest="cluster_url",
                    required=True,
                    metavar="URL",
                    help="the external cluster's base URL",
                ),
                arg("--username", help="the user a password belongs to"),
                one_of(
                    arg(
                        "--password-secret",
                        metavar="NAME",
                        help="the password is this secret declared in [secrets.NAME]",
                    ),
                    arg(
                        "--token-secret",
                        metavar="NAME",
                        help="a bearer token: this secret declared in [secrets.NAME]",
                    ),
                    arg(
                        "--password",
                        help="stored encrypted by the server (visible in `ps`: prefer --password-secret)",
                    ),
                    arg("--token", help="stored encrypted by the server (prefer --token-secret)"),
                ),
                arg(
                    "--no-verify-tls",
                    dest="verify_tls",
                    action="store_false",
                    help="accept any TLS certificate",
                ),
                arg("--ca-file", metavar="FILE", help="a PEM file of CAs, on the server's machine"),
                arg(
                    "--timeout",
                    dest="cluster_timeout",
                    metavar="DUR",
                    help="per request, e.g. 30s (default 30 s)",
                ),
                arg("--connect-timeout", metavar="DUR", help="to connect, e.g. 5s (default 5 s)"),
                arg("--compression", choices=COMPRESSIONS, help="compress request bodies (default none)"),
                arg("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for programs"),
            ),
            common=False,
        ),
        Command(
            "list", "list external clusters", lambda args, client: client.clusters(), text=print_clusters
        ),
        Command(
            "show",
            "show an external cluster (never its secret)",
            lambda args, client: client.cluster(args.name),
            text=print_cluster,
            args=(arg("name"),),
        ),
        Command(
            "ping",
            "check that the server reaches the cluster and is let in",
            lambda args, client: client.ping_cluster(args.name),
            text=print_ping,
            args=(arg("name"),),
            exit=ping_exit,
        ),
        drop("cluster", "forget an external cluster", lambda args, client: client.drop_cluster(args.name)),
    ),
)
