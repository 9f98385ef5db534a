"""The Python client for Capella's HTTP API: ``AsyncClient`` and its blocking twin ``Client``.

```python
async with AsyncClient("http://127.0.0.1:8676") as client:
    await client.put_queue("orders", save="wait")
    await client.produce("orders", ["a text", b"\\x00bytes", {"data": "x", "external_id": 7}])
    page = await client.read("orders", after=0)
    for message in page.messages:
        print(message.id, message.payload)
```

Answers are the typed msgspec structs of the HTTP contract in ``capella.wire`` (``QueueInfo``,
``Messages``, ``ClaimedMessage``...); ``msgspec.to_builtins`` turns one into plain dicts. A
message read back has ``payload``, the payload as ``bytes``. Errors are the
``capella.errors`` classes the server names by code; ``Unreachable`` means no answer came.
``MultiWriter`` stores each batch on M of K clusters.
"""

from __future__ import annotations

from capella.client.answers import Saved, error_from_answer
from capella.client.async_client import DEFAULT_URL, AsyncClient
from capella.client.message import MessageLike, Segments
from capella.client.multi import MultiWriter, Receipt
from capella.client.sync_client import Client

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "Client",
    "MessageLike",
    "MultiWriter",
    "Receipt",
    "Saved",
    "Segments",
    "error_from_answer",
]
