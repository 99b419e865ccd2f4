"""Placement constraints: node selectors, required node affinity, taints and tolerations, cordons.

A task group's selector, affinity terms and tolerations make its *constraint class*, interned
by fold in first-seen order (:func:`class_of`; class 0 is "no constraint"). A node's labels,
taints and cordon are its *attributes*, kept by fold per node row (:func:`node_attrs_of`; a
node with none has no entry). Which nodes a class may use is a pure function of the two:
:func:`fleetlog.core.eligibility.eligible` computes it with a numba kernel
(``kernels.eligible_nodes``) over labels and values interned to integers, once per class until
a node's attributes change (the answer is kept in ``state.derived``), and decide narrows a
job's candidate nodes with it before the placement kernels run — a job of class 0 on a fleet
without taints or cordons pays nothing.

The plain-Python definitions here (:func:`node_matches`, :func:`untolerated`) are the spec:
the kernel must agree with them exactly (``tests/core/test_constraints.py``), and fold and
explain use them directly (a ``NoExecute`` eviction, why a job has no eligible node).

Semantics, as Kubernetes defines them: a selector label must be present with that value; a
node meets the affinity when it meets every requirement of at least one term (``In``/``NotIn``
a set — a node without the label is ``NotIn`` every set — ``Exists``, ``DoesNotExist``); a
toleration matches a taint when its effect is empty or equal and either its key is empty with
``Exists`` (every taint) or its key is the taint's and it is ``Exists`` or its value equal. A
task may use a node that is not cordoned, matches, and tolerates each of its ``NoSchedule``
and ``NoExecute`` taints (``PreferNoSchedule`` is advisory and not enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.kernels.eligible import (
    EFFECT_ANY,
    EFFECT_NO_EXECUTE,
    EFFECT_NO_SCHEDULE,
    NO_KEY,
    OP_DOES_NOT_EXIST,
    OP_EXISTS,
    OP_IN,
    OP_NOT_IN,
    eligible_nodes,
)
from fleetlog.events.model import NodeHeartbeat, TaskGroup
from fleetlog.events.spec import (
    NO_ATTRS,
    NO_CONSTRAINTS,
    ConstraintsKey,
    NodeAttrs,
    Requirement,
    TaintKey,
    TolerationKey,
    constraints_key,
    tolerates,
)

__all__ = [
    "ENFORCED", "NO_ATTRS", "NO_CLASS", "ClassKey", "Compiled", "NodeAttrs", "class_key", "label_mismatch",
    "node_attrs_of", "node_matches", "preference", "untolerated", "why_not",
]  # fmt: skip

ClassKey = ConstraintsKey
"""A constraint class: a task group's constraints in canonical form (``fleetlog.events.spec``)."""

NO_CLASS: Final[ClassKey] = NO_CONSTRAINTS
ENFORCED: Final = ("NoSchedule", "NoExecute")
_OPS: Final = {"In": OP_IN, "NotIn": OP_NOT_IN, "Exists": OP_EXISTS, "DoesNotExist": OP_DOES_NOT_EXIST}
_EFFECTS: Final = {"": EFFECT_ANY, "NoSchedule": EFFECT_NO_SCHEDULE, "NoExecute": EFFECT_NO_EXECUTE}


def class_key(g: TaskGroup) -> ClassKey:
    """The constraint class of a task group (its order of entries does not count)."""
    return constraints_key(g)


def node_attrs_of(e: NodeHeartbeat) -> NodeAttrs:
    """A heartbeat's labels (sorted), taints and cordon."""
    if not (e.labels or e.taints or e.unschedulable):
        return NO_ATTRS
    labels = tuple(sorted(e.labels.items()))
    return labels, tuple((t.key, t.value, t.effect) for t in e.taints), e.unschedulable


# --- the spec, in plain Python ------------------------------------------------------------


def untolerated(cls: ClassKey, attrs: NodeAttrs, effects: Sequence[str] = ENFORCED) -> TaintKey | None:
    """The node's first taint of one of ``effects`` the class does not tolerate, or None."""
    for taint in attrs[1]:
        if taint[2] in effects and not tolerates(cls[2], taint):
            return taint
    return None


def requirement_met(labels: dict[str, str], req: Requirement) -> bool:
    key, op, values = req
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    inside = key in labels and labels[key] in values
    return inside if op == "In" else not inside


def label_mismatch(cls: ClassKey, attrs: NodeAttrs) -> str | None:
    """Why the node's labels do not meet the class (the first selector label it lacks, the
    failing requirement of a single term, or that no term matched), or None when they do."""
    labels = dict(attrs[0])
    for key, value in cls[0]:
        if labels.get(key) != value:
            return f"node selector {key}={value}"
    terms = cls[1]
    if not terms or any(all(requirement_met(labels, r) for r in term) for term in terms):
        return None
    if len(terms) == 1:
        key, op, values = next(r for r in terms[0] if not requirement_met(labels, r))
        return f"node affinity {key} {op}" + (f" [{', '.join(values)}]" if values else "")
    return f"none of the {len(terms)} node affinity terms"


def preference(cls: ClassKey, attrs: NodeAttrs) -> int:
    """The spec of soft affinity: the summed weights of the class's preferred terms whose
    requirements the node's labels meet (its taints and cordon aside)."""
    labels = dict(attrs[0])
    return sum(weight for term, weight in cls[3] if all(requirement_met(labels, r) for r in term))


def node_matches(cls: ClassKey, attrs: NodeAttrs) -> bool:
    """The spec of eligibility: a task of ``cls`` may be placed on a node with ``attrs``."""
    return not attrs[2] and label_mismatch(cls, attrs) is None and untolerated(cls, attrs) is None


def why_not(cls: ClassKey, attrs: NodeAttrs) -> str | None:
    """Why a node is not eligible for the class, kube-scheduler's way (the first of: cordoned,
    an untolerated taint, labels), or None when it is."""
    if attrs[2]:
        return "cordoned"
    taint = untolerated(cls, attrs)
    if taint is not None:
        key, value, effect = taint
        return f"untolerated taint {key}{'=' + value if value else ''}:{effect}"
    mismatch = label_mismatch(cls, attrs)
    return None if mismatch is None else f"not matching {mismatch}"


# --- compiled for the kernel ----------------------------------------------------------------


class Compiled:
    """The fleet's node attributes as the kernel takes them: label keys and values interned
    (ids of this object only: any numbering gives the same answers), CSR rows per node."""

    __slots__ = ("arrays", "ids", "size", "version")

    def __init__(self, attrs: dict[int, NodeAttrs], size: int, version: int) -> None:
        self.ids: dict[str, int] = {}
        self.size, self.version = size, version
        lab_ptr, taint_ptr = np.zeros(size + 1, np.int64), np.zeros(size + 1, np.int64)
        labels: list[tuple[int, int]] = []
        taints: list[tuple[int, int, int]] = []
        cordoned = np.zeros(size, dtype=np.bool_)
        for row in range(size):
            node = attrs.get(row)
            if node is not None:
                labels += [(self.id(k), self.id(v)) for k, v in node[0]]
                taints += [(self.id(k), self.id(v), _EFFECTS[e]) for k, v, e in node[1] if e in ENFORCED]
                cordoned[row] = node[2]
            lab_ptr[row + 1], taint_ptr[row + 1] = len(labels), len(taints)
        lab = np.array(labels, dtype=np.int32).reshape(-1, 2)
        tnt = np.array(taints, dtype=np.int32).reshape(-1, 3)
        self.arrays = (
            lab_ptr, lab[:, 0].copy(), lab[:, 1].copy(),
            taint_ptr, tnt[:, 0].copy(), tnt[:, 1].copy(), tnt[:, 2].copy(), cordoned,
        )  # fmt: skip

    def id(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))

    def eligible(self, cls: ClassKey) -> Array:
        """Per node row: may a task of ``cls`` be placed there."""
        selector, terms, tolerations, _ = cls
        return self._nodes(selector, terms, tolerations, self.arrays[7])

    def matching(self, term: tuple[Requirement, ...]) -> Array:
        """Per node row: do its labels meet every requirement of ``term`` (a soft affinity
        term: taints and cordons aside)."""
        return self._nodes((), (term,), (("", "Exists", "", ""),), np.zeros(self.size, dtype=np.bool_))

    def _nodes(
        self,
        selector: tuple[tuple[str, str], ...],
        terms: tuple[tuple[Requirement, ...], ...],
        tolerations: tuple[TolerationKey, ...],
        cordoned: Array,
    ) -> Array:
        i32 = np.int32
        req_term, req_key, req_op, req_ptr, req_vals = [], [], [], [0], []
        for t, term in enumerate(terms):
            for key, op, values in term:
                req_term.append(t)
                req_key.append(self.id(key))
                req_op.append(_OPS[op])
                req_vals += [self.id(v) for v in values]
                req_ptr.append(len(req_vals))
        out = np.zeros(self.size, dtype=np.bool_)
        eligible_nodes(
            *self.arrays[:7],
            cordoned,
            np.array([self.id(k) for k, _ in selector], dtype=i32),
            np.array([self.id(v) for _, v in selector], dtype=i32),
            np.array(req_term, dtype=i32),
            np.array(req_key, dtype=i32),
            np.array(req_op, dtype=i32),
            np.array(req_ptr, dtype=np.int64),
            np.array(req_vals, dtype=i32),
            len(terms),
            np.array([self.id(k) if k else NO_KEY for k, _, _, _ in tolerations], dtype=i32),
            np.array([op == "Exists" for _, op, _, _ in tolerations], dtype=i32),
            np.array([self.id(v) for _, _, v, _ in tolerations], dtype=i32),
            np.array([_EFFECTS.get(e, -1) for _, _, _, e in tolerations], dtype=i32),
            out,
        )
        return out
