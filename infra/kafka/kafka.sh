#!/usr/bin/env bash
# A real, single-node Apache Kafka (KRaft broker + controller) for development and tests.
#
#   infra/kafka/kafka.sh fetch            fetch the broker jars into infra/kafka/dist/lib (idempotent)
#   infra/kafka/kafka.sh start [--fresh]  start in the background, wait until it answers, print bootstrap
#   infra/kafka/kafka.sh stop             stop the broker by the PID in its pid file
#   infra/kafka/kafka.sh status           say whether it runs (exit 0) or not (exit 3)
#
# Settings (environment):
#   FLEETLOG_KAFKA_PORT             client port on 127.0.0.1            (default 19092)
#   FLEETLOG_KAFKA_CONTROLLER_PORT  KRaft controller port on 127.0.0.1  (default client port + 1)
#   FLEETLOG_KAFKA_DIR              data, config, log and pid file      (default <repo>/var/kafka)
#   FLEETLOG_KAFKA_HEAP             JVM heap                            (default 512m)
#   FLEETLOG_KAFKA_START_TIMEOUT    seconds to wait for the broker      (default 60)
#   FLEETLOG_KAFKA_SASL_PORT        also listen with SASL_SSL + SCRAM-SHA-512 on this port (default: off);
#                                   user "fleetlog", password in <dir>/tls/password, CA in <dir>/tls/ca.pem
# A second broker only needs another port and directory.  `start --fresh` wipes the directory first.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
LIB="$HERE/dist/lib"
PORT="${FLEETLOG_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${FLEETLOG_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
DIR="${FLEETLOG_KAFKA_DIR:-$REPO/var/kafka}"
HEAP="${FLEETLOG_KAFKA_HEAP:-512m}"
START_TIMEOUT="${FLEETLOG_KAFKA_START_TIMEOUT:-60}"
SASL_PORT="${FLEETLOG_KAFKA_SASL_PORT:-}"
TLS="$DIR/tls"
PID_FILE="$DIR/kafka.pid"
LOG_FILE="$DIR/kafka.log"
CONFIG="$DIR/server.properties"

say() { echo "kafka.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# Fetched jars are stamped with the pom's hash: editing the pom (a new Kafka version) refetches.
fetch() {
  local want stamp="$HERE/dist/.pom-sha256"
  want="$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found: install Maven 3.8+ to fetch the broker"
  command -v java >/dev/null || die "java not found: install a Java 17+ runtime"
  say "fetching the Kafka broker jars with Maven (the first time takes a while)"
  rm -rf "$LIB"
  (cd "$HERE" && mvn -q -B -Dstyle.color=never dependency:copy-dependencies 1>&2) || die "maven fetch failed"
  compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null || die "fetch finished but no kafka jar in $LIB"
  echo "$want" >"$stamp"
}

# The PID in the pid file if that process is alive and is our broker, else nothing.
running_pid() {
  [[ -f "$PID_FILE" ]] || return 0
  local pid
  pid="$(cat "$PID_FILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$CONFIG"; then
    echo "$pid"
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A random KRaft cluster id: 16 random bytes in URL-safe base64 without padding.
cluster_id() {
  local id="-"
  while [[ "$id" == -* ]]; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
  done
  echo "$id"
}

write_log_config() {
  cat >"$DIR/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

# A CA, a server certificate for 127.0.0.1 signed by it (PEM, as Kafka reads it) and a random
# SCRAM password: what a SASL_SSL listener needs, made once per broker directory.
write_tls() {
  [[ -f "$TLS/server.pem" ]] && return 0
  command -v openssl >/dev/null || die "openssl not found: needed for the SASL_SSL listener"
  mkdir -p "$TLS"
  (
    cd "$TLS"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 \
      -subj "/CN=fleetlog test CA" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.crt \
      -days 30 -extfile san.ext 2>/dev/null
    openssl pkcs8 -topk8 -nocrypt -in server.key -out server.p8
    cat server.p8 server.crt >server.pem
    head -c 18 /dev/urandom | base64 | tr -d '+/=\n' >password
  ) || die "making the TLS material in $TLS failed"
}

sasl_config() {
  [[ -n "$SASL_PORT" ]] || return 0
  cat <<EOF
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS/server.pem
EOF
}

write_server_config() {
  local listeners="PLAINTEXT://127.0.0.1:$PORT" advertised="PLAINTEXT://127.0.0.1:$PORT"
  if [[ -n "$SASL_PORT" ]]; then
    write_tls
    listeners+=",SASL_SSL://127.0.0.1:$SASL_PORT"
    advertised+=",SASL_SSL://127.0.0.1:$SASL_PORT"
  fi
  cat >"$CONFIG" <<EOF
# Written by infra/kafka/kafka.sh: a single-node KRaft broker + controller for tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=$listeners,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
$(sasl_config)
log.dirs=$DIR/data
num.network.threads=2
num.io.threads=4
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
transaction.max.timeout.ms=900000
log.retention.hours=168
log.segment.bytes=268435456
EOF
}

format_storage() {
  [[ -f "$DIR/data/meta.properties" ]] && return 0
  local scram=()
  [[ -n "$SASL_PORT" ]] && scram=(--add-scram "SCRAM-SHA-512=[name=fleetlog,password=$(cat "$TLS/password")]")
  java -cp "$LIB/*" -Dlog4j2.configurationFile="$DIR/log4j2.properties" kafka.tools.StorageTool \
    format --cluster-id "$(cluster_id)" --config "$CONFIG" "${scram[@]}" >>"$LOG_FILE" 2>&1 \
    || { tail -n 30 "$LOG_FILE" >&2; die "formatting KRaft storage in $DIR/data failed"; }
}

launch() {
  setsid java "-Xms$HEAP" "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$DIR/log4j2.properties" -cp "$LIB/*" kafka.Kafka "$CONFIG" \
    </dev/null >>"$LOG_FILE" 2>&1 &
  echo $! >"$PID_FILE"
}

wait_ready() {
  local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$LOG_FILE" >&2
      die "the broker exited during start-up (log: $LOG_FILE)"
    fi
    if port_open "$PORT" && grep -q "Kafka Server started" "$LOG_FILE"; then
      return 0
    fi
    sleep 0.2
  done
  tail -n 40 "$LOG_FILE" >&2
  die "the broker did not answer on 127.0.0.1:$PORT within ${START_TIMEOUT}s (log: $LOG_FILE)"
}

start() {
  local fresh=0
  [[ "${1:-}" == "--fresh" ]] && fresh=1
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    ((fresh)) && die "--fresh asked but a broker already runs from $DIR (pid $pid)"
    say "already running (pid $pid)"
    echo "127.0.0.1:$PORT"
    return 0
  fi
  port_open "$PORT" && die "port $PORT is already in use by another process"
  port_open "$CONTROLLER_PORT" && die "controller port $CONTROLLER_PORT is already in use"
  fetch
  if ((fresh)) && [[ -d "$DIR" ]]; then
    # Wipe only a directory this script made (or an empty one), never an arbitrary path.
    [[ -f "$DIR/server.properties" || -z "$(ls -A "$DIR")" ]] \
      || die "--fresh refuses to wipe $DIR: it holds no server.properties written by kafka.sh"
    rm -rf "$DIR"
  fi
  mkdir -p "$DIR"
  : >"$LOG_FILE"
  write_log_config
  write_server_config
  format_storage
  launch
  wait_ready "$(cat "$PID_FILE")"
  say "started (pid $(cat "$PID_FILE"), log $LOG_FILE)"
  echo "127.0.0.1:$PORT"
}

stop() {
  local pid
  pid="$(running_pid)"
  if [[ -z "$pid" ]]; then
    rm -f "$PID_FILE"
    say "not running"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    say "pid $pid did not stop within 30s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
  say "stopped (pid $pid)"
}

status() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    echo "running pid=$pid bootstrap=127.0.0.1:$PORT dir=$DIR"
  else
    echo "stopped dir=$DIR"
    return 3
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 fetch|start [--fresh]|stop|status" >&2; exit 2 ;;
esac
