"""``fleetlog replay``: the committed fixtures verify (the regression gate), the divergent one
fails at exactly the tampered decision, and state-at, explain, what-if, timeline, report and dump
give answers that agree with each other and with the log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import EXIT_USAGE, main

DATA = Path(__file__).parent / "data"
CLEAN = str(DATA / "clean")
DIVERGENT = str(DATA / "divergent")
PNG = b"\x89PNG\r\n\x1a\n"


def run_json(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> Any:
    assert main(["replay", *args, "--json"]) == code
    return json.loads(capsys.readouterr().out)


def test_the_clean_fixture_replays_bit_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "verify", "--log", CLEAN)
    assert report["ok"]
    assert report["divergence"] is None
    assert report["batches"] > 10
    assert report["decisions"] > report["batches"]


def test_the_divergent_fixture_fails_at_exactly_the_tampered_decision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tampered = json.loads((DATA / "divergent.json").read_text())
    report = run_json(capsys, "verify", "--log", DIVERGENT, code=1)
    d = report["divergence"]
    assert not report["ok"]
    assert report["batches"] == tampered["batch_number"]  # every batch before it matched
    assert d["decisions_offset"] == tampered["batch_number"]  # one record per batch in the file log
    assert d["what"] == f"decision #{tampered['index']}"
    assert d["recorded_decision"]["job_id"] == d["replayed_decision"]["job_id"] == tampered["job_id"]
    assert d["recorded_decision"]["tasks"][0][1] == tampered["tampered"]
    assert d["replayed_decision"]["tasks"][0][1] == tampered["original"]
    nodes = {row["key"]: row for row in d["state_diff"] if row["kind"] == "node"}
    assert set(nodes) == {f"c1/{tampered['tampered']}", f"c1/{tampered['original']}"}
    moved = nodes[f"c1/{tampered['tampered']}"]
    assert moved["recorded"]["gpu_free_milli"] < moved["replayed"]["gpu_free_milli"]
    assert d["inputs_since"][-1]["offset"] == d["as_of"] - 1
    assert d["inputs_since_count"] >= len(d["inputs_since"]) > 0
    assert d["previous_as_of"] < d["as_of"]


def test_the_divergence_is_printed_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    tampered = json.loads((DATA / "divergent.json").read_text())
    assert main(["replay", "verify", "--log", DIVERGENT]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"DIVERGED at decisions@{tampered['batch_number']}")
    assert f"node='{tampered['tampered']}'" in out
    assert "inputs since the previous batch" in out


def test_state_at_the_end_is_the_verified_state_with_and_without_snapshots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    final = run_json(capsys, "verify", "--log", CLEAN)["final_digest"]
    inputs = run_json(capsys, "state-at", "0", "--log", CLEAN, "--show", "queues")
    assert inputs["inputs_folded"] == 0
    assert inputs["queues"] == []
    total = _inputs_end(capsys)
    fast = run_json(capsys, "state-at", str(total), "--log", CLEAN)
    slow = run_json(capsys, "state-at", str(total), "--log", CLEAN, "--no-snapshots")
    assert fast["digest"] == slow["digest"] == final
    assert fast["snapshot"]
    assert slow["snapshot"] is None
    assert fast["inputs_folded"] < slow["inputs_folded"] == total
    assert {"nodes", "jobs", "tenants", "queues"} <= fast.keys()
    assert sum(q["running"] for q in fast["queues"]) == sum(t["running"] for t in fast["tenants"])


def _inputs_end(capsys: pytest.CaptureFixture[str]) -> int:
    assert main(["replay", "dump", "--log", CLEAN]) == 0
    lines = capsys.readouterr().out.splitlines()
    return int(json.loads(lines[-1])["offset"]) + 1


def test_state_at_a_time_is_the_state_after_every_input_appended_by_then(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["replay", "dump", "--log", CLEAN, "--start", "40", "--stop", "41"]) == 0
    record = json.loads(capsys.readouterr().out)
    at = run_json(capsys, "state-at", f"{record['timestamp_ms']}ms", "--log", CLEAN, "--show", "jobs")
    assert at["log_time_ms"] == record["timestamp_ms"]
    assert (
        main(
            ["replay", "dump", "--log", CLEAN, "--start", str(at["offset"]), "--stop", str(at["offset"] + 1)]
        )
        == 0
    )
    after = json.loads(capsys.readouterr().out)
    assert after["timestamp_ms"] > record["timestamp_ms"]
    by_offset = run_json(capsys, "state-at", str(at["offset"]), "--log", CLEAN, "--show", "jobs")
    assert by_offset["digest"] == at["digest"]


def test_explain_tells_the_urgent_jobs_story_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    found = run_json(capsys, "explain", "urgent", "--log", CLEAN)
    whats = [s["what"] for s in found["steps"]]
    assert whats[0] == "submitted"
    assert "preempted another job" in whats
    assert "placed" in whats
    assert whats.index("preempted another job") < whats.index("placed") < whats.index("task started")
    placed = next(s for s in found["steps"] if s["what"] == "placed")
    why = placed["why"]
    assert why["rank"] == 1
    assert why["node"] == why["best"][0]["node"]
    assert why["feasible_nodes"] >= 1
    assert why["chosen_score"] == why["best"][0]["score"]
    assert placed["detail"].startswith("cell c1: 0->" + why["node"])


def test_what_if_under_the_recorded_policy_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(capsys, "what-if", "--policy", "default", "--log", CLEAN)
    assert result["first_divergence"] is None
    assert result["moved_jobs"] == 0
    assert result["simulated_observations"] == 0
    assert result["recorded"] == result["replayed"]
    assert result["recorded"]["preemptions"] >= 1
    assert result["recorded"]["jobs_placed"] > 10


def test_what_if_under_another_policy_moves_jobs_and_compares(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('base = "best-fit"\npreemption = false\n')
    result = run_json(capsys, "what-if", "--policy", str(policy), "--log", CLEAN)
    assert result["policy"] == "best-fit?preemption=false"
    assert result["first_divergence"] is not None
    assert result["moved_jobs"] > 0
    assert result["simulated_observations"] > result["moved_jobs"]  # moved jobs started and finished
    assert result["replayed"]["preemptions"] == 0 < result["recorded"]["preemptions"]
    shares = result["replayed"]["tenant_share_pct"]
    assert set(shares) == {"t0", "t1", "t2"}
    assert sum(shares.values()) == pytest.approx(100, abs=1e-2)


def test_timeline_is_a_perfetto_trace_of_every_task(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "trace.json"
    summary = run_json(capsys, "timeline", "--out", str(out), "--log", CLEAN)
    events = json.loads(out.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    tasks = {(e["name"], e["args"]["task"], e["ts"]): e["args"]["gpus"] for e in slices}
    assert len(tasks) == summary["task_slices"] > 0
    assert len(slices) == sum(max(1, len(gpus)) for gpus in tasks.values())  # a slice per GPU held
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in slices)
    urgent = {(e["args"]["task"], e["ts"]): e for e in slices if e["name"] == "urgent"}
    assert len(urgent) == 4
    urgent = list(urgent.values())
    assert {e["args"]["end"] for e in urgent} == {"finished"}
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"queue depth", "GPU allocation"}


def test_report_writes_png_plots_and_a_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = run_json(capsys, "report", "--out", str(tmp_path / "report"), "--log", CLEAN)
    pngs = [Path(f) for f in result["files"] if f.endswith(".png")]
    assert len(pngs) == 4
    assert all(p.read_bytes().startswith(PNG) for p in pngs)
    assert json.loads((tmp_path / "report" / "summary.json").read_text()) == result["summary"]


def test_dump_shows_events_and_the_malformed_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "dump", "--log", CLEAN]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [x["offset"] for x in lines] == list(range(len(lines)))
    bad = [x for x in lines if "error" in x]
    assert len(bad) == 1
    assert bad[0]["error"]["reason"] == "undecodable"
    assert (
        main(["replay", "dump", "--log", CLEAN, "--from-log", "decisions", "--start", "1", "--stop", "3"])
        == 0
    )
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["offset"] for b in batches] == [1, 2]
    assert {b["event"]["type"] for b in batches} == {"DecisionBatch"}


# --- bad input: one line, exit 2, never a traceback -------------------------------------------


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(CLEAN, target)
    return target


def _truncated(tmp_path: Path) -> Path:
    log = _copy(tmp_path)
    segment = next((log / "inputs").glob("*.log"))
    segment.write_bytes(segment.read_bytes()[: segment.stat().st_size // 2])
    return log


def _corrupt(tmp_path: Path) -> Path:
    log = _copy(tmp_path)
    segment = next((log / "decisions").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    return log


BAD = [
    ("missing log", lambda t: ["verify", "--log", str(t / "nowhere")], "no file log at"),
    ("truncated log", lambda t: ["verify", "--log", str(_truncated(t))], "truncated"),
    ("corrupt log", lambda t: ["verify", "--log", str(_corrupt(t))], "corrupt"),
    ("corrupt log, state-at", lambda t: ["state-at", "400", "--log", str(_corrupt(t))], "corrupt"),
    ("offset out of range", lambda t: ["state-at", "1000000", "--log", CLEAN], "out of range"),
    (
        "time before the log",
        lambda t: ["state-at", "2020-01-01T00:00:00Z", "--log", CLEAN],
        "before the first",
    ),
    ("bad time format", lambda t: ["state-at", "yesterday", "--log", CLEAN], "ISO 8601"),
    ("bad section", lambda t: ["state-at", "5", "--show", "gpus", "--log", CLEAN], "choose from"),
    ("unknown job", lambda t: ["explain", "nobody", "--log", CLEAN], "unknown job 'nobody'"),
    (
        "unknown policy",
        lambda t: ["what-if", "--policy", "magic", "--log", CLEAN],
        "--policy: unknown policy 'magic'",
    ),
    (
        "bad policy file",
        lambda t: ["what-if", "--policy", str(_text(t, "p.toml", "x = [")), "--log", CLEAN],
        "cannot read the policy file",
    ),
    (
        "bad policy field",
        lambda t: ["what-if", "--policy", str(_text(t, "p.json", '{"warp": 1}')), "--log", CLEAN],
        "unknown field `warp`",
    ),
    (
        "unwritable output",
        lambda t: ["timeline", "--out", str(_text(t, "f", "") / "x.json"), "--log", CLEAN],
        "cannot write",
    ),
    (
        "dump out of range",
        lambda t: ["dump", "--start", "5", "--stop", "999999", "--log", CLEAN],
        "out of range",
    ),
    ("no log given", lambda t: ["verify"], "set exactly one place for the logs"),
    (
        "unreachable Kafka",
        lambda t: ["verify", "--kafka", "127.0.0.1:1"],
        "cannot reach Kafka at 127.0.0.1:1",
    ),
]


def _text(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("case", "argv", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(
    case: str,
    argv: Any,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("FLEETLOG_LOG_DIR", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(key, raising=False)
    assert main(["replay", *argv(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err, err
    errors = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
    assert "Traceback" not in err
    assert len(errors) == 1
    assert errors[0].startswith("fleetlog replay: error: ")


async def _copy_to_memory(tamper_batch: int) -> Any:
    """The clean fixture copied record by record (same log times) into a memory store, with the
    recorded digest of batch ``tamper_batch`` changed."""
    import msgspec

    from fleetlog.events import encode, envelope
    from fleetlog.log.base import DECISIONS, INPUTS, LOG_NAMES, Message
    from fleetlog.log.memory import MemoryLogStore
    from fleetlog.replay.source import decode_batch, open_file_source

    clock = [0]
    target = MemoryLogStore(clock=lambda: clock[0])
    await target.open()
    source = await open_file_source(CLEAN)
    try:
        for name in LOG_NAMES:
            for record in await source.store.log(name).read(0, 100_000):
                value = record.value
                if name == DECISIONS and record.offset == tamper_batch:
                    batch = msgspec.structs.replace(decode_batch(record), digest="0" * 64)
                    value = encode(envelope(batch, "tamper"))
                clock[0] = record.timestamp_ms
                await target.log(name).append([Message(value, record.key, record.headers)])
        assert await target.log(INPUTS).end_offset() == await source.store.log(INPUTS).end_offset()
    finally:
        await source.close()
    return target


async def test_a_wrong_recorded_digest_is_reported_with_the_inputs_before_it() -> None:
    from fleetlog.replay.verify import verify

    store = await _copy_to_memory(tamper_batch=5)
    report = await verify(store)
    d = report.divergence
    assert d is not None
    assert (d.what, d.decisions_offset, report.batches) == ("state digest", 5, 5)
    assert d.recorded == "0" * 64
    assert d.replayed == report.final_digest  # the state the batch was computed on
    assert d.state_diff == ()  # the recorded state is known only by its digest
    assert d.inputs_since[-1].offset < d.as_of  # offset 54, the malformed record, was skipped
    assert d.inputs_since_count == len(d.inputs_since) > 0
