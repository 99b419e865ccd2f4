"""docs/replay.md's "history" section and the README's row: every example runs and prints what the
page shows, every field the page defines is a field of the record (and every field is
defined), every flag the README names is a flag of the command, and ``-o json`` prints an item a
line."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fleetlog.cli import build_parser, main
from fleetlog.replay.history import Finished

REPO = Path(__file__).resolve().parents[2]
SECTION = (REPO / "docs" / "replay.md").read_text().split("## history", 1)[1].split("\n## ", 1)[0]
SELF_EVIDENT = {"job_id", "tenant", "queue", "priority", "tasks", "cell"}


def examples() -> list[tuple[str, str | None]]:
    """(command, the output shown after it — the next block, when it is ``text`` — or None) of
    each ``sh`` block of the section."""
    blocks = list(re.finditer(r"```(\w*)\n(.*?)```", SECTION, re.S))
    out = []
    for i, block in enumerate(blocks):
        if block.group(1) != "sh":
            continue
        shown = blocks[i + 1].group(2) if i + 1 < len(blocks) and blocks[i + 1].group(1) == "text" else None
        out += [(line, shown) for line in block.group(2).splitlines()]
    return out


def test_the_section_has_examples() -> None:
    assert len(examples()) >= 2
    assert all(shown is not None for _, shown in examples())
    assert all(command.startswith("fleetlog history ") for command, _ in examples())


@pytest.mark.parametrize(("command", "shown"), examples(), ids=[c for c, _ in examples()])
def test_the_example_prints_what_the_page_shows(
    command: str, shown: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    if shown is not None:
        assert [line.rstrip() for line in out.splitlines()] == shown.rstrip("\n").splitlines()


def test_every_field_is_defined_and_every_defined_field_is_one() -> None:
    table = re.findall(r"^\| (`[^|]+`) \|", SECTION, re.M)
    defined = {name for cell in table for name in re.findall(r"`(\w+)`", cell)}
    fields = set(Finished.__struct_fields__)
    assert defined <= fields
    assert fields - SELF_EVIDENT <= defined


def test_the_readme_row_names_the_commands_flags() -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    rows = [line for line in readme if line.startswith("| `fleetlog history")]
    assert len(rows) == 1
    flags = set(re.findall(r"(--[a-z-]+|-o)\b", rows[0].split("|")[1]))
    parser = next(p for p in _subparsers() if p.prog == "fleetlog history")
    assert flags
    assert flags <= set(parser._option_string_actions)


def _subparsers() -> list[object]:
    from fleetlog.usage import walk

    return list(walk(build_parser()))


def test_json_is_one_object_with_an_item_a_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    assert main(["history", "--log", "tests/replay/data/clean", "--json"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    items = json.loads(out)["items"]
    assert len(lines) == len(items) + 2
    assert [json.loads(line.rstrip(",")) for line in lines[1:-1]] == items
