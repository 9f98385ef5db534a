"""The command table (``capella.cli.command``): what a row declares is what running it does.

Rows here work on nothing (``standalone``), so no server is needed: the order of a run (check,
confirmation, call, output, exit code) and the parser built from a row are seen directly.
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any

import pytest

from capella.cli.command import Command, Confirm, Family, Refused, add, arg, one_of, run, standalone


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def calls(answer: object) -> tuple[list[str], Command[object]]:
    done: list[str] = []

    def call(args: argparse.Namespace, _: None) -> object:
        done.append(args.name)
        return answer

    return done, Command(
        "drop",
        "drop a thing",
        call,
        text=lambda args, answer: print(f"dropped {args.name}: {answer}"),
        json=lambda args, answer: {"dropped": args.name},
        args=(arg("name"),),
        on=standalone,
        check=lambda args: "no dots" if "." in args.name else None,
        confirm=Confirm("drop {name}?", "not dropping {name} without --yes", "not dropped"),
        exit=lambda args, answer: 0 if answer == "ok" else 1,
    )


def parsed(row: Command[Any], *argv: str) -> argparse.Namespace:
    root = argparse.ArgumentParser(prog="capella")
    root.add_argument("--json", action="store_true")
    add(root.add_subparsers(dest="command", required=True), Family("thing", "things", (row,)), None)
    return root.parse_args(argv)


def test_a_row_prints_its_answer_as_text_or_json_and_exits_with_its_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    done, row = calls("ok")

    assert run(row, parsed(row, "thing", "drop", "a", "--yes")) == 0
    assert run(row, parsed(row, "--json", "thing", "drop", "b", "--yes")) == 0

    assert done == ["a", "b"]
    assert capsys.readouterr().out == 'dropped a: ok\n{"dropped":"b"}\n'
    assert run(calls("failed")[1], parsed(row, "thing", "drop", "c", "--yes")) == 1


def test_a_wrong_use_is_refused_with_2_before_the_question(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done, row = calls("ok")
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))

    assert run(row, parsed(row, "thing", "drop", "a.b")) == 2

    assert done == []
    assert capsys.readouterr() == ("", "capella: no dots\n")


def test_without_a_terminal_or_yes_nothing_is_done(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done, row = calls("ok")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))

    assert run(row, parsed(row, "thing", "drop", "a")) == 2

    assert done == []
    assert capsys.readouterr().err == "capella: not dropping a without --yes\n"


@pytest.mark.parametrize(("typed", "code", "done"), [("y\n", 0, ["a"]), ("YES\n", 0, ["a"]), ("\n", 1, [])])
def test_the_question_is_asked_on_a_terminal(
    typed: str,
    code: int,
    done: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    called, row = calls("ok")
    monkeypatch.setattr(sys, "stdin", Terminal(typed))

    assert run(row, parsed(row, "thing", "drop", "a")) == code

    assert called == done
    assert capsys.readouterr().out.startswith("drop a? [y/N] ")


def test_a_call_that_refuses_says_why_with_its_status(capsys: pytest.CaptureFixture[str]) -> None:
    def call(args: argparse.Namespace, _: None) -> None:
        raise Refused("cannot do it", 3)

    row: Command[None] = Command("do", "do it", call, text=print, on=standalone)

    assert run(row, parsed(row, "thing", "do")) == 3
    assert capsys.readouterr() == ("", "capella: cannot do it\n")


def test_a_row_without_text_prints_nothing_of_its_answer(capsys: pytest.CaptureFixture[str]) -> None:
    row: Command[str] = Command("stream", "stream", lambda args, _: "the answer", text=None, on=standalone)

    assert run(row, parsed(row, "--json", "thing", "stream")) == 0
    assert capsys.readouterr().out == ""


def test_groups_of_a_row_are_argparse_groups(capsys: pytest.CaptureFixture[str]) -> None:
    row: Command[None] = Command(
        "move",
        "move it",
        lambda args, _: None,
        text=None,
        args=(one_of(arg("--at"), arg("--delay"), required=True),),
        on=standalone,
    )

    assert parsed(row, "thing", "move", "--at", "1").at == "1"
    with pytest.raises(SystemExit):
        parsed(row, "thing", "move", "--at", "1", "--delay", "2")
    assert "not allowed with argument" in capsys.readouterr().err
