"""One valid example of every event type, for round-trip and schema tests."""

from __future__ import annotations

from fleetlog.events import (
    CellSummary,
    DecisionBatch,
    Event,
    FreeSlots,
    JobCancelled,
    JobDispatched,
    JobPayload,
    JobPending,
    JobPlaced,
    JobRejected,
    JobReturned,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeat,
    NodeLabel,
    NodeRemoved,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PolicyGrant,
    PolicySet,
    QuotaSet,
    Resources,
    Taint,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
    TenantUsage,
    Tick,
    Toleration,
)


def job(job_id: str = "job-1", gpus: int = 8, tasks: int = 2) -> JobSubmitted:
    return JobSubmitted(
        job_id=job_id,
        tenant="team-a",
        queue="training",
        priority=100,
        task_groups=(
            TaskGroup(
                count=tasks, cpu_milli=16_000, mem_mib=65_536, gpu_count=gpus, gpu_milli=1000, name="worker"
            ),
            TaskGroup(
                count=1, cpu_milli=500, mem_mib=1024, gpu_count=1, gpu_milli=250, gpu_models=("T4", "A10")
            ),
            TaskGroup(count=1, cpu_milli=2000, mem_mib=4096),
        ),
        allowed_cells=("cell-a", "cell-b"),
        required_topology="rack",
        expected_duration_ms=3_600_000,
    )


ALL_EVENTS: list[Event] = [
    job(),
    JobSubmitted(job_id="j2", tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),)),
    JobSubmitted(
        job_id="j3",
        tenant="t",
        task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),),
        labels={"team": "vision", "app.kubernetes.io/name": "trainer", "empty": ""},
        annotations={"owner": "Ada Lovelace <ada@example.org>", "note": "line 1\nline 2 'quoted' $(not run)"},
        payload=JobPayload(
            command=("python", "train.py", "--lr", "0.1", "it's \"quoted\"", "$(rm -rf /)", "two\nlines"),
            env={"CUDA_VISIBLE_DEVICES": "0,1", "GREETING": "hello; echo injected"},
            image="nvcr.io/nvidia/pytorch:24.01-py3",
        ),
    ),
    JobSubmitted(
        job_id="j4",
        tenant="t",
        task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),),
        payload=JobPayload(script="#!/bin/bash\nset -e\necho \"$HOME\"\n"),
    ),
    JobCancelled(job_id="job-1", reason="user asked"),
    NodeHeartbeat(
        cell="cell-a",
        node="node-0001",
        cpu_milli=96_000,
        mem_mib=786_432,
        gpu_count=8,
        gpu_model="A100",
        topology=("block-1", "rack-3", "host-17"),
        labels={"zone": "eu-1", "kubernetes.io/arch": "amd64"},
    ),
    NodeHeartbeat(cell="cell-a", node="cpu-7", cpu_milli=8000, mem_mib=32_768, healthy=False),
    NodeHeartbeat(
        cell="cell-a",
        node="gpu-9",
        cpu_milli=64_000,
        mem_mib=262_144,
        gpu_count=4,
        gpu_model="H100",
        labels={"zone": "eu-2"},
        taints=(
            Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),
            Taint(key="maintenance", effect="NoExecute"),
        ),
        unschedulable=True,
    ),
    JobSubmitted(
        job_id="j3",
        tenant="t",
        task_groups=(
            TaskGroup(
                count=2,
                cpu_milli=1000,
                mem_mib=1024,
                gpu_count=1,
                gpu_milli=1000,
                node_selector=(NodeLabel(key="zone", value="eu-2"),),
                node_affinity=(
                    NodeSelectorTerm(
                        match_expressions=(
                            NodeSelectorRequirement(key="gpu-class", operator="In", values=("big", "huge")),
                            NodeSelectorRequirement(key="spot", operator="DoesNotExist"),
                        )
                    ),
                    NodeSelectorTerm(
                        match_expressions=(NodeSelectorRequirement(key="reserved", operator="Exists"),)
                    ),
                ),
                tolerations=(
                    Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
                    Toleration(key="maintenance", value="", effect="NoExecute"),
                    Toleration(operator="Exists"),
                ),
            ),
        ),
    ),
    NodeRemoved(cell="cell-a", node="node-0001"),
    NodeDrained(cell="cell-a", node="node-0002", reason="firmware update"),
    TaskStarted(job_id="job-1", task_index=0, node="node-0001"),
    TaskFinished(job_id="job-1", task_index=0, exit_code=0),
    TaskFailed(job_id="job-1", task_index=1, reason="OOMKilled", exit_code=137),
    QuotaSet(
        tenant="team-a",
        cell="cell-a",
        cohort="research",
        nominal=Resources(cpu_milli=1_000_000, mem_mib=4_000_000, gpu_milli=64_000),
        borrowing_limit=Resources(gpu_milli=16_000),
        weight_milli=2000,
    ),
    PolicySet(
        grants=(
            PolicyGrant("ci team a", ("tenant:team-a", "tenant:team-a-batch")),
            PolicyGrant("slurm-backend", ("backend:cell-a",)),
            PolicyGrant("root", ("policy-admin", "operator", "quota-admin", "reader", "node-agent:cell-a")),
        ),
        reason="on-call rota",
    ),
    Tick(),
    DecisionBatch(
        as_of=42,
        digest="ab" * 32,
        policy="default",
        decisions=(
            JobPlaced(job_id="job-1", cell="cell-a", tasks=(TaskPlacement(0, "node-0001", (0, 1, 2, 3)),)),
            TaskPreempted(job_id="job-0", task_index=3, by_job_id="job-1", cause="priority"),
            JobRejected(job_id="job-9", reason="no_such_gpu_model", message="no cell has GPU model H200"),
            JobPending(
                job_id="job-7", reason="gang_does_not_fit_topology", message="no rack has 8 free GPUs; best 5"
            ),
        ),
    ),
    JobDispatched(job=job(), cell="cell-b", attempt=2, seq=17, as_of=4242),
    JobReturned(
        job_id="job-1",
        cell="cell-a",
        attempt=1,
        reason="gang_does_not_fit_topology",
        message="no rack has 8 free GPUs; best 5",
        as_of=99,
    ),
    CellSummary(
        cell="cell-a",
        partition=3,
        seq=12,
        as_of=120_000,
        at_ms=1_700_000_000_000,
        total=Resources(cpu_milli=96_000_000, mem_mib=786_432_000, gpu_milli=8_000_000),
        dispatched_seq=16,
        pending=4,
        free=(
            FreeSlots("", 0, 40, 320_000, 1_280_000),
            FreeSlots("A100", 1, 64, 900_000, 7_000_000),
            FreeSlots("A100", 8, 6, 900_000, 7_000_000),
        ),
        usage=(TenantUsage("team-a", 64_000, 512_000, 16_000), TenantUsage("team-b", 1000, 1024, 0)),
    ),
]
