"""Clusters, workloads and modes from specs and trace files; every bad input names what and where."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetlog.simulation import (
    SpecError,
    TraceError,
    arrivals,
    load_cluster,
    load_workload,
    parse_mode,
)
from fleetlog.simulation.durations import PHILLY_QUANTILES, load_durations, quantile_runtime
from tests.backends.helpers import NODE_HEADER, POD_HEADER, nodes_csv, pod, write_csv

NODE_CASES = [  # (id, lines after the header, wanted message)
    (
        "bad-int",
        ["n0,32000,131072,2,T4", "n1,lots,131072,2,T4"],
        ":3: column 'cpu_milli': 'lots' is not an integer",
    ),
    ("negative", ["n0,32000,-1,2,T4"], ":2: column 'memory_mib': -1 is outside 0.."),
    ("too-many-gpus", ["n0,32000,1,65,T4"], ":2: column 'gpu': 65 is outside 0..64"),
    ("no-model", ["n0,32000,1,2,"], ":2: node 'n0' has 2 GPUs but no model"),
    ("duplicate", ["n0,1,1,0,", "n1,1,1,0,", "n0,1,1,0,"], ":4: node 'n0' is listed twice (first on line 2)"),
    ("fields", ["n0,1,1,0"], ":2: 4 fields, but the header has 5"),
    ("no-name", [",1,1,0,"], ":2: column 'sn': a node name"),
    ("no-rows", [], ": no nodes (the file has a header but no data lines)"),
]


@pytest.mark.parametrize(("lines", "want"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES])
def test_a_malformed_node_list_names_the_file_and_line(tmp_path: Path, lines: list[str], want: str) -> None:
    path = write_csv(tmp_path / "nodes.csv", NODE_HEADER, lines)
    with pytest.raises(TraceError) as caught:
        load_cluster(str(path))
    assert str(caught.value) == f"{path}{want}" or str(caught.value).startswith(f"{path}{want}")


POD_CASES = [
    ("share-of-two", [pod("p", gpus=2, milli=500)], ":2: num_gpu 2 with gpu_milli 500"),
    ("milli-range", [pod("p", milli=1200)], ":2: column 'gpu_milli': 1200 is outside 0..1000"),
    (
        "cpu-text",
        ["p,four,8192,1,1000,,LS,Running,0,1,0"],
        ":2: column 'cpu_milli': 'four' is not an integer",
    ),
    (
        "time-text",
        ["p,1,8192,1,1000,,LS,Running,soon,1,0"],
        ":2: column 'creation_time': 'soon' is not a number",
    ),
    ("deleted-first", [pod("p", created=50, scheduled=50, deleted=10)], ":2: deletion_time 10 is before"),
    ("duplicate", [pod("p"), pod("q"), pod("p")], ":4: pod 'p' is listed twice (first on line 2)"),
    ("no-rows", [], ": no pods"),
]


@pytest.mark.parametrize(("lines", "want"), [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_a_malformed_pod_list_names_the_file_and_line(tmp_path: Path, lines: list[str], want: str) -> None:
    path = write_csv(tmp_path / "pods.csv", POD_HEADER, lines)
    cluster = load_cluster("synthetic?nodes=1")
    with pytest.raises(TraceError) as caught:
        load_workload(str(path), cluster, 1)
    assert str(caught.value).startswith(f"{path}{want}")


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"sn,cpu_milli,memory_mib,gpu,model\n\xff\xfe,1,1,0,\n")
    header = write_csv(tmp_path / "header.csv", "sn,cpu,memory_mib,gpu,model", ["n0,1,1,0,"])
    for path, want in (
        (empty, "empty file"),
        (binary, "not UTF-8 text"),
        (header, ":1: header lacks column"),
    ):
        with pytest.raises(TraceError, match=want) as caught:
            load_cluster(str(path))
        assert str(caught.value).startswith(str(path))
    with pytest.raises(TraceError, match="cannot read"):
        load_cluster(str(tmp_path / "missing" / "nodes.csv"))


SPEC_CASES = [  # (id, cluster, workload, mode, wanted message)
    ("cluster-kind", "cloud", "synthetic", "replay", "not 'synthetic', 'openb' or a CSV file"),
    ("cluster-param", "synthetic?racks=2", "synthetic", "replay", "unknown parameter 'racks'"),
    ("cluster-int", "synthetic?nodes=many", "synthetic", "replay", "nodes='many' is not an integer"),
    ("cluster-zero", "synthetic?nodes=0", "synthetic", "replay", "nodes=0 is outside 1..1000000"),
    ("cluster-both", "synthetic?nodes=2&shapes=2x8xA100", "synthetic", "replay", "nodes or shapes, not both"),
    ("shape", "synthetic?shapes=2x8", "synthetic", "replay", "shape '2x8' needs 0..64 GPUs and a model"),
    ("shape-text", "synthetic?shapes=big", "synthetic", "replay", "shape 'big' is not COUNTxGPUSxMODEL"),
    ("twice", "synthetic?nodes=1&nodes=2", "synthetic", "replay", "parameter 'nodes' given twice"),
    ("not-kv", "synthetic?nodes", "synthetic", "replay", "'nodes' is not key=value"),
    ("heartbeat", "synthetic?heartbeat_s=90", "synthetic", "replay", "heartbeat_s=90 is outside 1..45"),
    ("workload-kind", "synthetic", "poisson", "replay", "not 'synthetic', 'openb[:VARIANT]'"),
    ("workload-num", "synthetic", "synthetic?load=nan", "replay", "load=nan is outside"),
    ("workload-param", "synthetic", "synthetic?users=3", "replay", "unknown parameter 'users'"),
    ("workload-cpu", "synthetic", "synthetic?cpu=1.5", "replay", "cpu=1.5 is outside 0..1"),
    ("mode", "synthetic", "synthetic", "simulate", "choose inflate or replay"),
    ("mode-param", "synthetic", "synthetic", "replay?ratio=2", "unknown parameter 'ratio'"),
    ("order", "synthetic", "synthetic", "inflate?order=random", "order='random' is not one of file, shuffle"),
    ("batch", "synthetic", "synthetic", "inflate?batch=0", "batch=0 is outside 1..1000000"),
]


@pytest.mark.parametrize(
    ("cluster", "workload", "mode", "want"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES]
)
def test_a_bad_spec_says_what_is_wrong(cluster: str, workload: str, mode: str, want: str) -> None:
    def load() -> None:
        parse_mode(mode)
        load_workload(workload, load_cluster(cluster), 1)

    with pytest.raises(SpecError, match=re.escape(want)):
        load()


def test_replay_of_a_pod_list_without_times_is_refused(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", ["p,1,1,1,1000"]
    )
    cluster = load_cluster("synthetic?nodes=1")
    workload = load_workload(str(path), cluster, 1)
    with pytest.raises(SpecError, match="replay needs arrival times"):
        arrivals(parse_mode("replay"), workload, cluster, 1)
    assert len(arrivals(parse_mode("inflate"), workload, cluster, 1)) == 11  # 8 GPUs x 1.3: 11 one-GPU pods


def test_inflate_shuffles_by_seed_and_keeps_file_order_on_request(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "pods.csv", POD_HEADER, [pod(f"p{i}") for i in range(8)])
    cluster = load_cluster(str(nodes_csv(tmp_path / "nodes.csv")))  # 12 GPUs: 16 pods reach 130%
    workload = load_workload(str(path), cluster, 1)
    ordered = [j.job_id for j in arrivals(parse_mode("inflate?order=file"), workload, cluster, 1)]
    assert ordered[:8] == [f"p{i}" for i in range(8)]
    assert len(ordered) == 16
    assert all("~" in name for name in ordered[8:])  # copies of drawn pods, named apart
    first = [j.job_id for j in arrivals(parse_mode("inflate"), workload, cluster, 1)]
    assert first == [j.job_id for j in arrivals(parse_mode("inflate"), workload, cluster, 1)] != ordered
    assert sorted(first) != sorted(j.job_id for j in arrivals(parse_mode("inflate"), workload, cluster, 2))


def test_a_synthetic_cluster_has_the_shapes_and_topology_asked_for() -> None:
    cluster = load_cluster("synthetic?shapes=3x8xA100,2x0xcpu&hosts_per_rack=2&racks_per_block=2&cell=west")
    assert [(n.gpu_count, n.gpu_model) for n in cluster.nodes] == [(8, "A100")] * 3 + [(0, "")] * 2
    assert [n.topology[:2] for n in cluster.nodes] == [("block-000", "rack-0000")] * 2 + [
        ("block-000", "rack-0001")
    ] * 2 + [("block-001", "rack-0002")]
    assert (cluster.cell, cluster.gpu_milli) == ("west", 24_000)


def test_a_synthetic_workload_is_a_function_of_its_seed() -> None:
    cluster = load_cluster("synthetic")
    a, b = (load_workload("synthetic?jobs=50", cluster, seed) for seed in (1, 1))
    assert a == b
    assert a != load_workload("synthetic?jobs=50", cluster, 2)
    arrivals_ms = [j.arrival_ms for j in a.jobs]
    assert arrivals_ms == sorted(arrivals_ms)
    assert len({j.event.tenant for j in a.jobs}) == 3
    assert {j.event.priority for j in a.jobs} == {0, 100}
    assert any(j.event.required_topology == "rack" and j.tasks > 1 for j in a.jobs)


def test_a_synthetic_workload_has_cpu_only_jobs_only_when_asked() -> None:
    cluster = load_cluster("synthetic")
    default = load_workload("synthetic?jobs=300", cluster, 1)
    assert load_workload("synthetic?jobs=300&cpu=0", cluster, 1).jobs == default.jobs  # old seeds unchanged
    assert all(j.gpu_milli for j in default.jobs)
    mixed = load_workload("synthetic?jobs=300&cpu=0.3", cluster, 1)
    cpu_only = [j.event.task_groups[0] for j in mixed.jobs if not j.gpu_milli]
    assert 60 <= len(cpu_only) <= 120  # about 30%
    assert all(g.gpu_count == g.gpu_milli == 0 < g.cpu_milli for g in cpu_only)


def test_builtin_durations_follow_the_philly_quantiles(tmp_path: Path) -> None:
    assert [round(quantile_runtime(p)) for p, _ in PHILLY_QUANTILES] == [
        round(v) for _, v in PHILLY_QUANTILES
    ]
    runtimes = write_csv(tmp_path / "runtimes.csv", "runtime", ["60.0", "120.0"])
    sampled = load_durations(str(runtimes), scale=0.5)
    assert sampled.runtimes_s == (60.0, 120.0)
    bad = write_csv(tmp_path / "bad.csv", "runtime", ["60.0", "-3"])
    with pytest.raises(TraceError, match=r"bad\.csv:3: column 'runtime'"):
        load_durations(str(bad))
