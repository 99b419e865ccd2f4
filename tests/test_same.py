"""``tests.same.assert_same``: names the first difference, and fails at once on large values
that pytest's own explanation took minutes to diff (3,000 dispatches that differ from the
1,234th on: past a minute under ``CI=true``, measured; past the suite's timeout in
tests/core/test_dispatch_runs.py's break cases)."""

from __future__ import annotations

import pytest

from fleetlog.core.dispatch import Step
from fleetlog.events import JobDispatched, JobSubmitted, TaskGroup
from tests.same import assert_same, first_difference


def step(n: int, odd: int = -1, shift: int = 0) -> Step:
    """A step of ``n`` dispatches, the ``odd``-th to another cell, and from the ``shift``-th
    on each to the cell of the one ``shift`` before it in a step without it (the many small
    differences that made difflib's diff slow)."""
    group = (TaskGroup(count=1, cpu_milli=1_000, mem_mib=1_024, gpu_count=1, gpu_milli=1_000),)
    return Step(dispatched=tuple(
        JobDispatched(job=JobSubmitted(job_id=f"j{i}", tenant="a", task_groups=group),
                      cell="c099" if i == odd else f"c{(i - shift if shift and i >= shift else i) % 7:03d}",
                      attempt=1, seq=i + 1, as_of=1)
        for i in range(n)), cancels=(), waiting=())


def test_the_first_difference_is_named() -> None:
    assert first_difference(step(5, odd=3), step(5), "", 8) == [
        ".dispatched[3].cell:", "  left:  'c099'", "  right: 'c003'"]
    assert first_difference([1, 2, 3], [1, 2], "", 8)[0] == "value: lengths 3 != 2; first extra item 3"
    assert first_difference({"a": 1}, {"b": 1}, "", 8) == ["['a']: only on the left"]
    assert first_difference({"a": [1, 2]}, {"a": [1, 3]}, "", 8)[0] == "['a'][1]:"
    assert first_difference(1, "1", "", 8) == ["value:", "  left:  1", "  right: '1'"]
    assert first_difference([[[1]]], [[[2]]], "", 1) == ["[0]:", "  left:  [[1]]", "  right: [[2]]"]
    long = first_difference("x" * 1_000, "y", "", 8)[1]
    assert long.endswith("... (1002 characters)")
    assert len(long) < 450


def test_large_values_fail_at_once_with_the_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(AssertionError, match=r"^seed 3 step 1: not the same\n\.dispatched\[1234\]\.cell:"):
        assert_same(step(3_000, shift=1_234), step(3_000), "seed 3 step 1")
    assert_same(step(3_000), step(3_000), "equal")
