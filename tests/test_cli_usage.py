"""Usage errors of every command line: one line on stderr, exit code 2, the subcommand's own
name and usage; no prefix matching of flags; ``fleetlog --version``.

The parsers are walked, so a subcommand added later is covered without touching this file."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlog.cli import build_parser, main
from fleetlog.usage import EXIT_USAGE, walk

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLOG_LOG_DIR", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS", "FLEETLOG_SERVICE_POLICY",
                 "FLEETLOG_SERVICE_HTTP_PORT"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``fleetlog ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for o in parser._option_string_actions if o.startswith("--"))


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Arguments that satisfy ``parser``'s required positionals and options (the value ``x``,
    ``1`` for a typed option), so that the flag under test is the only thing wrong."""
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings and action.required:
            argv += [action.option_strings[-1], "x" if action.type is None else "1"]
        elif not action.option_strings and action.nargs in (None, 1):
            argv.append("x")
    return argv


def _commands() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """(the words that select it, parser) for ``fleetlog`` and every subcommand below it."""
    for parser in walk(build_parser()):
        yield parser.prog.split()[1:], parser


def _is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


COMMANDS = [pytest.param(path, parser, id=parser.prog) for path, parser in _commands()]
LEAVES = [pytest.param(path, parser, id=parser.prog) for path, parser in _commands() if _is_leaf(parser)]


def _abbreviations(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(option, its shortest prefix no other option starts with) — what argparse would have
    expanded with ``allow_abbrev``."""
    options = _long_options(parser)
    for option in options:
        for end in range(3, len(option)):
            prefix = option[:end]
            if not any(other.startswith(prefix) for other in options if other != option):
                yield option, prefix
                break


def test_every_subcommand_is_walked() -> None:
    progs = {parser.prog for _, parser in _commands()}
    assert {"fleetlog", "fleetlog run", "fleetlog submit", "fleetlog replay", "fleetlog replay dump",
            "fleetlog simulate", "fleetlog status"} <= progs
    assert all(parser.allow_abbrev is False for _, parser in _commands())


@pytest.mark.parametrize(("path", "parser"), LEAVES)
def test_a_prefix_of_a_flag_is_an_unknown_flag(
    capsys: pytest.CaptureFixture[str], path: list[str], parser: argparse.ArgumentParser
) -> None:
    abbreviations = list(_abbreviations(parser))
    assert abbreviations, parser.prog
    for option, prefix in abbreviations:
        code, out, err = run(capsys, *path, *_required(parser), prefix)
        assert (code, out) == (EXIT_USAGE, ""), (option, prefix, err)
        assert err.startswith(f"{parser.prog}: error: unrecognized arguments: {prefix} "), (option, err)
        assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(("path", "parser"), COMMANDS)
def test_an_unknown_flag_is_one_line_with_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str], path: list[str], parser: argparse.ArgumentParser
) -> None:
    code, out, err = run(capsys, *path, *_required(parser), "--no-such-flag")
    assert (code, out) == (EXIT_USAGE, ""), err
    assert err.startswith(f"{parser.prog}: error: "), err
    assert f"(usage: {parser.prog} [-h]" in err, err
    assert len(err.splitlines()) == 1, err
    if _is_leaf(parser):
        assert err.startswith(f"{parser.prog}: error: unrecognized arguments: --no-such-flag "), err


@pytest.mark.parametrize(("path", "parser"), COMMANDS)
def test_every_bad_value_and_missing_argument_is_one_line(
    capsys: pytest.CaptureFixture[str], path: list[str], parser: argparse.ArgumentParser
) -> None:
    checked = 0
    for action in parser._actions:
        if action.option_strings and (action.type is not None or action.choices is not None):
            code, out, err = run(capsys, *path, *_required(parser), action.option_strings[-1], "\x01bad")
            assert (code, out) == (EXIT_USAGE, ""), (action.dest, err)
            named = "/".join(action.option_strings)  # (argparse's name of it: -o/--output)
            assert err.startswith(f"{parser.prog}: error: argument {named}"), err
            assert len(err.splitlines()) == 1, err
            checked += 1
    required = _required(parser)
    if required or not _is_leaf(parser):  # each missing in turn (a subcommand is required too)
        code, _, err = run(capsys, *path)
        assert code == EXIT_USAGE, err
        assert err.startswith(f"{parser.prog}: error: the following arguments are required"), err
        assert len(err.splitlines()) == 1, err


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--version")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (code, err) == (0, "")
    assert out == f"fleetlog {importlib.metadata.version('fleetlog')}\n"
    assert out == f"fleetlog {declared}\n"


@pytest.mark.parametrize(
    ("module", "argv", "prefix"),
    [
        ("fleetlog.backends.kubernetes", ["--log", "x"], "--kubeconf"),
        ("fleetlog.backends.kubernetes", ["--log", "x"], "--sched"),
        ("fleetlog.backends.slurm", ["--log", "x"], "--slurm-co"),
        ("fleetlog.backends.slurm", ["--log", "x"], "--part"),
        ("fleetlog.backends.slurm", [], "--lo"),
    ],
)
def test_backend_entry_points_match_whole_flags_only(module: str, argv: list[str], prefix: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *argv, prefix, "x"], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith(f"python -m {module}: error: "), done.stderr
    assert f"unrecognized arguments: {prefix} x" in done.stderr or "required" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


# -- settings given as flags are named as flags ---------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--http-port", "-1"], "--http-port: service.http_port = -1: Expected `int` >= 0"),
        (["--http-port", "65536"], "--http-port: service.http_port = 65536: Expected `int` <= 65535"),
        (["--policy", "fastest"], "--policy: service.policy = 'fastest': unknown policy 'fastest'"),
    ],
)
def test_run_names_the_flag_that_is_wrong(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], says: str
) -> None:
    code, out, err = run(capsys, "run", "--log", str(tmp_path / "log"), *flags)
    assert (code, out) == (EXIT_USAGE, ""), err
    assert err.startswith(f"fleetlog run: error: {says}"), err
    assert "environment" not in err
    assert "FLEETLOG_" not in err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "log").exists()


def test_run_names_the_variable_or_the_file_when_the_value_came_from_there(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETLOG_SERVICE_HTTP_PORT", "-1")
    code, _, err = run(capsys, "run", "--log", str(tmp_path / "log"))
    assert code == EXIT_USAGE
    assert err.startswith("fleetlog run: error: environment variable FLEETLOG_SERVICE_HTTP_PORT: "
                          "service.http_port = '-1'"), err
    monkeypatch.delenv("FLEETLOG_SERVICE_HTTP_PORT")
    config = tmp_path / "fleetlog.toml"
    config.write_text('[service]\nidle_wait_ms = 5\npolicy = "fastest"\n')
    code, _, err = run(capsys, "run", "--log", str(tmp_path / "log"), "--config", str(config))
    assert code == EXIT_USAGE
    assert err.startswith(f"fleetlog run: error: {config}, line 3: service.policy = 'fastest'"), err
    assert len(err.splitlines()) == 1, err


def test_flags_beat_the_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetlog.service.command import configure

    monkeypatch.setenv("FLEETLOG_SERVICE_POLICY", "fastest")  # would be refused: the flag wins
    config = tmp_path / "fleetlog.toml"
    config.write_text("[service]\nhttp_port = 1234\n")
    loaded = configure(str(config), str(tmp_path), None, policy="fgd", http_port=4321)
    assert (loaded.service.policy, loaded.service.http_port) == ("fgd", 4321)


def test_a_mistyped_flag_or_config_key_says_what_was_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "jobs", "--stat", "pending")
    assert code == EXIT_USAGE
    said = "fleetlog jobs: error: unrecognized arguments: --stat pending (did you mean --state?)"
    assert err.startswith(said), err
    code, _, err = run(capsys, "jobs", "--zzzzzz")
    assert "did you mean" not in err  # nothing close: no guess
    config = tmp_path / "fleetlog.toml"
    config.write_text("[service]\nhttp_prot = 1\n")
    code, _, err = run(capsys, "run", "--config", str(config), "--log", str(tmp_path / "log"))
    assert code == EXIT_USAGE
    assert "unknown key service.http_prot; did you mean service.http_port?" in err
    config.write_text("[servce]\nhttp_port = 1\n")
    code, _, err = run(capsys, "run", "--config", str(config), "--log", str(tmp_path / "log"))
    assert "unknown table [servce]; did you mean [service]?" in err


URL_COMMANDS = [p for p in LEAVES if "--url" in p.values[1]._option_string_actions]  # type: ignore[attr-defined]


def test_some_commands_take_a_url() -> None:
    assert {p.values[1].prog for p in URL_COMMANDS} >= {  # type: ignore[attr-defined]
        "fleetlog jobs", "fleetlog top", "fleetlog submit", "fleetlog node drain"}


@pytest.mark.parametrize(("path", "parser"), URL_COMMANDS)
def test_every_url_takes_host_and_port_without_a_scheme(
    path: list[str], parser: argparse.ArgumentParser
) -> None:
    """``--url 127.0.0.1:9464`` was refused (or taken as a path): ``http://`` is meant, as curl
    takes it, on every command that has ``--url``; a scheme that is not HTTP is a usage error."""
    base = [*path, *_required(parser)]
    for given, meant in (("127.0.0.1:9464", "http://127.0.0.1:9464"), ("https://h:1/", "https://h:1"),
                         ("[::1]:80", "http://[::1]:80")):
        assert build_parser().parse_args([*base, "--url", given]).url == meant
    for wrong in ("ftp://h:1", "h", "http://h:port"):
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args([*base, "--url", wrong])
        assert stopped.value.code == EXIT_USAGE


def test_history_takes_since_and_until_as_a_duration_ago(capsys: pytest.CaptureFixture[str]) -> None:
    """``--since 1h`` as journalctl and kubectl take it: the recorded log ended in 2026-01-01."""
    clean = str(Path(__file__).resolve().parent / "replay" / "data" / "clean")
    code, out, err = run(capsys, "history", "--log", clean, "--since", "1h", "-o", "json")
    assert (code, json.loads(out)["items"]) == (0, []), err
    code, out, err = run(capsys, "history", "--log", clean, "--since", "36500d", "-o", "json")
    everything = json.loads(out)["items"]
    assert code == 0, err
    assert len(everything) > 10
    code, out, _ = run(capsys, "history", "--log", clean, "--until", "1.5h", "-o", "json")
    assert json.loads(out)["items"] == everything
    code, _, err = run(capsys, "history", "--log", clean, "--since", "1x")
    assert code == EXIT_USAGE
    assert "or a duration ago: 90s, 30m, 1h, 2d, 1w" in err
