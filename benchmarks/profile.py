"""Read py-spy's raw output (collapsed stacks) and name where the server's time went."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
# Frames every stack of a thread shares (interpreter start, event loop, thread pool): they
# say nothing about where the time goes, so the inclusive list leaves them out.
_PLUMBING = (
    "(<frozen runpy>)",
    "(capella/__main__.py)",
    "(cli/__init__.py)",
    "(cli/serve.py)",
    "run (capella/server.py)",
    "(uvloop/__init__.py)",
    "Runner.run (asyncio/runners.py)",
    "(threading.py)",
    "_worker (futures/thread.py)",
    "_WorkItem.run (futures/thread.py)",
)


def summarize(path: Path, top: int = 15) -> str:
    """Per thread share, then the top functions by own (self) and inclusive samples."""
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        count = int(match["count"])
        frames = match["stack"].split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        frames = [_short(f) for f in frames if not f.startswith(("thread", "process"))]
        total += count
        threads[thread] += count
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            if not frame.endswith(_PLUMBING):
                inclusive[frame] += count
    if total == 0:
        return "(no samples)"
    out = [f"{total} samples (idle time excluded)"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in threads.most_common(6)]
    out.append("self:")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    out.append("inclusive:")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(out)


def _short(frame: str) -> str:
    """``func (path/to/file.py:12)`` → ``func (to/file.py)``: lines merged, paths shortened."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    parts = match["file"].replace("\\", "/").split("/")
    return f"{match['func']} ({'/'.join(parts[-2:])})"
