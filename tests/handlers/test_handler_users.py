"""A handler's user may not exist yet; each pass runs only while its definer covers that user.

The original's examples define a handler before its user (``h_add``, then ``capsec
create_user``): the handler is stored and fails each pass until the user exists. Whoever defined
it is kept with it, and every pass checks that the definer still holds everything the user
holds (``AuthStore.act_on``), so a user created or widened later never runs with more than its
definer holds. On the supervisor with a real cluster and a real ``AuthStore``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.supervisor import launched, started

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.store import AuthStore, parse_rules
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import Forbidden
from capella.handlers.supervisor import Supervisor

FLUSH = {"type": "flush", "queues": ["q"], "started": False}
# mgr manages the svc-* users and may write queue q, nothing else.
MGR_RULES = ["allow:user:admin:svc-*", "allow:handler:*:*", "allow:queue:*:q"]


@pytest.fixture
def users(tmp_path: Path) -> AuthStore:
    store = AuthStore(tmp_path / "auth")
    store.add_user("root", "root-password", admin=True)
    store.add_user("mgr", "mgr-password", rules=parse_rules(MGR_RULES))
    return store


@pytest.fixture
async def supervisor(cluster: Cluster, users: AuthStore) -> Supervisor:
    await cluster.put_queue("q", {})
    await cluster.put_queue("secret", {})
    made = await launched(cluster, users=users)
    return made


def as_user(users: AuthStore, name: str) -> Identity:
    return users.user(name).identity("basic")


async def error_code(supervisor: Supervisor, name: str) -> str | None:
    state = await supervisor.run_now(name)
    return None if state.last_error is None else state.last_error.code


async def test_a_handler_for_a_user_who_does_not_exist_yet_is_stored_and_waits_for_it(
    supervisor: Supervisor, users: AuthStore
) -> None:
    mgr = as_user(users, "mgr")
    state, created = await supervisor.put("h", {**FLUSH, "user": "svc-etl"}, mgr)
    assert created and state.user == "svc-etl" and state.definer == "mgr"
    assert state.status().cannot_run == "handler user 'svc-etl' does not exist or is disabled"
    assert await error_code(supervisor, "h") == "handler_user_unavailable"

    # Made (disabled, as capsec makes users): still waiting. Enabled, with no rights: forbidden.
    users.change_user("svc-etl", password="svc-password", enabled=False)
    assert await error_code(supervisor, "h") == "handler_user_unavailable"
    users.change_user("svc-etl", enabled=True)
    assert state.status().cannot_run is None
    assert await error_code(supervisor, "h") == "forbidden"
    users.put_user("svc-etl", {"rules": ["allow:queue:write:q"]})
    assert await error_code(supervisor, "h") is None
    assert state.status().runs == 4 and state.status().last_error is None


async def test_naming_a_user_needs_user_admin_on_the_name_even_before_it_exists(
    supervisor: Supervisor, users: AuthStore
) -> None:
    with pytest.raises(Forbidden):
        await supervisor.put("h", {**FLUSH, "user": "other"}, as_user(users, "mgr"))
    with pytest.raises(Forbidden):
        await supervisor.put("h", {**FLUSH, "user": "root"}, as_user(users, "mgr"))


async def test_a_user_made_an_admin_later_does_not_run_the_narrow_definers_handler(
    supervisor: Supervisor, users: AuthStore, cluster: Cluster
) -> None:
    # mgr may not write "secret"; it names it in a handler for a user who does not exist yet.
    await cluster.queue("secret").append([Draft(b"x")], SaveMode.NONE)
    state, _ = await supervisor.put(
        "h", {**FLUSH, "queues": ["secret"], "user": "svc-x"}, as_user(users, "mgr")
    )
    users.add_user("svc-x", "svc-password", admin=True)
    assert await error_code(supervisor, "h") == "handler_user_not_covered"
    assert "now holds an admin that 'mgr', who defined it, does not hold" in (state.status().cannot_run or "")

    # Wider rules than mgr's: refused the same; rules mgr holds: it runs (and is then forbidden
    # the queue, as the user's rules say).
    users.change_user("svc-x", admin=False)
    users.put_user("svc-x", {"rules": ["allow:queue:write:*"]})
    assert await error_code(supervisor, "h") == "handler_user_not_covered"
    users.put_user("svc-x", {"rules": ["allow:queue:write:q"]})
    assert await error_code(supervisor, "h") == "forbidden"


async def test_a_definer_dropped_or_demoted_stops_the_handler(
    supervisor: Supervisor, users: AuthStore
) -> None:
    users.add_user("svc-a", "svc-password", rules=parse_rules(MGR_RULES[2:]))
    await supervisor.put("h", {**FLUSH, "user": "svc-a"}, as_user(users, "mgr"))
    assert await error_code(supervisor, "h") is None

    users.put_user("mgr", {"rules": ["allow:user:admin:svc-*", "allow:handler:*:*"]})  # demoted
    assert await error_code(supervisor, "h") == "handler_user_not_covered"
    users.put_user("mgr", {"rules": MGR_RULES})
    assert await error_code(supervisor, "h") is None

    users.drop_user("mgr")
    assert await error_code(supervisor, "h") == "handler_user_not_covered"
    assert "'mgr', who defined it and no longer exists" in (supervisor.handler("h").status().cannot_run or "")
    # A new user of the same name, an admin even, is not the definer.
    users.add_user("mgr", "mgr-password", admin=True)
    assert await error_code(supervisor, "h") == "handler_user_not_covered"
    assert "an earlier user named 'mgr'" in (supervisor.handler("h").status().cannot_run or "")
    # Defined again by someone who holds what svc-a holds, it runs.
    await supervisor.put("h", {**FLUSH, "user": "svc-a"}, as_user(users, "root"))
    assert await error_code(supervisor, "h") is None


async def test_a_handler_of_a_user_dropped_and_made_again_waits_for_a_new_definition(
    supervisor: Supervisor, users: AuthStore
) -> None:
    users.add_user("svc-self", "svc-password", rules=parse_rules(MGR_RULES))
    me = as_user(users, "svc-self")
    await supervisor.put("mine", FLUSH, me)
    assert await error_code(supervisor, "mine") is None
    users.drop_user("svc-self")
    users.add_user("svc-self", "svc-password", admin=True)
    assert await error_code(supervisor, "mine") == "handler_user_not_covered"


async def test_the_definer_survives_a_restart_and_the_handler_runs_once_its_user_exists(
    supervisor: Supervisor, users: AuthStore, cluster: Cluster
) -> None:
    await supervisor.put("h", {**FLUSH, "user": "svc-later"}, as_user(users, "mgr"))
    await supervisor.close()
    async with started(cluster, users=users) as again:
        state = again.handler("h")
        assert (state.user, state.definer) == ("svc-later", "mgr")
        assert await error_code(again, "h") == "handler_user_unavailable"
        users.add_user("svc-later", "svc-password", admin=True)
        assert await error_code(again, "h") == "handler_user_not_covered"
        users.change_user("svc-later", admin=False, rules=parse_rules(MGR_RULES[2:]))
        assert await error_code(again, "h") is None


async def test_with_authentication_off_a_named_user_is_not_checked(cluster: Cluster) -> None:
    await cluster.put_queue("q", {})
    async with started(cluster) as supervisor:
        state, _ = await supervisor.put("h", {**FLUSH, "user": "nobody-yet"}, UNRESTRICTED)
        assert state.definer is None and state.status().cannot_run is None
        assert await error_code(supervisor, "h") is None
