#!/usr/bin/env bash
# A real Apache Kafka for development and tests: one KRaft node (the default), or a replicated
# cluster of three with a fault-injecting proxy (Toxiproxy) in front of them.
#
#   infra/kafka/kafka.sh fetch            fetch the broker jars into infra/kafka/dist/lib and build
#                                         toxiproxy-server into the cache (both idempotent)
#   infra/kafka/kafka.sh start [--fresh]  start in the background, wait until it answers, print bootstrap
#   infra/kafka/kafka.sh stop             stop the broker by the PID in its pid file
#   infra/kafka/kafka.sh status           say whether it runs (exit 0) or not (exit 3)
#   infra/kafka/kafka.sh user NAME        (with a SASL port) add SCRAM-SHA-512 user NAME to the running
#                                         broker, a random password in <dir>/tls/users/NAME
#   infra/kafka/kafka.sh acl ARGS...      kafka-acls against the running broker: ARGS as for
#                                         kafka-acls.sh (--add --allow-principal User:NAME --operation
#                                         Write --topic T; --list), bootstrap given
#
#   infra/kafka/kafka.sh cluster start [--fresh]   three combined controller + broker nodes and
#                                                  toxiproxy; prints the direct and proxied bootstraps
#   infra/kafka/kafka.sh cluster stop              stop all three and the proxy, by PID
#   infra/kafka/kafka.sh cluster status            one line per node (exit 3 if any is down)
#   infra/kafka/kafka.sh cluster kill N            SIGKILL node N (1-3): a crash
#   infra/kafka/kafka.sh cluster restart N         start node N again on its data (stopping it first
#                                                  if it runs); waits until it answers
#   infra/kafka/kafka.sh cluster pause N           SIGSTOP node N (it holds its connections, answers nothing)
#   infra/kafka/kafka.sh cluster resume N          SIGCONT node N
#
# Settings (environment):
#   FLEETLOG_KAFKA_PORT             client port on 127.0.0.1            (default 19092)
#   FLEETLOG_KAFKA_CONTROLLER_PORT  KRaft controller port on 127.0.0.1  (default client port + 1)
#   FLEETLOG_KAFKA_DIR              data, config, log and pid file      (default <repo>/var/kafka)
#   FLEETLOG_KAFKA_HEAP             JVM heap                            (default 512m)
#   FLEETLOG_KAFKA_JVM_OPTS         more JVM options, split on spaces   (default none)
#   FLEETLOG_KAFKA_START_TIMEOUT    seconds to wait for the broker      (default 60)
#   FLEETLOG_KAFKA_SASL_PORT        also listen with SASL_SSL + SCRAM-SHA-512 on this port (default: off);
#                                   user "fleetlog", password in <dir>/tls/password, CA in <dir>/tls/ca.pem.
#                                   With it the broker authorizes (StandardAuthorizer): a principal
#                                   on that listener may do only what an ACL allows; "fleetlog" and
#                                   the plaintext listener (User:ANONYMOUS: the controller, the broker
#                                   itself, the operator on 127.0.0.1) are super users
#   FLEETLOG_KAFKA_SASL_USERS       more SCRAM users, made when the storage is formatted: names
#                                   split on spaces, each password in <dir>/tls/users/NAME
# A second broker only needs another port and directory.  `start --fresh` wipes the directory first.
#
# The cluster (`cluster ...`; FLEETLOG_KAFKA_HEAP and _START_TIMEOUT apply to each node):
#   FLEETLOG_KAFKA_CLUSTER_PORT     first of 31 ports on 127.0.0.1      (default 19200)
#   FLEETLOG_KAFKA_CLUSTER_DIR      node-1..3 and proxy directories     (default <repo>/var/kafka-cluster)
# Node N (1-3) uses ports base+10(N-1)+k: k=0 the direct client listener, 1 its controller, 2 the
# listener between brokers, 3 the proxied client listener (toxiproxy listens there and forwards
# to k=4, where the broker listens; the broker advertises k=3).  base+30 is toxiproxy's API;
# its proxies are named kafka-1..3.  A client that bootstraps on a k=3 port reaches every broker
# through the proxy; one on a k=0 port never does.  Topics default to replication factor 3,
# min.insync.replicas=2, no unclean leader election; a node is fenced 4 s after its last
# heartbeat to the controllers (broker.session.timeout.ms=4000, Kafka's default is 9000).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
LIB="$HERE/dist/lib"
PORT="${FLEETLOG_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${FLEETLOG_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
DIR="${FLEETLOG_KAFKA_DIR:-$REPO/var/kafka}"
HEAP="${FLEETLOG_KAFKA_HEAP:-512m}"
read -r -a JVM_OPTS <<<"${FLEETLOG_KAFKA_JVM_OPTS:-}"
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
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:fleetlog
allow.everyone.if.no.acl.found=false
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS/server.pem
EOF
}

# Settings of every broker this script starts, one or three: fast group joins for tests,
# transaction clean-up within a second, a week of retention.
shared_settings() {
  cat <<'EOF'
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
transaction.max.timeout.ms=900000
log.retention.hours=168
log.segment.bytes=268435456
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
$(shared_settings)
EOF
}

# A SCRAM user name kafka.sh accepts (also a file name): letters, digits and . _ : -
check_user() {
  [[ "$1" =~ ^[A-Za-z0-9._:-]+$ ]] || { echo "kafka.sh: user name '$1' must match [A-Za-z0-9._:-]+" >&2; exit 2; }
}

# A new random password for user $1, kept in $TLS/users/$1 (0600); printed.
new_password() {
  mkdir -p "$TLS/users"
  chmod 700 "$TLS/users"
  (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '+/=\n' >"$TLS/users/$1")
  cat "$TLS/users/$1"
}

format_storage() {
  [[ -f "$DIR/data/meta.properties" ]] && return 0
  local scram=() user
  if [[ -n "$SASL_PORT" ]]; then
    scram=(--add-scram "SCRAM-SHA-512=[name=fleetlog,password=$(cat "$TLS/password")]")
    for user in ${FLEETLOG_KAFKA_SASL_USERS:-}; do
      check_user "$user"
      scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$(new_password "$user")]")
    done
  fi
  java "${JVM_OPTS[@]}" -cp "$LIB/*" -Dlog4j2.configurationFile="$DIR/log4j2.properties" kafka.tools.StorageTool \
    format --cluster-id "${CLUSTER_ID:-$(cluster_id)}" --config "$CONFIG" "${scram[@]}" >>"$LOG_FILE" 2>&1 \
    || { tail -n 30 "$LOG_FILE" >&2; die "formatting KRaft storage in $DIR/data failed"; }
}

launch() {
  if [[ -s "$LOG_FILE" ]]; then cat "$LOG_FILE" >>"$LOG_FILE.old"; : >"$LOG_FILE"; fi
  setsid java "-Xms$HEAP" "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true "${JVM_OPTS[@]}" \
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

# A Kafka command-line tool (a main class) against the running broker's plaintext listener.
run_tool() {
  [[ -n "$(running_pid)" ]] || die "no broker runs from $DIR: start it first"
  local main="$1"
  shift
  printf 'status = warn\nrootLogger.level = WARN\nrootLogger.appenderRef.err.ref = ERR\nappender.err.type = Console\nappender.err.name = ERR\nappender.err.target = SYSTEM_ERR\nappender.err.layout.type = PatternLayout\nappender.err.layout.pattern = %%p %%m%%n\n' \
    >"$DIR/tools-log4j2.properties"
  java "${JVM_OPTS[@]}" -Dlog4j2.configurationFile="$DIR/tools-log4j2.properties" -cp "$LIB/*" "$main" \
    --bootstrap-server "127.0.0.1:$PORT" "$@"
}

add_user() {
  [[ -n "${1:-}" ]] || { echo "usage: $0 user NAME" >&2; exit 2; }
  check_user "$1"
  [[ -n "$SASL_PORT" ]] || die "user needs FLEETLOG_KAFKA_SASL_PORT: SCRAM users log in on the SASL_SSL listener"
  run_tool kafka.admin.ConfigCommand --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[password=$(new_password "$1")]" >&2
  say "user $1 added (password in $TLS/users/$1)"
}

# --- the three-node cluster ---------------------------------------------------------------------

CLUSTER_BASE="${FLEETLOG_KAFKA_CLUSTER_PORT:-19200}"
CLUSTER_DIR="${FLEETLOG_KAFKA_CLUSTER_DIR:-$REPO/var/kafka-cluster}"
NODES=(1 2 3)
PROXY_VERSION="v2.5.0"
PROXY_CACHE="${FLEETLOG_CACHE:-$HOME/.cache/fleetlog}/toxiproxy"
PROXY_BIN="$PROXY_CACHE/toxiproxy-server-$PROXY_VERSION"
PROXY_DIR="$CLUSTER_DIR/proxy"
PROXY_API_PORT=$((CLUSTER_BASE + 30))
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

node_port() { echo $((CLUSTER_BASE + 10 * ($1 - 1) + $2)); }

# Point the single-node globals (PORT, DIR, CONFIG, ...) at node N, so start/stop/launch serve it.
use_node() {
  local n="$1"
  [[ "$n" =~ ^[123]$ ]] || { echo "kafka.sh: node must be 1, 2 or 3, not '$n'" >&2; exit 2; }
  PORT="$(node_port "$n" 0)"
  CONTROLLER_PORT="$(node_port "$n" 1)"
  DIR="$CLUSTER_DIR/node-$n"
  TLS="$DIR/tls"
  PID_FILE="$DIR/kafka.pid"
  LOG_FILE="$DIR/kafka.log"
  CONFIG="$DIR/server.properties"
  SASL_PORT=""
  NODE="$n"
}

voters() {
  local n out=""
  for n in "${NODES[@]}"; do out+="${out:+,}$n@127.0.0.1:$(node_port "$n" 1)"; done
  echo "$out"
}

write_node_config() {
  local n="$NODE"
  local client internal proxied upstream
  client="$(node_port "$n" 0)" internal="$(node_port "$n" 2)"
  proxied="$(node_port "$n" 3)" upstream="$(node_port "$n" 4)"
  cat >"$CONFIG" <<EOF
# Written by infra/kafka/kafka.sh: node $n of a three-node KRaft cluster for tests.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=CLIENT://127.0.0.1:$client,INTERNAL://127.0.0.1:$internal,PROXIED://127.0.0.1:$upstream,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=CLIENT://127.0.0.1:$client,INTERNAL://127.0.0.1:$internal,PROXIED://127.0.0.1:$proxied
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
num.network.threads=2
num.io.threads=4
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
auto.create.topics.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=1000
$(shared_settings)
EOF
}

# toxiproxy-server, built once from its Go module into the cache (like kube-apiserver).
fetch_proxy() {
  [[ -x "$PROXY_BIN" ]] && return 0
  [[ -x "$GO" ]] || die "the Go toolchain is needed to build toxiproxy-server (looked for $GO)"
  mkdir -p "$PROXY_CACHE"
  say "building toxiproxy-server $PROXY_VERSION into $PROXY_BIN (once, about a minute)"
  local tmp
  tmp="$(mktemp -d)"
  GOBIN="$tmp" "$GO" install "github.com/Shopify/toxiproxy/v2/cmd/server@$PROXY_VERSION" 1>&2 \
    || { rm -rf "$tmp"; die "building toxiproxy-server failed"; }
  mv "$tmp/server" "$PROXY_BIN"
  rm -rf "$tmp"
}

proxy_pid() {
  [[ -f "$PROXY_DIR/toxiproxy.pid" ]] || return 0
  local pid
  pid="$(cat "$PROXY_DIR/toxiproxy.pid")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$PROXY_DIR/proxies.json"; then
    echo "$pid"
  fi
}

start_proxy() {
  [[ -n "$(proxy_pid)" ]] && return 0
  port_open "$PROXY_API_PORT" && die "toxiproxy's API port $PROXY_API_PORT is already in use"
  mkdir -p "$PROXY_DIR"
  local n sep="" json="["
  for n in "${NODES[@]}"; do
    json+="$sep{\"name\": \"kafka-$n\", \"listen\": \"127.0.0.1:$(node_port "$n" 3)\", \"upstream\": \"127.0.0.1:$(node_port "$n" 4)\", \"enabled\": true}"
    sep=", "
  done
  echo "$json]" >"$PROXY_DIR/proxies.json"
  setsid "$PROXY_BIN" -host 127.0.0.1 -port "$PROXY_API_PORT" -config "$PROXY_DIR/proxies.json" \
    </dev/null >>"$PROXY_DIR/toxiproxy.log" 2>&1 &
  echo $! >"$PROXY_DIR/toxiproxy.pid"
  local deadline=$((SECONDS + 20))
  until port_open "$PROXY_API_PORT" && port_open "$(node_port 3 3)"; do
    ((SECONDS < deadline)) || { tail -n 20 "$PROXY_DIR/toxiproxy.log" >&2; die "toxiproxy did not start"; }
    sleep 0.1
  done
}

stop_proxy() {
  local pid
  pid="$(proxy_pid)"
  if [[ -n "$pid" ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PROXY_DIR/toxiproxy.pid"
}

# Write node N's config and storage if new, and launch it (not waiting).
launch_node() {
  use_node "$1"
  local k
  for k in 0 1 2 4; do
    port_open "$(node_port "$1" "$k")" && die "port $(node_port "$1" "$k") of node $1 is already in use"
  done
  mkdir -p "$DIR"
  write_log_config
  write_node_config
  format_storage
  launch
}

cluster_start() {
  local fresh=0 n
  [[ "${1:-}" == "--fresh" ]] && fresh=1
  for n in "${NODES[@]}"; do
    use_node "$n"
    if [[ -n "$(running_pid)" ]] && ((fresh)); then
      die "--fresh asked but node $n already runs from $DIR"
    fi
  done
  fetch
  fetch_proxy
  if ((fresh)) && [[ -d "$CLUSTER_DIR" ]]; then
    # Wipe only a directory this script made (or an empty one), never an arbitrary path.
    [[ -f "$CLUSTER_DIR/cluster.id" || -z "$(ls -A "$CLUSTER_DIR")" ]] \
      || die "--fresh refuses to wipe $CLUSTER_DIR: it holds no cluster.id written by kafka.sh"
    rm -rf "$CLUSTER_DIR"
  fi
  mkdir -p "$CLUSTER_DIR"
  [[ -f "$CLUSTER_DIR/cluster.id" ]] || cluster_id >"$CLUSTER_DIR/cluster.id"
  CLUSTER_ID="$(cat "$CLUSTER_DIR/cluster.id")"
  start_proxy
  local started=()
  for n in "${NODES[@]}"; do
    use_node "$n"
    [[ -n "$(running_pid)" ]] && continue
    launch_node "$n"
    started+=("$n")
  done
  for n in "${started[@]}"; do
    use_node "$n"
    wait_ready "$(cat "$PID_FILE")"
  done
  say "cluster started (dir $CLUSTER_DIR)"
  cluster_bootstraps
}

cluster_bootstraps() {
  local n direct="" proxied=""
  for n in "${NODES[@]}"; do
    direct+="${direct:+,}127.0.0.1:$(node_port "$n" 0)"
    proxied+="${proxied:+,}127.0.0.1:$(node_port "$n" 3)"
  done
  echo "direct=$direct"
  echo "proxied=$proxied"
  echo "proxy_api=http://127.0.0.1:$PROXY_API_PORT"
}

# SIGTERM to every node at once (one after the other, the last would wait for a controller
# quorum that left before it), SIGKILL to any still running 30 s later; then the proxy.
cluster_stop() {
  local n pid pids=() deadline=$((SECONDS + 30))
  for n in "${NODES[@]}"; do
    use_node "$n"
    pid="$(running_pid)"
    [[ -n "$pid" ]] || continue
    kill -CONT "$pid" 2>/dev/null || true  # a paused JVM cannot act on SIGTERM
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$n:$pid")
  done
  for entry in "${pids[@]}"; do
    n="${entry%%:*}" pid="${entry##*:}"
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      say "node $n (pid $pid) did not stop within 30s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    use_node "$n"
    rm -f "$PID_FILE"
    say "node $n stopped (pid $pid)"
  done
  stop_proxy
}

cluster_status() {
  local n pid down=0
  for n in "${NODES[@]}"; do
    use_node "$n"
    pid="$(running_pid)"
    if [[ -z "$pid" ]]; then
      echo "node $n stopped"
      down=1
    elif grep -q '^State:.*(stopped)' "/proc/$pid/status" 2>/dev/null; then
      echo "node $n paused pid=$pid client=127.0.0.1:$PORT"
    else
      echo "node $n running pid=$pid client=127.0.0.1:$PORT"
    fi
  done
  pid="$(proxy_pid)"
  if [[ -n "$pid" ]]; then echo "proxy running pid=$pid api=http://127.0.0.1:$PROXY_API_PORT"; else echo "proxy stopped"; down=1; fi
  return $((down ? 3 : 0))
}

signal_node() {
  use_node "$2"
  local pid
  pid="$(running_pid)"
  [[ -n "$pid" ]] || die "node $2 is not running"
  kill "-$1" "$pid"
  if [[ "$1" == KILL ]]; then
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$PID_FILE"
  fi
  say "node $2 (pid $pid): SIG$1"
}

cluster_restart() {
  use_node "$1"
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    kill -CONT "$pid" 2>/dev/null || true
    stop
  fi
  [[ -f "$CLUSTER_DIR/cluster.id" ]] || die "no cluster in $CLUSTER_DIR: run 'cluster start' first"
  CLUSTER_ID="$(cat "$CLUSTER_DIR/cluster.id")"
  local deadline=$((SECONDS + 30))
  while port_open "$PORT" && ((SECONDS < deadline)); do sleep 0.1; done
  launch_node "$1"
  wait_ready "$(cat "$PID_FILE")"
  say "node $1 started (pid $(cat "$PID_FILE"))"
}

cluster() {
  local what="${1:-}"
  shift || true
  case "$what" in
    start) cluster_start "$@" ;;
    stop) cluster_stop ;;
    status) cluster_status ;;
    kill) signal_node KILL "${1:-}" ;;
    pause) signal_node STOP "${1:-}" ;;
    resume) signal_node CONT "${1:-}" ;;
    restart) cluster_restart "${1:-}" ;;
    *) echo "usage: $0 cluster start [--fresh]|stop|status|kill N|restart N|pause N|resume N" >&2; exit 2 ;;
  esac
}

case "${1:-}" in
  fetch) fetch; fetch_proxy ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  user) shift; add_user "$@" ;;
  acl) shift; run_tool org.apache.kafka.tools.AclCommand "$@" ;;
  cluster) shift; cluster "$@" ;;
  *) echo "usage: $0 fetch|start [--fresh]|stop|status|user NAME|acl ARGS...|cluster ..." >&2; exit 2 ;;
esac
