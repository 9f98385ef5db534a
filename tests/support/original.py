"""The original protocol's envelopes (``POST /cluster``), as its Go clients write them, for tests.

``envelope`` builds one signed in with Basic credentials (the password as base64 of a JSON
string), or with none (``password=None``, for a server with authentication off); ``call``
sends it to a server and answers the ``responce`` object (the original's
spelling).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from typing import Any


def envelope(
    action: str, body: object = None, *, user: str = "", password: str | None, object_name: str = ""
) -> dict[str, Any]:
    """An envelope that runs ``action`` (on ``object_name``, with ``body``) as ``user``."""
    request: dict[str, Any] = {"name": "", "user": "", "action": action, "object_name": object_name}
    if body is not None:
        request["body"] = body
    return {
        "auth_type": "" if password is None else "basic",
        "user_name": user,
        "auth_info": None if password is None else base64.b64encode(json.dumps(password).encode()).decode(),
        "wait": 5_000_000_000,
        "current_time": time.time_ns(),
        "prefer_content_type": "",
        "replace_name_force": False,
        "request": request,
    }


def call(url: str, sent: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """The ``responce`` of ``sent`` posted to ``url``'s ``/cluster`` (always HTTP 200)."""
    request = urllib.request.Request(f"{url}/cluster", data=json.dumps(sent).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        assert resp.status == 200
        answer: dict[str, Any] = json.loads(resp.read())["responce"]
    return answer
