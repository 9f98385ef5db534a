"""What a ``/v1`` request relayed through a link may be, and how the far answer is served here.

The HTTP handler, ``/v1/clusters/{name}/v1/{path}``, is ``capella/api/relay.py``; the rules are
here: the clusters the request has passed (``hops``), the path it may take, and the headers and
media type its answer is served with.

A link narrows what its far-side user may do (docs/security.md, "Attenuation"):

- The path is checked as it came, not as aiohttp decoded it: each segment must be a name,
  number or word of Capella's own (letters, digits, ``_``, ``-``, ``.`` but not first), so
  ``..``, ``%2e%2e``, ``%2F``, ``\\`` and empty segments are a 400 ``invalid_relay_path`` and
  nothing leaves. The relayed path is always under ``/v1``.
- ``/v1/users`` and ``/v1/tokens`` (and everything below them), at the end of however many
  ``clusters/{name}/v1`` hops, are a 403 ``relay_refused``: a relay must not mint the far user's
  tokens or make far users. ``/v1/me`` passes: it only reads who the link signs in as.
- The far answer is served as one of Capella's own media types (JSON, NDJSON, SSE, the binary
  forms), or else as an ``application/octet-stream`` attachment, so a far page is never
  rendered on this server's origin; a far redirect (3xx) is a 502 ``unreachable`` and no
  ``Location`` is passed on.
"""

from __future__ import annotations

import re

from capella import wire
from capella.errors import CallLoop, InvalidRelayPath, RelayRefused, TooManyHops
from capella.wire import batch_page, frames
from capella.wire.fields import RELAY_SEGMENT

HOPS_HEADER = "Capella-Hops"
# Headers that mean the same on the far side; credentials, cookies and hop-by-hop ones stay here.
REQUEST_HEADERS = ("Content-Type", "Accept", "Last-Event-ID", "Idempotency-Key")
# Never Location: a far redirect is not followed or passed on (an open redirect from this origin).
ANSWER_HEADERS = ("Retry-After", "Cache-Control")
# What Capella itself answers; anything else is served as an attachment, never rendered here.
MEDIA_TYPES = frozenset(
    {
        wire.JSON,
        wire.NDJSON,
        "text/event-stream",
        frames.MEDIA_TYPE,
        batch_page.BATCH_MEDIA_TYPE,
        batch_page.PAGE_MEDIA_TYPE,
    }
)
OTHER_MEDIA = {"Content-Type": "application/octet-stream", "Content-Disposition": "attachment"}
# A segment of a path Capella serves: a name (wire.fields.NAME), a number, a fixed word.
SEGMENT = re.compile(RELAY_SEGMENT)
# What a path under this many clusters/{name}/v1 hops may not end in, on any far side.
NEVER_RELAYED = frozenset({"users", "tokens"})


def hops(header: str, here: str, max_hops: int) -> list[str]:
    """The clusters a request has passed through (``header``, its ``Capella-Hops``), this one
    (``here``) last, or a refusal."""
    passed = [h for h in header.split(",") if h]
    if here in passed:
        raise CallLoop(f"the request has already passed through cluster {here!r}: {passed}")
    if len(passed) >= max_hops:
        raise TooManyHops(f"the request has passed through {len(passed)} clusters ([compat] max_hops)")
    return [*passed, here]


def relayed_path(raw_path: str) -> str:
    """The far path of ``/v1/clusters/{name}/v1/{path}`` as it came (``raw_path``, not decoded),
    or a refusal: ``invalid_relay_path`` for a segment that is not plainly one, ``relay_refused``
    for users or tokens at the end of the hops."""
    # "", "v1", "clusters", name, "v1", then the relayed segments.
    segments = raw_path.split("/")[5:]
    for segment in segments:
        if not SEGMENT.fullmatch(segment):
            shown = segment[:64] or "an empty segment"
            raise InvalidRelayPath(
                f"the relayed path /v1/{'/'.join(segments)[:200]} has {shown!r}: each segment must be "
                "letters, digits, '_', '-' or '.' (not first), unencoded; '.', '..', '%2F', '\\' "
                "and empty segments are refused"
            )
    final = segments
    while len(final) > 3 and final[0] == "clusters" and final[2] == "v1":
        final = final[3:]
    if final[0].lower() in NEVER_RELAYED:
        raise RelayRefused(
            f"/v1/{final[0]} is never relayed to an external cluster: a link must not create "
            "tokens or users as its far-side user"
        )
    return "/v1/" + "/".join(segments)


def answer_headers(status: int, far: dict[str, str]) -> dict[str, str]:
    """The headers a far answer is served with here: its media type if it is one of Capella's,
    else an attachment; ``far`` has lower-case names."""
    headers = {name: far[name.lower()] for name in ANSWER_HEADERS if name.lower() in far}
    if status in (204, 304):
        return headers
    kind = far.get("content-type", "").partition(";")[0].strip().lower()
    if kind in MEDIA_TYPES:
        headers["Content-Type"] = kind
    else:
        headers.update(OTHER_MEDIA)
    return headers
