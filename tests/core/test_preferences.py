"""Soft node affinity (``TaskGroup.preferred_affinity``) and gangs spread one task a host
(``JobSubmitted.spread``): the compiled weights against their plain spec, the tie-break against
a brute force over every node, and decide's answers (docs/scheduling.md)."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlog.core import kernels
from fleetlog.core.constraints import NO_ATTRS, Compiled, NodeAttrs, class_key, node_attrs_of, preference
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.eligibility import eligible, preference_weights
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.never_fits import never_fits_submitted
from fleetlog.core.policy import Policy
from fleetlog.core.scratch import Scratch
from fleetlog.core.state import State
from fleetlog.core.views import folded_spec
from fleetlog.events import JobPending, NodeHeartbeat, TaskGroup
from fleetlog.events.model import (
    JobSubmitted,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Taint,
    Toleration,
)
from fleetlog.events.spec import same_submission, submission_spec
from tests.core.budget import examples
from tests.core.builders import Driver, job, node
from tests.core.test_constraints import labels_st, taints_st, term_st, with_attrs


def prefer(j: JobSubmitted, *terms: tuple[int, str, str]) -> JobSubmitted:
    """``j`` whose every group prefers each (weight, label, value)."""
    preferred = tuple(
        PreferredTerm(w, NodeSelectorTerm((NodeSelectorRequirement(k, "In", (v,)),))) for w, k, v in terms
    )
    groups = tuple(msgspec.structs.replace(g, preferred_affinity=preferred) for g in j.task_groups)
    return msgspec.structs.replace(j, task_groups=groups)


# --- the compiled weights equal the spec -------------------------------------------------------

preferred_st = st.lists(
    st.builds(PreferredTerm, weight=st.integers(1, 100), preference=term_st), min_size=1, max_size=4
).map(tuple)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(labels_st, taints_st, st.booleans()).map(
            lambda t: with_attrs(node("n", gpus=0), labels=t[0], taints=tuple(t[1]), unschedulable=t[2])
        ),
        min_size=1,
        max_size=12,
    ),
    preferred_st,
    st.integers(0, 3),
)
def test_the_preference_weights_equal_the_plain_spec(
    nodes: list[NodeHeartbeat], preferred: tuple[PreferredTerm, ...], extra: int
) -> None:
    """Random labels (taints and cordons do not count), terms repeated or not; rows past the
    listed ones have no attributes."""
    attrs: dict[int, NodeAttrs] = {}
    for row, hb in enumerate(nodes):
        if node_attrs_of(hb) != NO_ATTRS:
            attrs[row] = node_attrs_of(hb)
    size = len(nodes) + extra
    cls = class_key(TaskGroup(count=1, cpu_milli=1, mem_mib=1, preferred_affinity=preferred))
    compiled = Compiled(attrs, size, 0)
    got = np.zeros(size, dtype=np.int64)
    for t, weight in cls[3]:
        got += weight * compiled.matching(t)
    assert got.tolist() == [preference(cls, attrs.get(row, NO_ATTRS)) for row in range(size)]


def test_a_term_given_twice_weighs_twice_and_order_does_not_count() -> None:
    zone_a = NodeSelectorTerm((NodeSelectorRequirement("zone", "In", ("a",)),))
    fast = NodeSelectorTerm((NodeSelectorRequirement("fast", "Exists"),))
    g = TaskGroup(count=1, cpu_milli=1, mem_mib=1, preferred_affinity=(PreferredTerm(5, zone_a),) * 2)
    assert preference(class_key(g), ((("zone", "a"),), (), False)) == 10
    one = job("j", gpus=0)
    a = prefer(one, (5, "zone", "a"), (7, "fast", "yes"))
    b = prefer(one, (7, "fast", "yes"), (5, "zone", "a"))
    assert same_submission(a, b)
    assert not same_submission(a, prefer(one, (6, "zone", "a"), (7, "fast", "yes")))
    assert not same_submission(one, msgspec.structs.replace(one, spread="host"))
    assert class_key(
        TaskGroup(count=1, cpu_milli=1, mem_mib=1, preferred_affinity=(PreferredTerm(1, fast),))
    )[3]


# --- decide: soft affinity only within ties -----------------------------------------------------


def zoned(d: Driver, zones: str = "aabc", gpus: int = 8) -> None:
    d.feed(*(with_attrs(node(f"n{i}", gpus=gpus), labels={"zone": z}) for i, z in enumerate(zones)))


@pytest.mark.parametrize("policy", [Policy(), Policy(name="best-fit", scoring="best-fit")])
def test_among_equal_nodes_the_preferred_one_is_taken(policy: Policy) -> None:
    """Four empty nodes alike, zones a a b c (each job on a fleet of its own)."""

    def lands(j: JobSubmitted) -> str:
        d = Driver(policy)
        zoned(d)
        d.feed(j)
        return d.placed(d.decide())[j.job_id].tasks[0].node

    assert lands(prefer(job("to-c", gpus=1), (10, "zone", "c"))) == "n3"  # (not n0, the lowest index)
    assert lands(prefer(job("heavier", gpus=1), (10, "zone", "c"), (20, "zone", "b"))) == "n2"
    assert (
        lands(prefer(job("summed", gpus=1), (15, "zone", "c"), (10, "zone", "b"), (10, "zone", "b"))) == "n2"
    )
    assert lands(prefer(job("nowhere", gpus=1), (10, "zone", "z"))) == "n0"  # (none preferred: as without)
    assert lands(prefer(job("a", gpus=1), (10, "zone", "a"))) == "n0"  # (two preferred: the lower index)


def test_a_preference_never_beats_a_better_score() -> None:
    """Best fit: the node already half full fits better than the empty preferred ones."""
    d = Driver(Policy(name="best-fit", scoring="best-fit"))
    zoned(d)
    d.feed(job("first", gpus=4))
    on = d.placed(d.decide())["first"].tasks[0].node
    assert on == "n0"
    d.feed(prefer(job("second", gpus=2), (100, "zone", "c")))
    assert d.placed(d.decide())["second"].tasks[0].node == "n0"


def test_a_gang_goes_to_the_preferred_nodes_when_they_score_alike() -> None:
    d = Driver(Policy(name="best-fit", scoring="best-fit"))
    zoned(d, "aabb")
    d.feed(prefer(job("gang", tasks=2, gpus=8), (10, "zone", "b")))
    (placed,) = d.placed(d.decide()).values()
    assert sorted(t.node for t in placed.tasks) == ["n2", "n3"]


def brute_force(
    sc: Scratch, cands: np.ndarray, task: tuple[int, int, int, int, int], weights: np.ndarray
) -> int:
    """The spec of the tie-break: the feasible candidate with the least (primary, secondary),
    then the most weight, then the least index — every node scored."""
    cpu, _, gpus, milli, _ = task
    best: tuple[int, int, int, int] | None = None
    for n in cands.tolist():
        if not kernels.fits(n, sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_count, sc.model, *task):
            continue
        a, b = kernels.node_score(
            n, sc.cpu_free, sc.gpu_free, sc.gpu_count, cpu, gpus, milli, sc.policy_id, sc.shapes
        )
        key = (int(a), int(b), -int(weights[n]), n)
        best = key if best is None or key < best else best
    return -1 if best is None else best[3]


@pytest.mark.parametrize("scoring", ["fgd", "best-fit"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_tie_break_equals_a_brute_force_over_every_node(scoring: str, seed: int) -> None:
    """Random fleets (shapes, usage, labels, taints, cordons), random one-task jobs with random
    soft affinity, placed one decide at a time: each lands where the brute force says."""
    rng = random.Random(seed)
    policy = Policy(name=scoring, scoring=scoring)  # type: ignore[arg-type]
    d = Driver(policy)
    zones = "abcd"
    for i in range(24):
        taints = (Taint(key="gpu", value="present", effect="NoSchedule"),) if rng.random() < 0.2 else ()
        labels = {"zone": rng.choice(zones), **({"fast": "yes"} if rng.random() < 0.5 else {})}
        hb = node(f"n{i}", gpus=rng.choice([2, 4, 8]), cpu=rng.choice([16_000, 64_000]))
        d.feed(with_attrs(hb, labels=labels, taints=taints, unschedulable=rng.random() < 0.05))
    checked = 0
    for k in range(60):
        gpus = rng.choice([0, 1, 1, 2, 4])
        milli = rng.choice([250, 500, 1000]) if gpus == 1 else 1000
        j = job(f"j{k}", gpus=gpus, milli=milli, cpu=rng.choice([1_000, 4_000]))
        terms = [(rng.choice([1, 10, 50]), "zone", rng.choice(zones)) for _ in range(rng.randint(0, 2))]
        if rng.random() < 0.3:
            terms.append((rng.choice([1, 5]), "fast", "yes"))
        if terms:
            j = prefer(j, *terms)
        if rng.random() < 0.3:
            j = msgspec.structs.replace(
                j,
                task_groups=tuple(
                    msgspec.structs.replace(g, tolerations=(Toleration(key="gpu", operator="Exists"),))
                    for g in j.task_groups
                ),
            )
        d.feed(j)
        row = d.state.job_row(j.job_id)
        t = int(d.state.jobs.cols["first_task"][row])
        cls = int(d.state.tasks.cols["cls"][t])
        sc = Scratch(d.state, policy)
        ok = eligible(d.state, cls)
        cands = np.flatnonzero(d.state.nodes.cols["status"][: d.state.nodes.size] == 1).astype(np.int64)
        cands = cands if ok is None else cands[ok[cands]]
        weights = preference_weights(d.state, cls)
        tc = d.state.tasks.cols
        task = tuple(int(tc[c][t]) for c in ("cpu", "mem", "gpus", "milli", "models"))
        want = brute_force(
            sc, cands, task, weights if weights is not None else np.zeros(d.state.nodes.size, np.int64)
        )  # type: ignore[arg-type]
        placed = d.placed(d.decide())
        got = placed[j.job_id].tasks[0].node if j.job_id in placed else None
        assert got == (None if want < 0 else f"n{want}"), f"seed {seed} job {k}"
        checked += weights is not None and want >= 0
        if rng.random() < 0.3 and placed:  # some finish: free capacity moves
            from fleetlog.events import TaskFinished

            d.feed(TaskFinished(job_id=j.job_id, task_index=0))
    assert checked >= 10  # (enough placements with soft affinity to say something)


# --- spread one task a host ---------------------------------------------------------------------


def test_a_spread_gang_takes_one_node_a_task_where_a_plain_one_packs() -> None:
    d = Driver(Policy(name="best-fit", scoring="best-fit"))
    zoned(d, "aaaa")
    d.feed(
        job("packed", tasks=3, gpus=1), msgspec.structs.replace(job("spread", tasks=3, gpus=1), spread="host")
    )
    placed = d.placed(d.decide())
    assert len({t.node for t in placed["packed"].tasks}) == 1
    assert len({t.node for t in placed["spread"].tasks}) == 3


def test_a_spread_gang_in_one_rack_needs_as_many_hosts_in_that_rack() -> None:
    d = Driver()
    d.feed(
        *(node(f"a{i}", rack="ra", gpus=8) for i in range(2)),
        *(node(f"b{i}", rack="rb", gpus=8) for i in range(3)),
    )
    gang = msgspec.structs.replace(job("g", tasks=3, gpus=1, topology="rack"), spread="host")
    d.feed(gang)
    (placed,) = d.placed(d.decide()).values()
    assert sorted(t.node for t in placed.tasks) == ["b0", "b1", "b2"]
    too_wide = msgspec.structs.replace(job("wide", tasks=4, gpus=1, topology="rack"), spread="host")
    assert never_fits_submitted(d.state, too_wide) == (
        "no rack can hold all 4 tasks even when empty (the best holds 3) (spread: one task a node)"
    )
    two_shapes = msgspec.structs.replace(
        too_wide,
        task_groups=(
            *too_wide.task_groups[0:1],
            msgspec.structs.replace(too_wide.task_groups[0], count=1, gpu_count=2),
        ),
    )  # (3 + 1 tasks: each shape alone fits a rack's nodes, the four together do not)
    two_shapes = msgspec.structs.replace(
        two_shapes,
        task_groups=(msgspec.structs.replace(two_shapes.task_groups[0], count=3), two_shapes.task_groups[1]),
    )
    assert never_fits_submitted(d.state, two_shapes) == (
        "no rack has 4 nodes for its 4 tasks (spread: one task a node; the best has 3)"
    )
    assert never_fits_submitted(d.state, msgspec.structs.replace(too_wide, spread=None)) is None
    d.feed(too_wide)
    decisions = d.decide()
    assert d.reasons(decisions) == {"wide": "never_fits"}
    assert "one task a node" in next(x.message for x in decisions if isinstance(x, JobPending))


def test_a_spread_gang_waits_while_too_few_nodes_have_room() -> None:
    d = Driver(Policy(reserve=False, preemption=False))
    zoned(d, "aaa", gpus=2)
    d.feed(job("fill", gpus=2))
    d.decide()
    d.feed(msgspec.structs.replace(job("s", tasks=3, gpus=1), spread="host"))
    decisions = d.decide()
    assert d.reasons(decisions) == {"s": "gang_does_not_fit"}
    assert next(x.message for x in decisions if isinstance(x, JobPending)) == (
        "only 2 of 3 tasks (1 GPU x 1000 milli, 1000 mCPU, 1024 MiB largest) fit at once in cell c1"
        " (spread: one task a node)"
    )
    d.feed(msgspec.structs.replace(job("s2", tasks=2, gpus=1), spread="host"))
    (placed,) = d.placed(d.decide()).values()
    assert len({t.node for t in placed.tasks}) == 2


def test_spread_and_soft_affinity_survive_a_snapshot_and_the_batched_fold() -> None:
    events: list[Any] = [with_attrs(node(f"n{i}"), labels={"zone": "ab"[i % 2]}) for i in range(40)]
    events += [prefer(job(f"p{i}", gpus=1), (10, "zone", "b")) for i in range(20)]
    events += [msgspec.structs.replace(job(f"s{i}", tasks=2, gpus=1), spread="host") for i in range(5)]
    one, batched = State(), State()
    d = Driver()
    d.state = one
    d.feed(*events, check_each=False)
    fold_lists(batched, events, [1_001 + i for i in range(len(events))])
    assert digest(batched) == digest(one)
    d.decide()
    again = restore(snapshot(one))
    assert digest(again) == digest(one)
    assert again.classes == one.classes
    spec = folded_spec(again, "s1")
    assert spec is not None
    assert spec == submission_spec(events[-4])
    assert folded_spec(again, "p3") == submission_spec(events[43])
    assert spec.spread == "host"


def test_the_invariant_catches_a_spread_gang_on_one_node() -> None:
    """A decision batch that put two tasks of a spread job on one node (as a buggy decide
    would) breaks ``spread_gangs_spread``."""
    from fleetlog.core.invariants import InvariantError, check
    from fleetlog.events.model import JobPlaced, TaskPlacement

    d = Driver()
    zoned(d, "aa")
    d.feed(msgspec.structs.replace(job("s", tasks=2, gpus=1), spread="host"), check_each=False)
    bad = JobPlaced(job_id="s", cell="c1", tasks=(TaskPlacement(0, "n0", (0,)), TaskPlacement(1, "n0", (1,))))
    from fleetlog.core.fold import fold
    from fleetlog.events import DecisionBatch

    fold(d.state, DecisionBatch(as_of=d.state.offset, digest=digest(d.state), decisions=(bad,)), 10_000_000)
    with pytest.raises(InvariantError, match="spread_gangs_spread"):
        check(d.state)
