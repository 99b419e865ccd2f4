"""The pure translations between Slurm and fleetlog (no cluster needed)."""

from __future__ import annotations

from fleetlog.backends.slurm import Backoff, SlurmBackend, SlurmConfig, SubmitSettings
from fleetlog.backends.slurm.client import SlurmJob, SlurmNode
from fleetlog.backends.slurm.mapping import (
    decode_status,
    event_key,
    gpu_gres,
    healthy,
    job_name,
    outcome,
    parse_name,
    submission,
)
from fleetlog.events import NodeRemoved, TaskPlacement, decode
from fleetlog.log.memory import MemoryLogStore
from tests.backends.slurm.harness import job


def test_job_names_round_trip_and_foreign_names_are_ignored() -> None:
    name = job_name("fl", 42, 3, "team:a/job-1")
    parsed = parse_name("fl", name)
    assert parsed is not None
    assert (parsed.incarnation, parsed.task_index, parsed.job_id) == (42, 3, "team:a/job-1")
    assert parse_name("fl", "other:1:2:x") is None
    assert parse_name("fl", "fl:x:2:job") is None
    assert parse_name("fl", "fl:1:2:") is None
    assert parse_name("fl", "interactive") is None


def test_long_event_keys_are_hashed_to_fit() -> None:
    short, long = event_key("fl:1:0:j", "started"), event_key("fl:1:0:" + "j" * 250, "started")
    assert short == "fl:1:0:j/started"
    assert long.startswith("sha256:")
    assert len(long) <= 253
    assert long != event_key("fl:1:0:" + "j" * 250, "finished")


def test_wait_statuses_decode_to_exit_codes_and_signals() -> None:
    assert decode_status(None) == (0, 0)
    assert decode_status(7 << 8) == (7, 0)
    assert decode_status(9) == (137, 9)


def test_gpu_gres_counts_typed_and_untyped_gpus_only() -> None:
    assert gpu_gres("gpu:fake:4") == (4, "fake")
    assert gpu_gres("gpu:a100:2(S:0),gpu:a100:2(S:1),nic:1") == (4, "a100")
    assert gpu_gres("gpu:8") == (8, "")
    assert gpu_gres("(null)") == (0, "")


def test_drained_down_and_unresponsive_nodes_are_unhealthy() -> None:
    assert healthy(SlurmNode("n1", "idle"))
    assert healthy(SlurmNode("n1", "mixed"))
    assert not healthy(SlurmNode("n1", "idle", ["DRAIN"]))
    assert not healthy(SlurmNode("n1", "down"))
    assert not healthy(SlurmNode("n1", "idle", ["NOT_RESPONDING"]))


def test_job_states_map_to_task_outcomes() -> None:
    assert outcome(SlurmJob(1, job_state="PENDING")).started is False
    assert outcome(SlurmJob(1, job_state="RUNNING")).ended is None
    assert outcome(SlurmJob(1, job_state="COMPLETED", exit_code=0)).ended == "finished"
    failed = outcome(SlurmJob(1, job_state="FAILED", exit_code=3 << 8))
    assert (failed.ended, failed.exit_code) == ("finished", 3)
    timeout = outcome(SlurmJob(1, job_state="TIMEOUT", state_reason="TimeLimit", exit_code=15))
    assert (timeout.ended, timeout.exit_code, timeout.started) == ("failed", 143, True)
    assert "TIMEOUT (TimeLimit)" in timeout.reason


def test_a_task_is_pinned_to_its_node_with_its_cpus_memory_and_gpus() -> None:
    spec = job("j", tasks=2, gpus=2, cpu_milli=1500, mem_mib=700)
    sub = submission(
        "fl:1:1:j", spec, TaskPlacement(1, "n3", (0, 1)), lambda s, i: "echo hi", SubmitSettings()
    )
    assert {
        "--nodelist=n3",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=2",
        "--mem=700M",
        "--gres=gpu:2",
    } <= set(sub.options)
    assert "--job-name=fl:1:1:j" in sub.options
    assert "export FLEETLOG_GPU_INDICES=0,1" in sub.script
    assert sub.script.rstrip().endswith("echo hi")


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    b = Backoff(0.25, 1.0)
    assert [b.next() for _ in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.25


def test_a_node_slurm_stops_listing_is_reported_removed() -> None:
    backend = SlurmBackend(MemoryLogStore(), SlurmConfig(gpu_model="x"))
    first = backend.observe_nodes([SlurmNode("n1", "idle", cpus=4), SlurmNode("n2", "idle", cpus=4)])
    assert [decode(m.value).event.node for m in first] == ["n1", "n2"]
    assert backend.observe_nodes([SlurmNode("n1", "idle", cpus=4), SlurmNode("n2", "idle", cpus=4)]) == []
    events = [decode(m.value).event for m in backend.observe_nodes([SlurmNode("n1", "idle", cpus=4)])]
    assert events[0] == NodeRemoved(cell="slurm", node="n2")
    assert [type(e).__name__ for e in events] == ["NodeRemoved", "NodeHeartbeat"]


def test_features_and_partitions_become_labels_and_constraints_become_terms() -> None:
    import pytest

    from fleetlog.backends.slurm.client import SlurmNode
    from fleetlog.backends.slurm.mapping import heartbeat
    from fleetlog.core.constraints import class_key, node_attrs_of, node_matches
    from fleetlog.events import TaskGroup
    from fleetlog.events.features import constraint_terms

    node = SlurmNode(
        name="n1", state="idle", cpus=8, real_memory=1024, features="ib,fast", partitions=["gpu"]
    )
    beat = heartbeat("slurm", node, "fake")
    assert beat.labels["slurm.feature/ib"] == beat.labels["slurm.feature/fast"] == "true"
    assert beat.labels["slurm.partition/gpu"] == "true"
    assert beat.labels["slurm/features"] == "ib,fast"

    def matches(expr: str) -> bool:
        g = TaskGroup(count=1, cpu_milli=1, mem_mib=1, node_affinity=constraint_terms(expr))
        return node_matches(class_key(g), node_attrs_of(beat))

    assert matches("ib")
    assert matches("ib&fast")
    assert matches("slow|fast")
    assert not matches("ib&slow")
    assert matches("a100&x|ib")  # (& binds tighter than |)
    for bad in ("[ib|fast]", "ib*2", "(ib)", "ib&", "|"):
        with pytest.raises(ValueError, match="constraint"):
            constraint_terms(bad)


def test_foreign_is_what_slurm_allocated_less_what_our_live_jobs_hold() -> None:
    import msgspec

    from fleetlog.backends.slurm.mapping import heartbeat, held_by

    node = SlurmNode(name="n1", cpus=8, real_memory=8192, gres="gpu:fake:4", alloc_cpus=5,
                     alloc_memory=2300, gres_used="gpu:fake:3(IDX:0-2)")
    ours = [
        SlurmJob(job_id=1, name="p:1:0:a", job_state="RUNNING", nodes="n1", cpus=2, memory_per_node=1000,
                 gres_detail=["gpu:fake:1(IDX:0)"]),
        SlurmJob(job_id=2, name="p:1:1:a", job_state="PENDING", nodes="", cpus=2),  # (holds nothing yet)
        SlurmJob(job_id=3, name="p:1:2:a", job_state="COMPLETING", nodes="n1", cpus=1, memory_per_node=300),
    ]
    held = held_by(ours)
    assert held == {"n1": (3, 1300, 1)}
    beat = heartbeat("c", node, "H100", held["n1"])
    assert (beat.foreign_cpu_milli, beat.foreign_mem_mib, beat.foreign_gpus) == (2000, 1000, 2)
    # ours holding more than Slurm says is allocated (the two were listed a moment apart): none
    beat = heartbeat("c", node, "H100", (9, 9000, 9))
    assert (beat.foreign_cpu_milli, beat.foreign_mem_mib, beat.foreign_gpus) == (0, 0, 0)
    # never more than the node has (a heartbeat past it would be refused)
    over = msgspec.structs.replace(node, alloc_cpus=99, alloc_memory=99_999, gres_used="gpu:fake:7(IDX:0-6)")
    beat = heartbeat("c", over, "H100")
    assert (beat.foreign_cpu_milli, beat.foreign_mem_mib, beat.foreign_gpus) == (8000, 8192, 4)
