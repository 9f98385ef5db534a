"""Attenuation: a grant to act on a user never lets its holder act *as* one who holds more.

Issue 33, tried as an attacker on a live server: a user with ``allow:*:*:dev-*`` minted a token
for an admin named ``dev-ops``; a user manager (``allow:user:admin:*``) minted a 365-day token
for ``admin`` and reset its password without the old one; ``dev`` defined a push handler running
as ``dev-ops``. Now ``*`` does not match ``user``, and acting on a user (a password, a token, a
handler that runs as them, enabling, disabling or dropping them), on ``/v1`` and through the
original protocol's ``capsec`` actions, needs everything that user holds.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.original import call, envelope

from capella.api.original.codes import PERMISSION_DENIED
from security.conftest import DEV_PASSWORD, Answer, Secured, StartSecured

ORIGINAL = "[compat]\noriginal = true\n"


def make_user(secured: Secured, name: str, *, admin: bool = False, rules: list[str] | None = None) -> None:
    body: dict[str, Any] = {"password": DEV_PASSWORD, "admin": admin, "rules": rules or []}
    made = secured.call("PUT", f"/v1/users/{name}", body, user="admin")
    assert made.status in (200, 201), made.body


def me(secured: Secured, token: str) -> Answer:
    return secured.call("GET", "/v1/me", user=None, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def wildcard(start_secured: StartSecured) -> Secured:
    """``dev`` holds ``allow:*:*:dev-*``; ``dev-ops`` is an admin whose name it matches."""
    secured = start_secured(ORIGINAL)
    make_user(secured, "dev", rules=["allow:*:*:dev-*"])
    make_user(secured, "dev-ops", admin=True)
    return secured


def test_a_star_type_does_not_grant_users(wildcard: Secured) -> None:
    minted = wildcard.call("POST", "/v1/tokens", {"user": "dev-ops", "ttl": "365d"})
    assert minted.status == 403 and minted.body["error"]["code"] == "forbidden", minted.body
    assert "user" in minted.body["error"]["message"]
    reset = wildcard.call("POST", "/v1/users/dev-ops/password", {"password": "taken-over-1"})
    assert reset.status == 403, reset.body
    disabled = wildcard.call("PUT", "/v1/users/dev-ops", {"enabled": False})
    assert disabled.status == 403, disabled.body
    assert wildcard.call("GET", "/v1/users/dev-ops").status == 403
    assert wildcard.call("GET", "/v1/users").body == {"users": []}
    # What dev holds by the rule stays its: queues, handlers, subscriptions named dev-*.
    assert wildcard.call("PUT", "/v1/queues/dev-q", {}).status == 201
    # dev-ops still signs in with its own password.
    assert wildcard.call("GET", "/v1/me", user="dev-ops").body["admin"] is True


def test_a_handler_never_runs_as_a_user_who_holds_more(wildcard: Secured) -> None:
    assert wildcard.call("PUT", "/v1/queues/dev-q", {}).status == 201
    push = {
        "type": "push",
        "queue": "dev-q",
        "user": "dev-ops",
        "params": {"url": "http://127.0.0.1:9/hook"},
        "started": False,
    }
    refused = wildcard.call("PUT", "/v1/handlers/dev-push", push)
    assert refused.status == 403, refused.body
    assert wildcard.call("GET", "/v1/handlers/dev-push").status == 404

    # Named by a rule of type user, the admin is still out of reach: dev does not hold everything.
    make_user(wildcard, "dev", rules=["allow:*:*:dev-*", "allow:user:admin:dev-*"])
    again = wildcard.call("PUT", "/v1/handlers/dev-push", push)
    assert again.status == 403 and "admin" in again.body["error"]["message"], again.body


def test_a_handler_that_runs_as_an_admin_is_out_of_reach(wildcard: Secured) -> None:
    assert wildcard.call("PUT", "/v1/queues/dev-q", {}, user="admin").status == 201
    flush = {"type": "flush", "queue": "dev-q", "started": False}
    assert wildcard.call("PUT", "/v1/handlers/dev-flush", flush, user="admin").status == 201
    assert wildcard.call("GET", "/v1/handlers/dev-flush").body["user"] == "admin"

    for method, path, body in [
        ("POST", "/v1/handlers/dev-flush/start", None),
        ("POST", "/v1/handlers/dev-flush/run", None),
        ("POST", "/v1/handlers/dev-flush/stop", None),
        ("PUT", "/v1/handlers/dev-flush", {**flush, "started": True}),
        ("DELETE", "/v1/handlers/dev-flush", None),
    ]:
        answer = wildcard.call(method, path, body)
        assert answer.status == 403, (method, path, answer.body)
    assert wildcard.call("GET", "/v1/handlers/dev-flush").body["started"] is False

    # dev's own handlers are dev's to run.
    assert wildcard.call("PUT", "/v1/handlers/dev-mine", flush).status == 201
    assert wildcard.call("POST", "/v1/handlers/dev-mine/run").status == 200
    assert wildcard.call("DELETE", "/v1/handlers/dev-mine").status == 204


@pytest.fixture
def managed(start_secured: StartSecured) -> Secured:
    """``mgr`` manages users (``allow:user:admin:*``) and holds every queue right."""
    secured = start_secured(ORIGINAL)
    make_user(secured, "mgr", rules=["allow:user:admin:*", "allow:queue:*:*"])
    make_user(secured, "reader", rules=["allow:queue:read:orders"])
    make_user(secured, "ops", admin=True)
    make_user(secured, "wide", rules=["allow:queue:*:*", "allow:handler:*:*"])
    return secured


def test_a_user_manager_acts_on_users_who_hold_no_more_than_it(managed: Secured) -> None:
    # On an admin: no token, no password reset, no disabling, no dropping.
    minted = managed.call("POST", "/v1/tokens", {"user": "admin", "ttl": "365d"}, user="mgr")
    assert minted.status == 403, minted.body
    assert (
        managed.call("POST", "/v1/users/admin/password", {"password": "taken-over-1"}, user="mgr").status
        == 403
    )
    assert managed.call("PUT", "/v1/users/ops", {"enabled": False}, user="mgr").status == 403
    assert managed.call("PUT", "/v1/users/ops", {"password": "taken-over-2"}, user="mgr").status == 403
    assert managed.call("DELETE", "/v1/users/ops", user="mgr").status == 403
    # On a user holding a right mgr lacks: refused too.
    assert managed.call("POST", "/v1/tokens", {"user": "wide"}, user="mgr").status == 403
    assert managed.call("DELETE", "/v1/users/wide", user="mgr").status == 403

    # On a user whose rights mgr holds: everything user admin gives.
    minted = managed.call("POST", "/v1/tokens", {"user": "reader", "ttl": "1h"}, user="mgr")
    assert minted.status == 201, minted.body
    assert me(managed, minted.body["token"]).body["user"] == "reader"
    reset = managed.call("POST", "/v1/users/reader/password", {"password": "reset-by-mgr"}, user="mgr")
    assert reset.status == 200, reset.body
    listed = managed.call("GET", "/v1/tokens", user="mgr").body["tokens"]
    assert [t["user"] for t in listed] == ["reader"]
    assert managed.call("DELETE", f"/v1/tokens/{minted.body['id']}", user="mgr").status == 204
    assert managed.call("PUT", "/v1/users/newbie", {"password": "newbie-password"}, user="mgr").status == 201
    assert managed.call("DELETE", "/v1/users/reader", user="mgr").status == 204

    # The admins' tokens are neither shown to mgr nor revocable by it.
    admins = managed.call("POST", "/v1/tokens", {"ttl": "1h"}, user="admin").body
    assert all(t["user"] != "admin" for t in managed.call("GET", "/v1/tokens", user="mgr").body["tokens"])
    assert managed.call("DELETE", f"/v1/tokens/{admins['id']}", user="mgr").status == 404
    assert me(managed, admins["token"]).status == 200


def original_call(
    secured: Secured, action: str, body: object, user: str = "mgr", object_name: str = ""
) -> dict[str, Any]:
    """One ``POST /cluster`` call signed in as ``user`` (password ``DEV_PASSWORD``)."""
    sent = envelope(action, body, user=user, password=DEV_PASSWORD, object_name=object_name)
    return call(secured.url, sent)


def test_the_original_protocol_checks_the_same(managed: Secured) -> None:
    for action, body in [
        ("SecurityATCB_update_use_cluster", {"name": "ops", "pwd": "taken-over-3"}),
        ("SecurityATCB_disable_use_cluster", "ops"),
        ("SecurityATCB_drop_use_cluster", "ops"),
        ("SecurityATCB_update_use_cluster", {"name": "wide", "pwd": "taken-over-4"}),
    ]:
        answer = original_call(managed, action, body)
        assert answer["error"]["code"] == PERMISSION_DENIED, (action, answer)
    assert managed.call("GET", "/v1/me", user="ops").status == 200, "ops kept its password and stays enabled"
    assert managed.call("GET", "/v1/me", user="wide").status == 200

    assert (
        original_call(
            managed, "SecurityATCB_update_use_cluster", {"name": "reader", "pwd": "reset-by-mgr-5"}
        )["error"]
        is None
    )
    assert original_call(managed, "SecurityATCB_disable_use_cluster", "reader")["error"] is None


# --- a handler for a user who does not exist yet, or who is given more later ---------------------


@pytest.fixture
def namer(start_secured: StartSecured) -> Secured:
    """``dev`` manages the ``dev-*`` users and holds ``dev-*`` queues and handlers; the admin
    holds ``payroll``, which dev may not read."""
    secured = start_secured(ORIGINAL)
    make_user(secured, "dev", rules=["allow:*:*:dev-*", "allow:user:admin:dev-*"])
    for queue in ("payroll", "dev-stolen"):
        assert secured.call("PUT", f"/v1/queues/{queue}", {}, user="admin").status == 201
    sent = {"messages": [{"data": "salary 1"}, {"data": "salary 2"}]}
    assert secured.call("POST", "/v1/queues/payroll/messages", sent, user="admin").status in (200, 201)
    return secured


def copy_as(user: str) -> dict[str, Any]:
    return {"type": "copy", "params": {"from": "payroll", "to": "dev-stolen"}, "user": user, "started": False}


def stolen(secured: Secured) -> list[str]:
    answer = secured.call("GET", "/v1/queues/dev-stolen/messages?after=0")
    assert answer.status == 200, answer.body
    return [m["data"] for m in answer.body["messages"]]


def run_as_admin(secured: Secured, handler: str) -> dict[str, Any]:
    answer = secured.call("POST", f"/v1/handlers/{handler}/run", user="admin")
    assert answer.status == 200, answer.body
    status: dict[str, Any] = answer.body["status"]
    return status


def test_a_handler_named_for_a_future_user_never_runs_with_more_than_its_definer(namer: Secured) -> None:
    defined = namer.call("PUT", "/v1/handlers/dev-leak", copy_as("dev-svc"))
    assert defined.status == 201, defined.body
    assert defined.body["status"]["cannot_run"] == "handler user 'dev-svc' does not exist or is disabled"

    # The admin makes dev-svc, unaware, as an admin; then with every queue right.
    make_user(namer, "dev-svc", admin=True)
    status = run_as_admin(namer, "dev-leak")
    assert status["last_error"]["code"] == "handler_user_not_covered", status
    assert "'dev', who defined it, does not hold" in status["cannot_run"]
    make_user(namer, "dev-svc", rules=["allow:queue:*:*", "allow:subscription:*:*"])
    status = run_as_admin(namer, "dev-leak")
    assert status["last_error"]["code"] == "handler_user_not_covered", status
    assert stolen(namer) == []
    # Started, its loop fails the same way, and dev may no longer touch it.
    assert namer.call("POST", "/v1/handlers/dev-leak/start", user="admin").status == 200
    assert namer.call("POST", "/v1/handlers/dev-leak/run").status == 403
    assert stolen(namer) == []


def test_a_user_given_more_after_the_definition_does_not_carry_it_into_the_handler(namer: Secured) -> None:
    make_user(namer, "dev-reader", rules=["allow:queue:read:dev-*"])
    assert namer.call("PUT", "/v1/handlers/dev-copy", copy_as("dev-reader")).status == 201
    assert run_as_admin(namer, "dev-copy")["last_error"]["code"] == "forbidden"  # payroll is not dev-reader's

    # Later dev-reader is given the right it lacked (for some other job): dev does not hold it.
    make_user(namer, "dev-reader", rules=["allow:queue:*:*", "allow:subscription:*:*"])
    status = run_as_admin(namer, "dev-copy")
    assert status["last_error"]["code"] == "handler_user_not_covered", status
    assert stolen(namer) == []


def test_the_original_protocol_names_a_future_user_under_the_same_check(namer: Secured) -> None:
    handler = {
        "name": "dev-rs",
        "user_name": "dev-later",
        "type": "regularly_save",
        "queue_names": ["payroll"],
        "params": {"interval": 1_000_000_000},
    }
    assert original_call(namer, "add_h", handler, user="dev")["error"] is None
    # A name dev may not manage is refused, whether or not the user exists.
    other = {**handler, "name": "dev-rs2", "user_name": "ops"}
    assert original_call(namer, "add_h", other, user="dev")["error"]["code"] == PERMISSION_DENIED
    make_user(namer, "dev-later", admin=True)
    status = run_as_admin(namer, "dev-rs")
    assert status["last_error"]["code"] == "handler_user_not_covered", status
    # h_last_error shows it as the original shows a pass its user may not make.
    failed = original_call(namer, "h_last_error", None, user="dev", object_name="dev-rs")["error"]
    assert (failed["code"], failed["ie"]["code"]) == (10117400, 10111000), failed
    assert failed["ie"]["iet"] == "handler_user_not_covered"
