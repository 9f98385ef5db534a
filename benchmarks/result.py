"""What a scenario reports: rows measured against targets, percentiles, and the table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


class BenchmarkFailed(Exception):
    """The server or a request did not behave, so no figure can be trusted."""


@dataclass(frozen=True, slots=True)
class Row:
    """One figure; ``target`` is a floor when ``higher_is_better``, else a ceiling."""

    scenario: str
    metric: str
    value: float
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None or math.isnan(self.value):
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


@dataclass(slots=True)
class Outcome:
    """A scenario's rows for the table and its raw details for the JSON file."""

    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """Count, p50, p90, p99, p99.9 and max of ``values``, each multiplied by ``scale``."""
    return {
        "count": len(values),
        "p50": percentile(values, 50) * scale,
        "p90": percentile(values, 90) * scale,
        "p99": percentile(values, 99) * scale,
        "p99_9": percentile(values, 99.9) * scale,
        "max": (max(values) if values else math.nan) * scale,
    }


def render_table(rows: Sequence[Row]) -> str:
    """A plain-text table; rows below their target are marked ``BELOW``."""
    header = ("scenario", "metric", "measured", "target", "status", "note")
    lines = [header]
    for row in rows:
        target = "" if row.target is None else f"{'≥' if row.higher_is_better else '≤'} {_number(row.target)}"
        status = {True: "ok", False: "BELOW", None: ""}[row.met]
        lines.append((row.scenario, row.metric, f"{_number(row.value)} {row.unit}", target, status, row.note))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    rendered.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(rendered)


def _number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
