"""``capella serve``: run a broker in this process until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
from pathlib import Path

from capella.cli.output import error
from capella.config import load_config
from capella.errors import InvalidConfig
from capella.server import run as run_server


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve",
        help="run a Capella server",
        description="Run a Capella server. With no options: data in ./capella-data, HTTP on 127.0.0.1:8676.",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="a TOML configuration file")
    parser.add_argument("--data-dir", metavar="DIR", help="override cluster.data_dir")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override server.listen")
    parser.set_defaults(func=serve, uses_client=False)


def serve(args: argparse.Namespace) -> int:
    try:
        run_server(load_config(args.config, {"data_dir": args.data_dir, "listen": args.listen}))
    except InvalidConfig as exc:
        error(exc.message)
        return 2
    return 0
