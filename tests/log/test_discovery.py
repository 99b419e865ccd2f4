"""``service.json`` is defined once (``fleetlog.log.discovery``): what the service announces is
what the client and the backends read, and opening the log never needs the service's code."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from fleetlog.log.discovery import SERVICE_FILE, announce, running_service, withdraw


def test_what_the_service_announces_the_producers_find(tmp_path: Path) -> None:
    assert running_service(tmp_path) is None
    announce(tmp_path, os.getpid(), "127.0.0.1:9464")
    assert stat.S_IMODE((tmp_path / SERVICE_FILE).stat().st_mode) == 0o600  # others cannot redirect
    assert running_service(tmp_path) == ("127.0.0.1", 9464)
    announce(tmp_path, os.getpid(), ":81")  # no host: the local one
    assert running_service(tmp_path) == ("127.0.0.1", 81)
    withdraw(tmp_path)
    assert not (tmp_path / SERVICE_FILE).exists()
    assert running_service(tmp_path) is None
    withdraw(tmp_path)  # twice: nothing to remove is fine


def test_a_dead_or_garbled_announcement_is_no_service(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    announce(tmp_path, gone.pid, "127.0.0.1:9464")
    assert running_service(tmp_path) is None
    for text in ("", "{", "[]", '{"pid": 1}', '{"pid": "x", "http": "h:1"}', '{"pid": 1, "http": "h:port"}'):
        (tmp_path / SERVICE_FILE).write_text(text)
        assert running_service(tmp_path) is None, text


def _service_modules(imported: str) -> list[str]:
    code = f"import json, sys, {imported}\nprint(json.dumps([m for m in sys.modules if 'service' in m]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return sorted(m for m in json.loads(out) if m.startswith("fleetlog.service"))


def test_the_client_and_the_shared_log_open_the_log_without_the_service_config() -> None:
    assert _service_modules("fleetlog.client") == []
    assert "fleetlog.service.config" not in _service_modules("fleetlog.backends.shared_log")
