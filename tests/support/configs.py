"""Configurations the tests build: a cluster on files, a cluster on memory for the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capella.config import Config, parse_config


def file_config(tmp_path: Path, **queue_defaults: Any) -> Config:
    """A cluster on a file mount in ``tmp_path``, for tests that reopen it and move a ``Clock``.

    The periodic flush is an hour away, so only what a test saves is on disk.
    """
    return parse_config(
        {
            "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
            "storage": {"flush_interval": "1h"},
            "queue_defaults": queue_defaults,
        },
        {},
        base=tmp_path,
    )


def api_config(tmp_path: Path, name: str = "test") -> Config:
    raw = {"cluster": {"name": name}, "mounts": {"default": {"provider": "memory"}}}
    return parse_config(raw, {}, base=tmp_path)
