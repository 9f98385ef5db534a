"""The auth package on its own: password hashes, rules, the user and token files, and the
authenticator's cache and timing. No HTTP here (tests/api/test_api_auth.py has that)."""

from __future__ import annotations

import asyncio
import os
import stat
import statistics
import time
from pathlib import Path

import pytest
from support.clock import Clock

from capella.auth.authenticator import Authenticator
from capella.auth.password import hash_password, verify_password
from capella.auth.rule import AccessRule, Identity, allowed, contains, covers, meet
from capella.auth.store import AuthStore, split_token
from capella.config import AuthSettings
from capella.errors import AlreadyExists, Conflict, CorruptData, Forbidden, InvalidRequest, Unauthorized

# --- passwords ---------------------------------------------------------------------------


def test_a_password_hash_is_salted_and_verifies_only_its_password() -> None:
    first, second = hash_password("correct horse"), hash_password("correct horse")

    assert first != second  # a fresh salt each time
    assert first.startswith("scrypt$16384$8$1$")
    assert "correct horse" not in first
    assert verify_password("correct horse", first)
    assert not verify_password("correct horsf", first)
    assert not verify_password("correct horse", "md5$whatever")
    assert not verify_password("correct horse", "scrypt$x$y")


@pytest.mark.parametrize("bad", ["short", "", "x" * 1025, None, 12345678])
def test_a_new_password_must_be_a_string_of_reasonable_length(bad: object) -> None:
    with pytest.raises(InvalidRequest):
        hash_password(bad)  # type: ignore[arg-type]


# --- rules -------------------------------------------------------------------------------


def rules(*texts: str) -> tuple[AccessRule, ...]:
    return tuple(AccessRule.parse(t) for t in texts)


def test_no_rule_means_no() -> None:
    assert not allowed((), "queue", "read", "orders")


def test_deny_wins_over_allow_whatever_the_order() -> None:
    both = rules("allow:queue:read:*", "deny:queue:read:secret-*")

    assert allowed(both, "queue", "read", "orders")
    assert not allowed(both, "queue", "read", "secret-payroll")
    assert not allowed(tuple(reversed(both)), "queue", "read", "secret-payroll")


def test_a_wildcard_matches_any_run_of_characters_including_slashes() -> None:
    subs = rules("allow:subscription:read:orders/*")

    assert allowed(subs, "subscription", "read", "orders/billing")
    assert not allowed(subs, "subscription", "read", "orders2/billing")
    assert allowed(rules("allow:queue:read:a*c"), "queue", "read", "abbbc")
    assert not allowed(rules("allow:queue:read:a*c"), "queue", "read", "abbbcd")
    # Other regex characters are literal.
    assert not allowed(rules("allow:queue:read:a.c"), "queue", "read", "abc")


def test_read_and_write_are_separate_and_admin_grants_both() -> None:
    writer = rules("allow:queue:write:orders")

    assert allowed(writer, "queue", "write", "orders")
    assert not allowed(writer, "queue", "read", "orders")
    owner = rules("allow:queue:admin:orders")
    assert all(allowed(owner, "queue", a, "orders") for a in ("read", "write", "admin"))
    # A deny names exactly its action.
    assert allowed(rules("allow:queue:*:q", "deny:queue:admin:q"), "queue", "read", "q")
    assert not allowed(rules("allow:queue:*:q", "deny:queue:admin:q"), "queue", "admin", "q")


def test_the_object_type_must_match() -> None:
    assert not allowed(rules("allow:queue:read:*"), "handler", "read", "x")
    assert allowed(rules("allow:*:read:*"), "handler", "read", "x")


def test_an_admin_may_do_everything_and_check_names_what_was_refused() -> None:
    assert Identity("root", admin=True).can("user", "admin", "anyone")
    with pytest.raises(Forbidden) as caught:
        Identity("bob").check("external_cluster", "write", "dc2")
    assert caught.value.message == "user 'bob' may not write external cluster 'dc2'"


@pytest.mark.parametrize(
    "raw",
    [
        "allow:queue:read",
        "maybe:queue:read:*",
        "allow:topic:read:*",
        "allow:queue:delete:*",
        {"effect": "allow", "type": "queue", "action": "read", "name": ""},
        {"effect": "allow", "type": "queue", "action": "read", "extra": 1},
        42,
    ],
)
def test_a_bad_rule_is_refused_with_a_message(raw: object) -> None:
    with pytest.raises(InvalidRequest):
        AccessRule.parse(raw)


def test_a_rule_reads_from_both_forms() -> None:
    text = AccessRule.parse("deny:queue:write:orders-*")

    assert AccessRule.parse(text.to_wire()) == text
    assert str(text) == "deny:queue:write:orders-*"


# --- the store ---------------------------------------------------------------------------


def test_users_and_relays_are_granted_only_by_name() -> None:
    wide = rules("allow:*:*:*")
    assert not allowed(wide, "user", "admin", "admin") and not allowed(wide, "user", "read", "bob")
    assert not allowed(wide, "external_cluster", "relay", "dc")
    assert allowed(wide, "external_cluster", "write", "dc")
    assert allowed(rules("allow:user:*:*"), "user", "admin", "bob")
    assert allowed(rules("allow:external_cluster:*:dc"), "external_cluster", "relay", "dc")
    # admin implies read and write, never relay
    assert not allowed(rules("allow:external_cluster:admin:dc"), "external_cluster", "relay", "dc")
    assert allowed(rules("allow:external_cluster:relay:dc"), "external_cluster", "relay", "dc")
    # a * type still denies
    assert not allowed(rules("allow:user:*:*", "deny:*:*:admin"), "user", "admin", "admin")
    with pytest.raises(InvalidRequest):
        AccessRule.parse("allow:queue:relay:q")


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("*", "anything*", True),
        ("dev-*", "dev-a*", True),
        ("dev-a*", "dev-*", False),
        ("a*c", "ab*bc", True),
        ("a*c", "a*", False),
        ("x", "x", True),
        ("x", "x*", False),
    ],
)
def test_a_pattern_contains_another(outer: str, inner: str, expected: bool) -> None:
    assert contains(outer, inner) is expected


@pytest.mark.parametrize(
    ("one", "other", "expected"),
    [
        ("dev-*", "*-ops", True),
        ("a*", "b*", False),
        ("*", "x", True),
        ("a*b", "*c", False),
        ("ab", "a*b", True),
        ("", "*", True),
        ("", "a", False),
    ],
)
def test_two_patterns_meet(one: str, other: str, expected: bool) -> None:
    assert meet(one, other) is expected and meet(other, one) is expected


def test_an_identity_covers_another_only_when_it_holds_all_it_holds() -> None:
    admin = Identity("root", admin=True)
    manager = Identity("mgr", rules=rules("allow:user:admin:*", "allow:queue:*:*", "deny:queue:admin:prod-*"))
    assert covers(admin, admin) and covers(admin, manager)
    assert not covers(manager, admin)
    assert covers(manager, Identity("r", rules=rules("allow:queue:read:orders", "deny:*:*:*")))
    assert covers(manager, Identity("w", rules=rules("allow:queue:write:x*")))
    # denied to the manager where the other's pattern could reach
    assert not covers(manager, Identity("p", rules=rules("allow:queue:*:*")))
    assert not covers(manager, Identity("p", rules=rules("allow:queue:admin:p*")))
    assert covers(manager, Identity("p", rules=rules("allow:queue:admin:dev-*")))
    # another type, a wider pattern, a secret: not held
    assert not covers(manager, Identity("h", rules=rules("allow:handler:read:x")))
    assert not covers(manager, Identity("s", rules=rules("allow:secret:use:db")))
    assert not covers(
        Identity("n", rules=rules("allow:queue:read:a*")), Identity("m", rules=rules("allow:queue:read:*"))
    )
    # a * rule of the other grants what its types grant, users and secrets aside
    assert covers(
        Identity(
            "q",
            rules=rules(
                "allow:cluster:*:*",
                "allow:queue:*:*",
                "allow:subscription:*:*",
                "allow:group:*:*",
                "allow:handler:*:*",
                "allow:external_cluster:*:*",
            ),
        ),
        Identity("o", rules=rules("allow:*:*:*")),
    )


def test_users_and_tokens_survive_a_reopen_without_secrets_on_disk(tmp_path: Path, clock: Clock) -> None:
    store = AuthStore(tmp_path / "auth", clock)
    store.add_user("alice", "alice-password", admin=True)
    store.put_user("bob", {"password": "bob-password", "rules": ["allow:queue:read:orders"]})
    token, text = store.create_token("bob", 3600, "ci")

    again = AuthStore(tmp_path / "auth", clock)
    assert [u.name for u in again.users()] == ["alice", "bob"]
    assert again.user("bob").rules == (AccessRule("allow", "queue", "read", "orders"),)
    assert again.check_token(text) == again.user("bob")
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "auth").iterdir() if p.is_file())
    for secret in (b"alice-password", b"bob-password", text.encode(), split_token(text)[1].encode()):  # type: ignore[index]
        assert secret not in on_disk
    for name in ("users.json", "tokens.json"):
        assert stat.S_IMODE(os.stat(tmp_path / "auth" / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "auth").st_mode) == 0o700
    assert token.description == "ci"


def test_a_token_expires_and_a_revoked_one_is_gone(tmp_path: Path, clock: Clock) -> None:
    store = AuthStore(tmp_path / "auth", clock)
    store.add_user("bob", "bob-password")
    _, short_text = store.create_token("bob", 60, "")
    long, long_text = store.create_token("bob", 3600, "")

    clock.now += 61
    assert store.check_token(short_text) is None
    assert [t.id for t in store.tokens()] == [long.id]
    store.revoke_token(long.id)
    assert store.check_token(long_text) is None
    assert store.check_token("cap_" + "0" * 16 + "_" + "A" * 43) is None
    assert store.check_token("not a token") is None


def test_a_disabled_or_dropped_user_loses_its_tokens(tmp_path: Path, clock: Clock) -> None:
    store = AuthStore(tmp_path / "auth", clock)
    store.add_user("root", "root-password", admin=True)
    store.add_user("bob", "bob-password")
    _, text = store.create_token("bob", 3600)

    store.put_user("bob", {"enabled": False})
    assert store.check_token(text) is None
    store.put_user("bob", {"enabled": True})
    assert store.check_token(text) is not None
    store.drop_user("bob")
    assert store.check_token(text) is None
    assert store.tokens() == []


def test_the_last_enabled_admin_cannot_be_dropped_demoted_or_disabled(tmp_path: Path) -> None:
    store = AuthStore(tmp_path / "auth")
    store.add_user("root", "root-password", admin=True)

    for change in ({"admin": False}, {"enabled": False}):
        with pytest.raises(Conflict):
            store.put_user("root", change)
    with pytest.raises(Conflict):
        store.drop_user("root")
    store.add_user("second", "second-password", admin=True)
    store.drop_user("root")
    assert [u.name for u in store.users()] == ["second"]


def test_user_names_and_definitions_are_checked(tmp_path: Path) -> None:
    store = AuthStore(tmp_path / "auth")

    with pytest.raises(InvalidRequest):
        store.put_user("bob", {"admin": True})  # a new user needs a password
    with pytest.raises(InvalidRequest):
        store.put_user("../etc", {"password": "long enough"})
    with pytest.raises(InvalidRequest):
        store.put_user("bob", {"password": "long enough", "admin": "yes"})
    with pytest.raises(InvalidRequest):
        store.put_user("bob", {"password": "long enough", "colour": "blue"})
    store.add_user("bob", "long enough")
    with pytest.raises(AlreadyExists):
        store.add_user("bob", "long enough")


def test_one_process_at_a_time_holds_the_directory(tmp_path: Path) -> None:
    server = AuthStore(tmp_path / "auth")
    server.lock()
    offline = AuthStore(tmp_path / "auth")

    with pytest.raises(Conflict, match="in use by a running server"):
        offline.lock()
    server.unlock()
    offline.lock()
    offline.unlock()


def test_a_damaged_user_file_is_reported_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "users.json").write_text('{"version": 1, "users": {"bob": {}}}')

    with pytest.raises(CorruptData):
        AuthStore(tmp_path / "auth")
    (tmp_path / "auth" / "users.json").write_text("{not json")
    with pytest.raises(CorruptData):
        AuthStore(tmp_path / "auth")


# --- the authenticator -------------------------------------------------------------------


@pytest.fixture
def users(tmp_path: Path) -> AuthStore:
    store = AuthStore(tmp_path / "auth")
    store.add_user("root", "root-password", admin=True)
    store.add_user("bob", "bob-password", rules=(AccessRule.parse("allow:queue:read:*"),))
    return store


async def test_basic_credentials_give_the_users_identity(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True))

    who = await auth.basic("bob", "bob-password")

    assert (who.name, who.admin, who.via) == ("bob", False, "basic")
    assert who.can("queue", "read", "x") and not who.can("queue", "write", "x")


async def test_unknown_user_wrong_password_and_disabled_user_look_the_same(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True))
    users.add_user("carol", "carol-password")
    users.put_user("carol", {"enabled": False})

    answers = []
    for name, password in (
        ("nobody", "bob-password"),
        ("bob", "wrong-password"),
        ("carol", "carol-password"),
    ):
        with pytest.raises(Unauthorized) as caught:
            await auth.basic(name, password)
        answers.append((caught.value.code, caught.value.message))
    assert len(set(answers)) == 1


async def test_unknown_user_and_wrong_password_take_about_the_same_time(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True))

    async def seconds(name: str) -> float:
        started = time.perf_counter()
        with pytest.raises(Unauthorized):
            await auth.basic(name, "not-the-password")
        return time.perf_counter() - started

    unknown = statistics.median([await seconds("nobody") for _ in range(5)])
    wrong = statistics.median([await seconds("bob") for _ in range(5)])
    # Both run one scrypt (tens of ms); without the dummy hash "unknown" would take microseconds.
    assert unknown > 0.005 and wrong > 0.005
    assert 0.5 < unknown / wrong < 2.0


async def test_a_verified_password_is_cached_until_it_changes(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True))
    await auth.basic("bob", "bob-password")

    started = time.perf_counter()
    for _ in range(100):
        await auth.basic("bob", "bob-password")
    assert (time.perf_counter() - started) / 100 < 0.002  # no scrypt per request

    await asyncio.to_thread(users.put_user, "bob", {"password": "new-bob-password"})
    with pytest.raises(Unauthorized):
        await auth.basic("bob", "bob-password")
    assert (await auth.basic("bob", "new-bob-password")).name == "bob"
    users.put_user("bob", {"enabled": False})
    with pytest.raises(Unauthorized):
        await auth.basic("bob", "new-bob-password")


async def test_the_cache_forgets_after_its_ttl(users: AuthStore) -> None:
    clock = Clock()
    auth = Authenticator(users, AuthSettings(enabled=True, cache_ttl=10), clock=clock)
    await auth.basic("bob", "bob-password")

    async def seconds() -> float:
        started = time.perf_counter()
        await auth.basic("bob", "bob-password")
        return time.perf_counter() - started

    clock.now += 9
    cached = await seconds()
    clock.now += 2
    checked_again = await seconds()  # past the ttl: scrypt runs again
    assert checked_again > 5 * cached


def test_a_token_and_a_certificate_name_give_identities(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True))
    _, text = users.create_token("bob", 60)

    assert auth.token(text).via == "token"
    assert auth.certificate("bob").name == "bob"
    with pytest.raises(Unauthorized):
        auth.token(text[:-1] + ("A" if text[-1] != "A" else "B"))
    with pytest.raises(Unauthorized):
        auth.certificate("mallory")


def test_token_lifetimes_are_bounded(users: AuthStore) -> None:
    auth = Authenticator(users, AuthSettings(enabled=True, token_ttl=60, token_max_ttl=3600))

    assert auth.token_ttl(None) == 60
    assert auth.token_ttl(3600) == 3600
    for bad in (0, 3601):
        with pytest.raises(InvalidRequest):
            auth.token_ttl(bad)
