"""``capella serve``: run a broker in this process until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
from pathlib import Path

from capella.cli.command import Command, Refused, arg, standalone
from capella.config import load_config
from capella.errors import InvalidConfig
from capella.server import run as run_server


def serve(args: argparse.Namespace, _: None) -> None:
    try:
        run_server(load_config(args.config, {"data_dir": args.data_dir, "listen": args.listen}))
    except InvalidConfig as exc:
        raise Refused(exc.message, 2) from None


SERVE = Command(
    "serve",
    "run a Capella server",
    serve,
    text=None,
    description="Run a Capella server. With no options: data in ./capella-data, HTTP on 127.0.0.1:8676.",
    args=(
        arg("--config", type=Path, metavar="FILE", help="a TOML configuration file"),
        arg("--data-dir", metavar="DIR", help="override cluster.data_dir"),
        arg("--listen", metavar="HOST:PORT", help="override server.listen"),
    ),
    on=standalone,
    common=False,
)
