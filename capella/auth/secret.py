"""Named secrets: what the operator declared in ``[secrets.NAME]``, used by name under a rule.

A definition (a push handler, a PostgreSQL handler, an external cluster) names a secret; using it
needs ``allow:secret:use:NAME`` (admins may use all). The value is read from its variable or
file each time it is used, so rotating it needs no restart. A secret that is not declared, one
the user may not use, and one whose variable is unset get the same answer, so a definition
cannot find out which secrets or variables exist (Kafka's config providers with an allow-list,
KIP-887; RabbitMQ and NATS never take credentials from the broker's environment for a user).

A granted secret is a readable secret: its grantee may point a definition at a receiver of
their own, anywhere the egress policy allows. ``[secrets.NAME] hosts`` binds a secret to the
hosts it is for; a definition that would send it elsewhere is refused, when it is defined and
each time the secret is read for use.
"""

from __future__ import annotations

from collections.abc import Mapping

from capella.auth.rule import Identity
from capella.config import SecretSettings
from capella.errors import SecretNotForHost, SecretUnavailable


class Secrets:
    """The declared secrets, by name."""

    def __init__(self, declared: Mapping[str, SecretSettings] | None = None) -> None:
        self._declared = dict(declared or {})

    def names(self) -> list[str]:
        return sorted(self._declared)

    def use(self, name: str, identity: Identity, field: str, to: str | None) -> str:
        """The value of secret ``name`` for ``identity`` to send to host ``to``; ``field`` names
        where it was asked for.

        ``to`` is the host the definition sends it to, as the definition names it (a URL's or
        a DSN's host); None where that is not known yet (the DSN inside a ``dsn_secret``, whose
        host its caller checks with ``check_host``).
        """
        declared = self._declared.get(name)
        granted = declared is not None and identity.can("secret", "use", name)
        value = declared.value() if declared is not None and granted else None
        if value is None:
            raise SecretUnavailable(
                f"{field}: secret {name!r} cannot be used: it is not declared in [secrets], "
                f"not granted to {_who(identity)} (a rule allow:secret:use:{name}), or has no value",
                field=field,
            )
        if to is not None:
            self.check_host(name, to, field)
        return value

    def check_host(self, name: str, to: str, field: str) -> None:
        """``SecretNotForHost`` unless declared secret ``name`` may be sent to host ``to``."""
        declared = self._declared.get(name)
        if declared is not None and not declared.sends_to(to):
            raise SecretNotForHost(
                f"{field}: secret {name!r} may be sent only to {', '.join(declared.hosts)} "
                f"([secrets.{name}] hosts), not to {to}",
                field=field,
            )


def _who(identity: Identity) -> str:
    return "this server's handlers" if identity.name is None else f"user {identity.name!r}"
