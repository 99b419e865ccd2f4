"""Ingest: ``POST /v1/events`` from the body to the inputs log.  A body is decoded whole (one bad
event refuses it all), screened against the jobs the service has (identical resends dropped, a
conflicting one refused), admitted against the pending work it would create, checked against
the fleet (a job that can never fit: 422) and appended; the answer names the first offset."""

from __future__ import annotations

import asyncio
import math
import re
import resource
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import msgspec
import numpy as np

from fleetlog.core.authorize import Roles
from fleetlog.core.never_fits import Fleet, never_fits_submitted
from fleetlog.core.state import JobState, NodeStatus, State
from fleetlog.core.views import as_folded, folded_spec, job_ended, pending_tasks
from fleetlog.events.codec import (
    CONTENT_TYPE_HEADER,
    CONTENT_TYPES,
    JSON,
    MSGPACK,
    BadEventError,
    decode,
    encode,
    format_of,
)
from fleetlog.events.model import INPUT_TYPES, InputEvent, JobCancelled, JobSubmitted, Tick
from fleetlog.events.spec import spec_differences, submission_spec
from fleetlog.log.base import INPUTS, PRINCIPAL_HEADER, Headers, LogStore, Message
from fleetlog.log.discovery import ACCEPT_NEVER_FITS
from fleetlog.service.authz import Forbidden, check_events, forbidden
from fleetlog.service.config import ServiceSettings
from fleetlog.service.http import HttpLimits, Request, Response, json_response, refusal
from fleetlog.service.limits import SubmissionRates
from fleetlog.service.loop import SchedulerLoop
from fleetlog.service.metadata import metadata_refusal

INLINE_DECODE_BYTES: Final = 64 * 1024
"""Ingest bodies up to this size are decoded on the loop (a few ms); larger ones in a thread."""

Leading = Callable[[], tuple[LogStore | None, SchedulerLoop | None]]
"""The logs and the loop of the process while it leads (``None`` while it does not)."""


class IngestError(Exception):
    """An ingest body refused as a whole: ``status`` 400 (bad) or 413 (too much at once)."""

    def __init__(self, message: str, reason: str, status: int = 400, **extra: object) -> None:
        super().__init__(message)
        self.reason, self.status, self.extra = reason, status, extra


_PATH: Final = re.compile(r"at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)`")
_NAMED: Final = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def field_of(message: str) -> str | None:
    """The field a decode error names, as a path in the envelope (``event.nominal.gpu_milli``,
    ``event.task_groups[0].cpu_milli``); an unknown or missing field's own name appended;
    ``None`` if the message names none."""
    found = _PATH.search(message)
    if found is None:
        return None
    path = found.group(1).lstrip(".")
    named = _NAMED.search(message)
    if named is not None:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return path or None


class IngestBatch(msgspec.Struct, frozen=True):
    messages: list[Message]
    tasks: int
    """Tasks of the jobs it submits: the pending work it can create."""
    events: list[InputEvent] = []
    """The events of ``messages``, in order."""


def screened(state: State, unfolded: dict[str, JobSubmitted], batch: IngestBatch
             ) -> tuple[IngestBatch, list[dict[str, object]]]:
    """``batch`` without the identical resubmissions of jobs the service already has (folded,
    appended but not folded yet, or earlier in the batch), and those as ``{"index", "job_id"}``.
    A job id submitted again with another spec (409 ``already_exists``), a cancel of a job never
    submitted (404 ``unknown_job``) or of one that already ended otherwise than cancelled (409
    ``already_ended``) refuses the whole batch.  A cancel of a cancelled job is an identical resend.
    A new job costs dictionary lookups only: specs are compared when an id is seen again."""
    seen: dict[str, JobSubmitted] = {}
    skip: list[int] = []
    for index, event in enumerate(batch.events):
        if isinstance(event, JobSubmitted):
            if _resubmitted(state, seen.get(event.job_id) or unfolded.get(event.job_id), event, index):
                skip.append(index)
            else:
                seen[event.job_id] = event
        elif (isinstance(event, JobCancelled) and event.job_id not in seen and event.job_id not in unfolded
              and _cancelled_already(state, event.job_id, index)):
            skip.append(index)
    dropped: list[dict[str, object]] = [{"index": i, "job_id": getattr(batch.events[i], "job_id", "")}
                                        for i in skip]
    if not skip:
        return batch, dropped
    keep = sorted(set(range(len(batch.events))) - set(skip))
    events = [batch.events[i] for i in keep]
    tasks = sum(g.count for e in events if isinstance(e, JobSubmitted) for g in e.task_groups)
    return IngestBatch([batch.messages[i] for i in keep], tasks, events), dropped


def _resubmitted(state: State, earlier: JobSubmitted | None, event: JobSubmitted, index: int) -> bool:
    """Whether ``event`` resubmits a job the service has (``earlier``, not folded yet, or else in
    the state), with the same spec; an :class:`IngestError` if with another spec; ``False`` for
    a new job."""
    if earlier is not None:
        before, after = submission_spec(earlier), submission_spec(event)
    elif event.job_id in state.retired:
        return True  # (it ended and retired: within the dedup window the fold drops it as a duplicate)
    elif state.job_row(event.job_id) < 0:
        return False
    else:
        folded = folded_spec(state, event.job_id)
        assert folded is not None
        before, after = folded, as_folded(state, submission_spec(event))
    if before == after:
        return True
    if before.tenant != after.tenant:  # (another tenant's job: say nothing of it)
        raise IngestError(f"event {index}: job id {event.job_id!r} is taken by another tenant's job; job ids "
                          "are global: choose ids under your tenant's prefix (TENANT/NAME, docs/api.md)",
                          "job_id_taken", 409, job_id=event.job_id, index=index)
    changed = "; ".join(spec_differences(before, after))
    raise IngestError(f"event {index}: job {event.job_id!r} already exists with another spec ({changed}); "
                      "a job id is submitted once: cancel it and submit under a new id", "already_exists",
                      409, job_id=event.job_id, index=index)


def _cancelled_already(state: State, job_id: str, index: int) -> bool:
    """Whether a cancel of ``job_id`` repeats one the state holds; an :class:`IngestError` if the
    job is unknown or ended otherwise."""
    if job_id in state.retired:
        raise IngestError(f"event {index}: cannot cancel job {job_id!r}: it ended and retired from the state",
                          "already_ended", 409, job_id=job_id, index=index, state="retired")
    if state.job_row(job_id) < 0:
        raise IngestError(f"event {index}: cannot cancel job {job_id!r}: no such job", "unknown_job", 404,
                          job_id=job_id, index=index)
    ended = job_ended(state, job_id)
    if ended is None:
        return False
    if ended == "cancelled":
        return True
    raise IngestError(f"event {index}: cannot cancel job {job_id!r}: it already ended ({ended})",
                      "already_ended", 409, job_id=job_id, index=index, state=ended)


_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])


def ingest_messages(body: bytes, content_type: str | None,
                    settings: ServiceSettings | None = None) -> list[Message]:
    """The input records of an ingest body (see :func:`ingest_batch`)."""
    return ingest_batch(body, content_type, settings or ServiceSettings()).messages


def ingest_batch(body: bytes, content_type: str | None, settings: ServiceSettings) -> IngestBatch:
    """The input records of an ingest body: one envelope or a JSON array of them; every one is
    decoded first, so a bad one rejects the whole request and nothing is appended.  Past
    ``max_request_events`` events or ``max_request_tasks`` tasks: 413.  Runs in a worker thread:
    the array is split without building its items, and each event is decoded on its own, so no
    single call holds the GIL for long."""
    try:  # case-insensitive, with parameters (RFC 9110); none at all: JSON
        fmt = format_of(content_type.encode("utf-8", "replace") if content_type is not None else JSON)
    except BadEventError as exc:
        raise IngestError(str(exc), exc.reason) from None
    kind = CONTENT_TYPES[fmt]
    parts: list[bytes] | list[msgspec.Raw] = [body] if fmt == "msgpack" else _json_parts(body)
    if len(parts) > settings.max_request_events:
        raise IngestError(f"{len(parts)} events in one request; the limit is {settings.max_request_events}",
                          "too_many_events", 413, limit=settings.max_request_events)
    messages, tasks = [], 0
    events: list[InputEvent] = []
    for index, part in enumerate(parts):
        try:
            env = decode(bytes(part), kind)
        except BadEventError as exc:
            raise IngestError(f"event {index}: {exc}", exc.reason) from None
        if not isinstance(env.event, INPUT_TYPES):
            raise IngestError(f"event {index}: {type(env.event).__name__} is a decision, not an input: only "
                              "the scheduler writes decisions", "not_an_input", index=index)
        if isinstance(env.event, Tick):
            raise IngestError(f"event {index}: a Tick is the scheduler's own (the leader appends one when "
                              "no input arrived for service.tick_every_ms); a producer never sends it "
                              "- at `$.event.type`", "not_an_input", index=index)
        events.append(env.event)
        if isinstance(env.event, JobSubmitted):
            tasks += sum(group.count for group in env.event.task_groups)
            if tasks > settings.max_request_tasks:
                raise IngestError(f"the jobs of this request have over {settings.max_request_tasks} tasks "
                                  f"(event {index} passes it); split it", "too_many_tasks", 413,
                                  limit=settings.max_request_tasks)
        messages.append(Message(encode(env), headers=((CONTENT_TYPE_HEADER, MSGPACK),)))
    return IngestBatch(messages, tasks, events)


def _accepts_never_fits(request: Request) -> bool:
    name, value = ACCEPT_NEVER_FITS
    return request.headers.get(name, "").strip().lower() == value


def never_fitting(state: State, events: list[InputEvent]) -> Response | None:
    """422 ``never_fits`` when a submitted job can never fit on the fleet the service knows (node
    shapes, not usage: :mod:`fleetlog.core.never_fits`), as ``sbatch`` refuses a job no node can run;
    nothing of the request is appended.  Jobs of one shape are judged once."""
    if state.nodes.size == 0:
        return None
    fleet: Fleet | None = None
    judged: dict[tuple[object, ...], str | None] = {}
    for job in events:
        if not isinstance(job, JobSubmitted):
            continue
        fleet = fleet or Fleet(state)
        key = (job.task_groups, job.required_topology, job.spread, job.allowed_cells)
        if key not in judged:
            judged[key] = never_fits_submitted(state, job, fleet)
        why = judged[key]
        if why is not None:
            return refusal(422, "never_fits", f"job {job.job_id!r} can never fit on the current fleet: {why}",
                           extra={"job_id": job.job_id})
    return None


def _json_parts(body: bytes) -> list[bytes] | list[msgspec.Raw]:
    stripped = body.lstrip()
    if not stripped.startswith(b"["):
        return [body]
    try:  # each element's own bytes (not re-encoded: the codec sees repeated keys)
        return _RAW_LIST.decode(stripped)
    except msgspec.DecodeError as exc:
        raise IngestError(f"body is not a JSON array of events: {exc}", "undecodable") from None
    except RecursionError:
        raise IngestError("body nests arrays or maps too deeply", "too_deep") from None


def http_limits(settings: ServiceSettings) -> HttpLimits:
    """The HTTP server's limits: connections held under half the file-descriptor limit, so the
    logs and snapshots always find a descriptor, and requests with a body to at most half the
    connections, so health and status always find one."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = settings.http_max_connections if soft == resource.RLIM_INFINITY else max(
        4, min(settings.http_max_connections, soft // 2))
    bodies = max(1, min(settings.max_concurrent_requests, cap // 2))
    return HttpLimits(
        header_timeout_s=settings.http_header_timeout_s, body_timeout_s=settings.http_body_timeout_s,
        body_first_byte_timeout_s=settings.http_body_first_byte_timeout_s,
        tls_handshake_timeout_s=settings.http_tls_handshake_timeout_s,
        max_connections=cap, max_body_requests=bodies,
        max_body_requests_per_client=min(bodies, settings.max_concurrent_requests_per_client),
        max_headers=settings.http_max_headers, max_line_bytes=settings.http_max_header_bytes,
        max_field_bytes=settings.http_max_header_bytes, max_body_bytes=settings.max_request_bytes)


def tenant_tasks(events: list[InputEvent]) -> Counter[str]:
    """Tasks submitted per tenant: the pending work ``events`` create for each."""
    out: Counter[str] = Counter()
    for e in events:
        if isinstance(e, JobSubmitted):
            out[e.tenant] += sum(g.count for g in e.task_groups)
    return out


TENANT_IDS_RULE: Final = ("with service.job_ids_by_tenant, the jobs a tenant:NAME role submits have ids "
                          "that start with NAME/")


def check_job_ids(roles: Roles | None, events: list[InputEvent]) -> Forbidden | None:
    """``service.job_ids_by_tenant``: a job a principal submits as tenant NAME (by its
    ``tenant:NAME`` role; an operator's and a backend's for its cell are not checked) must
    have an id under ``NAME/``, so no tenant can take another's ids (issue 46)."""
    if roles is None or roles.operator:
        return None
    for index, e in enumerate(events):
        if not isinstance(e, JobSubmitted) or e.tenant not in roles.tenants:
            continue
        if not e.job_id.startswith(f"{e.tenant}/"):
            return Forbidden(f"event {index}: job id {e.job_id!r} of tenant {e.tenant!r} does not start with "
                             f"{e.tenant + '/'!r}", TENANT_IDS_RULE, index, "JobSubmitted")
    return None


RESERVED_IDS_RULE: Final = ("a job id TENANT/NAME is TENANT's: no other tenant's role submits under that "
                           "prefix (docs/api.md, Job ids)")


def check_reserved_ids(roles: Roles | None, events: list[InputEvent], tenants: frozenset[str]
                       ) -> Forbidden | None:
    """Ids under a tenant's prefix (``bob/...``) are that tenant's, always: a job another tenant's
    role submits under it is refused (an operator's is not), so no tenant can take the ids
    another will use once it names them under its prefix (issue 46; ``tenants``: those of the
    policy in force and of the state).  Plain ids stay global, first come."""
    if roles is None or roles.operator:
        return None
    for index, e in enumerate(events):
        if not isinstance(e, JobSubmitted) or e.job_id.startswith(f"{e.tenant}/"):
            continue
        head = e.job_id.split("/", 1)[0]
        owner = next((t for t in sorted(tenants) if e.job_id.startswith(f"{t}/")), None) if "/" in e.job_id \
            else None
        if owner is not None and owner != e.tenant:
            return Forbidden(f"event {index}: job id {e.job_id!r} is under tenant {owner!r}'s prefix "
                             f"({head + '/'!r}): submit tenant {e.tenant!r}'s jobs under {e.tenant + '/'!r}",
                             RESERVED_IDS_RULE, index, "JobSubmitted")
    return None


def known_cells(state: State) -> frozenset[str]:
    """The cells that hold a node the state knows (not removed): the cells that exist."""
    nodes = state.nodes
    cells = np.unique(nodes.view("cell")[nodes.view("status") != int(NodeStatus.REMOVED)])
    names = state.names["cell"].names
    return frozenset(names[int(c)] for c in cells.tolist() if c >= 0)


def backend_own(roles: Roles | None, event: JobSubmitted, cells: frozenset[str]) -> bool:
    """Whether ``event`` is what a backend must submit for its own cell (a job its cluster holds,
    held by ``allowed_cells`` to cells of its ``backend:`` roles that exist): exempt from the
    rate limits, since the work is there already (issue 46: a role alone exempts nothing)."""
    if roles is None or not event.allowed_cells:
        return False
    return roles.backend_cells.issuperset(event.allowed_cells) and cells.issuperset(event.allowed_cells)


class IngestGate:
    """Bounds the pending work ingest can create: tasks of pending jobs plus tasks appended but
    not folded yet, in all and per tenant; and the jobs and tasks each tenant submits a second."""

    def __init__(self, settings: ServiceSettings, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        rate, task_rate = settings.max_submissions_per_s, settings.max_submitted_tasks_per_s
        self.rates = None if rate is None else SubmissionRates(
            rate, settings.max_submission_burst or max(1, math.ceil(rate)), monotonic)
        """Submissions per second per tenant (``max_submissions_per_s``), if bounded."""
        self.task_rates = None if task_rate is None else SubmissionRates(
            task_rate, settings.max_submitted_task_burst or max(1, math.ceil(task_rate)), monotonic,
            "tasks", "max_submitted_tasks_per_s")
        """Tasks submitted per second per tenant (``max_submitted_tasks_per_s``), if bounded."""
        self.tenant_limit = settings.max_pending_tasks_per_tenant or max(
            settings.max_pending_tasks // 4, min(settings.max_request_tasks, settings.max_pending_tasks))
        """What one tenant may hold of the pending work (``max_pending_tasks_per_tenant``; by
        default a quarter, and at least one largest request: it always fits an empty share)."""
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fleetlog-ingest")
        self._unfolded: deque[tuple[int, int, Counter[str]]] = deque()  # (end, tasks, per tenant) appended
        self._jobs: dict[str, JobSubmitted] = {}  # appended, not folded yet: job id -> submission
        self._job_ends: deque[tuple[int, str]] = deque()  # (end offset, job id) of those, in order
        self._appending: set[str] = set()  # ids in ``_jobs`` whose append has not returned yet
        self.reserved_tenants: Callable[[State], frozenset[str]] | None = None
        """The tenants whose id prefixes are reserved (:func:`check_reserved_ids`): the service's
        policy in force and the state's tenants; ``None``: no check (no policy to name tenants)."""

    def pending(self, loop: SchedulerLoop) -> int:
        while self._unfolded and self._unfolded[0][0] <= loop.offset:
            self._unfolded.popleft()
        return pending_tasks(loop.state) + sum(tasks for _, tasks, _ in self._unfolded)

    def tenant_pending(self, loop: SchedulerLoop, tenants: list[str]) -> dict[str, int]:
        """Tasks each of ``tenants`` holds pending: of its pending jobs, and appended but not
        folded (one pass over the jobs, however many tenants a request names)."""
        self.pending(loop)  # (drops what the loop folded)
        jobs, names = loop.state.jobs, loop.state.names["tenant"]
        waiting = jobs.view("state") == JobState.PENDING
        sums = np.bincount(jobs.view("tenant")[waiting], weights=jobs.view("ntasks")[waiting])
        out = {}
        for tenant in tenants:
            tid = names.get(tenant)
            folded = int(sums[tid]) if 0 <= tid < len(sums) else 0
            out[tenant] = folded + sum(by[tenant] for _, _, by in self._unfolded)
        return out

    def admit(self, loop: SchedulerLoop, batch: IngestBatch) -> Response | None:
        """``None`` when the pending tasks ``batch`` creates fit, in all and for each tenant's
        share, else the 429."""
        if batch.tasks == 0:
            return None
        limit, tasks = self.settings.max_pending_tasks, batch.tasks
        pending = self.pending(loop)
        if pending + tasks > limit:
            return refusal(429, "too_much_pending", f"{pending} tasks pending; {tasks} more would pass "
                           f"the limit of {limit}", extra={"pending": pending, "limit": limit,
                                                           "bound": "max_pending_tasks"})
        wants = tenant_tasks(batch.events)
        holds = self.tenant_pending(loop, sorted(wants))
        for tenant, held in holds.items():
            wanted = wants[tenant]
            if held + wanted > self.tenant_limit:
                return refusal(429, "too_much_pending", f"tenant {tenant!r} holds {held} tasks pending; "
                               f"{wanted} more would pass its share of {self.tenant_limit} "
                               "(max_pending_tasks_per_tenant)", extra={
                                   "tenant": tenant, "pending": held, "limit": self.tenant_limit,
                                   "bound": "max_pending_tasks_per_tenant"})
        return None

    def rate_limited(self, batch: IngestBatch, roles: Roles | None, state: State) -> Response | None:
        """``None`` when every tenant of ``batch``'s submissions may submit them now (jobs and
        tasks taken from its buckets, from all or from none), else the 429.  What a backend
        submits for its own existing cell (:func:`backend_own`) is not counted."""
        if self.rates is None and self.task_rates is None:
            return None
        cells = known_cells(state) if roles is not None and roles.backend_cells else frozenset()
        jobs = [e for e in batch.events if isinstance(e, JobSubmitted) and not backend_own(roles, e, cells)]
        if not jobs:
            return None
        limits = [(r, c) for r, c in ((self.rates, Counter(e.tenant for e in jobs)),
                                      (self.task_rates, tenant_tasks(list(jobs)))) if r is not None]
        for rates, counts in limits:
            limited = rates.check(counts)
            if limited is not None:
                return refusal(429, "too_many_submissions", limited.message,
                               extra={"tenant": limited.tenant, "limit": rates.rate, "unit": rates.unit},
                               retry_after_s=limited.retry_after_s)
        for rates, counts in limits:
            rates.commit(counts)
        return None

    def unfolded_jobs(self, loop: SchedulerLoop) -> dict[str, JobSubmitted]:
        """The jobs appended through ingest that the loop has not folded yet, with their submission
        (the folded ones are in its state).  Read it, do not keep it."""
        ends = self._job_ends
        while ends and ends[0][0] <= loop.offset:
            del self._jobs[ends.popleft()[1]]
        return self._jobs

    def reserve(self, batch: IngestBatch) -> None:
        """Count the jobs of ``batch`` as the service's while it is being appended."""
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id not in self._jobs:
                self._jobs[event.job_id] = event
                self._appending.add(event.job_id)

    def release(self, batch: IngestBatch) -> None:
        """``batch`` was not appended after all: forget what :meth:`reserve` counted."""
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id in self._appending:
                self._appending.discard(event.job_id)
                del self._jobs[event.job_id]

    def appended(self, first: int, batch: IngestBatch) -> None:
        end = first + len(batch.messages)
        if batch.tasks:
            self._unfolded.append((end, batch.tasks, tenant_tasks(batch.events)))
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id in self._appending:
                self._appending.discard(event.job_id)
                self._job_ends.append((end, event.job_id))

    async def serve(self, request: Request, leading: Leading, roles: Roles | None = None) -> Response:
        """``POST /v1/events``: decode and check the body in a worker thread (the loop keeps
        stepping and answering health meanwhile), then admit it against the pending work and
        append it.  ``leading()`` is asked before and after the decode: the lead may be lost
        meanwhile."""
        if leading()[0] is None:
            return refusal(503, "standby", "this process is not leading")
        content_type = request.headers.get("content-type")
        try:
            if len(request.body) <= INLINE_DECODE_BYTES:  # a few ms: cheaper than the thread hop
                batch = ingest_batch(request.body, content_type, self.settings)
            else:
                batch = await asyncio.get_running_loop().run_in_executor(
                    self.executor, ingest_batch, request.body, content_type, self.settings)
        except IngestError as exc:
            return refusal(exc.status, exc.reason, str(exc), field_of(str(exc)), exc.extra)
        store, loop = leading()
        if store is None or loop is None:
            return refusal(503, "standby", "this process is not leading")
        try:
            if roles is not None:  # (before the checks below: a 403 reveals no other tenant's job state)
                check_events(roles, loop.state, batch.events, self.unfolded_jobs(loop))
                wrong_id = check_job_ids(roles, batch.events) if self.settings.job_ids_by_tenant else None
                if wrong_id is None and self.reserved_tenants is not None:
                    wrong_id = check_reserved_ids(roles, batch.events, self.reserved_tenants(loop.state))
                if wrong_id is not None:
                    raise wrong_id
            batch, duplicates = screened(loop.state, self.unfolded_jobs(loop), batch)
        except Forbidden as exc:
            return forbidden(exc)
        except IngestError as exc:
            return refusal(exc.status, exc.reason, str(exc), extra=exc.extra)
        refused = self.admit(loop, batch)
        if refused is not None:
            return refused
        refused = metadata_refusal(loop.state, self.unfolded_jobs(loop), batch.events,
                                   self.settings.max_metadata_bytes_per_tenant)
        if refused is not None:
            return refused
        refused = None if _accepts_never_fits(request) else never_fitting(loop.state, batch.events)
        if refused is not None:
            return refused
        refused = self.rate_limited(batch, roles, loop.state)  # (last: if refused otherwise, takes nothing)
        if refused is not None:
            return refused
        log_ = store.log(INPUTS)
        self.reserve(batch)  # before the await: a concurrent request sees these jobs
        try:
            messages = signed(batch.messages, request.principal)
            first = await log_.append(messages) if messages else await log_.end_offset()
        except BaseException:
            self.release(batch)
            raise
        self.appended(first, batch)
        answer: dict[str, object] = {"appended": len(batch.messages), "first_offset": first}
        if duplicates:  # (only then: the answer stays what it always was for new events)
            answer["duplicates"] = duplicates
        return json_response(200, answer)


def signed(messages: list[Message], principal: str | None) -> list[Message]:
    """``messages`` with the authenticated ``principal`` in a :data:`PRINCIPAL_HEADER` (the audit
    trail: ``fleetlog history --audit``), replacing any such header the producer sent."""
    if principal is None:
        return messages
    mark = (PRINCIPAL_HEADER, principal.encode())
    marked: dict[Headers, Headers] = {}  # (a request's messages share their headers: marked once)
    out = []
    for m in messages:
        headers = marked.get(m.headers)
        if headers is None:
            headers = marked[m.headers] = (*(h for h in m.headers if h[0] != PRINCIPAL_HEADER), mark)
        out.append(Message(m.value, m.key, headers))
    return out
