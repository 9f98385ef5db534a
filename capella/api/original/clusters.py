"""The original's external-cluster actions (``add_ec``, ``drop_ec``, ``gd_ec``, ``list_ec``) on ``Links``.

The original sends a cluster's password inline (``auth_info``, base64 of a JSON string); it becomes
a Capella cluster with an inline password, which ``Links`` stores sealed and bound to the
cluster's name, URL and user. ``gd_ec`` never shows it back (the original showed its ciphertext).
"""

from __future__ import annotations

import base64
import binascii

import msgspec
import orjson

from capella.api.original import shapes
from capella.api.original.actions import Action, Context, body_name
from capella.api.original.envelope import Request
from capella.api.route import CLUSTER_PATH
from capella.errors import AlreadyExists, InvalidRequest
from capella.links.link import Link
from capella.wire.clusters import ClusterDefinition


class Connection(msgspec.Struct):
    server: str = ""
    ignore_ssql_validation: bool = False
    query_wait: int = 0
    max_conn: int = 0
    max_idle_duration: int = 0


class ClusterParams(msgspec.Struct):
    connection: Connection = msgspec.field(default_factory=Connection)
    auth_type: str = ""
    auth_info: str | None = None
    user_name: str = ""
    prefer_content_type: str = ""
    send_content_type: str = ""
    replace_name_force: bool = False


class ClusterBody(msgspec.Struct):
    name: str
    type: str = ""
    params: ClusterParams = msgspec.field(default_factory=ClusterParams)


def _password(auth_info: str | None) -> str | None:
    if not auth_info:
        return None
    try:
        value = orjson.loads(base64.b64decode(auth_info, validate=True))
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        value = None
    if not isinstance(value, str):
        raise InvalidRequest("auth_info must be base64 of a JSON string (the password)", field="auth_info")
    return value


def capella_cluster(body: ClusterBody) -> ClusterDefinition:
    """The definition ``PUT /v1/clusters/{name}`` takes, for the original's external cluster."""
    if body.type != "http_cluster":
        raise InvalidRequest(f"external cluster type {body.type!r}: Capella takes http_cluster", field="type")
    p = body.params
    if p.connection.query_wait <= 0:
        raise InvalidRequest(
            f"Connection.QueryWait should be > 0 ec.name: {body.name} value: {p.connection.query_wait}ns",
            field="query_wait",
        )
    return ClusterDefinition(
        url=p.connection.server,
        username=p.user_name or None,
        password=_password(p.auth_info),
        verify_tls=not p.connection.ignore_ssql_validation,
        timeout=p.connection.query_wait / shapes.NS,
        compression="gzip" if p.send_content_type in ("gzip", "gzip1", "gzip9") else "none",
    )


def original_cluster(cluster: Link) -> ClusterBody:
    """A cluster in the original's ``gd_ec`` shape, without its secret."""
    return ClusterBody(
        name=cluster.name,
        type="http_cluster",
        params=ClusterParams(
            connection=Connection(
                server=cluster.url,
                ignore_ssql_validation=not cluster.verify_tls,
                query_wait=round(cluster.timeout * shapes.NS),
            ),
            auth_type="basic" if cluster.secret_kind == "password" else "",
            auth_info=None,  # never shown, not even encrypted
            user_name=cluster.username or "",
            send_content_type="gzip" if cluster.compression == "gzip" else "",
            replace_name_force=True,
        ),
    )


async def add_ec(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, ClusterBody, request.action)
    ctx.same_as("PUT", CLUSTER_PATH, name=body.name)
    if any(cluster.name == body.name for cluster in ctx.clusters.links()):
        raise AlreadyExists(f"external cluster `{body.name}` already exists")
    # Put as /v1 puts a body, which the registry decodes and checks as it checks any other.
    await ctx.clusters.put(body.name, msgspec.to_builtins(capella_cluster(body)), by=ctx.identity)
    return None


async def drop_ec(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("DELETE", CLUSTER_PATH, name=name)
    await ctx.clusters.drop(name, used_by=ctx.supervisor.using_link(name))
    return None


async def gd_ec(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("GET", CLUSTER_PATH, name=name)
    return original_cluster(ctx.clusters.link(name))


async def list_ec(ctx: Context, request: Request) -> object:
    return [
        cluster.name
        for cluster in ctx.clusters.links()
        if ctx.identity.can("external_cluster", "read", cluster.name)
    ]


ACTIONS: dict[str, Action] = {"add_ec": add_ec, "drop_ec": drop_ec, "gd_ec": gd_ec, "list_ec": list_ec}
