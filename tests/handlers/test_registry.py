"""The handler registry: one module and one entry per type, imported only when needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from capella.errors import InvalidRequest
from capella.handlers.base import MODULES, Handler, PassTally, find, handler_type
from capella.wire.handlers import DEFINITIONS, HANDLER_TYPES, params_type
from capella.wire.params import Params


@pytest.mark.parametrize("name", HANDLER_TYPES)
def test_every_type_is_one_module_with_its_entry(name: str) -> None:
    entry = handler_type(name)
    assert entry.name == name
    assert MODULES[name] == f"capella.handlers.{name}"
    assert issubclass(entry.params, Params)
    # The definition the API decodes for this type carries the same params struct.
    assert params_type(DEFINITIONS[name]) is entry.params


def test_every_type_has_a_definition_and_no_definition_lacks_a_type() -> None:
    assert sorted(DEFINITIONS) == sorted(HANDLER_TYPES)


def test_an_unknown_type_has_no_entry() -> None:
    assert find("nope") is None
    with pytest.raises(InvalidRequest, match="unknown handler type 'nope'"):
        handler_type("nope")


def test_the_hooks_default_to_nothing() -> None:
    class Bare(Handler):
        interval = 1.0

        async def run_once(self) -> PassTally:  # the one method a handler must write
            return PassTally()

    bare = Bare()
    assert bare.status() is None
    assert not bare.closes


def test_the_server_imports_no_handler_type_until_one_is_built() -> None:
    code = (
        "import sys, capella.server, capella.metrics, capella.cli\n"
        f"print(sorted(set(sys.modules) & {set(MODULES.values())!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
