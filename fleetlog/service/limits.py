"""Submissions per second per tenant (issue 22): one noisy tenant cannot fill the ingest path.
Jobs are counted, and (issue 46) tasks too, in a second bucket: a job of 10,000 tasks costs
10,000 there.

A token bucket per tenant: it holds at most ``burst`` submissions and fills at ``rate`` a
second.  A request takes, for every tenant it submits jobs of, as many as it submits — for all of
them or for none: when one tenant's bucket holds too few, nothing is taken and the request gets
429 ``too_many_submissions`` with ``Retry-After`` the whole seconds until it would fit (the client
waits that long and sends again, :class:`fleetlog.client.HttpTransport`).  A request with more
submissions of one tenant than ``burst`` fits once the bucket is full, and leaves it in debt:
the tenant's next submission waits until the debt is paid at ``rate`` (so a job set larger than
the burst is never refused for good).  Resubmissions the service recognises as duplicates are
not counted (they append nothing).

Buckets that have filled up again are forgotten, so the table holds only tenants that submitted
within the last ``burst / rate`` seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

FORGET_EVERY: Final = 1024
"""Every this many requests, the full buckets are dropped."""


@dataclass(frozen=True)
class Limited:
    """Why a request does not fit now: the tenant, and the whole seconds to wait."""

    tenant: str
    message: str
    retry_after_s: int


class SubmissionRates:
    """The buckets of every tenant that submitted lately."""

    def __init__(self, rate: float, burst: int, monotonic: Callable[[], float] = time.monotonic,
                 unit: str = "jobs", setting: str = "max_submissions_per_s") -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate > 0 and a burst >= 1, not {rate} and {burst}")
        self.rate, self.burst, self._monotonic = rate, burst, monotonic
        self.unit, self.setting = unit, setting
        """What a bucket counts (``jobs``, or ``tasks``: a job of many tasks costs them all) and
        the setting that bounds it, for the 429's message."""
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (submissions held, when)
        self._calls = 0

    def _held(self, tenant: str, now: float) -> float:
        held, when = self._buckets.get(tenant, (self.burst, now))
        return min(float(self.burst), held + (now - when) * self.rate)

    def take(self, counts: Mapping[str, int]) -> Limited | None:
        """Take ``counts`` (submissions per tenant) if every bucket holds them; else why not."""
        limited = self.check(counts)
        if limited is None:
            self.commit(counts)
        return limited

    def check(self, counts: Mapping[str, int]) -> Limited | None:
        """Why ``counts`` do not fit now (``None``: they do), taking nothing: a request checked
        against several limits takes from all of them or from none."""
        now = self._monotonic()
        self._calls += 1
        if self._calls % FORGET_EVERY == 0:
            self._forget(now)
        for tenant in sorted(counts):
            wanted = counts[tenant]
            held = self._held(tenant, now)
            needed = min(wanted, self.burst)  # (more than the burst: a full bucket, then debt)
            if held < needed:
                wait = max(1, math.ceil((needed - held) / self.rate))
                return Limited(tenant, f"tenant {tenant!r} submits over {self.rate:g} {self.unit} a second "
                               f"({self.setting}); {wanted} more fit in {wait} s", wait)
        return None

    def commit(self, counts: Mapping[str, int]) -> None:
        """Take ``counts`` (after :meth:`check` found they fit)."""
        now = self._monotonic()
        for tenant, wanted in counts.items():
            self._buckets[tenant] = (self._held(tenant, now) - wanted, now)

    def _forget(self, now: float) -> None:
        full = [tenant for tenant in self._buckets if self._held(tenant, now) >= self.burst]
        for tenant in full:
            del self._buckets[tenant]

    def __len__(self) -> int:
        return len(self._buckets)
