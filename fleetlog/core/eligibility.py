"""Which nodes each job may use by its constraints, kept in ``state.derived`` (the lookups
decide makes; the definitions are :mod:`fleetlog.core.constraints`)."""

from __future__ import annotations

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.constraints import ENFORCED, Compiled, NodeAttrs
from fleetlog.core.state import State


class Eligibility:
    """What ``state.derived`` keeps of constraints: the compiled node attributes and each
    class's eligible nodes, for one version of the node attributes (fold bumps
    ``Derived.attrs_version`` when a node's attributes change or a node row is added)."""

    __slots__ = ("by_class", "compiled", "open", "weights")

    def __init__(self, attrs: dict[int, NodeAttrs], size: int, version: int) -> None:
        self.compiled = Compiled(attrs, size, version)
        self.open = not any(a[2] or any(t[2] in ENFORCED for t in a[1]) for a in attrs.values())
        """No node is cordoned or has an enforced taint: class 0 may use every node."""
        self.by_class: dict[int, Array] = {}
        self.weights: dict[int, Array] = {}
        """Per class with soft affinity: each node row's summed weight (:func:`preference_weights`)."""


def eligible(state: State, cls: int) -> Array | None:
    """Per node row, whether a task of class ``cls`` may be placed there; None when it may be
    placed anywhere (class 0 on a fleet without taints or cordons: no work at all)."""
    if cls == 0 and not state.node_attrs:
        return None
    e = _kept(state)
    if cls == 0 and e.open:
        return None
    found = e.by_class.get(cls)
    if found is None:
        found = e.by_class[cls] = e.compiled.eligible(state.classes[cls])
    return found


def _kept(state: State) -> Eligibility:
    """What ``state.derived`` keeps for the current node attributes (made anew when they changed)."""
    derived = state.derived
    e = derived.eligibility
    size, version = state.nodes.size, derived.attrs_version
    if not isinstance(e, Eligibility) or e.compiled.version != version or e.compiled.size != size:
        e = derived.eligibility = Eligibility(state.node_attrs, size, version)
    return e


def preference_weights(state: State, cls: int) -> Array | None:
    """Per node row, the summed weight of class ``cls``'s soft affinity terms the node meets
    (:func:`fleetlog.core.constraints.preference`); None when the class has none."""
    preferred = state.classes[cls][3]
    if not preferred:
        return None
    e = _kept(state)
    found = e.weights.get(cls)
    if found is None:
        found = np.zeros(state.nodes.size, dtype=np.int64)
        for term, weight in preferred:
            found += weight * e.compiled.matching(term)
        e.weights[cls] = found
    return found


def job_preferences(state: State, job: int) -> Array | None:
    """Per node row, what ``job``'s soft affinity makes of it: the weights of each of its
    classes (each class once) summed; None when no class of the job has soft affinity."""
    out = None
    for c in job_classes(state, job):
        w = preference_weights(state, c)
        if w is not None:
            out = w if out is None else out + w
    return out


def job_classes(state: State, job: int) -> tuple[int, ...]:
    """The distinct constraint classes of ``job``'s tasks, ascending ((0,) for most jobs)."""
    rows = state.job_tasks(job)
    cls = state.tasks.cols["cls"][rows.start : rows.stop]
    if rows.stop - rows.start == 1 or not cls.any():
        return (int(cls[0]),) if cls.size else (0,)
    return tuple(np.unique(cls).tolist())


def job_eligible(state: State, job: int) -> Array | None:
    """Per node row, whether some task of ``job`` may be placed there (None: any node)."""
    masks = [eligible(state, c) for c in job_classes(state, job)]
    if any(m is None for m in masks):
        return None
    out = masks[0]
    for m in masks[1:]:
        out = out | m  # type: ignore[operator]
    return out
