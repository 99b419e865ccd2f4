"""The handlers of ``fleetlog replay …`` (registered by :mod:`fleetlog.replay.command`).

The same on the embedded file log and on Kafka: the CLI resolves ``--config``/``--log``/``--kafka``
(the service's configuration rules) and hands this module a place — a directory or a
:class:`~fleetlog.log.kafka.KafkaConfig`.  Every bad input is one line and exit code 2; ``verify``
exits with 1 when the log diverges.  Long work shows a progress bar when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from rich.table import Table

from fleetlog.api.dryrun import dry_run
from fleetlog.api.resources import ApiError
from fleetlog.api.routes import answer_list
from fleetlog.core.policy import Policy, UnknownPolicyError, policy_named
from fleetlog.core.views import (
    job_status,
    jobs_table,
    named_by_reports,
    nodes_table,
    queues_table,
    tenants_table,
)
from fleetlog.display import console, describe, log_time, print_sections
from fleetlog.log.base import INPUTS, LogError, Shard
from fleetlog.log.consumer import parked_for_job
from fleetlog.log.kafka import KafkaConfig
from fleetlog.logsetup import silence
from fleetlog.measures import ROWS as MEASURE_ROWS
from fleetlog.measures import rows as measure_rows
from fleetlog.replay import fleet_handlers
from fleetlog.replay import source as src
from fleetlog.replay.audit import command as cmd_audit
from fleetlog.replay.charts import Quotas
from fleetlog.replay.dump import dump
from fleetlog.replay.explain import explain
from fleetlog.replay.history import command as cmd_history
from fleetlog.replay.jobend import retired_status, with_run_facts
from fleetlog.replay.shards import Topology, open_shard
from fleetlog.replay.source import ReplayError, Source
from fleetlog.replay.state_at import Point, history, log_time_of, state_at
from fleetlog.replay.terminal import parse_point, progress_bar
from fleetlog.replay.timeline import record, write_report, write_trace
from fleetlog.replay.verify import verify
from fleetlog.replay.whatif import what_if

EXIT_DIVERGED = 1
EXIT_NOTHING_TO_VERIFY = 3
Place = Path | KafkaConfig
Handler = Callable[[argparse.Namespace, Source], Awaitable[int]]
T = TypeVar("T")
SECTIONS = ("nodes", "jobs", "tenants", "queues")


async def _with_source(place: Place, args: argparse.Namespace, handler: Handler,
                       shard: Shard = Shard.SINGLE, topology: Topology | None = None) -> int:
    """Run ``handler`` on the logs of ``shard`` (a cell partition: folded with its shard's
    settings from ``topology``)."""
    snapshots = not getattr(args, "no_snapshots", False)
    source = await open_shard(place, shard, topology, snapshots)
    core = getattr(args, "core", None)  # (the CLI's: the configuration the service ran with)
    if core is not None and topology is None:
        source.core = core
    try:
        for note in source.warnings:
            print(f"warning: {note}", file=sys.stderr)
        inputs, decisions = await history(source)
        if inputs or decisions:
            print(f"note: the logs start at inputs offset {inputs} and decisions offset {decisions} (older "
                  "history was pruned): replay starts from the oldest snapshot they continue",
                  file=sys.stderr)
        try:
            return await handler(args, source)
        except ValueError as exc:  # (fold: a decision the inputs, folded so, cannot have made)
            raise ReplayError(
                f"the logs do not fold with these settings: {exc}; was the log written with other "
                "settings? give the service's node timeout (--node-timeout SECONDS) or its --config"
            ) from None
    finally:
        await source.close()


async def _inputs_total(source: Source) -> int:
    return await src.end_offset(source.store, INPUTS)


def _print_json(data: Any) -> None:
    print(json.dumps(msgspec.to_builtins(data), indent=None))


# --- verify --------------------------------------------------------------------------------


async def cmd_verify(args: argparse.Namespace, source: Source) -> int:
    with progress_bar("verify", await _inputs_total(source)) as bar:
        report = await verify(source, progress=bar, jobs=args.jobs)
    if report.empty:  # nothing was checked: not a pass (docs/replay.md, exit code 3)
        inputs = await src.end_offset(source.store, INPUTS)
        report = msgspec.structs.replace(report, inputs=max(report.inputs, inputs))
    cut = source.cut  # (a torn decisions tail, a log shorter than it once was: issue 46)
    if args.json:
        _print_json({"ok": report.ok and not report.empty and not cut, "nothing_to_verify": report.empty,
                     "cut": list(cut), **msgspec.to_builtins(report)})
    else:
        _print_verify(report, cut)
    if cut and report.ok:
        return EXIT_DIVERGED
    return EXIT_NOTHING_TO_VERIFY if report.empty else 0 if report.ok else EXIT_DIVERGED


def _print_verify(report: Any, cut: tuple[str, ...] = ()) -> None:
    summary = f"{report.batches:,} batches, {report.decisions:,} decisions, {report.inputs:,} inputs"
    if cut and report.ok:  # what is left verifies, but it is not the whole log: not a pass
        print(f"CUT: {summary} replayed bit-exactly, but the log was cut: what it lost is not verified")
        for note in cut:
            print(f"  {note}")
        return
    if report.empty:
        print(f"NOTHING TO VERIFY: {report.inputs:,} inputs and no decision batch: no scheduler has "
              "decided on this log yet (`fleetlog run` does)")
        return
    if report.ok:
        print(f"OK: {summary} replayed bit-exactly; final digest {report.final_digest}")
        return
    d = report.divergence
    print(
        f"DIVERGED at decisions@{d.decisions_offset} (as_of {d.as_of}, policy {d.policy or 'default'}) "
        f"after {summary} matched"
    )
    print(f"  what:      {d.what}")
    print(f"  recorded:  {d.recorded}")
    print(f"  replayed:  {d.replayed}")
    if d.what == "state digest" and report.batches == 0:  # (the digest covers the fold's settings)
        print("  hint:      a service run with another node timeout diverges here: replay with its "
              "--node-timeout SECONDS (or service.node_timeout_ms); so does a log recorded with the "
              "first CPU-bound rule (d932362, 2026-12-07): replay it with "
              "service.cpu_bound_weights = false (FLEETLOG_SERVICE_CPU_BOUND_WEIGHTS=0); one recorded "
              "before it with service.cpu_bound_rule = false "
              "(FLEETLOG_SERVICE_CPU_BOUND_RULE=0), and one recorded before 2026-12-06 with "
              "service.shape_cpu_rows = 0 as well "
              "(FLEETLOG_SERVICE_SHAPE_CPU_ROWS=0); and every log recorded before capacity reasons "
              "counted only the nodes a job may use (issue 47, 2026-12-07) with "
              "service.most_free_usable = false (FLEETLOG_SERVICE_MOST_FREE_USABLE=0)")
    for row in d.state_diff:
        print(f"  state {row.kind} {row.key}: recorded {row.recorded} vs replayed {row.replayed}")
    print(f"  inputs since the previous batch (as_of {d.previous_as_of}): {d.inputs_since_count}")
    for seen in d.inputs_since:
        print(f"    inputs@{seen.offset} {log_time(seen.timestamp_ms)}  {json.dumps(seen.event)}")


# --- state-at ------------------------------------------------------------------------------


async def cmd_state_at(args: argparse.Namespace, source: Source) -> int:
    point = parse_point(args.point)
    sections = _sections(args.show)
    with progress_bar("state-at", None) as bar:
        found = await state_at(source, point, use_snapshots=not args.no_snapshots, progress=bar)
    state = found.state
    tables = {
        "nodes": lambda: nodes_table(state),
        "jobs": lambda: jobs_table(state, include_finished=args.all_jobs),
        "tenants": lambda: tenants_table(state),
        "queues": lambda: queues_table(state),
    }
    out: dict[str, Any] = {
        "offset": found.offset,
        "log_time_ms": await log_time_of(source, found.offset),
        "digest": found.digest,
        "snapshot": found.snapshot,
        "inputs_folded": found.inputs_folded,
        "batches_folded": found.batches_folded,
        "seconds": round(found.seconds, 4),
        "notes": found.notes,
    }
    out |= {name: tables[name]() for name in sections}
    if args.json:
        _print_json(out)
    else:
        _print_state(out, sections, args.limit)
    return 0


async def cmd_status(args: argparse.Namespace, source: Source) -> int:
    """``fleetlog status JOB``: the job as the state at the end of the logs holds it, and for a
    job that ended, when, after how long and with which exit code (from its events)."""
    end = await src.end_offset(source.store, INPUTS)
    state = (await state_at(source, Point(offset=end))).state
    found = job_status(state, args.job)
    if found is None:
        found = await retired_status(source, args.job)
        if found is not None:  # (it retired: its status is in the logs, not the state)
            if args.json:
                _print_json(found)
            else:
                print("\n".join(describe(found)))
            return 0
        if state.known_job(args.job):
            raise ReplayError(f"job {args.job!r} retired (it ended more than retain_finished_ms ago) and its "
                              "submission is no longer in the inputs log: its history was pruned")
        try:
            parked = await parked_for_job(source.store, args.job)
        except LogError:  # no dead-letter log to read (a Kafka topic never created): nothing parked
            parked = None
        if parked is not None:  # refused, not unknown: say why and where to look
            raise ReplayError(
                f"job {args.job!r} was refused: its record {parked.source} is in the dead-letter log at "
                f"offset {parked.offset} ({parked.reason}: {parked.error[:300]}); see `fleetlog replay dump "
                f"--from-log dead-letters --start {parked.offset}`")
        raise ReplayError(f"unknown job {args.job!r}: no JobSubmitted for it in the inputs log"
                          + named_by_reports(state, args.job))
    found = await with_run_facts(source, state, found)
    if args.json:
        _print_json(found)
    else:
        print("\n".join(describe(found)))
    return 0


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in SECTIONS]
    if bad or not names:
        raise ReplayError(f"--show {text!r}: choose from {', '.join(SECTIONS)} (comma-separated)")
    return names


def _print_state(out: dict[str, Any], sections: tuple[str, ...], limit: int) -> None:
    screen = console()
    via = f"snapshot {out['snapshot']}" if out["snapshot"] else "the start of the log"
    when = "" if out["log_time_ms"] is None else f" (log time {log_time(out['log_time_ms'])})"
    screen.print(
        f"state at inputs offset {out['offset']}{when}, "
        f"digest {out['digest'][:16]}…; from {via}: {out['inputs_folded']:,} inputs and "
        f"{out['batches_folded']:,} batches folded in {out['seconds']} s"
    )
    for note in out["notes"]:
        screen.print(f"note: {note}")
    print_sections(screen, out, sections, limit)


# --- explain -------------------------------------------------------------------------------


async def cmd_explain(args: argparse.Namespace, source: Source) -> int:
    with progress_bar("explain", await _inputs_total(source)) as bar:
        found = await explain(source, args.job, why=not args.no_why, progress=bar)
    if args.json:
        _print_json(found)
        return 0
    print(f"job {found.job_id}: {len(found.steps)} steps")
    for step in found.steps:
        where = f"{step.log}@{step.offset}"
        print(f"  {where:<18} {log_time(step.time_ms)}  {step.what}  {step.detail}")
        if step.why:
            _print_why(step.why)
    return 0


def _print_why(why: dict[str, Any]) -> None:
    if "error" in why:
        print(f"      why: {why['error']}")
        return
    print(
        f"      why {why['node']}: rank {why['rank']} of {why['feasible_nodes']} feasible nodes "
        f"({why['up_nodes_in_cell']} up in the cell) under policy {why['policy']}; {why['rule']}"
    )
    for rival in why["best"]:
        print(f"        {rival['node']}: score {rival['score']}")


# --- what-if -------------------------------------------------------------------------------


def load_policy(spec: str) -> Policy:
    """A policy by name (``fgd``, ``best-fit?preemption=false``…) or from a TOML/JSON file of Policy
    fields (``base = "fgd"`` picks the built-in it starts from)."""
    path = Path(spec)
    try:
        if path.suffix in (".toml", ".json") or path.is_file():
            fields = _policy_file(path)
            base = str(fields.pop("base", "default"))
            return policy_named(base, **fields)
        return policy_named(spec)
    except UnknownPolicyError as exc:
        raise ReplayError(f"--policy: {exc}") from None


def _policy_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReplayError(f"cannot read the policy file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ReplayError(f"the policy file {path} must hold a table of Policy fields")
    return data


async def cmd_what_if(args: argparse.Namespace, source: Source) -> int:
    policy = load_policy(args.policy)
    with progress_bar("what-if", 2 * await _inputs_total(source)) as bar:
        result = await what_if(source, policy, progress=bar)
    if args.json:
        _print_json(result)
        return 0
    table = Table(title=f"what-if: {result.policy} vs recorded {result.recorded_policy or 'default'}")
    for column in ("measure", "recorded", "what-if"):
        table.add_column(column)
    for label, key, fmt in MEASURE_ROWS:  # the measures replay report and simulate print
        table.add_row(label, fmt(result.recorded.get(key)), fmt(result.replayed.get(key)))
    console().print(table)
    first = result.first_divergence
    print(
        "no decision differs: the policies agree on this log"
        if first is None
        else f"first diverging decision at decisions@{first['decisions_offset']} (as_of {first['as_of']}); "
        f"{result.moved_jobs} jobs moved (their observations simulated)"
    )
    return 0


# --- timeline, report, dump ----------------------------------------------------------------


async def cmd_timeline(args: argparse.Namespace, source: Source) -> int:
    with progress_bar("timeline", await _inputs_total(source)) as bar:
        slices, measures = await record(source, bar)
    count = _write(lambda: write_trace(Path(args.out), slices, measures), args.out)
    out = {"out": args.out, "trace_events": count, "task_slices": len(slices.done)}
    print(
        json.dumps(out)
        if args.json
        else f"wrote {count:,} trace events ({len(slices.done):,} task slices) to {args.out}; "
        "open it in https://ui.perfetto.dev"
    )
    return 0


async def cmd_report(args: argparse.Namespace, source: Source) -> int:
    quotas = Quotas()
    with progress_bar("report", await _inputs_total(source)) as bar:
        _, measures = await record(source, bar, (quotas,))  # Measures: as simulate computes them
    files = _write(lambda: write_report(Path(args.out), measures, quotas), args.out)
    summary = measures.summary()
    if args.json:
        print(json.dumps({"out": args.out, "files": [str(f) for f in files], "summary": summary}))
        return 0
    table = Table(title=f"fleetlog replay report — {source.where}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, text in measure_rows(summary):  # the rows and numbers fleetlog simulate prints
        table.add_row(label, text)
    console().print(table)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _write(action: Callable[[], T], where: str) -> T:
    try:
        return action()
    except OSError as exc:
        raise ReplayError(f"cannot write {where}: {exc}") from None


async def cmd_dump(args: argparse.Namespace, source: Source) -> int:
    async for line in dump(source, args.from_log, args.start, args.stop):
        print(json.dumps(line))
    return 0


async def cmd_list(args: argparse.Namespace, source: Source) -> int:
    """``fleetlog jobs|nodes|...`` without a service: the API's list (``args.list_path``) of the
    state at the end of the logs, every page (``args.read_list``), kept in ``args.listed``."""
    end = await src.end_offset(source.store, INPUTS)
    state = (await state_at(source, Point(offset=end))).state

    def fetch(query: dict[str, list[str]]) -> dict[str, Any]:
        try:
            page: dict[str, Any] = msgspec.to_builtins(answer_list(state, args.list_path, query))
        except ApiError as exc:
            raise ReplayError(exc.message) from None
        return page

    args.listed = args.read_list(fetch)
    return 0


async def cmd_dry_run(args: argparse.Namespace, source: Source) -> int:
    """``fleetlog submit --dry-run`` without a service: :func:`fleetlog.api.dryrun.dry_run` of
    ``args.dry_jobs`` with ``args.dry_policy`` on the state at the end of the logs, kept in
    ``args.dry_answer`` (the API's shape)."""
    end = await src.end_offset(source.store, INPUTS)
    state = (await state_at(source, Point(offset=end))).state
    args.dry_answer = msgspec.to_builtins(dry_run(state, args.dry_policy, args.dry_jobs))
    return 0


async def cmd_serve(args: argparse.Namespace, source: Source) -> int:
    """``fleetlog replay serve``: the server is the CLI's (``args.serve``, fleetlog.replay_serve:
    replay imports no HTTP server); it answers from states this replay folds."""
    serve: Callable[[argparse.Namespace, Source], Awaitable[int]] | None = getattr(args, "serve", None)
    if serve is None:
        raise ReplayError("replay serve runs from the fleetlog command")
    return await serve(args, source)


async def run(name: str, place: Place, args: argparse.Namespace) -> int:
    """Open the logs at ``place`` and run the handler of subcommand ``name``: across the shards of
    a deployment with a ``[cells]`` map (or on the one ``--shard`` names), else on the one log."""
    silence("aiokafka")  # its connection errors reach us as one line
    topology: Topology | None = getattr(args, "topology", None)
    if topology is None and getattr(args, "shard", None) is None:
        return await _with_source(place, args, HANDLERS[name])

    async def single(shard: Shard) -> int:
        return await _with_source(place, args, HANDLERS[name], shard, topology)

    return await fleet_handlers.run(name, place, args, topology, single)


HANDLERS: dict[str, Handler] = {
    "status": cmd_status,
    "verify": cmd_verify,
    "state-at": cmd_state_at,
    "explain": cmd_explain,
    "what-if": cmd_what_if,
    "timeline": cmd_timeline,
    "report": cmd_report,
    "dump": cmd_dump,
    "list": cmd_list,
    "dry-run": cmd_dry_run,
    "history": cmd_history,
    "audit": cmd_audit,
    "serve": cmd_serve,
}

