"""Permission rules and the identity they belong to; pure functions, no I/O.

A rule is ``allow`` or ``deny`` + an object type + an action + a name pattern (``*`` matches
any run of characters, also ``/``). Deny wins over allow; no matching rule means deny; an
admin may do everything. ``admin`` in an allow rule grants ``read`` and ``write`` as well
(who may delete a queue may also read it); a deny rule denies exactly the action it names.
Subscriptions are named ``queue/subscription``. Secrets have one action, ``use``, and are
granted only by a rule of type ``secret`` (``allow:secret:use:orders-*``), never by ``*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from capella.errors import Forbidden, InvalidRequest

OBJECT_TYPES = ("cluster", "queue", "subscription", "handler", "external_cluster", "user", "secret")
# ``use`` applies to secrets only; the others to every other type.
ACTIONS = ("read", "write", "admin", "use")
EFFECTS = ("allow", "deny")


@dataclass(frozen=True, slots=True)
class Rule:
    effect: str  # "allow" or "deny"
    type: str  # one of OBJECT_TYPES, or "*"
    action: str  # one of ACTIONS, or "*"
    pattern: str = "*"

    @classmethod
    def parse(cls, raw: object, where: str = "rules") -> Rule:
        """A rule from ``{"effect", "type", "action", "name"}`` or ``"allow:queue:read:orders-*"``."""
        if isinstance(raw, str):
            parts = raw.split(":", 3)
            if len(parts) != 4:
                raise InvalidRequest(
                    f"{where}: expected EFFECT:TYPE:ACTION:PATTERN (allow:queue:read:orders-*), got {raw!r}",
                    field=where,
                )
            raw = dict(zip(("effect", "type", "action", "name"), parts, strict=True))
        if not isinstance(raw, dict):
            raise InvalidRequest(f"{where}: a rule must be an object or a string", field=where)
        if unknown := sorted(set(raw) - {"effect", "type", "action", "name"}):
            raise InvalidRequest(f"{where}: unknown field {unknown[0]!r}", field=where)
        effect, kind, action, pattern = (raw.get(k) for k in ("effect", "type", "action", "name"))
        return cls.of(effect, kind, action, "*" if pattern is None else pattern, where)

    @classmethod
    def of(cls, effect: object, kind: object, action: object, pattern: object, where: str = "rules") -> Rule:
        """A rule from its four parts, each checked; ``where`` names it in an error."""
        if effect not in EFFECTS:
            raise InvalidRequest(f"{where}.effect: expected allow or deny, got {effect!r}", field=where)
        if kind not in (*OBJECT_TYPES, "*"):
            raise InvalidRequest(
                f"{where}.type: expected one of {', '.join(OBJECT_TYPES)} or *, got {kind!r}", field=where
            )
        if action not in (*ACTIONS, "*"):
            raise InvalidRequest(
                f"{where}.action: expected read, write, admin, use or *, got {action!r}", field=where
            )
        if (kind == "secret") != (action == "use") and "*" not in (kind, action):
            raise InvalidRequest(
                f"{where}: a secret's action is use (allow:secret:use:NAME), and use is only for secrets",
                field=where,
            )
        if not isinstance(pattern, str) or not pattern or len(pattern) > 512:
            raise InvalidRequest(f"{where}.name: expected a name pattern such as orders-*", field=where)
        return cls(str(effect), str(kind), str(action), pattern)

    def to_dict(self) -> dict[str, Any]:
        return {"effect": self.effect, "type": self.type, "action": self.action, "name": self.pattern}

    def __str__(self) -> str:
        return f"{self.effect}:{self.type}:{self.action}:{self.pattern}"

    def matches(self, kind: str, action: str, name: str) -> bool:
        if self.type not in ("*", kind):
            return False
        if kind == "secret" and self.effect == "allow" and self.type != "secret":
            # A secret is granted only by name: allow:*:*:dev-* must not hand out credentials.
            return False
        if self.effect == "allow":
            covers = self.action in ("*", "admin", action)
        else:
            covers = self.action in ("*", action)
        return covers and _compiled(self.pattern).fullmatch(name) is not None


def allowed(rules: tuple[Rule, ...], kind: str, action: str, name: str) -> bool:
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
    rules: tuple[Rule, ...] = field(default=())
    via: str = "none"  # "basic", "token", "tls", or "none" when auth is off

    def can(self, kind: str, action: str, name: str) -> bool:
        return self.admin or allowed(self.rules, kind, action, name)

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
