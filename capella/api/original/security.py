"""``capsec``'s actions (``SecurityATCB_*`` users, ``SecurityATRZ_*`` rights) on Capella's ``AuthStore``.

The original keeps users (ATCB: name, password, enabled) apart from their rights (ATRZ: admin
flag, rules ``object type / action / object name → allowed``); Capella keeps both on one user.
A rule of the original becomes a Capella rule through ``PERMISSIONS`` (``GET_QUEUE`` on
``orders`` is ``allow:queue:read:orders``); the object type (``CLUSTER_SELF``...) is not needed
for that and is not kept. Each action needs what its ``/v1`` route needs; setting the admin flag
or rules is for admins only, and acting on another user (a password, enabling, dropping) needs
everything that user holds, as on ``/v1``. docs/compat.md lists the mapping and its gaps.
"""

from __future__ import annotations

import asyncio

import msgspec

from capella.api.original import shapes
from capella.api.original.actions import PERMISSIONS, Action, Context, body_name
from capella.api.original.envelope import Request
from capella.api.route import USER_PATH
from capella.auth.rule import AccessRule
from capella.auth.store import AuthStore
from capella.errors import AlreadyExists, Forbidden, InvalidRequest, NotFound
from capella.wire.auth import UserPut

# Where rights Capella has but the original cannot name are shown in SecurityATRZ_get.
CAPELLA_TYPE = "CAPELLA"


class NamePassword(msgspec.Struct):
    name: str
    pwd: str = ""


class NameAdmin(msgspec.Struct):
    name: str
    is_admin: bool = False


class RuleBody(msgspec.Struct):
    name: str
    object_type: str = ""
    action: str = ""
    object_name: str = ""
    allowed: bool = False


class ShownUser(msgspec.Struct):
    """A user as ``SecurityATCB_get_use_cluster`` lists it."""

    name: str
    is_enable: bool


class UserRights(msgspec.Struct, omit_defaults=True):
    """A user's rights as ``SecurityATRZ_get`` shows them: ``is_admin`` only when true."""

    name: str
    rule: dict[str, dict[str, dict[str, bool]]]
    is_admin: bool = False


class Rights(msgspec.Struct):
    """``SecurityATRZ_get``'s answer: the rights of every user the caller may read, by name."""

    users: dict[str, UserRights]


def _store(ctx: Context) -> AuthStore:
    if ctx.users is None:
        raise NotFound("authentication is off: there are no users (set [auth] enabled = true)")
    return ctx.users


async def _put(ctx: Context, name: str, change: UserPut) -> None:
    """Change the user with ``change``, the body ``PUT /v1/users/{name}`` takes, as the store reads one."""
    await asyncio.to_thread(_store(ctx).put_user, name, msgspec.to_builtins(change))


def _acting_on(ctx: Context, name: str) -> None:
    """An existing user that the sender may act on, as ``/v1`` checks it (``AuthStore.act_on``)."""
    if _store(ctx).act_on(ctx.identity, name) is None:
        _store(ctx).user(name)  # the original's "no user"


def _admin_only(ctx: Context, name: str) -> None:
    ctx.same_as("PUT", USER_PATH, name=name)
    if not ctx.identity.admin:
        # /v1 lets only an admin set admin or rules: a user manager could otherwise grant itself more.
        raise Forbidden("only an admin may set admin or rules")


def capella_rule(body: RuleBody) -> AccessRule:
    """The original's rule as a Capella rule: the action names the type and the action."""
    mapped = PERMISSIONS.get(body.action)
    if mapped is None:
        raise InvalidRequest(
            f"action {body.action!r}: Capella maps {', '.join(sorted(PERMISSIONS))}; admin rights "
            "(SET_USER_ADMIN, USER_RULE_SET...) are the admin flag",
            field="action",
        )
    return AccessRule("allow" if body.allowed else "deny", mapped[0], mapped[1], body.object_name or "*")


def original_rules(rules: tuple[AccessRule, ...]) -> dict[str, dict[str, dict[str, bool]]]:
    """Capella rules as the original's ``{object type: {action: {object name: allowed}}}``.

    A rule shows under every original action it covers (``allow:queue:read:*`` is
    ``GET_QUEUE``, ``GET_QUEUE_DESCR`` and ``GET_MESSAGE``); one the original cannot name is
    shown under ``CAPELLA`` as ``type:action``.
    """
    shown: dict[str, dict[str, dict[str, bool]]] = {}
    for rule in rules:
        allow = rule.effect == "allow"
        names = [
            name
            for name, (kind, action) in PERMISSIONS.items()
            if rule.type in ("*", kind)
            and (rule.action in ("*", action) or (allow and rule.action == "admin"))
        ]
        if names:
            for name in names:
                shown.setdefault("CLUSTER_SELF", {}).setdefault(name, {})[rule.pattern] = allow
        else:
            shown.setdefault(CAPELLA_TYPE, {}).setdefault(f"{rule.type}:{rule.action}", {})[rule.pattern] = (
                allow
            )
    return shown


# --- users (ATCB) ----------------------------------------------------------------------------


async def add_user(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, NamePassword, request.action)
    ctx.same_as("PUT", USER_PATH, name=body.name)
    if _store(ctx).find_user(body.name) is not None:
        raise AlreadyExists(f"User `{body.name}` is already exists")
    # As the original: a new user is disabled until enabled, and has no rights until given some.
    await _put(ctx, body.name, UserPut(password=body.pwd, enabled=False, rules=[]))
    return None


async def update_user(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, NamePassword, request.action)
    ctx.same_as("PUT", USER_PATH, name=body.name)
    _acting_on(ctx, body.name)
    await _put(ctx, body.name, UserPut(password=body.pwd))
    return None


async def _enable(ctx: Context, request: Request, enabled: bool) -> object:
    name = body_name(request)
    ctx.same_as("PUT", USER_PATH, name=name)
    _acting_on(ctx, name)
    await _put(ctx, name, UserPut(enabled=enabled))
    return None


async def enable_user(ctx: Context, request: Request) -> object:
    return await _enable(ctx, request, True)


async def disable_user(ctx: Context, request: Request) -> object:
    return await _enable(ctx, request, False)


async def drop_user(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("DELETE", USER_PATH, name=name)
    _acting_on(ctx, name)
    await asyncio.to_thread(_store(ctx).drop_user, name)
    return None


async def get_users(ctx: Context, request: Request) -> object:
    users = _store(ctx).users()
    return [ShownUser(u.name, u.enabled) for u in users if ctx.identity.can("user", "read", u.name)]


# --- rights (ATRZ) ---------------------------------------------------------------------------


async def add_sec_user(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, NameAdmin, request.action)
    _admin_only(ctx, body.name)
    _store(ctx).user(body.name)
    await _put(ctx, body.name, UserPut(admin=body.is_admin, rules=[]))
    return None


async def set_admin(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, NameAdmin, request.action)
    _admin_only(ctx, body.name)
    _store(ctx).user(body.name)
    await _put(ctx, body.name, UserPut(admin=body.is_admin))
    return None


async def drop_sec_user(ctx: Context, request: Request) -> object:
    """The user's rights go; the user stays (it is ``SecurityATCB_drop_use_cluster`` that drops it)."""
    name = body_name(request)
    _admin_only(ctx, name)
    _store(ctx).user(name)
    await _put(ctx, name, UserPut(admin=False, rules=[]))
    return None


async def _set_rules(ctx: Context, request: Request, add: bool) -> object:
    body = shapes.decode(request.body, RuleBody, request.action)
    _admin_only(ctx, body.name)
    rule = capella_rule(body)
    user = _store(ctx).user(body.name)
    # One rule per (type, action, name), as the original keeps one verdict per key.
    kept = [r for r in user.rules if (r.type, r.action, r.pattern) != (rule.type, rule.action, rule.pattern)]
    if add:
        kept.append(rule)
    await _put(ctx, body.name, UserPut(rules=[str(r) for r in kept]))
    return None


async def set_rule(ctx: Context, request: Request) -> object:
    return await _set_rules(ctx, request, True)


async def drop_rule(ctx: Context, request: Request) -> object:
    return await _set_rules(ctx, request, False)


async def get_rights(ctx: Context, request: Request) -> object:
    return Rights(
        {
            u.name: UserRights(u.name, original_rules(u.rules), u.admin)
            for u in _store(ctx).users()
            if ctx.identity.can("user", "read", u.name)
        }
    )


ACTIONS: dict[str, Action] = {
    "SecurityATCB_add_use_cluster": add_user,
    "SecurityATCB_update_use_cluster": update_user,
    "SecurityATCB_enable_use_cluster": enable_user,
    "SecurityATCB_disable_use_cluster": disable_user,
    "SecurityATCB_drop_use_cluster": drop_user,
    "SecurityATCB_get_use_cluster": get_users,
    "SecurityATRZ_add_user": add_sec_user,
    "SecurityATRZ_set_user_admin": set_admin,
    "SecurityATRZ_drop_user": drop_sec_user,
    "SecurityATRZ_user_role_set": set_rule,
    "SecurityATRZ_user_role_drop": drop_rule,
    "SecurityATRZ_get": get_rights,
}
