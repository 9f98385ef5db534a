"""What a handler may reach beyond its queues: links, named secrets, the network.

The supervisor holds one ``Reach`` and hands each handler type's ``build`` a copy naming who
the handler acts for (``by``): whoever defines it, or on a restart the user it runs as. A
definition can only name secrets that user may use, and every connection a handler opens
passes the egress policy; a file it names is read through ``files``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.sealed import Sealer
from capella.auth.secret import Secrets
from capella.egress import Egress
from capella.file_access import FileAccess
from capella.links.registry import Links


@dataclass(frozen=True, slots=True)
class Reach:
    links: Links
    secrets: Secrets = field(default_factory=Secrets)
    egress: Egress = field(default_factory=Egress.open)
    # The files a definition may name (an admin's: any).
    files: FileAccess = field(default_factory=FileAccess)
    by: Identity = UNRESTRICTED

    @property
    def sealer(self) -> Sealer:
        """What a definition's stored secrets are sealed with (the links' key file)."""
        return self.links.sealer
