"""The dispatcher's remembered cell scores (``fleetlog.core.dispatch.Scores``) against their plain
twin: the same answers, the same dispatches."""

from __future__ import annotations

import functools
import random

import pytest

from fleetlog.core import dispatch as d
from tests.core.builders import job
from tests.sharded.test_driver import World, scenario


def spread() -> list[str]:
    """Ten one-GPU jobs in one step over two equal cells: where each went."""
    w = World({"a": (1, 2), "b": (1, 2)})
    w.fleet.submit(*[job(f"j{i}") for i in range(10)])
    return [e.cell for e in w.step().dispatched]


def test_a_remembered_score_is_the_plain_take_until_the_cell_changes() -> None:
    rng = random.Random(3)
    room: dict[str, d.Room] = {
        c: {("A100", b): [rng.randint(0, 9), 64_000, 500_000] for b in (1, 2, 4, 8)} for c in "ab"
    }
    plain = {c: {k: list(v) for k, v in r.items()} for c, r in room.items()}
    scores = d.Scores(room)
    for _ in range(200):
        spec = job("x", gpus=rng.choice((1, 2, 4, 8)), tasks=rng.randint(1, 3))
        for cell in "ab":
            assert scores.left(cell, spec) == d.take(plain[cell], spec, commit=False)
        cell = rng.choice("ab")
        if scores.left(cell, spec) is not None:
            scores.take(cell, spec)
            d.take(plain[cell], spec, commit=True)
        assert room == plain


def test_a_run_with_remembered_scores_dispatches_as_the_plain_one(monkeypatch: pytest.MonkeyPatch) -> None:
    remembered = scenario(11), spread()
    assert remembered[1] == ["a", "b"] * 5
    monkeypatch.setattr(d, "Scores", functools.partial(d.Scores, remember=False))
    assert (scenario(11), spread()) == remembered


def test_the_twin_test_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memo that forgets to drop a cell's scores when its room changes dispatches otherwise."""
    class Stale(d.Scores):
        def take(self, cell: str, spec: d.JobSubmitted) -> None:
            d.take(self.room[cell], spec, commit=True)

    monkeypatch.setattr(d, "Scores", Stale)
    assert spread() == ["a"] * 10
