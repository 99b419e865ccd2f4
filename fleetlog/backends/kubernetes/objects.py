"""The parts of Kubernetes objects the backend reads, decoded straight from the API's JSON.

Typed msgspec structs over the subset of ``Node`` and ``Pod`` fields fleetlog needs: decoding a
watch line costs microseconds and never builds the generated client models.  Unknown fields are
ignored (the API server sends many more), missing ones take the defaults below.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Final

import msgspec


class ObjectMeta(msgspec.Struct, frozen=True, rename="camel", gc=False):
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None
    creation_timestamp: str | None = None


class Taint(msgspec.Struct, frozen=True, gc=False):
    key: str
    effect: str
    value: str = ""


class Condition(msgspec.Struct, frozen=True, rename="camel", gc=False):
    type: str
    status: str
    reason: str = ""
    message: str = ""


class NodeSpec(msgspec.Struct, frozen=True, gc=False):
    taints: list[Taint] = []
    unschedulable: bool = False


class NodeStatus(msgspec.Struct, frozen=True, gc=False):
    allocatable: dict[str, str] = {}
    conditions: list[Condition] = []


class Node(msgspec.Struct, frozen=True, gc=False):
    metadata: ObjectMeta
    spec: NodeSpec = NodeSpec()
    status: NodeStatus = NodeStatus()


class ResourceRequirements(msgspec.Struct, frozen=True, gc=False):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}


class Container(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()


class SelectorRequirement(msgspec.Struct, frozen=True, gc=False):
    key: str
    operator: str
    values: list[str] = []


class SelectorTerm(msgspec.Struct, frozen=True, rename="camel", gc=False):
    match_expressions: list[SelectorRequirement] = []
    match_fields: list[SelectorRequirement] = []


class RequiredSelector(msgspec.Struct, frozen=True, rename="camel", gc=False):
    node_selector_terms: list[SelectorTerm] = []


class PreferredSchedulingTerm(msgspec.Struct, frozen=True, gc=False):
    weight: int = 0
    preference: SelectorTerm | None = None


class NodeAffinity(msgspec.Struct, frozen=True, rename="camel", gc=False):
    required_during_scheduling_ignored_during_execution: RequiredSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = []


class LabelSelector(msgspec.Struct, frozen=True, rename="camel", gc=False):
    match_labels: dict[str, str] = {}
    match_expressions: list[SelectorRequirement] = []


class PodAffinityTerm(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """One required term of ``podAffinity`` / ``podAntiAffinity`` (the preferred ones are not
    decoded: fleetlog does not read them)."""

    topology_key: str = ""
    label_selector: LabelSelector | None = None
    namespaces: list[str] = []
    namespace_selector: LabelSelector | None = None
    match_label_keys: list[str] = []
    mismatch_label_keys: list[str] = []


class PodAffinity(msgspec.Struct, frozen=True, rename="camel", gc=False):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = []


class Affinity(msgspec.Struct, frozen=True, rename="camel", gc=False):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class PodToleration(msgspec.Struct, frozen=True, rename="camel", gc=False):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class PodSpec(msgspec.Struct, frozen=True, rename="camel", gc=False):
    scheduler_name: str = ""
    node_name: str = ""
    priority: int = 0
    containers: list[Container] = []
    init_containers: list[Container] = []
    node_selector: dict[str, str] = {}
    affinity: Affinity | None = None
    tolerations: list[PodToleration] = []


class Terminated(msgspec.Struct, frozen=True, rename="camel", gc=False):
    exit_code: int = 0
    reason: str = ""


class ContainerState(msgspec.Struct, frozen=True, gc=False):
    terminated: Terminated | None = None


class ContainerStatus(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    state: ContainerState = ContainerState()


class PodStatus(msgspec.Struct, frozen=True, rename="camel", gc=False):
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    conditions: list[Condition] = []
    container_statuses: list[ContainerStatus] = []


class Pod(msgspec.Struct, frozen=True, gc=False):
    metadata: ObjectMeta
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


class ListMeta(msgspec.Struct, frozen=True, rename="camel", gc=False):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class NodeList(msgspec.Struct, frozen=True, gc=False):
    items: list[Node]
    metadata: ListMeta = ListMeta()


class PodList(msgspec.Struct, frozen=True, gc=False):
    items: list[Pod]
    metadata: ListMeta = ListMeta()


class Status(msgspec.Struct, frozen=True, gc=False):
    """The API's error object (also the ``object`` of a watch ``ERROR`` event)."""

    code: int = 0
    reason: str = ""
    message: str = ""


class RawWatchEvent(msgspec.Struct, frozen=True, gc=False):
    """One line of a watch stream; ``object`` is decoded once its ``type`` says what it is."""

    type: str
    object: msgspec.Raw


NODE_LIST: Final = msgspec.json.Decoder(NodeList)
POD_LIST: Final = msgspec.json.Decoder(PodList)
NODE: Final = msgspec.json.Decoder(Node)
POD: Final = msgspec.json.Decoder(Pod)
STATUS: Final = msgspec.json.Decoder(Status)
WATCH_EVENT: Final = msgspec.json.Decoder(RawWatchEvent)


class BookmarkMeta(msgspec.Struct, frozen=True, gc=False):
    metadata: ListMeta = ListMeta()


BOOKMARK: Final = msgspec.json.Decoder(BookmarkMeta)

# --- quantities ----------------------------------------------------------------------------

_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY: Final = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


class BadQuantityError(ValueError):
    """A resource quantity that is not in Kubernetes' quantity syntax."""


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (``500m``, ``2``, ``1.5Gi``, ``1e9``) as an exact decimal."""
    match = _QUANTITY.match(text.strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise BadQuantityError(f"not a Kubernetes quantity: {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        raise BadQuantityError(f"not a Kubernetes quantity: {text!r}") from None


def milli(text: str) -> int:
    """A CPU quantity in milli-units, rounded up (``250m`` → 250, ``2`` → 2000)."""
    return math.ceil(quantity(text) * 1000)


def mib(text: str) -> int:
    """A memory quantity in MiB, rounded up (``1Gi`` → 1024, ``1e9`` → 954)."""
    return math.ceil(quantity(text) / 2**20)


def count(text: str) -> int:
    """A countable resource (``nvidia.com/gpu``): a whole number, rounded down."""
    return math.floor(quantity(text))
