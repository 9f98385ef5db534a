"""``Client`` is ``AsyncClient`` made blocking: the same public methods, parameters and docs.

The blocking methods are derived from the async ones (``blocking(AsyncClient.produce)``);
these tests fail when a method is added to one client and not the other, or written by hand
again, and when mypy no longer sees the async method's parameters and result on ``Client``.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

from capella.client import AsyncClient, Client

# Written by hand in Client, each for a reason; every other public method is derived.
HAND_WRITTEN = {
    "close": "also stops the client's loop thread",
}
# Options only AsyncClient has: a session belongs to the loop that made it, not Client's.
ONLY_ASYNC_OPTIONS = {"session"}
# Names starting with "_" are not API, but these are, spelled for a blocking context manager.
RENAMED = {"__aenter__": "__enter__", "__aexit__": "__exit__"}


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("_") and callable(value)}


def public_properties(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_") and name not in public_methods(cls)}


def test_both_clients_have_the_same_public_methods() -> None:
    assert public_methods(Client) == public_methods(AsyncClient)
    assert set(HAND_WRITTEN) <= public_methods(Client)
    assert set(RENAMED) <= set(vars(AsyncClient))
    assert set(RENAMED.values()) <= set(vars(Client))


def test_each_blocking_method_takes_the_async_methods_parameters() -> None:
    for name in sorted(public_methods(AsyncClient)):
        blocking, original = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(blocking).parameters == inspect.signature(original).parameters, name


def test_every_method_but_the_hand_written_ones_is_derived_with_its_docstring() -> None:
    for name in sorted(public_methods(AsyncClient) - set(HAND_WRITTEN)):
        blocking, original = getattr(Client, name), getattr(AsyncClient, name)
        assert getattr(blocking, "__wrapped__", None) is original, f"{name} is written by hand"
        assert blocking.__doc__ == original.__doc__, name


def test_every_property_is_derived_with_its_docstring() -> None:
    # base_url is an attribute of an AsyncClient, set by its constructor: Client's property shows it.
    assert public_properties(Client) == public_properties(AsyncClient) | {"base_url"}
    for name in sorted(public_properties(AsyncClient)):
        derived, original = vars(Client)[name], vars(AsyncClient)[name]
        assert getattr(derived, "__wrapped__", None) is original, f"{name} is written by hand"
        assert derived.__doc__ == original.__doc__, name


def test_a_derived_property_reads_the_async_clients_value() -> None:
    with Client("http://127.0.0.1:9") as client:
        assert client.transport is client._client.transport
        assert client.base_url == client._client.base_url


def test_the_constructors_take_the_same_options() -> None:
    async_options = inspect.signature(AsyncClient.__init__).parameters
    options = inspect.signature(Client.__init__).parameters

    assert list(options.values()) == [p for p in async_options.values() if p.name not in ONLY_ASYNC_OPTIONS]


def test_mypy_sees_the_async_signatures_with_awaited_results(tmp_path: Path) -> None:
    names = sorted(public_methods(AsyncClient) - set(HAND_WRITTEN))
    revealed = revealed_types(names, tmp_path)

    for name, async_type, blocking_type in zip(names, revealed[::2], revealed[1::2], strict=True):
        assert blocking_type == awaited(async_type), name


def test_mypy_sees_the_async_properties_types(tmp_path: Path) -> None:
    names = sorted(public_properties(AsyncClient))
    revealed = revealed_types(names, tmp_path)

    for name, async_type, blocking_type in zip(names, revealed[::2], revealed[1::2], strict=True):
        assert blocking_type == async_type, name


def revealed_types(names: list[str], tmp_path: Path) -> list[str]:
    """What mypy shows for ``a.NAME`` and then ``c.NAME`` (AsyncClient, Client), for each name."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from capella.client import AsyncClient, Client\n"
        "def probe(a: AsyncClient, c: Client) -> None:\n"
        + "".join(f"    reveal_type(a.{name})\n    reveal_type(c.{name})\n" for name in names)
    )

    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(probe)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )

    revealed = re.findall(r'Revealed type is "(.*)"', done.stdout)
    assert len(revealed) == 2 * len(names), done.stdout + done.stderr
    return revealed


def awaited(async_type: str) -> str:
    """The type mypy should show for a blocking method, given the async method's type."""
    returned = re.sub(r" -> typing\.Coroutine\[Any, Any, (.*)\]$", r" -> \1", async_type)
    yielded = re.sub(
        r" -> typing\.AsyncGenerator\[(.*), None\]$", r" -> typing.Generator[\1, None, None]", returned
    )
    return yielded.removesuffix(" -> None")  # mypy leaves it out
