"""Users, rules and tokens on the wire; never a password hash or a token's digest."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.wire.fields import Duration, Time, schema
from capella.wire.struct import Struct

Password = Annotated[str, schema(minLength=8, maxLength=1024)]
# A rule in one line, as the CLI writes it: effect:type:action:name ("allow:queue:read:orders").
RuleText = Annotated[
    str, schema(pattern=r"^(allow|deny):[^:]+:[^:]+:.+$", description="effect:type:action:name")
]


class Rule(Struct, forbid_unknown_fields=True):
    """allow or deny an action on resources of a type whose names match a pattern"""

    effect: Literal["allow", "deny"]
    type: Literal[
        "cluster", "queue", "subscription", "group", "handler", "external_cluster", "user", "secret", "*"
    ]
    action: Annotated[
        Literal["read", "write", "admin", "use", "relay", "*"],
        Meta(description="use is for secrets, and only use; relay is only for external clusters"),
    ]
    name: Annotated[str, schema(minLength=1, description="Name pattern; * matches anything")] | UnsetType = (
        UNSET
    )


class User(Struct):
    """A user as shown: never the password hash."""

    name: str
    admin: bool
    enabled: bool
    rules: list[Rule]
    created: Time
    updated: Time


class UserList(Struct):
    """Every user the caller may read."""

    users: list[User]


class UserPut(Struct, forbid_unknown_fields=True):
    """password is required for a new user; only an admin may set admin or rules"""

    password: Password | UnsetType = UNSET
    admin: bool | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET
    rules: list[Rule | RuleText] | UnsetType = UNSET


class PasswordChange(Struct, forbid_unknown_fields=True):
    """A new password; your own needs the old one."""

    password: Password
    old_password: Annotated[str, Meta(description="Required to change your own password")] | UnsetType = UNSET


class Me(Struct):
    """Who the caller is, how it signed in, and its rules; and which cluster answers."""

    user: str | None
    admin: bool
    via: Literal["basic", "token", "tls", "none"]
    rules: list[Rule]
    # The external-cluster registry compares it with this cluster's (a same-named pair would
    # mint one identity twice);
    # null from a server older than the field.
    cluster: Annotated[str, Meta(description="the name of the cluster that answers")] | None = None


class Token(Struct, omit_defaults=True):
    """A bearer token as shown: its secret only in the answer that created it."""

    id: str
    user: str
    created: Time
    expires: float | None
    description: str
    token: (
        Annotated[str, Meta(description="The bearer token; only in the answer that created it")] | UnsetType
    ) = UNSET


class TokenList(Struct):
    """The tokens the caller may read."""

    tokens: list[Token]


class TokenCreate(Struct, forbid_unknown_fields=True):
    """A new token for yourself, or for another user when you may admin it."""

    ttl: Duration | UnsetType = UNSET
    description: Annotated[str, schema(maxLength=200)] | UnsetType = UNSET
    user: (
        Annotated[str, Meta(description="Another user (needs user admin on it and everything it holds)")]
        | UnsetType
    ) = UNSET
