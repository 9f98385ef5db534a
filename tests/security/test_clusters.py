"""External clusters: their credentials are the cluster owner's, not every handler author's.

A user who may define handlers could once copy into or out of any cluster, using its stored
credentials (a confused deputy). Now a copy handler needs ``external_cluster write`` on the
cluster for its user; a cluster in use cannot be dropped; cluster secrets come from declared secrets
under ``secret use``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.receiver import Receiver, listening

from security.conftest import DEV_PASSWORD, DEV_RULES, StartSecured

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n[secrets.far-token]\nenv = "FAR_TOKEN"\n\n'


def test_a_copy_handler_needs_write_on_the_cluster_and_a_used_cluster_is_not_dropped(
    start_secured: StartSecured,
) -> None:
    secured = start_secured(LOOPBACK, env={"FAR_TOKEN": "far-token-value"})
    definition = {"url": "http://127.0.0.1:9", "token_secret": "far-token"}
    assert secured.call("PUT", "/v1/clusters/far", definition, user="admin").status == 201
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    copy = {"type": "copy", "queue": "dev-q", "params": {"to": "far/anything"}, "started": False}

    refused = secured.call("PUT", "/v1/handlers/dev-copy", copy)
    assert refused.status == 403, refused.body
    assert "external cluster 'far'" in refused.body["error"]["message"]

    rules = [*DEV_RULES, "allow:external_cluster:write:far"]
    grant = {"password": DEV_PASSWORD, "rules": rules}
    assert secured.call("PUT", "/v1/users/dev", grant, user="admin").status == 200
    assert secured.call("PUT", "/v1/handlers/dev-copy", copy).status == 201

    dropped = secured.call("DELETE", "/v1/clusters/far", user="admin")
    assert dropped.status == 409 and dropped.body["error"]["code"] == "conflict", dropped.body
    assert "dev-copy" in dropped.body["error"]["message"]
    assert secured.call("GET", "/v1/clusters/far", user="admin").status == 200
    assert secured.call("DELETE", "/v1/handlers/dev-copy").status == 204
    assert secured.call("DELETE", "/v1/clusters/far", user="admin").status == 204


def test_a_cluster_secret_needs_secret_use_by_its_definer(start_secured: StartSecured) -> None:
    secured = start_secured(LOOPBACK, env={"FAR_TOKEN": "far-token-value"})
    rules = [*DEV_RULES, "allow:external_cluster:*:dev-*"]
    assert (
        secured.call("PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": rules}, user="admin").status
        == 200
    )
    definition = {"url": "http://127.0.0.1:9", "token_secret": "far-token"}
    refused = secured.call("PUT", "/v1/clusters/dev-far", definition)
    assert refused.status == 400 and refused.body["error"]["code"] == "secret_unavailable", refused.body
    old = secured.call("PUT", "/v1/clusters/dev-far", {"url": "http://127.0.0.1:9", "token_env": "FAR_TOKEN"})
    assert old.status == 400 and 'token_secret = "NAME"' in old.body["error"]["message"]


async def test_a_cluster_uses_its_secret_as_it_is_now(start_secured: StartSecured, tmp_path: Path) -> None:
    """A rotated secret (the file rewritten) is sent from the next call on, without a restart."""
    me = {"user": None, "admin": False, "via": "token", "rules": [], "cluster": "far"}
    far = Receiver(json={"/readyz": {"ready": True}, "/v1/me": me})
    async with listening(far.handle) as port:
        token = tmp_path / "far-token"
        token.write_text("first-token\n")
        secured = start_secured(f'{LOOPBACK}[secrets.far-file]\nfile = "{token}"\n')
        url = f"http://127.0.0.1:{port}"
        definition = {"url": url, "token_secret": "far-file"}
        assert secured.call("PUT", "/v1/clusters/far", definition, user="admin").status == 201

        ping = await asyncio.to_thread(secured.call, "POST", "/v1/clusters/far/ping", user="admin")
        assert ping.body["ok"] is True, ping.body
        token.write_text("second-token\n")
        ping = await asyncio.to_thread(secured.call, "POST", "/v1/clusters/far/ping", user="admin")
        assert ping.body["ok"] is True, ping.body
        # Adding the cluster asked the far side its name too.
        seen = far.authorizations("/v1/me")
        assert seen == ["Bearer first-token", "Bearer first-token", "Bearer second-token"]

        token.unlink()
        gone = await asyncio.to_thread(secured.call, "POST", "/v1/clusters/far/ping", user="admin")
        assert gone.body["ok"] is False and gone.body["error"]["code"] == "secret_unavailable", gone.body
        seen = far.authorizations("/v1/me")
        assert len(seen) == 3
