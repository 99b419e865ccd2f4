"""Every ``fleetlog replay`` example in docs/replay.md runs (from a copy of the repository layout,
so outputs land in a temporary directory) and exits as the page says: 0, or 1 where it says so."""

from __future__ import annotations

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
