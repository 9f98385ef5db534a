"""Users: list, create or change (PUT), show, drop, change a password; and ``/v1/me``.

Only an admin may grant ``admin`` or set rules (a user manager could otherwise hand out
more than it holds); ``user admin`` on a name is enough to create that user. Changing another
user's password, enabling, disabling or dropping them also needs everything they hold
(``AuthStore.act_on``): no acting on an admin unless you are one. A user changes its own
password with the old one.
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web
from msgspec import UNSET

from capella.api.access import AUTHENTICATOR, identity
from capella.api.openapi import answer, json_content, ref
from capella.api.request import CLUSTER, json_response, present, read_struct
from capella.api.route import USER_PATH, Route, on_named
from capella.auth.store import AuthStore
from capella.errors import Forbidden, NotFound, Unauthorized
from capella.wire.auth import Me, PasswordChange, UserList, UserPut


def store(request: web.Request) -> AuthStore:
    authenticator = request.app.get(AUTHENTICATOR)
    if authenticator is None:
        raise NotFound("authentication is off: there are no users (set [auth] enabled = true)")
    return authenticator.store


async def list_users(request: web.Request) -> web.Response:
    who = identity(request)
    users = [u.shown() for u in store(request).users() if who.can("user", "read", u.name)]
    return json_response(UserList(users=users))


async def put_user(request: web.Request) -> web.Response:
    users = store(request)
    # The store checks what the values mean; fields left out are left as they are.
    body = await read_struct(request, UserPut)
    given = present(body)
    who = identity(request)
    if given & {"admin", "rules"} and not who.admin:
        raise Forbidden(
            "only an admin may set admin or rules", field="admin" if "admin" in given else "rules"
        )
    users.act_on(who, request.match_info["name"])
    user, created = await asyncio.to_thread(users.apply, request.match_info["name"], body)
    return json_response(user.shown(), 201 if created else 200)


async def get_user(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    who = identity(request)
    if name != who.name:
        who.check("user", "read", name)
    return json_response(store(request).user(name).shown())


async def drop_user(request: web.Request) -> web.Response:
    users = store(request)
    name = request.match_info["name"]
    users.act_on(identity(request), name)
    await asyncio.to_thread(users.drop_user, name)
    return web.Response(status=204)


async def change_password(request: web.Request) -> web.Response:
    users = store(request)
    name = request.match_info["name"]
    body = await read_struct(request, PasswordChange)
    who = identity(request)
    if name != who.name:
        users.act_on(who, name)
    elif not who.can("user", "admin", name):
        # Checked as a login is, within its budgets: a stolen token cannot guess passwords here.
        try:
            if body.old_password is UNSET:
                raise Unauthorized
            await request.app[AUTHENTICATOR].basic(name, body.old_password, request.remote or "")
        except Unauthorized:
            raise Forbidden(
                "old_password is required and must be the current password", field="old_password"
            ) from None
    user, _ = await asyncio.to_thread(functools.partial(users.change_user, name, password=body.password))
    return json_response(user.shown())


async def me(request: web.Request) -> web.Response:
    who = identity(request)
    rules = [r.to_wire() for r in who.rules]
    return json_response(Me(who.name, who.admin, who.via, rules, request.app[CLUSTER].name))  # type: ignore[arg-type]  # via is one of Me's


ROUTES = [
    Route(
        "GET",
        "/v1/users",
        list_users,
        need=(),
        op="listUsers",
        summary="Users the caller may read",
        tag="users",
        answers={200: answer("Users", ref("UserList"))},
        fails=(404,),
    ),
    Route(
        "PUT",
        USER_PATH,
        put_user,
        need=(on_named("user", "admin"),),
        op="putUser",
        summary="Create (password required) or change a user",
        tag="users",
        answers={200: answer("Changed", ref("User")), 201: answer("Created", ref("User"))},
        fails=(400, 404, 409),
        body={"required": True, "content": json_content(ref("UserPut"))},
    ),
    Route(
        "GET",
        USER_PATH,
        get_user,
        need=(),  # yourself, or user read (checked by the handler)
        op="getUser",
        summary="A user (never its password)",
        tag="users",
        answers={200: answer("User", ref("User"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        USER_PATH,
        drop_user,
        need=(on_named("user", "admin"),),
        op="dropUser",
        summary="Delete a user and revoke its tokens",
        tag="users",
        answers={204: answer("Deleted")},
        fails=(404, 409),
    ),
    Route(
        "POST",
        "/v1/users/{name}/password",
        change_password,
        need=(),  # yourself (with the old password), or user admin
        op="changePassword",
        summary="Change a password (your own with old_password, or as user admin)",
        tag="users",
        answers={200: answer("Changed", ref("User"))},
        fails=(400, 404),
        body={"required": True, "content": json_content(ref("PasswordChange"))},
    ),
    Route(
        "GET",
        "/v1/me",
        me,
        need=(),
        op="me",
        summary="Who the credentials belong to, and the name of this cluster",
        tag="users",
        answers={200: answer("Identity", ref("Me"))},
    ),
]
