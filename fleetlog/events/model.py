"""The event vocabulary: frozen, tagged msgspec structs, past-tense names, units in names.

Evolution rules (msgspec's, and ours): events are only ever extended.  A new
field gets a default; nothing is renamed, re-typed or removed; the ``type`` tag
of an event never changes.  Every integer and every collection is bounded, so a
malformed or hostile producer gets a clear validation error instead of an
overflow deep inside the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import pairwise
from operator import attrgetter
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

SCHEMA_VERSION: Final = 1
"""The envelope version this code writes; :data:`SUPPORTED_SCHEMA_VERSIONS` it reads."""
SUPPORTED_SCHEMA_VERSIONS: Final = frozenset({1})

MAX_CPU_MILLI: Final = 1 << 40  # about a billion cores: far beyond any node, far below int64
MAX_MEM_MIB: Final = 1 << 40  # one exbibyte
MAX_GPUS_PER_NODE: Final = 64
MAX_TASKS_PER_GROUP: Final = 100_000
MAX_TASK_GROUPS: Final = 64
MAX_TIME_MS: Final = 1 << 53  # about 285,000 years
MAX_DECISIONS_PER_BATCH: Final = 1_000_000

NOT_PRINTABLE: Final = (
    "\\x00-\\x20\\x7f-\\xa0\\xad\\u061c\\u1680\\u180e\\u2000-\\u200f\\u2028-\\u202f"
    "\\u205f-\\u206f\\u3000\\ufeff\\ufff9-\\ufffb\\ud800-\\udfff"
)
"""What an identifier may not hold, as a regular-expression class body: controls (C0, DEL, C1),
every space and line or paragraph separator, soft hyphen, zero-width and bidirectional format
characters (U+200B-U+200F, U+202A-U+202E, U+2066-U+2069), the BOM, surrogates.  A fixed list,
not a Unicode category, so every build (and a producer's validator) draws the line alike."""
PRINTABLE_NAME: Final = f"^[^{NOT_PRINTABLE}]+$(?!\\n)"
"""The pattern of an identifier, as the JSON Schema states it.  ``(?!\\n)``: Python's ``$`` also
matches before a final newline.  The codec enforces it (:data:`ID_TEXT`), not msgspec: a
``Meta(pattern=...)`` check costs ~1.7 us per string, tripling msgpack decode time."""
_ID_SAYS: Final = "printable, no spaces (docs/events.md)"
_ID_SCHEMA: Final = {"pattern": PRINTABLE_NAME, "description": _ID_SAYS}
_OPTIONAL_ID_SCHEMA: Final = {"pattern": f"^[^{NOT_PRINTABLE}]*$(?!\\n)", "description": _ID_SAYS}
Name = Annotated[str, Meta(min_length=1, max_length=253, extra_json_schema=_ID_SCHEMA)]
"""An identifier: job, tenant, queue, cell, node, GPU model. Printable, no spaces."""
OptionalName = Annotated[str, Meta(max_length=253, extra_json_schema=_OPTIONAL_ID_SCHEMA)]
"""A :data:`Name` that may be empty (``""``: none, or every cell)."""
Text = Annotated[str, Meta(max_length=4096)]
LabelValue = Annotated[str, Meta(max_length=253)]
CpuMilli = Annotated[int, Meta(ge=0, le=MAX_CPU_MILLI)]
MemMiB = Annotated[int, Meta(ge=0, le=MAX_MEM_MIB)]
GpuCount = Annotated[int, Meta(ge=0, le=MAX_GPUS_PER_NODE)]
GpuMilli = Annotated[int, Meta(ge=0, le=1000)]
TotalGpuMilli = Annotated[int, Meta(ge=0, le=MAX_GPUS_PER_NODE * 1000 * 1_000_000)]
DurationMs = Annotated[int, Meta(ge=0, le=MAX_TIME_MS)]
Offset = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
Priority = Annotated[int, Meta(ge=0, le=1_000_000)]
TaskIndex = Annotated[int, Meta(ge=0, le=MAX_TASKS_PER_GROUP * MAX_TASK_GROUPS)]
ExitCode = Annotated[int, Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
WeightMilli = Annotated[int, Meta(ge=1, le=1_000_000_000)]
TopologyLevel = Literal["block", "rack", "host"]
TOPOLOGY_LEVELS: Final[tuple[TopologyLevel, ...]] = ("block", "rack", "host")


class _Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """Common settings: immutable, strict on input, compact on output.  ``gc=False``: events hold
    only strings, numbers and containers of them, never cycles, so the cyclic garbage collector
    need not track them — without this, decoding a large batch spends 80% of its time in GC."""


class _Event(_Struct, frozen=True, tag_field="type", tag=True):
    """Base of every event: tagged with its class name in the ``type`` field."""


# --- inputs -----------------------------------------------------------------------------

MAX_TASKS_PER_JOB: Final = 10_000
"""The most tasks one job may have (over all its groups).  A job's placement is one
``JobPlaced`` decision, which can never be split over decision records, so this bounds the
largest decision: 10,000 tasks on 253-character node names with 64 GPU indices each encode in
3.3 MB, inside one decision record (``fleetlog.events.parts.DECISION_RECORD_BYTES``, 3.5 MiB).
``tests/events/test_parts.py`` checks that worst case."""


MAX_CONSTRAINT_ITEMS: Final = 64
"""The most entries in one node selector, affinity term list, term, toleration list, value
list or taint list (Kubernetes has no such bound; 64 is far past what a pod spec carries)."""
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
TAINT_EFFECTS: Final[tuple[TaintEffect, ...]] = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class Taint(_Struct, frozen=True):
    """A node's taint, as Kubernetes defines it: a task that does not tolerate a ``NoSchedule``
    or ``NoExecute`` taint is never placed on the node, and ``NoExecute`` also evicts the
    running gangs that do not tolerate it. ``PreferNoSchedule`` is advisory (placements ignore it)."""

    key: Name
    effect: TaintEffect
    value: LabelValue = ""


class Toleration(_Struct, frozen=True):
    """What taints a task tolerates (Kubernetes' rules): ``Equal`` matches a taint of this key
    and value, ``Exists`` one of this key whatever its value, and ``Exists`` with an empty
    key every taint; an empty ``effect`` matches every effect."""

    key: OptionalName = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    def __post_init__(self) -> None:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration with an empty key must use operator Exists")


class NodeLabel(_Struct, frozen=True):
    """One entry of a node selector: the node's label ``key`` must be ``value``."""

    key: Name
    value: LabelValue


class NodeSelectorRequirement(_Struct, frozen=True):
    """One label test: ``In``/``NotIn`` a set of values (a node without the label is ``NotIn``
    every set), ``Exists``/``DoesNotExist`` (no values)."""

    key: Name
    operator: SelectorOperator
    values: Annotated[tuple[LabelValue, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()

    def __post_init__(self) -> None:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")


class NodeSelectorTerm(_Struct, frozen=True):
    """The requirements a node must meet all of (AND)."""

    match_expressions: Annotated[
        tuple[NodeSelectorRequirement, ...], Meta(min_length=1, max_length=MAX_CONSTRAINT_ITEMS)
    ]


class PreferredTerm(_Struct, frozen=True):
    """A soft node-affinity term (Kubernetes' ``PreferredSchedulingTerm``): among the nodes
    where a task scores best (a tie), it goes to the one whose matching terms weigh most."""

    weight: Annotated[int, Meta(ge=1, le=100)]
    preference: NodeSelectorTerm


SpreadLevel = Literal["host"]
SPREAD_LEVELS: Final[tuple[SpreadLevel, ...]] = ("host",)


# --- a job's metadata and payload: carried in the log, never read by the core -------------

MAX_JOB_LABELS: Final = 64
"""The most labels one job carries (each key a :data:`Name`, each value printable without spaces,
at most 253 characters, maybe empty: Kubernetes' label values fit)."""
MAX_JOB_ANNOTATIONS: Final = 64
MAX_JOB_METADATA_BYTES: Final = 16_384
"""The most bytes (UTF-8) of one job's labels and annotations, keys and values together: the
scheduler's state holds them for the read API while the job lives, so they are bounded by what
that memory may cost (10,000 jobs at this bound: 164 MB, where 64 KiB of annotations and 64 full
labels took 1.1 GB; issue 46).  Past it: ``invalid_event``."""
MAX_ANNOTATION_CHARS: Final = MAX_JOB_METADATA_BYTES
"""The most characters of one job's annotations, keys and values together (16 Ki: Kubernetes
allows 256 KiB, but fleetlog holds them in memory; :data:`MAX_JOB_METADATA_BYTES` bounds their
bytes with the labels')."""
MAX_COMMAND_ARGS: Final = 4096
MAX_ARG_CHARS: Final = 32_000
"""The most characters of one command argument or environment value: at four bytes a character,
with the variable's name, still under Linux's 128 KiB bound on one exec string (MAX_ARG_STRLEN)."""
MAX_ENV_VARS: Final = 256
MAX_IMAGE_CHARS: Final = 1024
MAX_PAYLOAD_CHARS: Final = 262_144
"""The most characters of a payload: its command's arguments, script, environment names and
values and image together (256 Ki: at most 1 MiB of UTF-8, so a submission at every bound still
fits one record, and the Slurm backend's batch script stays under sbatch's 4 MB)."""
ENV_NAME: Final = "^[A-Za-z_][A-Za-z0-9_]*$(?!\\n)"
"""An environment variable's name: the portable shell name (POSIX), so no quoting is ever needed."""
SCRIPT_START: Final = "^#![ \\t]*[^\\s\\x00]"
"""A script names its interpreter on its first line (``#!/bin/bash``), as ``sbatch`` asks."""
_NO_NUL: Final = {"pattern": "^[^\\x00]*$", "description": "no NUL character"}
_NO_NUL_SCRIPT: Final = {"pattern": f"{SCRIPT_START}[^\\x00]*$", "description": "#!interpreter first; no NUL"}
LabelKey = Name
LabelText = OptionalName
AnnotationValue = Annotated[str, Meta(max_length=MAX_ANNOTATION_CHARS)]
Arg = Annotated[str, Meta(max_length=MAX_ARG_CHARS, extra_json_schema=_NO_NUL)]
EnvName = Annotated[str, Meta(min_length=1, max_length=253, extra_json_schema={"pattern": ENV_NAME})]
EnvValue = Annotated[str, Meta(max_length=MAX_ARG_CHARS, extra_json_schema=_NO_NUL)]
ScriptText = Annotated[str, Meta(max_length=MAX_PAYLOAD_CHARS, extra_json_schema=_NO_NUL_SCRIPT)]
ImageRef = Annotated[str, Meta(max_length=MAX_IMAGE_CHARS, extra_json_schema=_OPTIONAL_ID_SCHEMA)]
_ENV_NAME_RE: Final = re.compile(ENV_NAME)
_SCRIPT_START_RE: Final = re.compile(SCRIPT_START)


class JobPayload(_Struct, frozen=True):
    """What a job runs.  Opaque to the scheduler — the core never reads it, and it is no part of a
    submission's identity (:mod:`fleetlog.events.spec`) — it is for the backends that run the
    work (the Slurm backend: docs/slurm.md).  Every field is optional; together they hold at most
    :data:`MAX_PAYLOAD_CHARS` characters, and no string holds a NUL (no exec or shell could pass it).

    ``command`` is an argv list, run as it is — no shell, nothing expanded; ``script`` a batch
    script whose first line names its interpreter (``#!/bin/bash``); a payload has one or the
    other, or neither (the backend's default workload runs).  ``env`` is set for it (names are
    portable shell names), ``image`` the container image it runs in (printable, no spaces)."""

    command: Annotated[tuple[Arg, ...], Meta(max_length=MAX_COMMAND_ARGS)] = ()
    script: ScriptText = ""
    env: Annotated[dict[EnvName, EnvValue], Meta(max_length=MAX_ENV_VARS)] = {}
    image: ImageRef = ""

    def __post_init__(self) -> None:
        if self.command and self.script:
            raise ValueError("a payload has a command or a script, not both")
        if self.command and self.command[0][:1] in ("", "-"):
            raise ValueError("a command's program (its first argument) is not empty, nor starts with -")
        if self.script and _SCRIPT_START_RE.match(self.script) is None:
            raise ValueError("a script starts with #! and its interpreter (e.g. #!/bin/sh)")
        bad = [name for name in self.env if _ENV_NAME_RE.match(name) is None]
        if bad:
            raise ValueError(f"env name {bad[0][:100]!r} is not a shell name ([A-Za-z_][A-Za-z0-9_]*)")
        texts = (*self.command, self.script, *self.env.values())
        if any("\x00" in text for text in texts):
            raise ValueError("a payload's command, script and env values hold no NUL character")
        chars = sum(map(len, texts)) + sum(map(len, self.env)) + len(self.image)
        if chars > MAX_PAYLOAD_CHARS:
            raise ValueError(f"a payload holds at most {MAX_PAYLOAD_CHARS} characters, not {chars}")


class TaskGroup(_Struct, frozen=True):
    """``count`` identical tasks. ``gpu_milli`` is the share of *each* of the ``gpu_count`` GPUs:
    1000 for whole GPUs, less than 1000 only with ``gpu_count == 1`` (a fractional GPU)."""

    count: Annotated[int, Meta(ge=1, le=MAX_TASKS_PER_GROUP)]
    cpu_milli: CpuMilli
    mem_mib: MemMiB
    gpu_count: GpuCount = 0
    gpu_milli: GpuMilli = 0
    gpu_models: Annotated[tuple[Name, ...], Meta(max_length=64)] = ()
    name: Annotated[str, Meta(max_length=253)] = ""
    node_selector: Annotated[tuple[NodeLabel, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()
    """Labels a node must carry with exactly these values (Kubernetes' ``nodeSelector``, as a
    list of ``{"key", "value"}``: a map would make task groups unhashable, and the fold keys
    runs of submissions by their task groups)."""
    node_affinity: Annotated[tuple[NodeSelectorTerm, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()
    """Required node affinity: a node must meet at least one term (OR of ANDs, Kubernetes'
    ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``); empty: any node."""
    tolerations: Annotated[tuple[Toleration, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()
    preferred_affinity: Annotated[tuple[PreferredTerm, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()
    """Soft node affinity (Kubernetes' ``preferredDuringSchedulingIgnoredDuringExecution``):
    never excludes a node; among the nodes where the placement scores alike, the one whose
    matching terms' weights sum highest is taken (docs/scheduling.md, "Preferred affinity")."""

    def __post_init__(self) -> None:
        if self.gpu_count == 0 and self.gpu_milli != 0:
            raise ValueError("gpu_milli must be 0 when gpu_count is 0")
        if self.gpu_count > 0 and self.gpu_milli == 0:
            raise ValueError("gpu_milli must be 1..1000 when gpu_count > 0")
        if self.gpu_count > 1 and self.gpu_milli != 1000:
            raise ValueError("a task with several GPUs must take whole GPUs (gpu_milli == 1000)")


class JobSubmitted(_Event, frozen=True):
    """A gang job: every task of every group is placed at once, or none is."""

    job_id: Name
    tenant: Name
    task_groups: Annotated[tuple[TaskGroup, ...], Meta(min_length=1, max_length=MAX_TASK_GROUPS)]
    queue: Name = "default"
    priority: Priority = 0
    allowed_cells: Annotated[tuple[Name, ...], Meta(max_length=1024)] = ()
    required_topology: TopologyLevel | None = None
    expected_duration_ms: DurationMs | None = None
    spread: SpreadLevel | None = None
    """``"host"``: at most one of the job's tasks on any one node (pod anti-affinity on the
    host level, for gangs that must not share a machine's failure or bandwidth); with
    ``required_topology`` too, the tasks are on distinct hosts of one domain."""
    labels: Annotated[dict[LabelKey, LabelText], Meta(max_length=MAX_JOB_LABELS)] = {}
    """What the job is, to select it by (``team``, ``app.kubernetes.io/name``): keys are
    identifiers, values printable without spaces (both checked by the codec, like every
    :data:`Name`).  Kept in the log; the scheduler does not read them."""
    annotations: Annotated[dict[LabelKey, AnnotationValue], Meta(max_length=MAX_JOB_ANNOTATIONS)] = {}
    """Free text about the job (any characters), at most :data:`MAX_ANNOTATION_CHARS` in all, and
    with the labels at most :data:`MAX_JOB_METADATA_BYTES` bytes.  Kept in the log; the scheduler
    does not read them."""
    payload: JobPayload | None = None
    """What the job runs, for the backends (:class:`JobPayload`); the scheduler never reads it."""

    def __post_init__(self) -> None:
        tasks = sum(g.count for g in self.task_groups)
        if tasks > MAX_TASKS_PER_JOB:
            raise ValueError(f"a job may have at most {MAX_TASKS_PER_JOB} tasks, not {tasks}")
        if self.annotations:
            chars = sum(len(k) + len(v) for k, v in self.annotations.items())
            if chars > MAX_ANNOTATION_CHARS:
                raise ValueError(f"annotations hold at most {MAX_ANNOTATION_CHARS} characters "
                                 f"(keys and values), not {chars}")
        if self.labels or self.annotations:
            size = metadata_bytes(self.labels, self.annotations)
            if size > MAX_JOB_METADATA_BYTES:
                raise ValueError(f"labels and annotations hold at most {MAX_JOB_METADATA_BYTES} bytes "
                                 f"(UTF-8, keys and values together), not {size}")


def metadata_bytes(labels: dict[str, str], annotations: dict[str, str]) -> int:
    """UTF-8 bytes of a job's labels and annotations, keys and values: what the per-job bound
    (:data:`MAX_JOB_METADATA_BYTES`) and the service's per-tenant bound count.  (An annotation may
    hold a lone surrogate a JSON escape made: counted as UTF-8 would write it, never an error.)"""
    return sum(_utf8_len(k) + _utf8_len(v) for m in (labels, annotations) for k, v in m.items())


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class JobCancelled(_Event, frozen=True):
    job_id: Name
    reason: Text = ""


class NodeHeartbeat(_Event, frozen=True):
    """A node's state as its cell sees it. ``topology`` is its path, e.g. (block, rack, host).
    Keep sending it, for every node, well within the scheduler's node timeout (60 s of log time
    unless ``service.node_timeout_ms`` / ``fleetlog run --node-timeout`` says otherwise): a node
    silent that long is taken down and every job with a task on it is requeued."""

    cell: Name
    node: Name
    cpu_milli: CpuMilli
    mem_mib: MemMiB
    gpu_count: GpuCount = 0
    gpu_model: OptionalName = ""
    topology: Annotated[tuple[Name, ...], Meta(max_length=3)] = ()
    labels: Annotated[dict[Name, LabelValue], Meta(max_length=64)] = {}
    healthy: bool = True
    taints: Annotated[tuple[Taint, ...], Meta(max_length=MAX_CONSTRAINT_ITEMS)] = ()
    """The node's taints now (a heartbeat without them: none). Adding a ``NoExecute`` taint
    requeues every gang on the node that does not tolerate it."""
    unschedulable: bool = False
    """Cordoned: no new task is placed on the node; what runs there stays."""
    foreign_cpu_milli: CpuMilli = 0
    """Of ``cpu_milli``, what work this scheduler does not own holds now (a job submitted
    straight to Slurm, a pod of another scheduler, a DaemonSet): nothing is placed in it."""
    foreign_mem_mib: MemMiB = 0
    """Of ``mem_mib``, what work this scheduler does not own holds now."""
    foreign_gpus: GpuCount = 0
    """Of ``gpu_count``, the whole GPUs work this scheduler does not own holds now."""

    def __post_init__(self) -> None:
        if self.gpu_count > 0 and not self.gpu_model:
            raise ValueError("a node with GPUs must name its gpu_model")
        for name, held, total in (("foreign_cpu_milli", self.foreign_cpu_milli, self.cpu_milli),
                                  ("foreign_mem_mib", self.foreign_mem_mib, self.mem_mib),
                                  ("foreign_gpus", self.foreign_gpus, self.gpu_count)):
            if held > total:
                raise ValueError(f"{name} {held} is more than the node has ({total})")


class NodeRemoved(_Event, frozen=True):
    cell: Name
    node: Name


class NodeDrained(_Event, frozen=True):
    """An operator's drain (``fleetlog node drain``): no new task is placed on the node until a
    ``NodeDrained`` with ``drained=false`` undoes it; what runs there stays. Unlike a heartbeat's
    ``unschedulable`` (the backend's view, which its next heartbeat restates), a drain holds
    whatever the heartbeats say, until undone or the node is removed."""

    cell: Name
    node: Name
    drained: bool = True
    reason: Text = ""


class TaskStarted(_Event, frozen=True):
    job_id: Name
    task_index: TaskIndex
    node: Name


class TaskFinished(_Event, frozen=True):
    job_id: Name
    task_index: TaskIndex
    exit_code: ExitCode = 0


class TaskFailed(_Event, frozen=True):
    job_id: Name
    task_index: TaskIndex
    reason: Text = ""
    exit_code: ExitCode | None = None
    requeue: bool = False
    """The backend withdrew the placement: the task could not run where it was placed (Slurm kept
    it pending behind work fleetlog does not own).  The scheduler requeues the whole gang, noting
    ``reason``, and decides again — the job is not failed.  Absent (old logs): the job fails."""


class Tick(_Event, frozen=True):
    """Log time moves on: the leading scheduler appends one to its inputs log when nothing else
    was appended for ``service.tick_every_ms``, so nodes whose heartbeats stopped go down on time
    (not at the next input, all at once) — and replay, reading the same ticks, sees the same.
    It carries nothing: its log timestamp is the time.  Only the scheduler writes it (ingest
    refuses one from a producer: ``not_an_input``)."""


class Resources(_Struct, frozen=True):
    cpu_milli: CpuMilli = 0
    mem_mib: MemMiB = 0
    gpu_milli: TotalGpuMilli = 0


class QuotaSet(_Event, frozen=True):
    """A tenant's guaranteed (nominal) quota in a cell ("" = every cell), how much idle quota
    it may borrow from its cohort on top, and its fair-share weight (milli-units)."""

    tenant: Name
    nominal: Resources
    cell: OptionalName = ""
    cohort: OptionalName = ""
    borrowing_limit: Resources | None = None
    weight_milli: WeightMilli = 1000


MAX_GRANTS: Final = 10_000
"""The most principals one ``PolicySet`` names."""
MAX_ROLES: Final = 1024
"""The most roles one grant gives."""
ROLE_PATTERN: Final = (f"^(?:(?:tenant|node-agent|backend):[^{NOT_PRINTABLE}]+"
                       "|quota-admin|operator|reader|policy-admin)$(?!\\n)")
"""A role as ``fleetlog.service.authz`` reads it (docs/service.md, "Who may do what")."""
Principal = Annotated[str, Meta(min_length=1, max_length=253, pattern="^[^\\x00-\\x1f\\x7f-\\x9f]+$(?!\\n)")]
"""Who a token or a client certificate names: any text but control characters (a certificate's
commonName may hold spaces)."""
Role = Annotated[str, Meta(max_length=253, pattern=ROLE_PATTERN)]


class PolicyGrant(_Struct, frozen=True):
    """The roles one principal holds."""

    principal: Principal
    roles: Annotated[tuple[Role, ...], Meta(max_length=MAX_ROLES)]
    max_priority: Priority | None = None
    """The highest priority the jobs of this grant's ``tenant:`` roles may have (issue 46: a
    higher one is refused, at ingest and by the fold's gate); none: any."""


class PolicySet(_Event, frozen=True):
    """The authorization policy from now on, whole: each principal's roles.  It replaces the
    policy file's grants (and an earlier ``PolicySet``'s) for the HTTP API's checks
    (``fleetlog.service.authz``); the core keeps the latest one (snapshotted, never digested)
    and no decision reads it."""

    grants: Annotated[tuple[PolicyGrant, ...], Meta(max_length=MAX_GRANTS)]
    reason: Text = ""


# --- decisions ----------------------------------------------------------------------------


class TaskPlacement(_Struct, frozen=True, array_like=True):
    """Where one task goes: its index within the job, the node and the GPU indices on it."""

    task_index: TaskIndex
    node: Name
    gpu_indices: Annotated[
        tuple[Annotated[int, Meta(ge=0, lt=MAX_GPUS_PER_NODE)], ...], Meta(max_length=64)
    ] = ()


class JobPlaced(_Event, frozen=True):
    job_id: Name
    cell: Name
    tasks: Annotated[tuple[TaskPlacement, ...], Meta(min_length=1, max_length=MAX_TASKS_PER_GROUP)]


class TaskPreempted(_Event, frozen=True):
    """A running task stopped to make room. ``cause`` is a reason code (see docs)."""

    job_id: Name
    task_index: TaskIndex
    by_job_id: Name
    cause: Name
    message: Text = ""


class JobRejected(_Event, frozen=True):
    """A job that can never run as submitted; ``reason`` is a reason code (see docs)."""

    job_id: Name
    reason: Name
    message: Text = ""


class JobPending(_Event, frozen=True):
    """Why a job still waits: a reason code (see docs) and the numbers behind it.

    Emitted only when a job's reason changes, so an idle queue writes nothing."""

    job_id: Name
    reason: Name
    message: Text = ""


Decision = JobPlaced | TaskPreempted | JobRejected | JobPending
DECISION_TYPES: Final = (JobPlaced, TaskPreempted, JobRejected, JobPending)


MAX_DECISION_PARTS: Final = 1 << 16
"""The most records one step's decisions may be split over (64 Ki x 3.5 MiB: far past any step)."""


MAX_TYPICAL_PODS: Final = 4096
"""The most typical pods a decision batch records."""
TypicalPod = tuple[
    Annotated[int, Meta(ge=0, le=64)],
    Annotated[int, Meta(ge=0, le=1000)],
    Annotated[int, Meta(ge=0)],
    Annotated[int, Meta(ge=1)],
]
"""(GPUs, milli per GPU, CPU milli, count) of one typical pod (``fleetlog.core.typical``)."""


class DecisionBatch(_Event, frozen=True):
    """The decisions computed after folding the inputs log up to (excluding) offset ``as_of``.

    ``digest`` is the state digest after folding those inputs, before these decisions, so
    replay finds the first divergence at once.

    One step's decisions too large for one record are split, in order, over ``parts`` records
    (``part`` 0 to ``parts - 1``, consecutive in the decisions log, written in one transaction),
    each with the same ``as_of``, ``digest`` and ``policy``: folding the parts one after the
    other is folding the step (see :mod:`fleetlog.events.parts`).  A step in one record leaves
    both at their defaults, so it encodes exactly as before the fields existed.
    """

    as_of: Offset
    digest: Annotated[str, Meta(max_length=128)]
    decisions: Annotated[tuple[Decision, ...], Meta(max_length=MAX_DECISIONS_PER_BATCH)] = ()
    policy: Annotated[str, Meta(max_length=253)] = ""
    part: Annotated[int, Meta(ge=0, lt=MAX_DECISION_PARTS)] = 0
    parts: Annotated[int, Meta(ge=1, le=MAX_DECISION_PARTS)] = 1
    typical_pods: Annotated[tuple[TypicalPod, ...], Meta(max_length=MAX_TYPICAL_PODS)] = ()
    """The policy's typical pods (``Policy.typical_pods``: the published FGD rule's shape mix,
    fixed for a run and too long for the name), so that replay rebuilds the policy exactly;
    empty (left out) for every other policy."""

    def __post_init__(self) -> None:
        if self.part >= self.parts:
            raise ValueError(f"part {self.part} of a step in {self.parts} parts (parts count from 0)")


# --- scale-out: written by fleetlog's own shards, folded by another shard (docs/scale-out.md) ---

MAX_DISPATCH_ATTEMPTS: Final = 1 << 20
"""The most times one job may be dispatched (a job returned this often is held, not re-sent)."""
MAX_SUMMARY_ENTRIES: Final = 1024
"""The most (GPU model, GPU bucket) rows one ``CellSummary`` holds: 64 models x 8 buckets, twice."""
MAX_SUMMARY_TENANTS: Final = 4096
"""The most tenants one ``CellSummary`` reports usage for."""
MAX_PARTITIONS: Final = 1 << 16
GPU_BUCKETS: Final = (0, 1, 2, 4, 8, 16, 32, 64)
"""Task-shape buckets of a summary: whole GPUs per task (0: a task without GPUs or with a share
of one).  A task of ``g`` GPUs counts against the smallest bucket ``>= g``."""
Attempt = Annotated[int, Meta(ge=1, le=MAX_DISPATCH_ATTEMPTS)]
Count = Annotated[int, Meta(ge=0, le=1 << 40)]
Partition = Annotated[int, Meta(ge=0, lt=MAX_PARTITIONS)]


class JobDispatched(_Event, frozen=True):
    """The dispatcher sends ``job`` (its spec exactly as submitted: the cell shard never reads
    the global partition) to ``cell``.  ``attempt`` counts the job's dispatches from 1; ``seq``
    counts the dispatcher's dispatches to this cell from 1 (a ``CellSummary`` says up to which
    it has folded); ``as_of`` is the global-partition offset the decision was computed at."""

    job: JobSubmitted
    cell: Name
    attempt: Attempt
    seq: Annotated[int, Meta(ge=1, le=(1 << 63) - 1)]
    as_of: Offset


class JobReturned(_Event, frozen=True):
    """A cell shard hands a dispatched job back: it could not place it within its policy time
    (log time).  ``reason`` is the job's pending reason code in the cell; ``as_of`` the cell
    partition offset the shard decided at; ``attempt`` the dispatch it answers."""

    job_id: Name
    cell: Name
    attempt: Attempt
    reason: Name
    as_of: Offset
    message: Text = ""


class FreeSlots(_Struct, frozen=True, array_like=True):
    """Room in a cell for tasks of one bucket on nodes of one GPU model (``""``: no GPUs):
    ``slots`` tasks of ``gpus`` whole GPUs each fit node by node, and those nodes have
    ``cpu_milli`` and ``mem_mib`` free in total, at most ``node_cpu_milli`` and
    ``node_mem_mib`` on any one of them (a task needing more fits none: the totals cannot say
    so).  Capacity the cell's held (dispatched, not yet placed) jobs would take is already taken
    off.  The two ``node_`` fields came later: ``None`` in a summary written before them (no
    bound but the totals)."""

    gpu_model: OptionalName
    gpus: Annotated[int, Meta(ge=0, le=MAX_GPUS_PER_NODE)]
    slots: Count
    cpu_milli: CpuMilli
    mem_mib: MemMiB
    node_cpu_milli: CpuMilli | None = None
    node_mem_mib: MemMiB | None = None


class TenantUsage(_Struct, frozen=True, array_like=True):
    """What a tenant's jobs held by the cell (running or dispatched and pending) take."""

    tenant: Name
    cpu_milli: CpuMilli
    mem_mib: MemMiB
    gpu_milli: TotalGpuMilli


class CellSummary(_Event, frozen=True):
    """A cell shard's compact view of its cell, appended to the global partition when its
    capacity changes materially and at least every few seconds.  ``seq`` is the ``as_of`` it
    was written at (strictly increasing per cell, across restarts and takeovers, and a function
    of the cell partition's log); ``as_of`` is the cell-partition offset and ``at_ms`` its log time;
    ``dispatched_seq`` the last ``JobDispatched.seq`` for this cell the shard had folded.
    ``free`` is sorted by (gpu_model, gpus) without repeats, ``usage`` by tenant."""

    cell: Name
    partition: Partition
    seq: Annotated[int, Meta(ge=1, le=(1 << 63) - 1)]
    as_of: Offset
    at_ms: DurationMs
    total: Resources
    dispatched_seq: Annotated[int, Meta(ge=0, le=(1 << 63) - 1)] = 0
    pending: Count = 0
    free: Annotated[tuple[FreeSlots, ...], Meta(max_length=MAX_SUMMARY_ENTRIES)] = ()
    usage: Annotated[tuple[TenantUsage, ...], Meta(max_length=MAX_SUMMARY_TENANTS)] = ()

    def __post_init__(self) -> None:
        keys = [(f.gpu_model, f.gpus) for f in self.free]
        if any(a >= b for a, b in pairwise(keys)):
            raise ValueError("free must be sorted by (gpu_model, gpus), each pair once")
        bad = [f.gpus for f in self.free if f.gpus not in GPU_BUCKETS]
        if bad:
            raise ValueError(f"free[].gpus {bad[0]} is not a bucket; buckets: {GPU_BUCKETS}")
        tenants = [u.tenant for u in self.usage]
        if any(a >= b for a, b in pairwise(tenants)):
            raise ValueError("usage must be sorted by tenant, each tenant once")


ShardEvent = JobDispatched | JobReturned | CellSummary
SHARD_TYPES: Final = (JobDispatched, JobReturned, CellSummary)
"""Events fleetlog's shards write for each other: folded as inputs by the dispatcher or a cell
shard, never accepted from an outside producer (the ingest refuses them: ``not_an_input``)."""


InputEvent = (
    JobSubmitted
    | JobCancelled
    | NodeHeartbeat
    | NodeRemoved
    | NodeDrained
    | TaskStarted
    | TaskFinished
    | TaskFailed
    | QuotaSet
    | PolicySet
    | Tick
)
INPUT_TYPES: Final = (
    JobSubmitted,
    JobCancelled,
    NodeHeartbeat,
    NodeRemoved,
    NodeDrained,
    TaskStarted,
    TaskFinished,
    TaskFailed,
    QuotaSet,
    PolicySet,
    Tick,
)
Event = InputEvent | ShardEvent | DecisionBatch
EVENT_TYPES: Final = (*INPUT_TYPES, *SHARD_TYPES, DecisionBatch)
EVENT_TYPE_NAMES: Final = tuple(t.__name__ for t in EVENT_TYPES)


class Envelope(_Struct, frozen=True):
    """What travels in a log record's value: the event plus who produced it, in which schema.

    ``key`` is the producer's idempotency key: a resent event with the same key is a duplicate.
    """

    schema_version: Annotated[int, Meta(ge=0, le=1 << 31)]
    producer_id: Annotated[str, Meta(min_length=1, max_length=253)]
    event: Event
    key: Annotated[str, Meta(max_length=253)] | None = None


# --- identifiers: where they are, for the codec's printable check ----------------------------

IdField = tuple[str, Literal["one", "many", "keys", "values", "groups", "job", "rows", "taints", "image"]]
ID_FIELDS: Final[dict[type, tuple[IdField, ...]]] = {
    JobSubmitted: (("job_id", "one"), ("tenant", "one"), ("queue", "one"), ("allowed_cells", "many"),
                   ("task_groups", "groups"), ("labels", "keys"), ("labels", "values"),
                   ("annotations", "keys"), ("payload", "image")),
    JobCancelled: (("job_id", "one"),),
    NodeHeartbeat: (("cell", "one"), ("node", "one"), ("gpu_model", "one"), ("topology", "many"),
                    ("labels", "keys"), ("taints", "taints")),
    NodeRemoved: (("cell", "one"), ("node", "one")),
    NodeDrained: (("cell", "one"), ("node", "one")),
    TaskStarted: (("job_id", "one"), ("node", "one")),
    TaskFinished: (("job_id", "one"),),
    TaskFailed: (("job_id", "one"),),
    QuotaSet: (("tenant", "one"), ("cell", "one"), ("cohort", "one")),
    Tick: (),
    PolicySet: (),  # (principals and roles: patterns of their own, which msgspec checks)
    JobDispatched: (("job", "job"), ("cell", "one")),
    JobReturned: (("job_id", "one"), ("cell", "one"), ("reason", "one")),
    CellSummary: (("cell", "one"), ("free", "rows"), ("usage", "rows")),
}
"""The identifier fields of every input and shard event ("groups": each task group's
``gpu_models`` and constraint keys, :func:`group_ids`; "taints": each taint's key; "job": a
whole nested submission; "rows": the first column of each row; "values": a map's values;
"image": a payload's image).
Decisions are not re-checked: the scheduler builds them from inputs that passed."""


def group_ids(g: TaskGroup) -> list[tuple[str, str]]:
    """A task group's identifiers with their paths under the group: GPU models, then the keys
    its constraints name (selector, affinity requirements, tolerations, soft affinity requirements)."""
    out = [(f".gpu_models[{j}]", m) for j, m in enumerate(g.gpu_models)]
    out += [(f".node_selector[{i}].key", label.key) for i, label in enumerate(g.node_selector)]
    out += [
        (f".node_affinity[{i}].match_expressions[{j}].key", r.key)
        for i, term in enumerate(g.node_affinity)
        for j, r in enumerate(term.match_expressions)
    ]
    out += [(f".tolerations[{i}].key", t.key) for i, t in enumerate(g.tolerations) if t.key]
    out += [
        (f".preferred_affinity[{i}].preference.match_expressions[{j}].key", r.key)
        for i, p in enumerate(g.preferred_affinity)
        for j, r in enumerate(p.preference.match_expressions)
    ]
    return out


def _group_text(g: TaskGroup) -> str:
    if not (g.node_selector or g.node_affinity or g.tolerations or g.preferred_affinity):
        return "".join(g.gpu_models)
    return "".join(text for _, text in group_ids(g))


def _submitted_ids(e: JobSubmitted) -> str:
    groups = [_group_text(g) for g in e.task_groups]
    if not (e.labels or e.annotations or e.payload):
        return "".join((e.job_id, e.tenant, e.queue, *e.allowed_cells, *groups))
    image = e.payload.image if e.payload else ""
    return "".join((e.job_id, e.tenant, e.queue, *e.allowed_cells, *groups, *e.labels, *e.labels.values(),
                    *e.annotations, image))


def _heartbeat_ids(e: NodeHeartbeat) -> str:
    return "".join((e.cell, e.node, e.gpu_model, *e.topology, *e.labels, *(t.key for t in e.taints)))


def _no_ids(e: object) -> str:
    return ""


ID_TEXT: Final[dict[type, Callable[[Any], str]]] = {
    JobSubmitted: _submitted_ids,
    JobCancelled: attrgetter("job_id"),
    NodeHeartbeat: _heartbeat_ids,
    NodeRemoved: lambda e: e.cell + e.node,
    NodeDrained: lambda e: e.cell + e.node,
    TaskStarted: lambda e: e.job_id + e.node,
    TaskFinished: attrgetter("job_id"),
    TaskFailed: attrgetter("job_id"),
    QuotaSet: lambda e: e.tenant + e.cell + e.cohort,
    PolicySet: lambda e: "",
    Tick: lambda e: "",
    JobDispatched: lambda e: _submitted_ids(e.job) + e.cell,
    JobReturned: lambda e: e.job_id + e.cell + e.reason,
    CellSummary: lambda e: "".join((e.cell, *(f.gpu_model for f in e.free), *(u.tenant for u in e.usage))),
    DecisionBatch: _no_ids,
}
"""Every identifier of an event run together: one regular-expression search tells whether all
are printable (the fast path); :func:`unprintable_id` then says which one is not."""


def unprintable_id(event: Event, is_bad: Callable[[str], object]) -> str | None:
    """The JSON path (under ``$.event``) of the first identifier ``is_bad`` flags, or ``None``."""
    for field, how in ID_FIELDS.get(type(event), ()):
        value = getattr(event, field)
        if how == "job":
            inner = unprintable_id(value, is_bad)
            if inner is not None:
                return f".{field}{inner}"
            continue
        if how == "one":
            found = [("", value)]
        elif how == "rows":
            found = [(f"[{i}][0]", row[0]) for i, row in enumerate(msgspec.structs.astuple(r) for r in value)]
        elif how == "groups":
            found = [(f"[{i}]{path}", text) for i, g in enumerate(value) for path, text in group_ids(g)]
        elif how == "taints":
            found = [(f"[{i}].key", t.key) for i, t in enumerate(value)]
        elif how == "values":
            found = [(f"[{k!r}]", v) for k, v in value.items()]
        elif how == "image":
            found = [(".image", value.image)] if value is not None else []
        else:
            found = [(f"[{i}]" if how == "many" else f"[{k!r}]", k) for i, k in enumerate(value)]
        for suffix, text in found:
            if is_bad(text):
                return f".{field}{suffix}"
    return None
