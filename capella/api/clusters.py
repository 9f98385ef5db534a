"""External clusters: register (PUT), describe (GET), list, drop (DELETE), and ping one.

No answer holds a password or token: a cluster is shown by ``Link.info()`` (``capella/links/``), which says
only what kind of credential it has and where it comes from, and an ``error`` when its
stored credentials cannot be read.
"""

from __future__ import annotations

from aiohttp import web

from capella.api.access import identity
from capella.api.handlers import supervisor
from capella.api.openapi import answer, json_content, ref
from capella.api.request import json_response, read_object
from capella.api.route import CLUSTER_PATH, Route, on_named
from capella.links.registry import Links
from capella.wire.clusters import ClusterList


async def list_clusters(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [link for link in links(request).links() if who.can("external_cluster", "read", link.name)]
    return json_response(ClusterList([link.info() for link in readable]))


async def put_cluster(request: web.Request) -> web.Response:
    data = await read_object(request)
    # A named secret must be one the definer may use (secret use), not any the server holds.
    link, created, check = await links(request).put(request.match_info["name"], data, by=identity(request))
    info = link.info()
    info.name_check = check
    return json_response(info, 201 if created else 200)


async def get_cluster(request: web.Request) -> web.Response:
    return json_response(links(request).link(request.match_info["name"]).info())


async def drop_cluster(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await links(request).drop(name, used_by=supervisor(request).using_link(name))
    return web.Response(status=204)


async def ping_cluster(request: web.Request) -> web.Response:
    """200 whatever the far side did: ``ok`` and ``error`` say how it went."""
    registry = links(request)
    name = request.match_info["name"]
    registry.link(name)  # an unknown name is a 404, not a failed ping
    return json_response(await registry.ping(name))


def links(request: web.Request) -> Links:
    # The registry is loaded with the handlers, after the queues: until then, answer 503.
    return supervisor(request).links


ROUTES = [
    Route(
        "GET",
        "/v1/clusters",
        list_clusters,
        need=(),
        op="listClusters",
        summary="List external clusters, sorted by name (no secrets)",
        tag="clusters",
        answers={200: answer("External clusters", ref("ClusterList"))},
    ),
    Route(
        "PUT",
        CLUSTER_PATH,
        put_cluster,
        need=(on_named("external_cluster", "admin"),),
        op="putCluster",
        summary="Register (201) or replace (200) an external cluster; 409 same_cluster_name when it has "
        "this cluster's name (accepted unchecked when it cannot be reached)",
        tag="clusters",
        answers={200: answer("Replaced", ref("ClusterInfo")), 201: answer("Created", ref("ClusterInfo"))},
        fails=(400, 408, 409, 413),
        body={"required": True, "content": json_content(ref("ClusterDefinition"))},
    ),
    Route(
        "GET",
        CLUSTER_PATH,
        get_cluster,
        need=(on_named("external_cluster", "read"),),
        op="getCluster",
        summary="Describe an external cluster (no secrets)",
        tag="clusters",
        answers={200: answer("The cluster", ref("ClusterInfo"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        CLUSTER_PATH,
        drop_cluster,
        need=(on_named("external_cluster", "admin"),),
        op="dropCluster",
        summary="Forget an external cluster and its stored secret (409 while copy handlers use it)",
        tag="clusters",
        answers={204: answer("Dropped")},
        fails=(404, 409),
    ),
    Route(
        "POST",
        "/v1/clusters/{name}/ping",
        ping_cluster,
        need=(on_named("external_cluster", "write"),),
        op="pingCluster",
        summary="Reach the cluster's /readyz and one authenticated call; a failure (also "
        "same_cluster_name) is ok false, not 5xx",
        tag="clusters",
        answers={200: answer("What happened", ref("ClusterPing"))},
        fails=(404,),
    ),
]
