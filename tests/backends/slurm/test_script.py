"""``infra/slurm/slurm.sh``'s own logic, apart from a cluster: while it starts the daemons it
asks whether one of them died, and a daemon that is still being exec'd is not dead.

A CI run failed with "munged exited" while munged was starting: the check read the command
line of the PID just launched, and under load that PID was still the script's forked
subshell (no munge socket on its command line yet), so a live daemon was judged gone.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.slurm_cluster import SCRIPT


def functions(*names: str) -> str:
    """The shell text of the script's functions ``names`` (each from its line ``name() {`` to
    the first line that is ``}``, or the one line when it closes on it)."""
    text = SCRIPT.read_text()
    out = []
    for name in names:
        found = re.search(rf"^{name}\(\) \{{.*?^\}}$|^{name}\(\) \{{[^\n]*\}}$", text, re.M | re.S)
        assert found, name
        out.append(found.group(0))
    return "\n".join(out)


def died(run_dir: Path, pid: int) -> tuple[int, str]:
    """Run the script's ``any_daemon_died`` with munged's pid file holding ``pid``."""
    (run_dir / "run").mkdir(parents=True, exist_ok=True)
    (run_dir / "run" / "munged.pid").write_text(f"{pid}\n")
    body = functions("say", "alive", "live_pid", "daemons", "any_daemon_died")
    script = (
        f'DIR="{run_dir}"; NODES=2; CONF="$DIR/slurm.conf"; MUNGE_SOCKET="$DIR/munge/munge.socket"\n'
        f"{body}\nany_daemon_died"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, done.stderr


def test_a_daemon_whose_command_line_does_not_show_yet_is_not_dead(tmp_path: Path) -> None:
    """A live process whose command line lacks the marker (as a forked subshell before its
    exec) counts as alive; a PID that exited counts as dead, by name."""
    starting = subprocess.Popen(["sleep", "30"])
    try:
        rc, err = died(tmp_path, starting.pid)
        assert rc == 1, err  # (nothing died)
    finally:
        starting.kill()
        starting.wait()
    rc, err = died(tmp_path, starting.pid)
    assert rc == 0
    assert "munged exited" in err
