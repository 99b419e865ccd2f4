"""``fleetlog agent``, the fake node agent, beside ``fleetlog run``: both real child processes on one
file log.  A job goes from ``submit --wait`` to succeeded; the nodes stay up past the node timeout;
a restarted agent goes on with what was placed; the README's "Try the service on one machine" runs
as written; SIGTERM stops the agent with exit code 0."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlog.backends.agent import AgentConfig, FakeAgent, kind_of
from fleetlog.events import (
    DecisionBatch,
    JobCancelled,
    JobPlaced,
    NodeHeartbeat,
    NodeRemoved,
    TaskFinished,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
    decode,
    encode,
    envelope,
)
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.memory import MemoryLogStore
from fleetlog.service.auth import entry_toml, new_token
from tests.core.builders import job
from tests.service.process import REPO, ServiceProcess

FLEETLOG = [sys.executable, "-m", "fleetlog.cli"]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
WAIT_S = 120.0
"""Generous bounds for what takes a second or two (a busy 2-core machine)."""


def new_log(directory: Path) -> Path:
    """An empty file log, as ``fleetlog run --create`` starts one."""

    async def create() -> None:
        async with FileLogStore(directory):
            pass

    asyncio.run(create())
    return directory


def fleetlog(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETLOG, *argv], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=WAIT_S * 2, check=False)


class Agent:
    """One ``fleetlog agent`` child process; its stdout and stderr go to files."""

    def __init__(self, tmp: Path, log: Path, *flags: str, name: str = "agent",
                 token: str | None = None) -> None:
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        env = ENV if token is None else {**ENV, "FLEETLOG_TOKEN": token}
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([*FLEETLOG, "agent", "--log", str(log), "--json", *flags], cwd=REPO,
                                         env=env, stdout=out, stderr=err, text=True)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def wait_ready(self) -> None:
        """Until its first heartbeats are in (it says so on stderr)."""
        wait_until("the agent's nodes are up", lambda: "nodes up in cell" in self.err.read_text(), self)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(WAIT_S)

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_until(what: str, check: Any, agent: Agent | None = None, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if agent is not None:
            exited = agent.proc.poll()
            assert exited is None, f"the agent exited ({exited}): {agent.err.read_text()}"
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def get(address: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as answer:
        return json.loads(answer.read())


def history(log: Path) -> dict[str, dict[str, Any]]:
    done = fleetlog("history", "--log", str(log), "-o", "json")
    assert done.returncode == 0, done.stderr
    return {item["job_id"]: item for item in json.loads(done.stdout)["items"]}


def inputs(log: Path) -> list[Any]:
    """The events of the inputs log (read-only: the service holds the writer lock)."""

    async def read() -> list[Any]:
        async with FileLogStore(log, read_only=True) as store:
            records = await store.log(INPUTS).read(0, 100_000)
        return [decode(r.value, r.header("content-type")).event for r in records]

    return asyncio.run(read())


def task_events(log: Path, job_id: str) -> list[Any]:
    events = inputs(log)
    return [e for e in events if isinstance(e, TaskStarted | TaskFinished) and e.job_id == job_id]


Beside = tuple[Path, ServiceProcess, list["Agent"]]


@pytest.fixture
def beside(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Beside]:
    """A running service on a new file log (``--node-timeout`` the test's indirect parameter, if
    any), and the agents a test starts: all stopped at the end."""
    log = new_log(tmp_path / "log")
    timeout = getattr(request, "param", None)
    flags = ["--node-timeout", str(timeout)] if timeout is not None else []
    service = ServiceProcess(tmp_path / "service.out", ["--log", str(log), *flags], {}).start()
    agents: list[Agent] = []
    try:
        service.wait_leading()
        yield log, service, agents
    finally:
        for agent in agents:
            agent.kill_if_running()
        service.stop()


def test_a_job_goes_from_submit_to_succeeded_through_run_and_agent_processes(
    tmp_path: Path, beside: Beside
) -> None:
    log, service, agents = beside
    agent = Agent(tmp_path, log, "--nodes", "2", "--gpus", "8", "--heartbeat-s", "0.5")
    agents.append(agent)
    agent.wait_ready()
    done = fleetlog("submit", "train-1", "--tenant", "alice", "--gpus", "8", "--tasks", "2", "--duration-ms",
                    "2500", "--log", str(log), "--wait", "--wait-for", "ended", "--timeout", str(WAIT_S))
    assert done.returncode == 0, done.stdout + done.stderr
    states = [line.split()[3] for line in done.stdout.splitlines() if " job train-1 " in line]
    order = ["pending", "placed", "running", "succeeded"]
    assert states[-1] == "succeeded", done.stdout
    assert "running" in states, done.stdout
    assert [order.index(s) for s in states] == sorted(order.index(s) for s in states), done.stdout
    said = [(line["event"], line["job_id"], line["task_index"]) for line in agent.lines()]
    assert said == [("started", "train-1", 0), ("started", "train-1", 1),
                    ("finished", "train-1", 0), ("finished", "train-1", 1)]
    nodes = get(service.address(), "/v1/nodes")["items"]
    assert [(n["node"], n["status"]) for n in nodes] == [("local-1", "up"), ("local-2", "up")]
    assert agent.stop(signal.SIGTERM) == 0
    assert "Traceback" not in agent.err.read_text()
    assert service.stop() == 0
    record = history(log)["train-1"]
    assert (record["state"], record["exit_code"], record["tasks"]) == ("succeeded", 0, 2)


@pytest.mark.parametrize("beside", [3], indirect=True)
def test_the_agent_keeps_its_nodes_up_past_the_node_timeout(
    tmp_path: Path, beside: Beside
) -> None:
    """The service takes a node silent for 3 s down (--node-timeout 3); a job that runs for three
    times that long on the agent's nodes is never requeued, and every node is up at the end."""
    log, service, agents = beside
    agent = Agent(tmp_path, log, "--nodes", "4", "--heartbeat-s", "0.5")
    agents.append(agent)
    agent.wait_ready()
    done = fleetlog("submit", "long-1", "--tenant", "alice", "--gpus", "8", "--tasks", "4", "--duration-ms",
                    "9000", "--log", str(log), "--wait", "--wait-for", "ended", "--timeout", str(WAIT_S))
    assert done.returncode == 0, done.stdout + done.stderr
    nodes = get(service.address(), "/v1/nodes")["items"]
    assert [(n["node"], n["status"]) for n in nodes] == [(f"local-{i}", "up") for i in range(1, 5)]
    assert agent.stop() == 0
    assert service.stop() == 0
    record = history(log)["long-1"]
    assert (record["state"], record["requeues"], record["preemptions"]) == ("succeeded", 0, 0)
    assert record["elapsed_ms"] >= 9000


def test_a_restarted_agent_goes_on_with_what_was_placed(
    tmp_path: Path, beside: Beside
) -> None:
    """Stopped while a task runs, the agent's successor finishes it (started once, not twice); a job
    placed while no agent ran is started by the next one."""
    log, service, agents = beside
    first = Agent(tmp_path, log, "--nodes", "2", "--heartbeat-s", "0.5", name="first")
    agents.append(first)
    first.wait_ready()
    submitted = fleetlog("submit", "a-1", "--tenant", "t", "--gpus", "8", "--duration-ms", "4000", "--log",
                         str(log), "--wait", "--wait-for", "running", "--timeout", str(WAIT_S))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert first.stop(signal.SIGINT) == 130  # Ctrl-C: a clean stop, fleetlog's exit code for it
    assert "fleetlog agent: interrupted" in first.err.read_text()
    submitted = fleetlog("submit", "b-1", "--tenant", "t", "--gpus", "8", "--duration-ms", "1000", "--log",
                         str(log), "--wait", "--wait-for", "placed", "--timeout", str(WAIT_S))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    second = Agent(tmp_path, log, "--nodes", "2", "--heartbeat-s", "0.5", name="second")
    agents.append(second)
    address = service.address()

    def both_succeeded() -> bool:
        return {get(address, f"/v1/jobs/{j}")["state"] for j in ("a-1", "b-1")} == {"succeeded"}

    wait_until("a-1 and b-1 succeeded", both_succeeded, second)
    assert [type(e).__name__ for e in task_events(log, "a-1")] == ["TaskStarted", "TaskFinished"]
    assert [type(e).__name__ for e in task_events(log, "b-1")] == ["TaskStarted", "TaskFinished"]
    said = sorted((line["event"], line["job_id"]) for line in second.lines())
    # a-1 started before: not again (whether its 4 s ran out before b-1 started depends on the load)
    assert said == [("finished", "a-1"), ("finished", "b-1"), ("started", "b-1")]
    assert second.stop() == 0


def test_the_agent_waits_for_the_log_and_fails_the_share_fail_rate_picks(tmp_path: Path) -> None:
    """Started before there is a log, the agent waits (said once) and creates nothing; with
    ``--fail-rate 1`` every task fails, so the job does."""
    log = tmp_path / "log"
    agent = Agent(tmp_path, log, "--nodes", "1", "--heartbeat-s", "0.5", "--fail-rate", "1",
                  "--default-duration-s", "0.5")
    service: ServiceProcess | None = None
    try:
        waits = "waiting for a file log"
        wait_until("the agent says it waits", lambda: waits in agent.err.read_text(), agent)
        time.sleep(1)
        assert not log.exists()
        assert agent.err.read_text().count("\n") == 1
        service = ServiceProcess(tmp_path / "service.out", ["--log", str(new_log(log))], {}).start()
        service.wait_leading()
        agent.wait_ready()
        done = fleetlog("submit", "doomed", "--tenant", "t", "--gpus", "1", "--log", str(log), "--wait",
                        "--wait-for", "ended", "--timeout", str(WAIT_S))
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1].split()[3] == "failed", done.stdout
        assert [(line["event"], line["exit_code"]) for line in agent.lines()] == [("started", None),
                                                                                  ("failed", 1)]
        assert agent.stop() == 0
    finally:
        agent.kill_if_running()
        if service is not None:
            service.stop()


def test_with_auth_the_agent_needs_the_node_agent_role_of_its_cell(tmp_path: Path) -> None:
    """Its token's principal with ``node-agent:local``: its heartbeats are taken.  A tenant's
    token: the first heartbeats are refused (403), and the agent stops with one line, exit 1."""
    tokens = {who: new_token() for who in ("agent", "alice")}
    for name, text in (("tokens.toml", "".join(entry_toml(w, t, None) for w, t in tokens.items())),
                       ("policy.toml", '[[grant]]\nprincipal = "agent"\nroles = ["node-agent:local"]\n'
                                       '[[grant]]\nprincipal = "alice"\nroles = ["tenant:alice"]\n')):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o600)
    log = new_log(tmp_path / "log")
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{log}"\n[auth]\ntokens_file = "{tmp_path / "tokens.toml"}"\n'
                      f'policy_file = "{tmp_path / "policy.toml"}"\n')
    service = ServiceProcess(tmp_path / "service.out", ["--config", str(config)], {}).start()
    agents: list[Agent] = []
    try:
        service.wait_leading()
        agents.append(Agent(tmp_path, log, "--nodes", "2", name="allowed", token=tokens["agent"]))
        agents[0].wait_ready()
        beats = [e for e in inputs(log) if isinstance(e, NodeHeartbeat)]
        assert {b.node for b in beats} == {"local-1", "local-2"}
        agents.append(Agent(tmp_path, log, "--nodes", "2", "--cell", "other", name="tenant",
                            token=tokens["alice"]))
        assert agents[1].proc.wait(WAIT_S) == 1
        said = agents[1].err.read_text()
        assert said.startswith("fleetlog agent: error: "), said
        assert said.count("\n") == 1, said
        assert "403" in said or "forbidden" in said, said
        assert agents[0].stop() == 0
    finally:
        for agent in agents:
            agent.kill_if_running()
        service.stop()


@pytest.mark.parametrize(("flags", "says"), [
    (["--cell", "no spaces"], "--cell"),
    (["--fail-rate", "2"], "--fail-rate"),
    (["--nodes", "0"], "--nodes"),
    (["--heartbeat-s", "0"], "--heartbeat-s"),
    (["--gpu-model", ""], "--gpu-model"),
    (["--gpus", "99999"], "--gpus"),
])
def test_bad_flags_are_one_line_and_exit_code_2(tmp_path: Path, flags: list[str], says: str) -> None:
    done = fleetlog("agent", "--log", str(new_log(tmp_path / "log")), *flags)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr


def readme_blocks() -> tuple[list[str], list[str]]:
    """The two shell blocks of the README's "Try the service on one machine": the processes it
    starts in the background, then the commands run while they do."""
    section = (REPO / "README.md").read_text().split("## Try the service on one machine", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```sh")[1:3]]
    lines = [[line.split("#", 1)[0].strip() for line in b.splitlines()] for b in blocks]
    return [line for line in lines[0] if line], [line for line in lines[1] if line]


def test_the_readme_try_it_on_one_machine_runs_as_written(tmp_path: Path) -> None:
    background, foreground = readme_blocks()
    assert [shlex.split(line)[:2] for line in background] == [["fleetlog", "run"], ["fleetlog", "agent"]]
    assert all(line.endswith("&") for line in background)
    started: list[subprocess.Popen[str]] = []
    env = {**ENV, "FLEETLOG_SERVICE_HTTP_PORT": "0"}  # (any free port: the README's default may be taken)
    try:
        for n, line in enumerate(background):
            with (tmp_path / f"bg{n}.err").open("w") as err:
                started.append(subprocess.Popen(shlex.split(line[:-1]), cwd=tmp_path, env=env, text=True,
                                                stdout=subprocess.DEVNULL, stderr=err))
        agent_err = tmp_path / "bg1.err"
        wait_until("the README's agent is up", lambda: "nodes up in cell" in agent_err.read_text()
                   or any(p.poll() is not None for p in started))
        assert all(p.poll() is None for p in started), agent_err.read_text()
        said = {}
        for line in foreground:
            done = subprocess.run(shlex.split(line), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=WAIT_S * 2, check=False)
            assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr}"
            said[shlex.split(line)[1]] = done.stdout
        assert said["submit"].splitlines()[-1].endswith(" succeeded"), said["submit"]
        assert [row.split()[:2] for row in said["history"].splitlines()[1:]] == [["train-1", "succeeded"]]
        assert "nodes 4 up" in said["top"]
        assert "task finished" in said["replay"]
        for process in reversed(started):  # the README's `kill %1 %2`: SIGTERM, a clean stop
            process.send_signal(signal.SIGTERM)
            assert process.wait(WAIT_S) == 0
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


# --- the agent's bookkeeping, in process on a memory log and a clock the test moves -----------


class Fleet:
    """A memory log the test writes inputs and decision batches to, as the service would."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000
        self.store = MemoryLogStore(clock=lambda: self.now_ms)
        self.seen = 0

    async def inputs(self, *events: Any) -> int:
        return await self.store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])

    async def decide(self, *decisions: Any) -> None:
        as_of = await self.store.log(INPUTS).end_offset()
        batch = DecisionBatch(as_of=as_of, digest="", decisions=decisions)
        await self.store.log(DECISIONS).append([Message(encode(envelope(batch, "fleetlog-scheduler")))])

    async def step(self, agent: FakeAgent, at_ms: int) -> list[tuple[str, str, int | None]]:
        """Move the clock to ``at_ms`` (after the start), step, and say what the agent appended:
        (kind, job, task) per task event, ("heartbeat", node, None) per heartbeat."""
        self.now_ms = 1_000_000 + at_ms
        await agent.step()
        records = await self.store.log(INPUTS).read(self.seen, 10_000)
        self.seen += len(records)
        out: list[tuple[str, str, int | None]] = []
        for record in records:
            env = decode(record.value, record.header("content-type"))
            if env.producer_id == "fleetlog-agent-local":
                e = env.event
                out.append(("heartbeat", e.node, None) if isinstance(e, NodeHeartbeat)
                           else (kind_of(e), e.job_id, e.task_index))
        return out


def placed(job_id: str, *nodes: str, cell: str = "local") -> JobPlaced:
    return JobPlaced(job_id=job_id, cell=cell, tasks=tuple(TaskPlacement(i, n) for i, n in enumerate(nodes)))


async def test_the_agent_starts_and_ends_what_the_scheduler_keeps_placed_at_the_limit() -> None:
    """A task finishes at its expected duration to the millisecond (not a millisecond before);
    a job without one runs the default; a preemption, a cancellation, a node's removal and a
    re-placement end a run as they do in the scheduler's state; a placement in another cell or
    on a node that is not the agent's is not its own; heartbeats come every period."""
    fleet = Fleet()
    async with fleet.store:
        config = AgentConfig(nodes=2, heartbeat_ms=1000, default_duration_ms=5000)
        agent = FakeAgent(fleet.store, config, clock=lambda: fleet.now_ms / 1000)
        await fleet.inputs(job("a", expected_ms=2000), job("b"), job("c", expected_ms=2000),
                           job("d", expected_ms=2000), job("x", expected_ms=1), job("y", expected_ms=1))
        await fleet.decide(placed("a", "local-1"), placed("b", "local-2"), placed("c", "local-1"),
                           placed("d", "local-2"), placed("x", "other-1", cell="other"),
                           placed("y", "elsewhere-1"))
        beats = [("heartbeat", "local-1", None), ("heartbeat", "local-2", None)]
        assert await fleet.step(agent, 0) == [*beats, ("started", "a", 0), ("started", "b", 0),
                                              ("started", "c", 0), ("started", "d", 0)]
        await fleet.inputs(JobCancelled(job_id="c"))
        await fleet.decide(TaskPreempted(job_id="b", task_index=0, by_job_id="z", cause="priority"))
        await fleet.inputs(NodeRemoved(cell="local", node="local-2"))  # d's node
        assert await fleet.step(agent, 999) == []
        assert await fleet.step(agent, 1000) == beats
        assert await fleet.step(agent, 1999) == []
        assert await fleet.step(agent, 2000) == [*beats, ("finished", "a", 0)]
        await fleet.decide(placed("b", "local-1", "local-2"))  # placed again: a new run
        assert await fleet.step(agent, 2500) == [("started", "b", 0), ("started", "b", 1)]
        assert ("finished", "b", 0) not in await fleet.step(agent, 7499)
        assert await fleet.step(agent, 7500) == [("finished", "b", 0), ("finished", "b", 1)]
        assert agent.runs == {}


async def test_a_restarted_agent_finishes_a_task_from_when_it_started_and_says_nothing_twice() -> None:
    fleet = Fleet()
    async with fleet.store:
        config = AgentConfig(nodes=1, heartbeat_ms=60_000)
        first = FakeAgent(fleet.store, config, clock=lambda: fleet.now_ms / 1000)
        await fleet.inputs(job("a", expected_ms=3000), job("b", expected_ms=1000))
        await fleet.decide(placed("a", "local-1"), placed("b", "local-1"))
        assert await fleet.step(first, 0) == [("heartbeat", "local-1", None), ("started", "a", 0),
                                              ("started", "b", 0)]
        assert await fleet.step(first, 1000) == [("finished", "b", 0)]
        await fleet.inputs(job("c", expected_ms=1000))
        await fleet.decide(placed("c", "local-1"))  # while no agent runs
        second = FakeAgent(fleet.store, config, clock=lambda: fleet.now_ms / 1000)
        assert await fleet.step(second, 2999) == [("heartbeat", "local-1", None), ("started", "c", 0)]
        assert await fleet.step(second, 3000) == [("finished", "a", 0)]  # 3 s after its start, not after 2999
        assert await fleet.step(second, 3999) == [("finished", "c", 0)]
