"""Virtual time: a clock the logs read, and a queue of timed actions fired in a total order."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from fleetlog.log.base import Message


class VirtualClock:
    """Milliseconds of virtual time; the log stores' injected clock. Never goes back."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, to_ms: int) -> None:
        if to_ms < self.now_ms:
            raise ValueError(f"virtual time cannot go back from {self.now_ms} to {to_ms} ms")
        self.now_ms = to_ms


class Emitted(NamedTuple):
    """What an action puts on the inputs log, and whether the scheduler should decide again
    (arrivals, finishes, failures: yes; steady heartbeats and task starts: no)."""

    messages: Sequence[Message] = ()
    trigger: bool = False


Action = Callable[[int], Emitted]
"""Called with the virtual time it fires at."""

Item = TypeVar("Item")


class Timers:
    """Actions at virtual times, fired in (time, order of scheduling) — a total order, so a run
    is reproduced exactly. Times are rounded up to the ``tick_ms`` grid: what falls in one tick
    is appended, and scheduled, together."""

    def __init__(self, clock: VirtualClock, tick_ms: int = 1) -> None:
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be positive, got {tick_ms}")
        self.clock, self.tick_ms = clock, tick_ms
        self._heap: list[tuple[int, int, Action]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def when(self, at_ms: int) -> int:
        """The time an action asked for ``at_ms`` fires at now: on the tick grid, never before now."""
        return max(self.clock.now_ms, -(-at_ms // self.tick_ms) * self.tick_ms)

    def at(self, at_ms: int, action: Action) -> None:
        """Run ``action`` at ``at_ms`` (on the tick grid, and never before now)."""
        heapq.heappush(self._heap, (self.when(at_ms), self._seq, action))
        self._seq += 1

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def fire_next(self) -> Emitted:
        """Advance the clock to the next time and run every action due then (including those they
        schedule for that same time); their messages, in order, and whether any triggers."""
        at = self.next_time()
        if at is None:
            return Emitted()
        self.clock.advance(at)
        messages: list[Message] = []
        trigger = False
        while self._heap and self._heap[0][0] == at:
            _, _, action = heapq.heappop(self._heap)
            out = action(at)
            messages.extend(out.messages)
            trigger = trigger or out.trigger
        return Emitted(messages, trigger)


class Agenda(Generic[Item]):
    """Items due at virtual times, handed to ``fire`` together, one timer per distinct time.

    Many per-item timers (a start per placed task) cost a closure and a heap entry each; here
    items due at one time share one timer, fired at the place in the timers' order of the first
    item scheduled for that time. Items of one time are handed over in the order they were
    added, so a run stays reproduced exactly."""

    def __init__(self, timers: Timers, fire: Callable[[int, list[Item]], Emitted]) -> None:
        self.timers, self.fire = timers, fire
        self._due: dict[int, list[Item]] = {}

    def add(self, at_ms: int, item: Item) -> None:
        """``item`` is due at ``at_ms`` (as :meth:`Timers.at` rounds it)."""
        self.add_after(at_ms, (0,), (item,))

    def add_after(self, base_ms: int, delays: Sequence[int], items: Sequence[Item]) -> None:
        """Each of ``items`` due ``delays`` (its own, in order) after ``base_ms``, in one loop."""
        timers, due = self.timers, self._due
        now, tick = timers.clock.now_ms, timers.tick_ms
        for delay, item in zip(delays, items, strict=True):
            at_ms = base_ms + delay
            when = max(now, -(-at_ms // tick) * tick)  # Timers.when, inlined
            bucket = due.get(when)
            if bucket is None:
                due[when] = [item]
                timers.at(at_ms, self._fire)  # fires at ``when``: computed alike, at the same now
            else:
                bucket.append(item)

    def _fire(self, now: int) -> Emitted:
        return self.fire(now, self._due.pop(now))
