"""The producer API: submit, cancel, heartbeat and quota events into the inputs log.

```python
async with await Client.connect(load_config(path, os.environ)) as client:
    offset = await client.submit("train-42", "vision", [TaskGroup(count=4, cpu_milli=16_000, mem_mib=65_536,
                                                                  gpu_count=8, gpu_milli=1000)])
    await client.cancel("train-42", "user asked")
```

Every event is validated before it is sent — encoded and decoded again through the codec, so it
fails here with the same typed reason the scheduler would give (:class:`ClientError.reason`) — and
carries an idempotency key derived from its content (``submit/<job_id>``, ``cancel/<job_id>``,
``heartbeat/<cell>/<node>/<seq>``…): a retry after a timeout resends the same key, and the fold
counts a duplicate as a no-op.

Where the events go: a :class:`~fleetlog.log.base.LogStore` (Kafka, or the file log) — or, when
``fleetlog run --log DIR`` holds the file log's writer lock, the running service's ingest endpoint,
which ``DIR/service.json`` announces (``{"pid": ..., "http": "host:port"}``, ``"scheme": "https"``
when it serves TLS: the client then presents what :func:`fleetlog.auth_client.tls_context` holds).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, cast

import aiohttp
import msgspec
import yarl

from fleetlog.auth_client import auth_headers, refused_why, tls_context, unreachable_why
from fleetlog.events.codec import (
    CONTENT_TYPE_HEADER,
    JSON,
    MSGPACK,
    BadEventError,
    InvalidEventError,
    TooDeepError,
    decode,
    encode,
    envelope,
    may_mention,
)
from fleetlog.events.model import (
    INPUT_TYPES,
    SCHEMA_VERSION,
    Envelope,
    InputEvent,
    JobCancelled,
    JobPayload,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeat,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    SpreadLevel,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
    TopologyLevel,
)
from fleetlog.events.spec import same_submission, spec_differences, submission_spec
from fleetlog.log.base import INPUTS, LogError, LogStore, Message, Shard, chunks
from fleetlog.log.discovery import Announced, announced, running_service  # noqa: F401 (still importable here)
from fleetlog.log.file import FileLogStore, HandOverError, LockedError
from fleetlog.log.location import Located, make_store
from fleetlog.log.routing import CELL_HEADER, Router, RoutingError
from fleetlog.numerals import whole
from fleetlog.retry import Backoff, poll

DEFAULT_PRODUCER_ID: Final = "fleetlog-client"
INGEST_PATH: Final = "/v1/events"
JOBS_PATH: Final = "/v1/jobs/"
HTTP_TIMEOUT_S: Final = 30.0
RETRY_MAX_S: Final = 5.0
HANDOVER_WAIT_S: Final = 60.0
"""How long a producer that gave the file log up waits for the service to announce itself."""
MAX_KEY: Final = 253


class ClientError(Exception):
    """An event that cannot be sent, or a log that cannot be reached.  ``reason`` is the codec's
    (or the service's) stable code when there is one: ``invalid_event``, ``unreachable``…"""

    def __init__(self, message: str, reason: str = "client_error") -> None:
        super().__init__(message)
        self.reason = reason


# -- idempotency keys ---------------------------------------------------------------------------


def _digest(event: InputEvent) -> str:
    return hashlib.blake2b(encode(envelope(event, "-")), digest_size=8).hexdigest()


def _bounded(key: str) -> str:
    """Keys are at most 253 characters: a long one keeps its start and gains a hash of the whole."""
    if len(key) <= MAX_KEY:
        return key
    return key[: MAX_KEY - 17] + "#" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _stem(event: InputEvent) -> str:
    """The part of a key that names what an event is about (a sequence or hash follows)."""
    match event:
        case NodeHeartbeat(cell=cell, node=node):
            return f"heartbeat/{cell}/{node}"
        case NodeRemoved(cell=cell, node=node):
            return f"removed/{cell}/{node}"
        case NodeDrained(cell=cell, node=node):
            return f"drained/{cell}/{node}"
        case TaskStarted(job_id=job_id, task_index=index):
            return f"started/{job_id}/{index}"
        case TaskFailed(job_id=job_id, task_index=index):
            return f"failed/{job_id}/{index}"
        case QuotaSet(tenant=tenant, cell=cell):
            return f"quota/{tenant}/{cell or '*'}"
    return type(event).__name__


def key_of(event: InputEvent, seq: int | None = None) -> str:
    """The idempotency key of ``event``: the same event (and ``seq``) always gets the same key.
    A job is submitted and cancelled once and a task finishes once; other events can repeat, so
    their key ends in the producer's ``seq`` or else a hash of the content."""
    match event:
        case JobSubmitted(job_id=job_id):
            key = f"submit/{job_id}"
        case JobCancelled(job_id=job_id):
            key = f"cancel/{job_id}"
        case TaskFinished(job_id=job_id, task_index=index):
            key = f"finished/{job_id}/{index}"
        case _:
            key = f"{_stem(event)}/{_digest(event) if seq is None else seq}"
    return _bounded(key)


# -- validation ---------------------------------------------------------------------------------


def checked(env: Envelope) -> Envelope:
    """``env`` after the round trip the scheduler's consumer makes; a :class:`ClientError` naming
    the field (JSON path) and the codec's reason code if the scheduler would refuse it."""
    try:
        data = encode(env)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ClientError(
            f"cannot encode {type(env.event).__name__}: {exc}", InvalidEventError.reason
        ) from None
    try:
        decoded = decode(data)
    except BadEventError as exc:
        raise ClientError(exc.message, exc.reason) from None
    if not isinstance(decoded.event, INPUT_TYPES):
        name = type(decoded.event).__name__
        raise ClientError(
            f"{name} is a decision, not an input: only the scheduler writes decisions",
            InvalidEventError.reason,
        )
    return decoded


def keyed(event: InputEvent, producer_id: str, key: str | None = None, seq: int | None = None) -> Envelope:
    """``event`` in a checked envelope with ``key``, or else the key :func:`key_of` derives."""
    env = checked(envelope(event, producer_id, key))  # checked first: the key hashes valid content
    return env if key is not None else msgspec.structs.replace(env, key=key_of(event, seq))


def envelope_from_json(data: bytes, producer_id: str, default_type: str | None = None) -> Envelope:
    """An envelope from JSON text: a full envelope (it has ``schema_version``) or a bare event,
    which gets wrapped (and, without a ``type``, typed ``default_type``).  Validated like
    :func:`checked`; the error names the JSON path, e.g. ``$.event.task_groups[0].cpu_milli``.

    The bytes given are decoded by the codec, as the HTTP API decodes a body (issue 46: one
    decoder, one set of rules): a bare event is wrapped by splicing bytes, not re-encoded, so a
    repeated key is refused (not kept last) and deep nesting is ``too_deep`` (not a traceback)."""
    try:
        top = _TOP_LEVEL.decode(data)
    except msgspec.ValidationError:
        raise _not_an_object(data) from None
    except msgspec.DecodeError as exc:
        raise ClientError(f"not valid JSON: {exc}", "undecodable") from None
    except RecursionError:
        top = {"schema_version": msgspec.Raw(b"0")}  # (the codec names it: too_deep)
    if "schema_version" not in top:
        data = _wrapped(data, producer_id, default_type if "type" not in top else None)
    try:
        env = decode(data, JSON)
    except BadEventError as exc:
        raise ClientError(exc.message, exc.reason) from None
    if env.key is None and isinstance(env.event, INPUT_TYPES):
        env = msgspec.structs.replace(env, key=key_of(env.event))
    return checked(env)


_TOP_LEVEL: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _not_an_object(data: bytes) -> ClientError:
    """Why ``data``, which is no JSON object, is refused: not JSON at all, nested too deeply (as
    the codec says it), or what it holds instead (``list``, ``int``...)."""
    try:
        got = type(msgspec.json.decode(data)).__name__
    except msgspec.DecodeError as exc:
        return ClientError(f"not valid JSON: {exc}", "undecodable")
    except RecursionError:
        deep = TooDeepError("arrays or maps nested too deeply (no event nests more than 6 levels)")
        return ClientError(deep.message, deep.reason)
    return ClientError(f"expected a JSON object, got {got}", InvalidEventError.reason)


def _wrapped(event: bytes, producer_id: str, type_: str | None) -> bytes:
    """The envelope around a bare event's own bytes (``type_``: spliced in as its first key)."""
    if type_ is not None:
        rest = event.lstrip()[1:]
        tag = b'{"type":' + msgspec.json.encode(type_)
        event = tag + (rest if rest.lstrip().startswith(b"}") else b"," + rest)
    producer = msgspec.json.encode(producer_id)
    head = b'{"schema_version":%d,"producer_id":%s,"event":' % (SCHEMA_VERSION, producer)
    return head + event + b"}"


# -- transports ---------------------------------------------------------------------------------


class Sent(msgspec.Struct, frozen=True):
    """What became of envelopes sent: ``appended`` of them went into the log from
    ``first_offset`` on; the ``duplicates`` (their indexes) repeat, with the same spec, what
    the log already holds and were not appended.  With nothing appended, ``first_offset`` is where
    the log ended (or, on a file log read directly, the offset of the original)."""

    first_offset: int
    appended: int
    duplicates: tuple[int, ...] = ()
    shards: tuple[str, ...] = ()
    """With a ``[cells]`` map (:class:`RoutedTransport`): each envelope's shard (``global``,
    ``cells-3``), and in ``offsets`` its offset in that shard's inputs log (``None``: a duplicate)."""
    offsets: tuple[int | None, ...] = ()


class Transport(Protocol):
    """Where checked envelopes go; :meth:`append` returns the offset of the first."""

    async def append(self, envelopes: Sequence[Envelope]) -> int: ...

    async def deliver(self, envelopes: Sequence[Envelope], check: bool = False) -> Sent:
        """:meth:`append`, saying which were duplicates.  ``check``: refuse a job id submitted
        again with another spec and a cancel of an unknown job where that costs a read of the
        log (the file log); the running service always checks."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...


def message_of(env: Envelope) -> Message:
    """The inputs-log record of ``env``: msgpack, keyed by its idempotency key."""
    key = env.key.encode() if env.key is not None else None
    return Message(encode(env), key=key, headers=((CONTENT_TYPE_HEADER, MSGPACK),))


class StoreTransport:
    """Appends to a log store's inputs log; closes the store only if it owns it."""

    def __init__(self, store: LogStore, owned: bool = False, what: str = "the inputs log") -> None:
        self.store, self.owned, self.what = store, owned, what

    async def append(self, envelopes: Sequence[Envelope]) -> int:
        return (await self.deliver(envelopes)).first_offset

    async def deliver(self, envelopes: Sequence[Envelope], check: bool = False) -> Sent:
        """Appends ``envelopes``; with ``check``, :func:`screen_log` first (a file log only: it
        reads the whole inputs log, which on Kafka is the service's work)."""
        duplicates: dict[int, int] = {}
        if check and isinstance(self.store, FileLogStore):
            try:
                duplicates = await screen_log(self.store, envelopes)
            except LogError as exc:
                raise ClientError(f"cannot read {self.what}: {exc}", "unreachable") from None
        kept = [e for i, e in enumerate(envelopes) if i not in duplicates]
        if not kept:
            return Sent(min(duplicates.values()), 0, tuple(sorted(duplicates)))
        try:
            first = await self.store.log(INPUTS).append([message_of(e) for e in kept])
        except HandOverError:
            raise  # nothing was written: FileTransport sends the batch to the service instead
        except LogError as exc:
            raise ClientError(f"cannot append to {self.what}: {exc}", "unreachable") from None
        return Sent(first, len(kept), tuple(sorted(duplicates)))

    async def close(self) -> None:
        if self.owned:
            await self.store.close()

    def describe(self) -> str:
        return self.what


class HttpTransport:
    """POSTs envelopes (a JSON array) to a running service's ingest endpoint (aiohttp).  A 429 or
    503 with ``Retry-After`` is retried after that delay while the timeout allows: every event
    carries its idempotency key, so a resend is harmless."""

    def __init__(self, host: str, port: int, timeout_s: float = HTTP_TIMEOUT_S,
                 headers: dict[str, str] | None = None, scheme: str = "http") -> None:
        self.host, self.port, self.timeout_s, self.scheme = host, port, timeout_s, scheme
        self.headers = dict(headers or {})
        """Sent with every ingest request (a backend's :data:`ACCEPT_NEVER_FITS`)."""
        self._auth = auth_headers()  # FLEETLOG_TOKEN, sent with every request
        self._tls = tls_context() if scheme == "https" else None  # FLEETLOG_CA_FILE, client certificate
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def to(cls, found: Announced, headers: dict[str, str] | None = None) -> HttpTransport:
        """The transport to the service a file log's ``service.json`` announces."""
        return cls(found.host, found.port, headers=headers, scheme=found.scheme)

    def _url(self, path: str) -> yarl.URL:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host  # IPv6
        return yarl.URL.build(scheme=self.scheme, host=host, port=self.port, path=path, encoded=True)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls or True)
            self._session = aiohttp.ClientSession(connector=connector,
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def append(self, envelopes: Sequence[Envelope]) -> int:
        return (await self.deliver(envelopes)).first_offset

    async def deliver(self, envelopes: Sequence[Envelope], check: bool = False) -> Sent:
        """POSTs ``envelopes``; the service checks them (``check`` changes nothing)."""
        body = b"[" + b",".join(encode(e, "json") for e in envelopes) + b"]"
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            status, answer, retry_s = await self._call("POST", INGEST_PATH, body)
            left = deadline - asyncio.get_running_loop().time()
            if retry_s is None or retry_s > left:
                break
            await asyncio.sleep(retry_s)
        if status != 200:
            raise ClientError(
                f"{self.describe()} refused the events (HTTP {status}): {answer.get('error', answer)}",
                str(answer.get("reason", "rejected")),
            )
        duplicates = tuple(int(d["index"]) for d in answer.get("duplicates", ()))
        return Sent(int(answer["first_offset"]), int(answer.get("appended", len(envelopes))), duplicates)

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's state as the running service holds it; ``None`` if it does not know it.  The
        id is percent-encoded whole (a ``/``, ``?``, ``%`` or non-ASCII letter is part of it)."""
        path = JOBS_PATH + urllib.parse.quote(job_id, safe="")
        status, answer, _ = await self._call("GET", path, None)
        if status == 404 and answer.get("reason") == "unknown_job":
            return None
        if status != 200:
            raise ClientError(f"{self.describe()} cannot tell job {job_id!r} (HTTP {status}): "
                              f"{answer.get('error', answer)}", str(answer.get("reason", "rejected")))
        return answer

    async def _call(self, method: str, path: str, body: bytes | None
                    ) -> tuple[int, dict[str, Any], float | None]:
        """Status, JSON answer and the delay to retry after (429/503 with ``Retry-After``)."""
        headers = {"Content-Type": JSON.decode(), **self.headers} if body is not None else {}
        headers.update(self._auth)
        try:
            async with self._client().request(method, self._url(path), data=body, headers=headers) as r:
                raw = await r.read()
                retry = r.headers.get("Retry-After", "") if r.status in (429, 503) else ""
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            why = unreachable_why(f"{self.scheme}://", repr(exc))
            raise ClientError(f"cannot reach {self.describe()}: {why}", "unreachable") from None
        if r.status == 401:
            raise ClientError(refused_why(401, str(_answer(raw).get("message", ""))), "unauthenticated")
        seconds = whole(retry, 9)  # (a Retry-After of "²" is none, not a crash)
        return r.status, _answer(raw), min(float(seconds), RETRY_MAX_S) if seconds is not None else None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def describe(self) -> str:
        return f"the running service at {self.scheme}://{self.host}:{self.port}{INGEST_PATH}"


def _answer(raw: bytes) -> dict[str, Any]:
    """The JSON object of a response body (anything else as ``{"error": text}``)."""
    try:
        answer = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = {"error": raw[:200].decode("utf-8", "replace")}
    return answer if isinstance(answer, dict) else {"error": answer}


class FileTransport:
    """The file log, appended to directly while no service holds it — until a service waits
    for it (``LOCK.intent``): then the log is handed over before the next append and every
    batch from then on goes to the service's ingest endpoint."""

    def __init__(self, config: Located, inner: Transport, shard: Shard = Shard.SINGLE,
                 headers: dict[str, str] | None = None) -> None:
        self.config, self.inner, self.shard, self.headers = config, inner, shard, headers

    async def append(self, envelopes: Sequence[Envelope]) -> int:
        return (await self.deliver(envelopes)).first_offset

    async def deliver(self, envelopes: Sequence[Envelope], check: bool = False) -> Sent:
        try:
            return await self.inner.deliver(envelopes, check)
        except HandOverError:
            await self.inner.close()
            self.inner = await _after_handover(self.config, self.shard, self.headers)
            return await self.inner.deliver(envelopes, check)

    async def close(self) -> None:
        await self.inner.close()

    def describe(self) -> str:
        return self.inner.describe()


SCAN_BATCH: Final = 10_000


async def screen_log(store: LogStore, envelopes: Sequence[Envelope]) -> dict[int, int]:
    """What the service's ingest checks, done by reading the inputs log: the envelopes that
    resubmit a job with the same spec (:func:`fleetlog.events.spec.same_submission`) or cancel a
    job already cancelled, as ``{index: offset of the original}`` (-1: earlier in ``envelopes``).
    A job id submitted again with another spec (``already_exists``) or a cancel of a job never
    submitted (``unknown_job``) raises :class:`ClientError`."""
    ids = sorted({e.event.job_id for e in envelopes if isinstance(e.event, JobSubmitted | JobCancelled)})
    submits, cancels = await _logged_jobs(store, ids)
    duplicates: dict[int, int] = {}
    for index, env in enumerate(envelopes):
        event = env.event
        if isinstance(event, JobSubmitted):
            if event.job_id not in submits:
                submits[event.job_id] = (-1, event)  # later ones in this batch compare with it
                continue
            offset, original = submits[event.job_id]
            if not same_submission(original, event):
                changed = "; ".join(spec_differences(submission_spec(original), submission_spec(event)))
                raise ClientError(f"job {event.job_id!r} already exists with another spec ({changed}); a "
                                  "job id is submitted once: cancel it and submit under a new id",
                                  "already_exists")
            duplicates[index] = offset
        elif isinstance(event, JobCancelled):
            if event.job_id not in submits:
                raise ClientError(f"cannot cancel job {event.job_id!r}: no such job", "unknown_job")
            if event.job_id in cancels:
                duplicates[index] = cancels[event.job_id]
    return duplicates


async def _logged_jobs(store: LogStore, ids: Sequence[str]
                       ) -> tuple[dict[str, tuple[int, JobSubmitted]], dict[str, int]]:
    """The first submission of each of ``ids`` in the inputs log (offset, event), and the
    offset of the first cancel that follows it — what the fold takes.  A record is decoded only
    if it may mention one of the ids (:func:`fleetlog.events.codec.may_mention`)."""
    submits: dict[str, tuple[int, JobSubmitted]] = {}
    cancels: dict[str, int] = {}
    if not ids:
        return submits, cancels
    needles, wanted = [i.encode() for i in ids], frozenset(ids)
    async for records in chunks(store.log(INPUTS), 0, SCAN_BATCH):
        for record in records:
            kind = record.header(CONTENT_TYPE_HEADER) if record.headers else None
            if not may_mention(record.value, kind, needles):
                continue
            try:
                event = decode(record.value, kind).event
            except BadEventError:
                continue  # the consumer dead-letters it: the fold never sees it
            if isinstance(event, JobSubmitted) and event.job_id in wanted:
                submits.setdefault(event.job_id, (record.offset, event))
            elif isinstance(event, JobCancelled) and event.job_id in submits:
                cancels.setdefault(event.job_id, record.offset)
    return submits, cancels


async def _direct(config: Located, shard: Shard = Shard.SINGLE) -> StoreTransport:
    store = FileLogStore(str(config.log.dir), shard=shard, fsync=config.log.fsync, yields=True)
    await store.open()
    where = f"the file log at {config.log.dir}" + ("" if shard == Shard.SINGLE else f", shard {shard}")
    return StoreTransport(store, owned=True, what=where)


def _is_some(value: object) -> bool:
    return value is not None


async def _after_handover(config: Located, shard: Shard = Shard.SINGLE,
                          headers: dict[str, str] | None = None) -> Transport:
    """The service that took (or is taking) the file log over, once it announces itself; the
    log (of ``shard``) itself again if that service went away without taking it."""
    directory = Path(str(config.log.dir))

    async def where() -> Transport | None:
        found = announced(directory)
        if found is not None:
            return HttpTransport.to(found, headers)
        try:
            return await _direct(config, shard)
        except LockedError:  # HandOverError too: the service is taking the log, wait for it
            return None
        except LogError as exc:
            raise ClientError(f"cannot open the file log at {directory}: {exc}", "unreachable") from None

    found = await poll(where, _is_some, within_s=HANDOVER_WAIT_S, backoff=Backoff(0.05, factor=1))
    if found is not None:
        return found
    raise ClientError(f"the service waiting for the file log at {directory} did not announce itself in "
                      f"{HANDOVER_WAIT_S:.0f} s (is it stalled? see its /healthz)", "unreachable")


async def open_transport(config: Located) -> Transport:
    """The configured inputs log, or the running service that holds the file log."""
    if config.log.dir is not None:
        found = announced(Path(config.log.dir))
        if found is not None:
            return HttpTransport.to(found)
        try:
            return FileTransport(config, await _direct(config))
        except HandOverError:
            return FileTransport(config, await _after_handover(config))
        except LogError as exc:
            raise ClientError(f"cannot open the file log at {config.log.dir}: {exc}", "unreachable") from None
    else:
        store: LogStore = make_store(config)
        what = f"Kafka at {config.kafka.bootstrap_servers}" if config.kafka else "the log"
    try:
        await store.open()
    except LogError as exc:
        raise ClientError(f"cannot open {what}: {exc}", "unreachable") from None
    return StoreTransport(store, owned=True, what=what)


# -- routing by cell (a [cells] map) ------------------------------------------------------------

ShardOpener = Callable[[Shard], Awaitable[Transport]]


class RoutedTransport:
    """With a ``[cells]`` map: each batch split by partition (:class:`~fleetlog.log.routing.Router`)
    and each part delivered to its shard's inputs log, whose transport is opened on first use (one
    per shard, kept).  Every event is routed, and every part's transport opened, before anything
    is written: a cell missing from the map or an unreachable shard writes nothing.  Atomic **per
    partition**: each part is appended whole or not at all; a failure between two parts leaves the
    earlier parts written (resending the batch is harmless: every event carries its key).  With
    ``whole`` (a running service's ingest, which routes by the same rule), the batch is checked
    here and sent there in one request."""

    def __init__(self, router: Router, opener: ShardOpener | None = None, what: str = "the logs",
                 whole: Transport | None = None) -> None:
        self.router, self.opener, self.what, self.whole = router, opener, what, whole
        self.transports: dict[Shard, Transport] = {}

    async def append(self, envelopes: Sequence[Envelope]) -> int:
        return (await self.deliver(envelopes)).first_offset

    def parts(self, envelopes: Sequence[Envelope]) -> list[tuple[Shard, list[int]]]:
        """The batch by shard; a :class:`ClientError` (``unknown_cell``, ``cell_needed``) if an
        event has no partition."""
        try:
            return self.router.split([cast(InputEvent, e.event) for e in envelopes])
        except RoutingError as exc:
            raise ClientError(str(exc), exc.reason) from None

    async def deliver(self, envelopes: Sequence[Envelope], check: bool = False) -> Sent:
        parts = self.parts(envelopes)
        if self.whole is not None:
            return await self.whole.deliver(envelopes, check)
        for shard, _ in parts:
            await self._transport(shard)
        shards: list[str] = [""] * len(envelopes)
        offsets: list[int | None] = [None] * len(envelopes)
        for shard, indexes in parts:
            sent = await self.transports[shard].deliver([envelopes[i] for i in indexes], check)
            at, skipped = sent.first_offset, frozenset(sent.duplicates)
            for local, index in enumerate(indexes):
                shards[index] = str(shard)
                if local not in skipped:
                    offsets[index], at = at, at + 1
        return _gathered(parts, shards, offsets)

    async def _transport(self, shard: Shard) -> Transport:
        found = self.transports.get(shard)
        if found is None:
            assert self.opener is not None
            found = self.transports[shard] = await self.opener(shard)
        return found

    async def close(self) -> None:
        transports, self.transports = list(self.transports.values()), {}
        if self.whole is not None:
            transports.append(self.whole)
        for transport in transports:
            await transport.close()

    def describe(self) -> str:
        return self.whole.describe() if self.whole is not None else self.what


def _gathered(parts: list[tuple[Shard, list[int]]], shards: list[str], offsets: list[int | None]) -> Sent:
    """One :class:`Sent` of the parts: the first offset is the first appended event's (in its
    shard), or the first part's end."""
    duplicates = tuple(i for i, offset in enumerate(offsets) if offset is None)
    first = next((o for o in offsets if o is not None), 0)
    return Sent(first, len(offsets) - len(duplicates), duplicates, tuple(shards), tuple(offsets))


def cell_headers(router: Router) -> dict[str, str]:
    """The ingest header naming a routed producer's cell (none without a map or a cell)."""
    return {CELL_HEADER: router.cell} if router.routed and router.cell is not None else {}


async def _open_shard(config: Located, shard: Shard, headers: dict[str, str]) -> Transport:
    """The inputs log of ``shard``: the file log's shard directory (handed over like the single
    log's), or its Kafka topic partition."""
    if config.log.dir is not None:
        try:
            return FileTransport(config, await _direct(config, shard), shard, headers)
        except HandOverError:
            return FileTransport(config, await _after_handover(config, shard, headers), shard, headers)
        except LogError as exc:
            raise ClientError(f"cannot open the file log at {config.log.dir}, shard {shard}: {exc}",
                              "unreachable") from None
    store = make_store(config, shard)
    what = f"Kafka at {config.kafka.bootstrap_servers}, shard {shard}" if config.kafka else f"shard {shard}"
    try:
        await store.open()
    except LogError as exc:
        raise ClientError(f"cannot open {what}: {exc}", "unreachable") from None
    return StoreTransport(store, owned=True, what=what)


def router_of(config: Located, cell: str | None = None) -> Router:
    """The routing rule of ``config``'s ``[cells]`` map (``Location.cells``, ``Config.cells``; none:
    today's single shard) for a producer of ``cell``; a :class:`ClientError` if the map does not
    name ``cell``."""
    try:
        return Router(getattr(config, "cells", ()), cell)
    except RoutingError as exc:
        raise ClientError(str(exc), exc.reason) from None


async def open_routed(config: Located, router: Router) -> Transport:
    """The transport of a configuration with a map: the running service that holds the file log
    (it routes; the producer's cell in :data:`~fleetlog.log.routing.CELL_HEADER`), else each
    shard's inputs log directly."""
    headers = cell_headers(router)
    if config.log.dir is not None:
        found = announced(Path(config.log.dir))
        if found is not None:
            return RoutedTransport(router, whole=HttpTransport.to(found, headers))
        what = f"the file log at {config.log.dir}"
    else:
        what = f"Kafka at {config.kafka.bootstrap_servers}" if config.kafka else "the logs"

    async def opener(shard: Shard) -> Transport:
        return await _open_shard(config, shard, headers)

    return RoutedTransport(router, opener, what)


# -- the client ---------------------------------------------------------------------------------


class Client:
    """Sends input events.  ``Client(store)`` appends to an open store (the caller closes it);
    :meth:`connect` opens what a configuration names (and :meth:`close` closes it)."""

    def __init__(self, target: LogStore | Transport, producer_id: str = DEFAULT_PRODUCER_ID) -> None:
        self.transport: Transport = StoreTransport(target) if isinstance(target, LogStore) else target
        self.producer_id = producer_id

    @classmethod
    async def connect(cls, config: Located, producer_id: str = DEFAULT_PRODUCER_ID,
                      cell: str | None = None) -> Client:
        """A client of the logs ``config`` names.  With a ``[cells]`` map each event goes to its
        partition (:mod:`fleetlog.log.routing`); ``cell`` is the producer's cell, where its task
        events go (a cell the map does not name: :class:`ClientError` ``unknown_cell``).
        Without a map ``cell`` changes nothing."""
        router = router_of(config, cell)
        if router.routed:
            return cls(await open_routed(config, router), producer_id)
        return cls(await open_transport(config), producer_id)

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def wrap(self, event: InputEvent, key: str | None = None, seq: int | None = None) -> Envelope:
        """``event`` in a checked envelope from this producer, with its idempotency key."""
        return keyed(event, self.producer_id, key, seq)

    async def send(self, events: Iterable[InputEvent | Envelope]) -> int:
        """Check every event (nothing is sent if one is bad), then append them in order, in one
        batch; returns the offset of the first (with a ``[cells]`` map: in its partition; see
        :meth:`deliver` for each event's)."""
        return (await self.deliver(events)).first_offset

    async def deliver(self, events: Iterable[InputEvent | Envelope]) -> Sent:
        """:meth:`send`, saying where each event went: with a ``[cells]`` map the batch is split
        by partition, each part appended whole (atomic per partition), ``Sent.shards`` and
        ``Sent.offsets`` name each event's shard and offset."""
        envelopes = [checked(e) if isinstance(e, Envelope) else self.wrap(e) for e in events]
        if not envelopes:
            raise ClientError("nothing to send")
        return await self.transport.deliver(envelopes)

    async def submit(
        self,
        job: JobSubmitted | str,
        tenant: str | None = None,
        task_groups: Iterable[TaskGroup] = (),
        *,
        queue: str = "default",
        priority: int = 0,
        allowed_cells: Iterable[str] = (),
        required_topology: TopologyLevel | None = None,
        expected_duration_ms: int | None = None,
        spread: SpreadLevel | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        payload: JobPayload | None = None,
        key: str | None = None,
    ) -> int:
        """Submit a gang job: a :class:`JobSubmitted`, or its fields.  Returns the offset.
        ``labels``, ``annotations`` and ``payload`` (what it runs: a command or a script, env,
        image) travel with the job for the backends; the scheduler never reads them
        (docs/events.md, "Labels, annotations and payload")."""
        if not isinstance(job, JobSubmitted):
            if tenant is None:
                raise ClientError("submit needs a tenant", InvalidEventError.reason)
            job = _built(
                JobSubmitted,
                job_id=job,
                tenant=tenant,
                task_groups=tuple(task_groups),
                queue=queue,
                priority=priority,
                allowed_cells=tuple(allowed_cells),
                required_topology=required_topology,
                expected_duration_ms=expected_duration_ms,
                spread=spread,
                labels=dict(labels or {}),
                annotations=dict(annotations or {}),
                payload=payload,
            )
        return await self.transport.append([self.wrap(job, key)])

    async def cancel(self, job_id: str, reason: str = "", *, key: str | None = None) -> int:
        """Cancel a job, pending or running.  Returns the offset."""
        return await self.transport.append([self.wrap(JobCancelled(job_id=job_id, reason=reason), key)])

    async def heartbeat(self, heartbeat: NodeHeartbeat, *, seq: int | None = None) -> int:
        """Report a node.  ``seq`` (the node agent's own counter) makes the key; without it the
        key is a hash of the content.  Returns the offset."""
        return await self.transport.append([self.wrap(heartbeat, seq=seq)])

    async def quota(self, quota: QuotaSet, *, key: str | None = None) -> int:
        """Set a tenant's quota.  Returns the offset."""
        return await self.transport.append([self.wrap(quota, key)])

    async def policy(self, policy: PolicySet, *, key: str | None = None) -> int:
        """Set the API's authorization policy, whole (a ``policy-admin``'s).  Returns the offset."""
        return await self.transport.append([self.wrap(policy, key)])

    def describe(self) -> str:
        return self.transport.describe()


def _built(cls: type[JobSubmitted], **fields: Any) -> JobSubmitted:
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise ClientError(f"invalid {cls.__name__}: {exc}", InvalidEventError.reason) from None
