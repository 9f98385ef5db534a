"""What the catalog saves (``capella.storage.catalog``): each registry's document, as a struct.

These are the on-disk formats of docs/format.md, not bodies of the API (so not in the OpenAPI
document): an older document loads as it always has. kw_only: ``version`` may be absent from a
document (early ones lack it) yet comes first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.wire.auth import Rule, RuleText, Token
from capella.wire.struct import Struct


class QueueEntry(Struct, kw_only=True):
    """A queue: its definition and whether it is being dropped (a drop that a crash interrupted
    finishes at the next start). The definition is the object ``QueueSettings.to_dict`` wrote,
    decoded into ``wire.queues.QueueDefinition`` when the queue opens (``capella.core.definition``),
    so a definition that no longer applies fails there, naming its field."""

    definition: dict[str, Any]
    state: Literal["active", "dropping"] = "active"


class QueueRegistry(Struct, kw_only=True):
    version: int = 1
    queues: dict[str, QueueEntry]


class ProducerIdLease(Struct, kw_only=True):
    """The producer ids handed out so far (``capella.core.producer_ids``): any id below
    ``lease_until`` may have been answered, so none of them is handed out again."""

    version: int = 1
    lease_until: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0


class TopicEntry(Struct, kw_only=True):
    """A topic of several partitions (``capella.core.topic``): how many, and the definition of
    each partition's queue (``QueueSettings.to_dict``). The partitions are queues of the queue
    registry; a start creates any this count names that it lacks, and drops any ``<topic>~<n>``
    queue this document does not name."""

    partitions: int
    definition: dict[str, Any]


class TopicRegistry(Struct, kw_only=True):
    version: int = 1
    topics: dict[str, TopicEntry]


class HandlerEntry(Struct, kw_only=True):
    """A handler's definition; ``params`` as its type stores them (secrets only encrypted)."""

    type: str
    queues: list[str]
    params: dict[str, Any]
    started: bool
    user: str | None = None
    # Who defined it (None: defined with authentication off, or before definers were kept):
    # each pass runs only while the definer holds everything ``user`` holds.
    definer: str | None = None
    # The definer's ``created``: a user of the same name made later is not the definer.
    definer_since: float | None = None


class HandlerRegistry(Struct, kw_only=True):
    version: int = 1
    handlers: dict[str, HandlerEntry]


class StoredUser(Struct, kw_only=True):
    """A user in the users file: what the API shows (``wire.auth.User``) and the password hash."""

    name: str = ""  # the record's key is the name; this copy is for a reader of the file
    admin: bool = False
    enabled: bool = True
    rules: list[Rule | RuleText] = []  # each checked by ``capella.auth.rule.AccessRule.of_wire``
    created: float = 0.0
    updated: float = 0.0
    password_hash: str


class UserFile(Struct, kw_only=True):
    version: int = 1
    users: dict[str, StoredUser]


class StoredToken(Struct, kw_only=True):
    """A token in the tokens file, and as the store holds it: what the API shows and the digest."""

    id: str = ""  # the record's key is the id
    user: str
    created: float = 0.0
    expires: float | None = None
    description: str = ""
    digest: str  # SHA-256 of the secret; the secret itself is never stored

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    def shown(self, token: str | UnsetType = UNSET) -> Token:
        """The token as the API shows it; its text (``token``) only in the answer that made it."""
        return Token(self.id, self.user, self.created, self.expires, self.description, token)


class TokenFile(Struct, kw_only=True):
    version: int = 1
    tokens: dict[str, StoredToken]
