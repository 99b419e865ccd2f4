"""Where a backend process finds the logs: the ``[log]`` and ``[kafka]`` tables of the service's
own configuration file and variables (``--config``, ``FLEETLOG_LOG_*``/``FLEETLOG_KAFKA_*``,
``--log``/``--kafka`` on top), read by :mod:`fleetlog.log.settings`, and the command's exit codes:
a usage or configuration problem is one line and 2, a failure that stops the backend one line and 1."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.backends.shared_log import SharedFileStore
from fleetlog.backends.store_args import UsageError, add_store_arguments, open_store, store_config
from fleetlog.log.kafka import KafkaLogStore
from fleetlog.log.location import ConfigError
from fleetlog.service.config import load_config

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ["fleetlog.backends.kubernetes", "fleetlog.backends.slurm"]


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_store_arguments(parser)
    return parser.parse_args(argv)


def run(module: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})


def one_line(stderr: str) -> str:
    """The command's own message: its one line on stderr (INFO log lines aside)."""
    lines = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


def test_the_config_file_and_the_environment_say_where_the_logs_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleetlog.toml"
    path.write_text('[kafka]\nbootstrap_servers = "broker:9093"\ntopic_prefix = "prod"\n'
                    '[service]\npolicy = "best-fit"\n')
    monkeypatch.setenv("FLEETLOG_KAFKA_CLIENT_ID", "kube-backend")
    config = store_config(parsed("--config", str(path)))
    assert config.kafka is not None
    assert (config.kafka.bootstrap_servers, config.kafka.topic_prefix, config.kafka.client_id) == (
        "broker:9093", "prod", "kube-backend")
    assert isinstance(open_store(config), KafkaLogStore)
    prefixed = store_config(parsed("--config", str(path), "--topic-prefix", "other"))
    assert prefixed.kafka is not None
    assert prefixed.kafka.topic_prefix == "other"
    on_file = store_config(parsed("--config", str(path), "--log", str(tmp_path / "log")))
    assert on_file.kafka is None
    assert on_file.log.dir == str(tmp_path / "log")
    assert isinstance(open_store(on_file), SharedFileStore)


def test_bad_settings_are_refused_like_the_service_refuses_them(tmp_path: Path) -> None:
    path = tmp_path / "fleetlog.toml"
    path.write_text('[kafka]\nbootstrap_servers = "b:9093"\nsecurity_protocol = "SASL_SSL"\n'
                    'sasl_mechanism = "SCRAM-SHA-512"\n')
    with pytest.raises(ConfigError, match="needs sasl_plain_username and sasl_plain_password"):
        store_config(parsed("--config", str(path)))
    with pytest.raises(ConfigError, match="exactly one place"):
        store_config(parsed())
    with pytest.raises(UsageError, match="--topic-prefix applies to Kafka only"):
        store_config(parsed("--log", str(tmp_path / "log"), "--topic-prefix", "p"))


def test_the_backend_reads_the_same_place_as_the_service_from_the_same_file_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = tmp_path / "password"
    password.write_text("s3cr3t\n")
    password.chmod(0o600)
    path = tmp_path / "fleetlog.toml"
    path.write_text('[log]\nfsync = "always"\n[kafka]\nbootstrap_servers = "broker:9093"\n'
                    'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                    '[service]\npolicy = "fgd"\n')
    env = {"FLEETLOG_KAFKA_SASL_PLAIN_USERNAME": "fleetlog", "FLEETLOG_KAFKA_TOPIC_PREFIX": "prod",
           "FLEETLOG_KAFKA_SASL_PLAIN_PASSWORD_FILE": str(password), "FLEETLOG_SERVICE_HTTP_PORT": "0",
           "FLEETLOG_KAFKA_PORT": "9092"}  # (the development broker's own variable: not a setting)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    service = load_config(path, env)
    for argv in (("--config", str(path)), ("--config", str(path), "--kafka", "broker:9093")):
        backend = store_config(parsed(*argv))
        assert (backend.log, backend.kafka) == (service.log, service.kafka)
    assert service.kafka is not None
    assert (service.kafka.topic_prefix, service.kafka.sasl_plain_password) == ("prod", "s3cr3t")
    on_file = store_config(parsed("--config", str(path), "--log", str(tmp_path / "log")))
    assert (on_file.log.dir, on_file.log.fsync, on_file.kafka) == (str(tmp_path / "log"), "always", None)


def test_the_services_table_is_the_services_a_backend_leaves_it_to_fleetlog_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleetlog.toml"
    path.write_text('[log]\ndir = "d"\n[service]\npolicy = "fastest"\nhttp_prot = 1\n')
    monkeypatch.setenv("FLEETLOG_SERVICE_HTTP_PORT", "not a port")
    assert store_config(parsed("--config", str(path))).log.dir == "d"
    with pytest.raises(ConfigError, match=r"unknown key service\.http_prot"):
        load_config(path, {})  # ... which refuses what is wrong in it


@pytest.mark.parametrize("module", BACKENDS)
def test_usage_and_configuration_errors_exit_2_in_one_line(module: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[kafka]\nbootstrap_servers = "b:9093"\nsasl_mechanizm = "PLAIN"\n')
    typo = tmp_path / "typo.toml"  # a table nobody reads is an error, as for the service
    typo.write_text('[log]\ndir = "d"\n[servce]\npolicy = "fgd"\n')
    cases = [
        ((), {}, "set exactly one place for the logs"),
        (("--config", str(bad)), {}, "line 3: unknown key kafka.sasl_mechanizm"),
        (("--kafka", "b:9093"), {"FLEETLOG_KAFKA_SECURITY_PROTOCOL": "TLS"},
         "FLEETLOG_KAFKA_SECURITY_PROTOCOL: kafka.security_protocol = 'TLS'"),
        (("--log", str(tmp_path / "log"), "--topic-prefix", "p"), {}, "--topic-prefix applies to Kafka only"),
        (("--config", str(tmp_path / "missing.toml")), {}, "cannot read config file"),
        (("--config", str(typo)), {}, "unknown table [servce]; expected log, kafka, cells, auth, service"),
    ]
    for argv, env, message in cases:
        done = run(module, *argv, env=env)
        assert done.returncode == 2, (argv, done.stderr)
        assert message in one_line(done.stderr), (argv, done.stderr)
    assert not (tmp_path / "log").exists()


def test_a_failure_that_stops_the_backend_exits_1_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-kubeconfig"
    done = run(BACKENDS[0], "--log", str(tmp_path / "log"), "--kubeconfig", str(missing))
    assert done.returncode == 1, done.stderr
    assert f"kubeconfig {missing}: no such file" in one_line(done.stderr)
    assert not (tmp_path / "log").exists()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    done = run(BACKENDS[1], "--log", str(not_a_dir), "--slurm-conf", str(tmp_path / "slurm.conf"))
    assert done.returncode == 1, done.stderr
    assert str(not_a_dir) in one_line(done.stderr)
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("clusters: [\n")
    done = run(BACKENDS[0], "--log", str(tmp_path / "log"), "--kubeconfig", str(garbage))
    assert done.returncode == 1, done.stderr
    assert f"cannot load the Kubernetes credentials from {garbage}" in one_line(done.stderr)
