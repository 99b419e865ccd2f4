"""``fleetlog completion bash|zsh``: scripts made from the real parser, run by a real bash and a
real zsh.

bash: the script is sourced and its completion function called with ``COMP_WORDS`` and
``COMP_CWORD`` set, as bash's ``complete -F`` does, for every subcommand of the walked parser
(its subcommands, every long flag, every flag's choices), so a command added later is covered.
zsh: an interactive zsh on a pseudo-terminal loads the script through ``compinit`` and is sent
the keys a person types (``fleetlog jo<Tab>``); a ``compadd`` wrapper writes down each candidate
the completion system offers."""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetlog.cli import build_parser, main
from fleetlog.usage import walk

Query = tuple[str, ...]
"""The words on the command line, the last one being completed (``""``: after a space)."""


def script(capsys: pytest.CaptureFixture[str], shell: str) -> str:
    capsys.readouterr()
    assert main(["completion", shell]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


def command(*words: str) -> argparse.ArgumentParser:
    """The parser of ``fleetlog WORDS``."""
    return next(p for p in walk(build_parser()) if p.prog == " ".join(("fleetlog", *words)))


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for o in parser._option_string_actions if o.startswith("--")}


def expected() -> Iterator[tuple[Query, set[str]]]:
    """(command line, what completes there) for every command of the walked parser: its
    subcommands, its long flags and each flag's choices."""
    for parser in walk(build_parser()):
        words = ("fleetlog", *parser.prog.split()[1:])
        if subcommands(parser):
            yield (*words, ""), subcommands(parser)
        yield (*words, "--"), long_flags(parser)
        for action in parser._actions:
            if action.option_strings and action.choices is not None:
                for flag in action.option_strings:
                    yield (*words, flag, ""), {str(c) for c in action.choices}


# --- bash ----------------------------------------------------------------------------------


def bash_complete(source: Path, queries: list[Query], cwd: Path) -> list[set[str]]:
    """What the script's completion function offers for each query, in one real bash."""
    lines = [f"source {shlex.quote(str(source))}"]
    for query in queries:
        lines += [f"COMP_WORDS=({' '.join(shlex.quote(w) for w in query)})",
                  f"COMP_CWORD={len(query) - 1}", "COMPREPLY=()", "_shtab_fleetlog",
                  'printf "%s\\n" "${COMPREPLY[@]}"', "echo '<end>'"]
    done = subprocess.run(["bash", "--norc", "--noprofile", "-s"], input="\n".join(lines) + "\n", cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stderr == "", done.stderr
    answers = done.stdout.split("<end>\n")
    assert answers[-1] == ""
    return [set(filter(None, answer.splitlines())) for answer in answers[:-1]]


def test_bash_completes_every_subcommand_flag_and_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "fleetlog.bash"
    source.write_text(script(capsys, "bash"))
    cases = list(expected())
    assert len(cases) > 100
    found = bash_complete(source, [query for query, _ in cases], tmp_path)
    for (query, wanted), offered in zip(cases, found, strict=True):
        assert offered == wanted, query
    progs = {parser.prog for parser in walk(build_parser())}
    assert {"fleetlog top", "fleetlog completion bash", "fleetlog replay what-if"} <= progs


def test_bash_completes_as_a_person_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "fleetlog.bash"
    source.write_text(script(capsys, "bash"))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logbook.toml").write_text("")
    cases: dict[Query, set[str]] = {
        ("fleetlog", "jo"): {"jobs"},
        ("fleetlog", "jobs", "-o", ""): {"table", "wide", "json", "yaml"},
        ("fleetlog", "jobs", "--state", "pe"): {"pending"},
        ("fleetlog", "replay", ""): subcommands(command("replay")),
        ("fleetlog", "replay", "state-at", "--sh"): {"--shard", "--show"},
        ("fleetlog", "completion", ""): {"bash", "zsh"},
        ("fleetlog", "top", "--in"): {"--interval"},
        ("fleetlog", "jobs", "--log", "log"): {"logs"},  # a directory: not the file
        ("fleetlog", "run", "--config", "log"): {"logs", "logbook.toml"},
    }
    for (query, wanted), offered in zip(cases.items(), bash_complete(source, list(cases), tmp_path),
                                        strict=True):
        assert offered == wanted, query


def test_the_bash_script_registers_for_the_fleetlog_command(capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "bash")
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"{text}\ncomplete -p fleetlog"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "complete -o bashdefault -F _shtab_fleetlog fleetlog"


# --- zsh -----------------------------------------------------------------------------------

ZSHRC = r"""
fpath=({functions} $fpath)
autoload -U compinit && compinit -u -d {home}/.zcompdump
compadd() {{
  # a call that only asks (-O, -A, -D: matches into an array) is left alone
  if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi
  local -a hits
  builtin compadd -O hits "$@"
  (( ${{#hits}} )) && print -rl -- $hits >> {capture}
  builtin compadd "$@"
}}
completed() {{ print -r -- '<completed>' >> {capture} }}  # Ctrl-X after Tab: Tab's work is done
zle -N completed
bindkey '^X' completed
PROMPT='READY> '
"""


def zsh() -> str:
    found = shutil.which("zsh")
    assert found, "zsh is missing: scripts/test installs it (apt_install zsh)"
    return found


def zsh_complete(home: Path, line: str, cwd: Path) -> set[str]:
    """What zsh offers when ``line`` is typed at its prompt and then Tab."""
    capture = home / "capture.txt"
    capture.write_text("")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 200, 200, 0, 0))  # lists never ask
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    child = subprocess.Popen([zsh(), "-i"], stdin=follower, stdout=follower, stderr=follower, cwd=cwd,
                             env=env | {"ZDOTDIR": str(home), "TERM": "xterm", "HOME": str(home)})
    os.close(follower)
    try:
        _read_until(leader, lambda seen: b"READY> " in seen)
        os.write(leader, line.encode() + b"\t\x18")  # zle runs the keys in turn
        _read_until(leader, lambda seen: "<completed>" in capture.read_text())
        offered = capture.read_text()
        assert "<completed>" in offered, f"zsh never finished completing {line!r}"
        return set(offered.split()) - {"<completed>"}
    finally:
        child.kill()
        child.wait()
        os.close(leader)


def _read_until(fd: int, done: Callable[[bytes], bool], timeout_s: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
        if done(seen):
            return seen
    return seen


@pytest.fixture
def zsh_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A ZDOTDIR whose .zshrc loads ``_fleetlog`` (the script as ``fpath`` takes it) by compinit."""
    functions, home = tmp_path / "functions", tmp_path / "home"
    functions.mkdir()
    home.mkdir()
    (functions / "_fleetlog").write_text(script(capsys, "zsh"))
    done = subprocess.run([zsh(), "-n", str(functions / "_fleetlog")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    (home / ".zshrc").write_text(ZSHRC.format(functions=functions, home=home, capture=home / "capture.txt"))
    return home


@pytest.mark.parametrize(
    ("line", "wanted"),
    [
        ("fleetlog jo", {"jobs"}),
        ("fleetlog jobs -o ", {"table", "wide", "json", "yaml"}),
        ("fleetlog replay ", subcommands(command("replay"))),
        ("fleetlog completion ", {"bash", "zsh"}),
        ("fleetlog top --", long_flags(command("top"))),
        ("fleetlog run --role ", {"all", "dispatch", "cell"}),
    ],
)
def test_zsh_completes_as_a_person_types(zsh_home: Path, tmp_path: Path, line: str, wanted: set[str]) -> None:
    assert zsh_complete(zsh_home, line, tmp_path) == wanted


def test_zsh_offers_every_subcommand(zsh_home: Path, tmp_path: Path) -> None:
    assert zsh_complete(zsh_home, "fleetlog ", tmp_path) == subcommands(build_parser())


# --- the README's way to install them --------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_the_readmes_install_commands_write_the_scripts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("### Shell completion", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("  #")[0] for line in block.strip().splitlines()]
    assert [c.split()[0] for c in commands] == ["mkdir", "fleetlog", "fleetlog"]
    bin_dir = str(Path(sys.executable).parent)  # (the venv's, where pip put the fleetlog command)
    env = os.environ | {"HOME": str(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for line in commands:
        subprocess.run(["bash", "--norc", "--noprofile", "-euo", "pipefail", "-c", line], env=env,
                       cwd=tmp_path, timeout=300, check=True)
    saved = tmp_path / ".local/share/bash-completion/completions/fleetlog"
    assert saved.read_text() == script(capsys, "bash")
    assert (tmp_path / ".zfunc/_fleetlog").read_text() == script(capsys, "zsh")
