"""Permission rules and the identity they belong to; pure functions, no I/O.

A rule is ``allow`` or ``deny`` + an object type + an action + a name pattern (``*`` matches
any run of characters, also ``/``). Deny wins over allow; no matching rule means deny; an
admin may do everything. ``admin`` in an allow rule grants ``read`` and ``write`` as well
(who may delete a queue may also read it); a deny rule denies exactly the action it names.
Subscriptions are named ``queue/subscription``.

Three powers are granted only by name, never by a ``*`` type: ``secret`` (one action, ``use``:
``allow:secret:use:orders-*``), ``user`` (acting on users, their credentials and tokens), and
``relay`` on an ``external_cluster`` (sending requests through the link as its far-side user),
which ``admin`` does not imply either.

``covers(holder, held)`` is the attenuation check (Kubernetes RBAC's escalation check): whether
everything ``held`` may do, ``holder`` may do too. Acting on a user (a password, a token, a
handler that runs as them, enabling or dropping them) needs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from msgspec import UNSET

from capella.errors import Forbidden, InvalidRequest
from capella.wire import auth as wire
from capella.wire.decode import decode

OBJECT_TYPES = ("cluster", "queue", "subscription", "group", "handler", "external_cluster", "user", "secret")
# ``use`` applies to secrets only, ``relay`` to external clusters only; the others to every other type.
ACTIONS = ("read", "write", "admin", "use", "relay")
# Types a ``*`` type never grants: each must be named in the rule.
BY_NAME_ONLY = ("user", "secret")
# What an ``admin`` allow rule grants beside ``admin`` itself.
ADMIN_IMPLIES = ("read", "write")
EFFECTS = ("allow", "deny")


@dataclass(frozen=True, slots=True)
class AccessRule:
    """A rule as the checks read it; its shape on the wire and on disk is ``wire.auth.Rule``."""

    effect: str  # "allow" or "deny"
    type: str  # one of OBJECT_TYPES, or "*"
    action: str  # one of ACTIONS, or "*"
    pattern: str = "*"

    @classmethod
    def parse(cls, raw: object, where: str = "rules") -> AccessRule:
        """A rule from its line (``"allow:queue:read:orders-*"``) or its object, which decodes
        into ``wire.auth.Rule`` as every body does (``wire.decode``)."""
        if isinstance(raw, str):
            parts = raw.split(":", 3)
            if len(parts) != 4:
                raise InvalidRequest(
                    f"{where}: expected EFFECT:TYPE:ACTION:PATTERN (allow:queue:read:orders-*), got {raw!r}",
                    field=where,
                )
            effect, kind, action, pattern = parts
            return cls.of(effect, kind, action, pattern, where)
        rule = raw if isinstance(raw, wire.Rule) else decode(raw, wire.Rule, at=where)
        return cls.of(rule.effect, rule.type, rule.action, "*" if rule.name is UNSET else rule.name, where)

    @classmethod
    def of(
        cls, effect: object, kind: object, action: object, pattern: object, where: str = "rules"
    ) -> AccessRule:
        """A rule from its four parts, each checked; ``where`` names it in an error."""
        if effect not in EFFECTS:
            raise InvalidRequest(f"{where}.effect: expected allow or deny, got {effect!r}", field=where)
        if kind not in (*OBJECT_TYPES, "*"):
            raise InvalidRequest(
                f"{where}.type: expected one of {', '.join(OBJECT_TYPES)} or *, got {kind!r}", field=where
            )
        if action not in (*ACTIONS, "*"):
            raise InvalidRequest(
                f"{where}.action: expected read, write, admin, use, relay or *, got {action!r}", field=where
            )
        if (kind == "secret") != (action == "use") and "*" not in (kind, action):
            raise InvalidRequest(
                f"{where}: a secret's action is use (allow:secret:use:NAME), and use is only for secrets",
                field=where,
            )
        if action == "relay" and kind not in ("external_cluster", "*"):
            raise InvalidRequest(
                f"{where}: relay is an action on external clusters (allow:external_cluster:relay:NAME)",
                field=where,
            )
        if not isinstance(pattern, str) or not pattern or len(pattern) > 512:
            raise InvalidRequest(f"{where}.name: expected a name pattern such as orders-*", field=where)
        return cls(str(effect), str(kind), str(action), pattern)

    def to_wire(self) -> wire.Rule:
        """The rule as answers show it and the users file keeps it."""
        return wire.Rule(self.effect, self.type, self.action, self.pattern)  # type: ignore[arg-type]  # checked by ``of``

    def __str__(self) -> str:
        return f"{self.effect}:{self.type}:{self.action}:{self.pattern}"

    def matches(self, kind: str, action: str, name: str) -> bool:
        return self.grants(kind, action) and _compiled(self.pattern).fullmatch(name) is not None

    def grants(self, kind: str, action: str) -> bool:
        """Whether this rule speaks of ``action`` on objects of type ``kind``, whatever their name."""
        if self.type not in ("*", kind):
            return False
        if self.effect == "deny":
            return self.action in ("*", action)
        if kind in BY_NAME_ONLY and self.type != kind:
            # Granted only by name: allow:*:*:dev-* must not hand out credentials or users.
            return False
        if action == "relay":
            # A link's far-side authority: never implied by admin, never by a * type.
            return self.type == kind and self.action in ("*", action)
        return self.action in ("*", action) or (self.action == "admin" and action in ADMIN_IMPLIES)


def covers(holder: Identity, held: Identity) -> bool:
    """Whether ``holder`` may do everything ``held`` may: an admin only by an admin, and each
    power an allow rule of ``held`` grants (type, action, every name its pattern matches) by one
    allow rule of ``holder`` whose pattern contains it, with no deny rule of ``holder`` that
    could meet it. Deny rules of ``held`` are not counted: ``held`` is taken to hold more than
    it may, never less. Sound, not complete: a power that only several of ``holder``'s rules
    cover together counts as not covered."""
    if holder.admin:
        return True
    if held.admin:
        return False
    denies = [r for r in holder.rules if r.effect == "deny"]
    allows = [r for r in holder.rules if r.effect == "allow"]
    for rule in held.rules:
        if rule.effect != "allow":
            continue
        for kind in OBJECT_TYPES:
            for action in ACTIONS:
                if not rule.grants(kind, action):
                    continue
                if not any(r.grants(kind, action) and contains(r.pattern, rule.pattern) for r in allows):
                    return False
                if any(r.grants(kind, action) and meet(r.pattern, rule.pattern) for r in denies):
                    return False
    return True


def contains(outer: str, inner: str) -> bool:
    """Whether every name pattern ``inner`` matches, pattern ``outer`` matches too: ``outer``
    matches ``inner``'s text with each of ``inner``'s ``*`` taken by one of ``outer``'s."""
    return _compiled(outer).fullmatch(inner) is not None


def meet(one: str, other: str) -> bool:
    """Whether some name matches both patterns (a table over the two patterns' suffixes)."""
    n, m = len(one), len(other)
    # common[j]: whether one[i:] and other[j:] match a name in common, for the current i.
    common = [False] * m + [True]
    for j in range(m - 1, -1, -1):
        common[j] = other[j] == "*" and common[j + 1]
    for i in range(n - 1, -1, -1):
        below = common  # the row of i + 1
        common = [False] * (m + 1)
        common[m] = one[i] == "*" and below[m]
        for j in range(m - 1, -1, -1):
            if one[i] == "*":
                common[j] = below[j] or common[j + 1]
            elif other[j] == "*":
                common[j] = common[j + 1] or below[j]
            else:
                common[j] = one[i] == other[j] and below[j + 1]
    return common[0]


def allowed(rules: tuple[AccessRule, ...], kind: str, action: str, name: str) -> bool:
    """Deny wins over allow; nothing matching means no."""
    verdict = False
    for rule in rules:
        if rule.matches(kind, action, name):
            if rule.effect == "deny":
                return False
            verdict = True
    return verdict


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: a user's name, admin flag and rules. ``name`` None means auth is off."""

    name: str | None
    admin: bool = False
    rules: tuple[AccessRule, ...] = field(default=())
    via: str = "none"  # "basic", "token", "tls", or "none" when auth is off

    def can(self, kind: str, action: str, name: str) -> bool:
        return self.admin or allowed(self.rules, kind, action, name)

    def check_acting_on(self, other: Identity) -> None:
        """Raise ``Forbidden`` unless this identity holds everything ``other`` holds (``covers``):
        the check before acting on another user's credentials, tokens, handlers or state."""
        if not covers(self, other):
            what = "an admin" if other.admin else "rules this user does not hold"
            raise Forbidden(
                f"user {self.name!r} may not act on user {other.name!r}, who holds {what}",
                type="user",
                action="admin",
                name=other.name or "",
            )

    def check(self, kind: str, action: str, name: str) -> None:
        """Raise ``Forbidden`` unless this identity may do ``action`` on ``kind`` ``name``."""
        if not self.can(kind, action, name):
            raise Forbidden(
                f"user {self.name!r} may not {action} {kind.replace('_', ' ')} {name!r}",
                type=kind,
                action=action,
                name=name,
            )


# Everything is allowed when authentication is off (loopback, zero configuration).
UNRESTRICTED = Identity(None, admin=True)


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)
