"""Where a consumer group's committed offsets live: one cursor subscription per partition.

A group's committed offset *o* on a partition is the subscription ``subscription_name(group)``
on that partition's queue, with ``last_id = o - 1`` (offsets are ids). A group id that makes a
valid subscription name with the ``kafka.`` prefix is that name, so the HTTP API, the CLI and
the console show it as itself; any other (too long, or holding a character names cannot) is
``kafka.`` and the first 16 hex digits of its SHA-256, and the subscription's ``group`` field
keeps the group id in full.
"""

from __future__ import annotations

import hashlib
import re

from capella.wire.fields import NAME

PREFIX = "kafka."
_NAME = re.compile(NAME)


def subscription_name(group_id: str) -> str:
    """The name of the subscription that holds ``group_id``'s offsets on every partition."""
    name = PREFIX + group_id
    if _NAME.fullmatch(name):
        return name
    return PREFIX + hashlib.sha256(group_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
