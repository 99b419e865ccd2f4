"""deploy/ (issue 21): the Grafana dashboard and the Prometheus alert rules, loaded and checked —
their shape, and that every metric their queries name is one a running ``fleetlog run`` exposes
on ``/metrics``.  Where Debian's ``prometheus`` package is installed, ``promtool`` checks and
unit-tests the rules and lints the exposition, and a real Prometheus scrapes a running service
and evaluates every query of the dashboard and the rules."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.kafka_broker import free_port
from tests.service.test_metrics import FLEET, WORK
from tests.service.test_service import Running, events_body, serving

DEPLOY: Final = Path(__file__).resolve().parents[1] / "deploy"
DASHBOARD: Final = DEPLOY / "grafana" / "fleetlog.json"
ALERTS: Final = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST: Final = DEPLOY / "prometheus" / "alerts_test.yml"
GRAFANA_BUILTINS: Final = frozenset({"__rate_interval", "__interval", "__range"})
SEVERITIES: Final = ("critical", "warning", "info")

# --- PromQL: the metric names an expression reads -----------------------------------------

KEYWORDS: Final = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "offset", "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values(selector, label)``
    query) reads: what is left once strings, ranges, label matchers and grouping clauses are
    cut, less function and aggregation names (followed by ``(``) and keywords."""
    found = _LABEL_VALUES.match(expr)
    text = found.group(1) if found else expr
    for pattern in (_STRING, _RANGE, _MATCHERS, _GROUPING):
        text = pattern.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end():].lstrip()
        if not rest.startswith("(") and match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


@pytest.mark.parametrize(("expr", "names"), [
    ("up", {"up"}),
    ('sum by (le) (rate(a_bucket{job=~"$job", x="y{z}]"}[$__rate_interval]))', {"a_bucket"}),
    ("histogram_quantile(0.99, sum(rate(a_bucket[5m])) by (le)) > 0.5", {"a_bucket"}),
    ("(sum(lead) or vector(0)) < 1", {"lead"}),
    ("a / on (instance) group_left (cell) b offset 5m > bool 1e3 and c unless ignoring (x) d",
     {"a", "b", "c", "d"}),
    ('x{status="down"} / sum without (status) (x) > 0.1', {"x"}),
    ("min_over_time(a[10m:1m]) - -Inf", {"a"}),
    ('label_values(fleetlog_cell_gpus{job=~"$job"}, cell)', {"fleetlog_cell_gpus"}),
    ("label_values(fleetlog_leader, job)", {"fleetlog_leader"}),
])
def test_metric_names_reads_what_an_expression_reads(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# --- the files -----------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", ())


def dashboard_queries() -> list[str]:
    """Every target's ``expr`` and every query variable's query."""
    exprs = [t["expr"] for p in panels() for t in p.get("targets", ())]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return exprs


def test_the_dashboard_has_the_shape_grafana_loads() -> None:
    board = dashboard()
    assert board["uid"] == "fleetlog"
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "job", "tenant", "cell"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"]
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
    for expr in dashboard_queries():  # every $variable is one of the dashboard's or Grafana's own
        for name in re.findall(r"\$\{?(\w+)\}?", expr):
            assert name in variables or name in GRAFANA_BUILTINS, (name, expr)


def test_the_dashboard_answers_the_questions_of_the_issue() -> None:
    """decisions/s, decide time, input lag, pending by reason, tenant use vs nominal quota,
    per-queue pending, GPU allocation by cell and model, nodes up/down, snapshot age, dead
    letters: each read by some panel."""
    used = set().union(*(metric_names(e) for e in dashboard_queries()))
    assert {
        "fleetlog_decisions_total", "fleetlog_decide_step_seconds_bucket", "fleetlog_consumer_lag",
        "fleetlog_pending_jobs", "fleetlog_tenant_used_gpus", "fleetlog_tenant_nominal_gpus",
        "fleetlog_queue_jobs", "fleetlog_cell_allocated_gpus", "fleetlog_cell_gpus", "fleetlog_nodes",
        "fleetlog_snapshot_age_seconds", "fleetlog_dead_letters_total",
    } <= used


def test_the_alert_rules_have_the_shape_prometheus_loads() -> None:
    loaded = yaml.safe_load(ALERTS.read_text())
    assert set(loaded) == {"groups"}
    for group in loaded["groups"]:
        assert set(group) == {"name", "rules"}
        assert group["rules"]
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"Fleetlog[A-Z][A-Za-z]+", rule["alert"])
        assert isinstance(rule["expr"], str)
        assert metric_names(rule["expr"]), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES
        assert set(rule["annotations"]) == {"summary", "description"}


def test_the_readme_names_every_alert_with_its_severity() -> None:
    table = re.findall(r"^\| `(Fleetlog\w+)` \|[^|]*\| (\w+) \|", (DEPLOY / "README.md").read_text(), re.M)
    assert table == [(rule["alert"], rule["labels"]["severity"]) for rule in rules()]


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    cases = yaml.safe_load(ALERTS_TEST.read_text())
    assert cases["rule_files"] == [ALERTS.name]
    fired = {check["alertname"] for case in cases["tests"] for check in case["alert_rule_test"]
             if check["exp_alerts"]}
    assert fired == {rule["alert"] for rule in rules()}


# --- against a running service -------------------------------------------------------------


def exposed(text: str) -> set[str]:
    """Every metric name an exposition offers to a query, a family's samples yet to come
    (a labelled counter before its first increment) included."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


async def busy_service(running: Running) -> str:
    """Feed ``running`` some fleet and work, wait for its gauges; its exposition."""
    assert (await running.request("/v1/events", events_body(*FLEET, *WORK)))[0] == 200
    for _ in range(100):
        status, body = await running.request("/metrics")
        assert status == 200
        text: str = body.decode()
        if "fleetlog_tenant_used_gpus{" in text:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError("no fleet gauges")


async def test_every_metric_the_dashboard_and_the_rules_read_is_exposed(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        text = await busy_service(running)
    offered = exposed(text)
    for where, exprs in (("dashboard", dashboard_queries()), ("alerts", [r["expr"] for r in rules()])):
        for expr in exprs:
            missing = metric_names(expr) - offered
            assert not missing, f"{where}: {expr} reads {missing}, which /metrics does not expose"


PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(autouse=False)
def _prometheus_installed() -> None:
    """scripts/test installs Debian's prometheus (promtool with it): missing is a failure, not a skip."""
    missing = "promtool/prometheus not found: run ./scripts/test once (it apt-installs prometheus)"
    assert PROMTOOL is not None, missing
    assert PROMETHEUS is not None, missing


needs_promtool = pytest.mark.usefixtures("_prometheus_installed")


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert PROMTOOL is not None
    for args in (("check", "rules", str(ALERTS)), ("test", "rules", str(ALERTS_TEST))):
        done = subprocess.run([PROMTOOL, *args], check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
async def test_promtool_finds_nothing_to_lint_in_the_exposition(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    async with serving(tmp_path / "log") as running:
        text = await busy_service(running)
    done = subprocess.run([PROMTOOL, "check", "metrics"], check=False, input=text, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == ""


# --- a real Prometheus evaluates every query -----------------------------------------------

MAY_BE_EMPTY: Final = ("fleetlog_loop_errors_total",)
"""Dashboard queries that may rightly return nothing from a healthy service (no loop error)."""


def as_grafana_sends(expr: str) -> str:
    """``expr`` with the dashboard's variables as Grafana fills them with "All"; of a
    ``label_values(selector, label)`` variable query (Grafana's own function), the selector."""
    found = _LABEL_VALUES.match(expr)
    expr = found.group(1) if found else expr.replace("$__rate_interval", "1m")
    return re.sub(r"\$\{?(job|tenant|cell)\}?", ".*", expr)


def query(port: int, expr: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            loaded: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        loaded = json.loads(exc.read())
    return loaded


def start_prometheus(directory: Path, target: str) -> tuple[subprocess.Popen[bytes], int]:
    assert PROMETHEUS is not None
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(ALERTS)],
              "scrape_configs": [{"job_name": "fleetlog", "static_configs": [{"targets": [target]}]}]}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (directory / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
             f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={directory / 'data'}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=log)
    return process, port


@needs_promtool
async def test_a_real_prometheus_evaluates_every_query_on_a_running_service(tmp_path: Path) -> None:
    """Every query of the dashboard (its variables as Grafana sends them with "All") returns
    data; every expression of the rules evaluates; every rule loads healthy."""
    async with serving(tmp_path / "log") as running:
        await busy_service(running)
        process, port = start_prometheus(tmp_path, f"127.0.0.1:{running.service.http.port}")
        try:
            await scraped_thrice(process, port, tmp_path)
            for expr in dashboard_queries():
                found = await asyncio.to_thread(query, port, as_grafana_sends(expr))
                assert found["status"] == "success", (expr, found)
                if not any(name in expr for name in MAY_BE_EMPTY):
                    assert found["data"]["result"], f"the dashboard's {expr} returned nothing"
            for rule in rules():
                found = await asyncio.to_thread(query, port, rule["expr"])
                assert found["status"] == "success", (rule["alert"], found)
            rules_state = await asyncio.to_thread(query_rules, port)
            health = [r["health"] for g in rules_state for r in g["rules"]]
            assert health == ["ok"] * len(rules()), rules_state
        finally:
            process.terminate()
            process.wait(30)


async def scraped_thrice(process: subprocess.Popen[bytes], port: int, directory: Path) -> dict[str, Any]:
    """Wait until Prometheus holds three scrapes of the service (a rate needs two samples)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, (directory / "prometheus.log").read_text()
        try:
            found = await asyncio.to_thread(query, port, "count_over_time(fleetlog_leader[1m]) >= 3")
            if found.get("data", {}).get("result"):
                return found
        except OSError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError("Prometheus scraped nothing: " + (directory / "prometheus.log").read_text())


def query_rules(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10) as answer:
        groups: list[dict[str, Any]] = json.loads(answer.read())["data"]["groups"]
    return groups
