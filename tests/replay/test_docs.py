"""Every ``fleetlog replay`` example in docs/replay.md runs (from a copy of the repository layout,
so outputs land in a temporary directory) and exits as the page says: 0, or 1 where it says so;
every example output shown is what the command prints, and the numbers the prose quotes from a
command's output are that output's."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest

from fleetlog.cli import main

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "replay.md"


def examples() -> list[tuple[str, int]]:
    """(command line, expected exit code) of every ``fleetlog replay`` line in the ``sh`` blocks."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith("fleetlog replay "):
                command, _, comment = line.partition("#")
                out.append((command.strip(), 1 if "exits with 1" in comment else 0))
    return out


def test_the_page_has_an_example_of_every_command() -> None:
    used = {shlex.split(command)[2] for command, _ in examples()}
    assert used == {"verify", "state-at", "explain", "what-if", "timeline", "report", "dump"}


@pytest.mark.parametrize(("command", "code"), examples(), ids=[c for c, _ in examples()])
def test_the_example_runs(
    command: str,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:]) == code
    assert capsys.readouterr().out.strip()


# --- example outputs and prose numbers ------------------------------------------------------


def shown_outputs() -> list[tuple[str, str]]:
    """(command, example output) of every ``sh`` block directly followed by a ``text`` block."""
    text = DOC.read_text()
    blocks = list(re.finditer(r"```(\w*)\n(.*?)```", text, re.S))
    pairs = [
        (a.group(2), b.group(2))
        for a, b in itertools.pairwise(blocks)
        if (a.group(1), b.group(1)) == ("sh", "text") and not text[a.end() : b.start()].strip()
    ]
    return [(next(line for line in sh.splitlines() if line.startswith("fleetlog replay ")), out)
            for sh, out in pairs]


def matches(example: str, line: str) -> bool:
    """``line`` is ``example`` where each ``…`` stands for any text (the rest verbatim)."""
    pattern = ".*".join(re.escape(part) for part in example.split("…"))
    return re.fullmatch(pattern, line) is not None


def test_the_page_shows_example_outputs() -> None:
    assert {shlex.split(c)[2] for c, _ in shown_outputs()} == {"verify", "explain"}


@pytest.mark.parametrize(("command", "shown"), shown_outputs(), ids=[c for c, _ in shown_outputs()])
def test_each_example_output_is_what_the_command_prints(
    command: str, shown: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every line shown appears, in order, in the real output (``…`` elides)."""
    monkeypatch.chdir(REPO)
    main(shlex.split(command.partition("#")[0])[1:])
    real = capsys.readouterr().out.splitlines()
    at = 0
    for example in shown.rstrip("\n").splitlines():
        found = next((i for i in range(at, len(real)) if matches(example, real[i])), None)
        assert found is not None, f"{example!r} is not in the output of {command!r} (after line {at}):\n" + (
            "\n".join(real))
        at = found + 1


def dumped(command: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert main(shlex.split(command)[1:]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_malformed_record_the_prose_points_at_is_in_the_dump_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    text = DOC.read_text()
    (offset,) = re.findall(r"offset (\d+) above: a malformed record", text)
    first_dump = next(c for c, _ in examples() if c.startswith("fleetlog replay dump "))
    lines = dumped(first_dump, capsys)
    broken = [line["offset"] for line in lines if "error" in line]
    assert broken == [int(offset)]
    every = dumped("fleetlog replay dump --log tests/replay/data/clean", capsys)
    assert [line["offset"] for line in every if "error" in line] == [int(offset)]  # the only one


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_the_fixture_is_the_fleet_the_prose_describes(capsys: pytest.CaptureFixture[str]) -> None:
    m = re.search(r"\(a (\w+)-node GPU fleet, (\w+) tenants,", DOC.read_text())
    assert m is not None
    assert main(["replay", "state-at", "290", "--log", str(REPO / "tests/replay/data/clean"), "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert len(state["nodes"]) == NUMBERS[m.group(1)]
    assert all(node["gpus"] > 0 for node in state["nodes"])
    assert len(state["tenants"]) == NUMBERS[m.group(2)]
