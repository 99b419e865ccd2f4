"""The service configuration: TOML file, environment overrides, security pass-through, errors."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from fleetlog.log.base import INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.location import ConfigError, LogConfig, describe, open_store
from fleetlog.service.config import Config, ServiceSettings, load_config

SECRET = "s3cr3t-Pa55"

FULL = """
[log]
fsync = "always"

[kafka]
bootstrap_servers = "broker-1:9093,broker-2:9093"
topic_prefix = "prod"
shard = 3
shards = 8
client_id = "fleetlog-prod"

[service]
policy = "fgd?fail_unplaced=true"
group = "sched-a"
producer_id = "sched-a"
max_batch = 500
idle_wait_ms = 20
snapshot_every_events = 1000
snapshot_every_s = 2.5
http_host = "0.0.0.0"
http_port = 0
leader_session_timeout_ms = 9000
"""


def write(tmp_path: Path, text: str, name: str = "fleetlog.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real self-signed CA and a client certificate signed by it (openssl)."""
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=fleetlog-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=fleetlog-client",
    )
    run(
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.pem",
        "-days",
        "2",
    )
    return {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key", "cakey": d / "ca.key"}


# -- loading ------------------------------------------------------------------------------------


def test_file_log_only_needs_a_directory(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[log]\ndir = "var/log"\n'), {})
    assert config == Config(log=LogConfig(dir="var/log"), kafka=None, service=ServiceSettings())
    assert config.service.http_port == 9464
    assert config.service.policy == "default"


def test_every_table_is_read_with_its_types(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), {})
    assert config.log == LogConfig(dir=None, fsync="always")
    assert config.kafka == KafkaConfig(
        bootstrap_servers="broker-1:9093,broker-2:9093",
        topic_prefix="prod",
        shard=3,
        shards=8,
        client_id="fleetlog-prod",
    )
    assert config.service == ServiceSettings(
        policy="fgd?fail_unplaced=true",
        group="sched-a",
        producer_id="sched-a",
        max_batch=500,
        idle_wait_ms=20,
        snapshot_every_events=1000,
        snapshot_every_s=2.5,
        http_host="0.0.0.0",
        http_port=0,
        leader_session_timeout_ms=9000,
    )


def test_environment_beats_the_file_and_is_converted_to_each_fields_type(tmp_path: Path) -> None:
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "other:9092",
        "FLEETLOG_KAFKA_SHARD": "5",
        "FLEETLOG_SERVICE_HTTP_PORT": "8080",
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_S": "0.5",
        "FLEETLOG_SERVICE_POLICY": "best-fit",
    }
    config = load_config(write(tmp_path, FULL), env)
    assert config.kafka is not None
    assert (config.kafka.bootstrap_servers, config.kafka.shard, config.kafka.topic_prefix) == (
        "other:9092",
        5,
        "prod",
    )
    assert (config.service.http_port, config.service.snapshot_every_s) == (8080, 0.5)
    assert config.service.policy == "best-fit"
    assert config.service.group == "sched-a"


def test_environment_alone_is_a_configuration() -> None:
    config = load_config(None, {"FLEETLOG_LOG_DIR": "/tmp/x", "FLEETLOG_LOG_FSYNC": "never", "HOME": "/root"})
    assert config.log == LogConfig(dir="/tmp/x", fsync="never")
    assert config.kafka is None


def test_an_empty_variable_clears_an_optional_key_so_kafka_can_replace_the_file_log(tmp_path: Path) -> None:
    path = write(tmp_path, '[log]\ndir = "var/log"\n')
    config = load_config(path, {"FLEETLOG_LOG_DIR": "", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert config.log.dir is None
    assert config.kafka == KafkaConfig(bootstrap_servers="k:9092")


def test_variables_that_are_not_settings_are_ignored() -> None:
    env = {
        "FLEETLOG_LOG_DIR": "d",
        "FLEETLOG_KAFKA": "127.0.0.1:1",  # the test suite's broker address
        "FLEETLOG_KAFKA_PORT": "19092",  # infra/kafka/kafka.sh's own settings
        "FLEETLOG_KAFKA_DIR": "var/kafka",
        "FLEETLOG_KAFKA_CLUSTER_PORT": "19200",  # and of its three-node cluster
        "FLEETLOG_KAFKA_CLUSTER_DIR": "var/kafka-cluster",
        "FLEETLOG_TRACES": "../shared/traces",
    }
    assert load_config(None, env).kafka is None


def test_password_file_is_read_at_load_and_never_shown(tmp_path: Path) -> None:
    secret_file = write(tmp_path, SECRET + "\n", "password")
    secret_file.chmod(0o600)
    text = f"""[kafka]
bootstrap_servers = "b:9096"
security_protocol = "SASL_PLAINTEXT"
sasl_mechanism = "SCRAM-SHA-256"
sasl_plain_username = "fleetlog"
sasl_plain_password_file = "{secret_file}"
"""
    config = load_config(write(tmp_path, text), {})
    assert config.kafka is not None
    assert config.kafka.sasl_plain_password == SECRET
    shown = [repr(config), str(config), str(config.redacted()), describe(config), repr(config.kafka)]
    assert all(SECRET not in s for s in shown)
    assert config.redacted()["kafka"]["sasl_plain_password"] == "***"
    assert (
        describe(config)
        == "Kafka at b:9096 (SASL_PLAINTEXT/SCRAM-SHA-256 as fleetlog), topics fleetlog.*, shard 0 of 1"
    )


def test_sasl_ssl_with_scram_and_tls_files_pass_through_to_aiokafka(tls_files: dict[str, Path]) -> None:
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "secure:9094",
        "FLEETLOG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FLEETLOG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "FLEETLOG_KAFKA_SASL_PLAIN_USERNAME": "svc",
        "FLEETLOG_KAFKA_SASL_PLAIN_PASSWORD": SECRET,
        "FLEETLOG_KAFKA_SSL_CAFILE": str(tls_files["ca"]),
        "FLEETLOG_KAFKA_SSL_CERTFILE": str(tls_files["cert"]),
        "FLEETLOG_KAFKA_SSL_KEYFILE": str(tls_files["key"]),
    }
    config = load_config(None, env)
    assert config.kafka is not None
    options = config.kafka.client_options()
    context = options.pop("ssl_context")
    assert options == {
        "bootstrap_servers": "secure:9094",
        "client_id": "fleetlog",
        "request_timeout_ms": 30_000,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": SECRET,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    subjects = [dict(pair[0] for pair in ca["subject"]) for ca in context.get_ca_certs()]
    assert {"commonName": "fleetlog-test-ca"} in subjects
    assert SECRET not in repr(config)
    assert SECRET not in str(config.redacted())


def test_plaintext_has_no_tls_context() -> None:
    config = load_config(None, {"FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "b:9092"})
    assert config.kafka is not None
    assert "ssl_context" not in config.kafka.client_options()


def test_command_line_shortcuts_move_the_logs_and_keep_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    env = {"FLEETLOG_KAFKA_SHARD": "4"}
    to_file = load_config(path, env, log_dir=str(tmp_path / "log"))
    assert to_file.kafka is None
    assert to_file.log == LogConfig(dir=str(tmp_path / "log"), fsync="always")
    assert to_file.service.group == "sched-a"
    moved = load_config(path, env, kafka="k3:9092")
    assert moved.kafka is not None
    assert (moved.kafka.bootstrap_servers, moved.kafka.shard, moved.kafka.topic_prefix) == (
        "k3:9092",
        4,
        "prod",
    )
    from_dir = load_config(write(tmp_path, '[log]\ndir = "a"\n', "f.toml"), {}, kafka="k4:9092")
    assert from_dir.log.dir is None
    assert from_dir.kafka == KafkaConfig(bootstrap_servers="k4:9092")
    assert load_config(None, {}, log_dir="x").log.dir == "x"
    with pytest.raises(ConfigError, match=r"--log: log\.dir"):
        load_config(None, {}, log_dir=123)  # type: ignore[arg-type]


# -- bad configurations: each names where, which key, and what was expected ------------------------

BAD_FILES = [
    ('[log]\ndir = "d"\n[servce]\nx = 1\n', ["unknown table [servce]", "log, kafka, service"]),
    (
        '[log]\ndir = "d"\n\n[service]\nhttp_prot = 1\n',
        ["line 5", "unknown key service.http_prot", "http_port"],
    ),
    (
        '[log]\ndir = "d"\n[service]\nhttp_port = "80"\n',
        ["line 4", "service.http_port = '80'", "Expected `int`"],
    ),
    ('[log]\ndir = "d"\n[service]\nhttp_port = 70000\n', ["line 4", "service.http_port", "<= 65535"]),
    ('[log]\ndir = "d"\n[service]\nmax_batch = 0\n', ["service.max_batch", ">= 1"]),
    ('[log]\ndir = "d"\nfsync = "sometimes"\n', ["line 3", "log.fsync", "never, batch, always"]),
    ('[log]\ndir = "d"\n[service\n', ["not valid TOML", "line 3"]),
    ('log = "d"\n', ["log must be a table"]),
    ("[service]\npolicy = 'default'\n", ["exactly one place", "neither"]),
    ('[log]\ndir = "d"\n[kafka]\nbootstrap_servers = "b:1"\n', ["exactly one place", "both"]),
    ("[kafka]\nshard = 1\n", ["kafka.bootstrap_servers is required"]),
    (
        '[log]\ndir = "d"\n[service]\npolicy = "fastest"\n',
        ["line 4", "service.policy = 'fastest'", "best-fit"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsecurity_protocol = "TLS"\n',
        ["line 3", "kafka.security_protocol", "SASL_SSL"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsecurity_protocol = "SASL_SSL"\n',
        ["kafka.sasl_mechanism", "SCRAM-SHA-512"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsecurity_protocol = "SASL_SSL"\n'
        'sasl_mechanism = "SCRAM-SHA-512"\n',
        ["line 4", "needs sasl_plain_username and sasl_plain_password"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsecurity_protocol = "SSL"\nssl_cafile = "/nonexistent/ca.pem"\n',
        ["line 4", "kafka.ssl_cafile", "no such file"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsasl_plain_password_file = "/nonexistent/pw"\n',
        ["line 3", "cannot read /nonexistent/pw"],
    ),
    (
        '[kafka]\nbootstrap_servers = "b:1"\nsasl_plain_password = "x"\nsasl_plain_password_file = "/p"\n',
        ["not both"],
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FILES)
def test_a_bad_file_names_the_file_the_key_and_what_was_expected(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    message = str(caught.value)
    for part in expected:
        assert part in message
    assert str(path) in message


BAD_ENV = [
    (
        {"FLEETLOG_SERVICE_HTTP_PORT": "http"},
        ["FLEETLOG_SERVICE_HTTP_PORT", "service.http_port = 'http'", "Expected `int`"],
    ),
    ({"FLEETLOG_SERVICE_SNAPSHOT_EVERY_S": "-1"}, ["FLEETLOG_SERVICE_SNAPSHOT_EVERY_S", "> 0.0"]),
    ({"FLEETLOG_LOG_FSYNC": "often"}, ["FLEETLOG_LOG_FSYNC", "never, batch, always"]),
    ({"FLEETLOG_SERVICE_HTTP_PORTS": "1"}, ["FLEETLOG_SERVICE_HTTP_PORTS", "unknown key service.http_ports"]),
    (
        {"FLEETLOG_KAFKA_BOOTSTRAP": "b:1"},
        ["FLEETLOG_KAFKA_BOOTSTRAP", "unknown key kafka.bootstrap", "bootstrap_servers"],
    ),
    ({"FLEETLOG_SERVICE_POLICY": "fgd?nonsense=1"}, ["FLEETLOG_SERVICE_POLICY", "nonsense"]),
    ({"FLEETLOG_LOG_DIR": ""}, ["exactly one place", "neither"]),
]


@pytest.mark.parametrize(("env", "expected"), BAD_ENV)
def test_a_bad_variable_is_named(env: dict[str, str], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"FLEETLOG_LOG_DIR": "d", **env})
    for part in expected:
        assert part in str(caught.value)


def test_a_missing_or_binary_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.toml"):
        load_config(tmp_path / "nope.toml", {})
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe[log]")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        load_config(binary, {})


def test_errors_never_show_the_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as wrong_type:
        load_config(
            write(tmp_path, '[kafka]\nbootstrap_servers = "b:1"\nsasl_plain_password = 123456789\n'), {}
        )
    assert "123456789" not in str(wrong_type.value)
    assert "sasl_plain_password = ***" in str(wrong_type.value)
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "b:1",
        "FLEETLOG_KAFKA_SASL_PLAIN_PASSWORD": SECRET,
        "FLEETLOG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FLEETLOG_KAFKA_SASL_MECHANISM": "MAGIC",
    }
    with pytest.raises(ConfigError) as other:
        load_config(None, env)
    assert "MAGIC" in str(other.value)
    assert SECRET not in str(other.value)


def test_tls_files_that_do_not_load_are_a_config_error(tls_files: dict[str, Path]) -> None:
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": "b:1",
        "FLEETLOG_KAFKA_SECURITY_PROTOCOL": "SSL",
        "FLEETLOG_KAFKA_SSL_CAFILE": str(tls_files["ca"]),
        "FLEETLOG_KAFKA_SSL_CERTFILE": str(tls_files["cert"]),
        "FLEETLOG_KAFKA_SSL_KEYFILE": str(tls_files["cakey"]),  # the wrong key for the certificate
    }
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        load_config(None, env)


# -- opening the configured store ---------------------------------------------------------------


async def test_open_store_opens_the_file_log(tmp_path: Path) -> None:
    config = load_config(None, {"FLEETLOG_LOG_DIR": str(tmp_path / "log"), "FLEETLOG_LOG_FSYNC": "always"})
    assert describe(config) == f"file log at {tmp_path / 'log'} (fsync=always)"
    store = await open_store(config)
    try:
        assert isinstance(store, FileLogStore)
        assert store.config.fsync == "always"
        assert await store.log(INPUTS).append([Message(b"x")]) == 0
    finally:
        await store.close()


@pytest.mark.kafka
async def test_open_store_opens_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FLEETLOG_KAFKA_TOPIC_PREFIX": f"cfg-{tmp_path.name}",
    }
    store = await open_store(load_config(None, env))
    try:
        assert isinstance(store, KafkaLogStore)
        first = await store.log(INPUTS).append([Message(b"x")])
        assert [r.value for r in await store.log(INPUTS).read(first, 10, 5000)] == [b"x"]
    finally:
        await store.close()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o606])
def test_a_password_file_others_can_read_or_write_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    secret_file = write(tmp_path, SECRET + "\n", "password")
    secret_file.chmod(mode)
    text = f'[kafka]\nbootstrap_servers = "b:1"\nsasl_plain_password_file = "{secret_file}"\n'
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {})
    message = str(caught.value)
    assert "\n" not in message
    assert f"accessible by others (mode {mode:04o})" in message
    assert f"chmod 600 {secret_file}" in message
    assert SECRET not in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_password_file_only_its_owner_can_read_is_accepted(tmp_path: Path, mode: int) -> None:
    secret_file = write(tmp_path, SECRET + "\n", "password")
    secret_file.chmod(mode)
    text = f'[kafka]\nbootstrap_servers = "b:1"\nsasl_plain_password_file = "{secret_file}"\n'
    config = load_config(write(tmp_path, text), {})
    assert config.kafka is not None
    assert config.kafka.sasl_plain_password == SECRET
