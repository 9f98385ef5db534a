"""Bearer tokens: create one from Basic (or TLS certificate) credentials, list, revoke.

The token's text is in the answer to its creation only; the server keeps a digest. A token
cannot create tokens, so a stolen one cannot outlive its expiry. Everybody sees and revokes
their own tokens. Another user's tokens are theirs to act on: minting, seeing or revoking one
needs ``user admin`` on the owner and everything the owner holds (``AuthStore.act_on``), so a
user manager never mints a token that can do more than it can.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from msgspec import UNSET

from capella.api.access import AUTHENTICATOR, identity
from capella.api.openapi import answer, json_content, ref
from capella.api.request import json_response, read_struct
from capella.api.route import Route
from capella.api.users import store
from capella.auth.rule import Identity
from capella.auth.store import AuthStore
from capella.errors import Forbidden, InvalidRequest, TokenNotFound
from capella.units import parse_duration
from capella.wire.auth import TokenCreate, TokenList


async def create_token(request: web.Request) -> web.Response:
    tokens = store(request)
    who = identity(request)
    if who.via == "token":
        raise Forbidden("a token cannot create tokens: use Basic credentials")
    body = await read_struct(request, TokenCreate)
    owner = who.name if body.user is UNSET else body.user
    if owner is None:  # no one signed in: ``store`` already refused that with auth off
        raise InvalidRequest("name the token's user", field="user")
    if tokens.act_on(who, owner) is None:
        tokens.user(owner)  # 404
    description = "" if body.description is UNSET else body.description
    if len(description) > 200:
        raise InvalidRequest("description must be a string of at most 200 characters", field="description")
    try:
        requested = None if body.ttl is UNSET else parse_duration(body.ttl)
    except ValueError as exc:
        raise InvalidRequest(f"ttl: {exc}", field="ttl") from None
    ttl = request.app[AUTHENTICATOR].token_ttl(requested)
    token, text = await asyncio.to_thread(tokens.create_token, owner, ttl, description)
    return json_response(token.shown(text), 201)


async def list_tokens(request: web.Request) -> web.Response:
    who = identity(request)
    users = store(request)
    found = [t.shown() for t in users.tokens() if _may_act_on(users, who, t.user)]
    return json_response(TokenList(tokens=found))


def _may_act_on(users: AuthStore, who: Identity, owner: str) -> bool:
    try:
        users.act_on(who, owner)
    except Forbidden:
        return False
    return True


async def revoke_token(request: web.Request) -> web.Response:
    tokens = store(request)
    who = identity(request)
    token = tokens.token(request.match_info["id"])
    if not _may_act_on(tokens, who, token.user):
        # Someone else's token looks like no token at all.
        raise TokenNotFound(f"no token {token.id!r}")
    await asyncio.to_thread(tokens.revoke_token, token.id)
    return web.Response(status=204)


ROUTES = [
    Route(
        "POST",
        "/v1/tokens",
        create_token,
        need=(),
        op="createToken",
        summary="A bearer token for yourself (from Basic credentials) or, as user admin, for another user",
        tag="users",
        answers={201: answer("Created; the token text is shown only now", ref("Token"))},
        fails=(400, 404),
        body={"required": False, "content": json_content(ref("TokenCreate"))},
    ),
    Route(
        "GET",
        "/v1/tokens",
        list_tokens,
        need=(),
        op="listTokens",
        summary="Your tokens, and those of users you administer",
        tag="users",
        answers={200: answer("Tokens", ref("TokenList"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        "/v1/tokens/{id}",
        revoke_token,
        need=(),  # your own, or user admin on the owner
        op="revokeToken",
        summary="Revoke a token",
        tag="users",
        answers={204: answer("Revoked")},
        fails=(404,),
    ),
]
