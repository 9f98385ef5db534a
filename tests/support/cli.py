"""The command line in process: ``run("queue", "list")`` gives (exit code, stdout, stderr)."""

from __future__ import annotations

from collections.abc import Callable

Run = Callable[..., tuple[int, str, str]]
