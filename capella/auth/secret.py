"""Named secrets: what the operator declared in ``[secrets.NAME]``, used by name under a rule.

A definition (a push handler, a PostgreSQL handler, an external cluster) names a secret; using it
needs ``allow:secret:use:NAME`` (admins may use all). The value is read from its variable or
file each time it is used, so rotating it needs no restart. A secret that is not declared, one
the user may not use, and one whose variable is unset get the same answer, so a definition
cannot find out which secrets or variables exist (Kafka's config providers with an allow-list,
KIP-887; RabbitMQ and NATS never take credentials from the broker's environment for a user).
"""

from __future__ import annotations

from collections.abc import Mapping

from capella.auth.rule import Identity
from capella.config import SecretSettings
from capella.errors import SecretUnavailable


class Secrets:
    """The declared secrets, by name."""

    def __init__(self, declared: Mapping[str, SecretSettings] | None = None) -> None:
        self._declared = dict(declared or {})

    def names(self) -> list[str]:
        return sorted(self._declared)

    def use(self, name: str, identity: Identity, field: str) -> str:
        """The value of secret ``name`` for ``identity``; ``field`` names where it was asked for."""
        declared = self._declared.get(name)
        value = declared.value() if declared is not None and identity.can("secret", "use", name) else None
        if value is None:
            raise SecretUnavailable(
                f"{field}: secret {name!r} cannot be used: it is not declared in [secrets], "
                f"not granted to {_who(identity)} (a rule allow:secret:use:{name}), or has no value",
                field=field,
            )
        return value


def _who(identity: Identity) -> str:
    return "this server's handlers" if identity.name is None else f"user {identity.name!r}"
