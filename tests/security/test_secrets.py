"""Secrets by name: a limited user cannot make a push handler send the server's own secrets.

Issue 20's first attack: ``dev`` defined a push handler with ``token_env:
CAPELLA_ADMIN_PASSWORD`` and the receiver got the admin password. Now a definition names a
secret the operator declared, and only one its user was granted (``allow:secret:use:NAME``).
"""

from __future__ import annotations

import json

from support.receiver import Receiver
from support.wait import holds, until

from security.conftest import ADMIN_PASSWORD, DEV_PASSWORD, DEV_RULES, Secured, StartSecured

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n'
DECLARED = (
    '[secrets.dev-hook]\nenv = "HOOK_TOKEN"\n\n'
    '[secrets.admin-password]\nenv = "CAPELLA_ADMIN_PASSWORD"\n\n'
    '[secrets.dev-unset]\nenv = "CAPELLA_TEST_NEVER_SET"\n\n'
)
HOOK_TOKEN = "hook-token-value"


def start(start_secured: StartSecured) -> Secured:
    secured = start_secured(LOOPBACK + DECLARED, env={"HOOK_TOKEN": HOOK_TOKEN})
    grant(secured, [*DEV_RULES, "allow:secret:use:dev-*"])
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    return secured


def grant(secured: Secured, rules: list[str]) -> None:
    answer = secured.call("PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": rules}, user="admin")
    assert answer.status == 200, answer.body


def push(url: str, **params: object) -> dict[str, object]:
    return {"type": "push", "queue": "dev-q", "params": {"url": url, "max_attempts": 1, **params}}


async def test_the_old_env_params_are_refused_naming_the_replacement(
    start_secured: StartSecured, receiver: Receiver
) -> None:
    secured = start(start_secured)
    for old, new in (("token_env", "token"), ("secret_env", "secret"), ("basic_env", "basic")):
        answer = secured.call(
            "PUT", "/v1/handlers/dev-hook", push(receiver.url, **{old: "CAPELLA_ADMIN_PASSWORD"})
        )
        assert answer.status == 400, answer.body
        assert answer.body["error"]["field"] == f"params.{old}"
        assert f'params.{new} = "NAME"' in answer.body["error"]["message"]
        assert "[secrets.NAME]" in answer.body["error"]["message"]
    assert secured.call("GET", "/v1/handlers/dev-hook").status == 404


async def test_ungranted_unknown_and_unset_secrets_get_the_same_answer(
    start_secured: StartSecured, receiver: Receiver
) -> None:
    secured = start(start_secured)
    # Declared but not granted to dev; not declared at all; granted but without a value.
    for param in ("token", "secret", "basic"):
        bodies = []
        for name in ("admin-password", "no-such-secret", "dev-unset"):
            answer = secured.call("PUT", "/v1/handlers/dev-hook", push(receiver.url, **{param: name}))
            assert answer.status == 400, answer.body
            assert answer.body["error"]["code"] == "secret_unavailable"
            text = json.dumps(answer.body, sort_keys=True)
            assert ADMIN_PASSWORD not in text and "CAPELLA_" not in text
            # Byte for byte the same answer, but for the name the request gave.
            bodies.append(text.replace(name, "NAME"))
        assert len(set(bodies)) == 1, bodies
    assert receiver.seen == []


async def test_a_granted_secret_is_sent_and_a_revoked_one_stops_the_handler(
    start_secured: StartSecured, receiver: Receiver
) -> None:
    secured = start(start_secured)
    defined = secured.call("PUT", "/v1/handlers/dev-hook", push(receiver.url, token="dev-hook"))
    assert defined.status == 201, defined.body
    assert defined.body["params"]["token"] == "dev-hook"
    assert HOOK_TOKEN not in json.dumps(defined.body)
    sent = secured.call("POST", "/v1/queues/dev-q/messages", {"messages": [{"data": "one"}]})
    assert sent.status in (200, 201), sent.body
    await until(lambda: receiver.seen, 15.0)
    assert receiver.seen[0].headers["Authorization"] == f"Bearer {HOOK_TOKEN}"

    # The grant is taken away: the next pass reads the secret as dev again and stops (a pass
    # already running finishes with what it read at its start).
    grant(secured, DEV_RULES)

    def failed() -> bool:
        status = secured.call("GET", "/v1/handlers/dev-hook", user="admin").body["status"]
        error = status.get("last_error")
        return bool(error) and "'dev-hook' cannot be used" in error["message"]

    await until(failed, 15.0)
    secured.call("POST", "/v1/queues/dev-q/messages", {"messages": [{"data": "two"}]})
    await holds(lambda: len(receiver.seen) == 1, 1.0, "the refused handler sending nothing more")
    assert len(receiver.seen) == 1
    for request in receiver.seen:
        assert (
            ADMIN_PASSWORD not in json.dumps(request.headers) and ADMIN_PASSWORD.encode() not in request.body
        )


async def test_an_admin_may_use_every_declared_secret(
    start_secured: StartSecured, receiver: Receiver
) -> None:
    secured = start(start_secured)
    answer = secured.call("PUT", "/v1/handlers/dev-hook", push(receiver.url, token="dev-hook"), user="admin")
    assert answer.status == 201, answer.body
    # But the admin cannot hand dev's handler a secret dev may not use: it runs as dev.
    as_dev = push(receiver.url, token="admin-password") | {"user": "dev"}
    refused = secured.call("PUT", "/v1/handlers/dev-other", as_dev, user="admin")
    assert refused.status == 400 and refused.body["error"]["code"] == "secret_unavailable"
