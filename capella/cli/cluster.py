"""``capella cluster add|list|show|ping|drop``: manage external Capella clusters.

``cluster add`` has its own ``--url`` (the external cluster's) and ``--timeout`` (its request
timeout, a duration); the server's ``--url`` and ``--timeout`` go before ``cluster``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from capella.cli.output import created, error, print_fields, print_json, print_table
from capella.client import Client
from capella.wire.clusters import NameCheck

COMPRESSIONS = ("none", "gzip", "zstd")


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    cluster = commands.add_parser(
        "cluster", help="add, list, show, ping and drop external clusters", parents=[common]
    )
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    # Not parents=[common]: its --url and --timeout would clash with the cluster's own.
    add = actions.add_parser(
        "add",
        help="add an external cluster, or replace its definition",
        description="The server's own --url and --timeout go before `cluster`.",
    )
    add.add_argument("name")
    add.add_argument(
        "--url", dest="cluster_url", required=True, metavar="URL", help="the external cluster's base URL"
    )
    add.add_argument("--username", help="the user a password belongs to")
    secret = add.add_mutually_exclusive_group()
    secret.add_argument(
        "--password-secret", metavar="NAME", help="the password is this secret declared in [secrets.NAME]"
    )
    secret.add_argument(
        "--token-secret", metavar="NAME", help="a bearer token: this secret declared in [secrets.NAME]"
    )
    secret.add_argument(
        "--password", help="stored encrypted by the server (visible in `ps`: prefer --password-secret)"
    )
    secret.add_argument("--token", help="stored encrypted by the server (prefer --token-secret)")
    add.add_argument(
        "--no-verify-tls", dest="verify_tls", action="store_false", help="accept any TLS certificate"
    )
    add.add_argument("--ca-file", metavar="FILE", help="a PEM file of CAs, on the server's machine")
    add.add_argument(
        "--timeout", dest="cluster_timeout", metavar="DUR", help="per request, e.g. 30s (default 30 s)"
    )
    add.add_argument("--connect-timeout", metavar="DUR", help="to connect, e.g. 5s (default 5 s)")
    add.add_argument("--compression", choices=COMPRESSIONS, help="compress request bodies (default none)")
    add.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for programs")
    add.set_defaults(func=add_cluster, uses_client=True)

    listing = actions.add_parser("list", help="list external clusters", parents=[common])
    listing.set_defaults(func=list_clusters, uses_client=True)

    show = actions.add_parser("show", help="show an external cluster (never its secret)", parents=[common])
    show.add_argument("name")
    show.set_defaults(func=show_cluster, uses_client=True)

    ping = actions.add_parser(
        "ping", help="check that the server reaches the cluster and is let in", parents=[common]
    )
    ping.add_argument("name")
    ping.set_defaults(func=ping_cluster, uses_client=True)

    drop = actions.add_parser("drop", help="forget an external cluster", parents=[common])
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    drop.set_defaults(func=drop_cluster, uses_client=True)


def add_cluster(args: argparse.Namespace, client: Client) -> int:
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
    info, was_created = client.save_cluster(args.name, **fields)
    if args.json:
        print_json(info)
    else:
        print(f"cluster {info.name} {created(was_created, 'replaced')}")
        check = info.name_check
        # A same-named far side is refused (409, printed as same_cluster_name); one that could
        # not be asked is saved, and the operator should ping it once it is reachable.
        if isinstance(check, NameCheck) and not check.checked:
            reason = f": {check.error.code}: {check.error.message}" if check.error else ""
            error(
                f"cluster {info.name}: its name could not be checked{reason}; "
                f"run `capella cluster ping {info.name}` later"
            )
    return 0


def list_clusters(args: argparse.Namespace, client: Client) -> int:
    clusters = client.clusters()
    if args.json:
        print_json(clusters)
        return 0
    rows = []
    for info in clusters:
        credentials = info.credentials
        kind: str = "none" if credentials is None else credentials.kind
        if credentials is not None and credentials.username:
            kind += f" ({credentials.username})"
        source = "-" if credentials is None else credentials.source
        rows.append([info.name, info.url, kind, source, info.compression])
    print_table(["NAME", "URL", "CREDENTIALS", "SOURCE", "COMPRESSION"], rows)
    return 0


def show_cluster(args: argparse.Namespace, client: Client) -> int:
    info = client.cluster(args.name)
    if args.json:
        print_json(info)
        return 0
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
    return 0


def ping_cluster(args: argparse.Namespace, client: Client) -> int:
    result = client.ping_cluster(args.name)
    if args.json:
        print_json(result)
    elif result.ok:
        print(f"cluster {args.name} ok: {float(result.latency_ms or 0.0):.1f} ms")
    if result.ok:
        return 0
    failure = result.error
    if failure:
        error(f"cluster {args.name}: {failure.code}: {failure.message}")
    else:
        error(f"cluster {args.name} is not ready")
    return 1


def drop_cluster(args: argparse.Namespace, client: Client) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"not dropping cluster {args.name} without --yes")
            return 2
        answer = input(f"drop cluster {args.name}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            error("not dropped")
            return 1
    client.drop_cluster(args.name)
    if args.json:
        print_json({"dropped": args.name})
    else:
        print(f"cluster {args.name} dropped")
    return 0
