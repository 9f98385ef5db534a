"""The base of every wire struct: ``Struct``, a ``msgspec.Struct`` that prints only what is set.

Answers leave out fields that do not apply (``UNSET``): the JSON encoding already omits them,
and so does the repr, so ``print(await client.produce(...))`` never shows ``UNSET``.
"""

from __future__ import annotations

import msgspec


class Struct(msgspec.Struct, repr_omit_defaults=True):
    """A request or answer body; subclasses add their own options (``omit_defaults``...)."""
