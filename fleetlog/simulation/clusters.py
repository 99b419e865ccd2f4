"""Simulated cells from a ``--cluster`` spec: which nodes there are, and how the cell behaves.

A cluster comes from a spec: ``synthetic`` (N nodes of given shapes in a block/rack/host
topology) or a node-list CSV in the Alibaba cluster-trace-gpu-v2023 "openb" format
(``sn,cpu_milli,memory_mib,gpu,model``).  Either may carry the cell's behaviour as
parameters: heartbeat period, task start delay, node failures and repairs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fleetlog.backends.simulated.cluster import CellBehaviour, Cluster, NodeSpec
from fleetlog.numerals import whole
from fleetlog.simulation.csvfile import read_rows
from fleetlog.simulation.spec import Spec, SpecError, TraceError, looks_like_path, parse_spec
from fleetlog.simulation.traces import openb_file

MAX_GPUS_PER_NODE: Final = 64
BEHAVIOUR_PARAMS: Final = ("heartbeat_s", "start_delay_s", "mtbf_h", "mttr_s", "cell")
SYNTHETIC_PARAMS: Final = ("nodes", "shapes", "hosts_per_rack", "racks_per_block")
DEFAULT_SHAPES: Final = "24x8xA100,8x4xT4"
SYNTHETIC_MTBF_H: Final = 168.0
"""Synthetic nodes fail about once a week each by default (trace clusters: never, unless asked)."""
NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


def load_cluster(text: str) -> Cluster:
    """The cluster a ``--cluster`` argument names: ``synthetic[?...]``, ``openb[?...]`` or a CSV path."""
    spec = parse_spec(text)
    if spec.kind == "synthetic":
        spec.check_known(SYNTHETIC_PARAMS + BEHAVIOUR_PARAMS)
        return synthetic_cluster(spec)
    if spec.kind == "openb" or looks_like_path(spec.kind):
        spec.check_known(BEHAVIOUR_PARAMS)
        path = openb_file("openb_node_list_gpu_node.csv") if spec.kind == "openb" else Path(spec.kind)
        nodes = read_node_list(path)
        return Cluster(spec.text_param("cell", "openb"), nodes, behaviour_of(spec), str(path))
    raise SpecError(f"--cluster {text!r}: not 'synthetic', 'openb' or a CSV file that exists")


def behaviour_of(spec: Spec, mtbf_h: float = 0.0) -> CellBehaviour:
    """The cell behaviour parameters of ``spec`` (``mtbf_h``: the default mean time between failures)."""
    heartbeat = spec.number("heartbeat_s", 20.0, 1.0, 45.0)  # + a 10 s tick: under the 60 s node timeout
    return CellBehaviour(
        heartbeat_ms=round(heartbeat * 1000),
        max_start_delay_ms=round(spec.number("start_delay_s", 2.0, 0.0, 3600.0) * 1000),
        mtbf_ms=round(spec.number("mtbf_h", mtbf_h, 0.0, 1e6) * 3_600_000),
        mttr_ms=max(round(spec.number("mttr_s", 600.0, 0.0, 1e7) * 1000), round(heartbeat * 1000)),
    )


def synthetic_cluster(spec: Spec) -> Cluster:
    """``shapes`` (``COUNTxGPUSxMODEL,...``; ``nodes=N`` alone means N eight-GPU A100 nodes),
    racks of ``hosts_per_rack`` hosts, blocks of ``racks_per_block`` racks."""
    if "nodes" in spec.params and "shapes" in spec.params:
        raise SpecError(f"{spec.text!r}: give nodes or shapes, not both")
    count = spec.integer("nodes", 0, 1, 1_000_000)
    shapes_text = f"{count}x8xA100" if count else spec.text_param("shapes", DEFAULT_SHAPES)
    per_rack = spec.integer("hosts_per_rack", 8, 1, 1_000_000)
    per_block = spec.integer("racks_per_block", 4, 1, 1_000_000)
    nodes: list[NodeSpec] = []
    for count, gpus, model in parse_shapes(spec, shapes_text):
        for _ in range(count):
            i = len(nodes)
            name = f"node-{i:05d}"
            rack = i // per_rack
            nodes.append(
                NodeSpec(
                    name,
                    *node_resources(gpus),
                    gpus,
                    model if gpus else "",
                    (f"block-{rack // per_block:03d}", f"rack-{rack:04d}", name),
                )
            )
    behaviour = behaviour_of(spec, SYNTHETIC_MTBF_H)
    return Cluster(spec.text_param("cell", "sim"), tuple(nodes), behaviour, spec.text or "synthetic")


def parse_shapes(spec: Spec, text: str) -> list[tuple[int, int, str]]:
    """``24x8xA100,8x4xT4`` as (count, GPUs per node, model) triples."""
    out = []
    for part in text.split(","):
        count, x1, rest = part.partition("x")
        gpus, x2, model = rest.partition("x")
        if not (x1 and whole(count) is not None and whole(gpus) is not None and int(count) > 0):
            raise SpecError(f"{spec.text!r}: shape {part!r} is not COUNTxGPUSxMODEL (e.g. 24x8xA100)")
        if int(gpus) > MAX_GPUS_PER_NODE or (int(gpus) > 0 and not (x2 and model)):
            raise SpecError(f"{spec.text!r}: shape {part!r} needs 0..{MAX_GPUS_PER_NODE} GPUs and a model")
        out.append((int(count), int(gpus), model))
    if sum(c for c, _, _ in out) > 1_000_000:
        raise SpecError(f"{spec.text!r}: at most 1,000,000 nodes")
    return out


def node_resources(gpus: int) -> tuple[int, int]:
    """CPU (milli) and memory (MiB) of a synthetic node: 12 cores and 96 GiB per GPU (CPU-only: 64, 256)."""
    return (12_000 * gpus, 98_304 * gpus) if gpus else (64_000, 262_144)


def read_node_list(path: Path) -> tuple[NodeSpec, ...]:
    """Nodes of an openb node-list CSV, in file order; a malformed line is a :class:`TraceError`."""
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for row in read_rows(path, NODE_COLUMNS):
        name, gpus, model = row.text("sn"), row.integer("gpu", 0, MAX_GPUS_PER_NODE), row.text("model")
        if not name or len(name) > 253:
            raise row.error("column 'sn': a node name of 1..253 characters is required")
        if name in seen:
            raise row.error(f"node {name!r} is listed twice (first on line {seen[name]})")
        if gpus and not model:
            raise row.error(f"node {name!r} has {gpus} GPUs but no model")
        seen[name] = row.line
        cpu, mem = row.integer("cpu_milli", 0, 1 << 40), row.integer("memory_mib", 0, 1 << 40)
        nodes.append(NodeSpec(name, cpu, mem, gpus, model if gpus else ""))
    if not nodes:
        raise TraceError(path, 0, "no nodes (the file has a header but no data lines)")
    return tuple(nodes)
