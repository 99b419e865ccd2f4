#!/usr/bin/env bash
# A real Kubernetes control plane for development and tests: etcd + kube-apiserver on 127.0.0.1.
# No kubelet, no controller-manager: fleetlog is the scheduler, and tests play kubelet.  The stock
# kube-scheduler can run beside it (start-scheduler), placing the pods without a schedulerName.
#
#   infra/kubernetes/kube.sh fetch                    build kube-apiserver and kube-scheduler once (cached),
#                                                     install etcd
#   infra/kubernetes/kube.sh fetch-scheduler          build kube-scheduler only
#   infra/kubernetes/kube.sh start [--fresh]          start etcd and kube-apiserver, print the kubeconfig path
#   infra/kubernetes/kube.sh start-scheduler [--no-wait]  start kube-scheduler against the running API server
#   infra/kubernetes/kube.sh stop-scheduler           stop kube-scheduler by PID
#   infra/kubernetes/kube.sh stop [apiserver]         stop all three (or only the API server) by PID
#   infra/kubernetes/kube.sh status                   say whether they run (exit 0) or not (exit 3)
#
# Settings (environment):
#   FLEETLOG_KUBE_DIR            certs, tokens, kubeconfigs, etcd data, logs, pid files (default <repo>/var/kube)
#   FLEETLOG_KUBE_PORT           API server port on 127.0.0.1    (default: a free port, kept in DIR/ports)
#   FLEETLOG_KUBE_ETCD_PORT      etcd client port on 127.0.0.1   (default: a free port, kept in DIR/ports)
#   FLEETLOG_KUBE_START_TIMEOUT  seconds to wait for readiness   (default 120)
#   FLEETLOG_KUBE_STOP_GRACE     seconds a stopped server gets after SIGTERM, then SIGKILL (default 30;
#                                an API server with open watches waits on them until killed)
#   FLEETLOG_KUBE_SCHEDULER_PORT kube-scheduler's secure port (/healthz) on 127.0.0.1 (default: a free port)
#   FLEETLOG_KUBE_SCHEDULER_QPS  kube-scheduler's client qps and burst (default 5000: its client's
#                                throttling is not what a benchmark should measure)
#   FLEETLOG_CACHE               where the built binaries are kept  (default ~/.cache/fleetlog)
#
# The build is pinned by tools/go.mod (k8s.io/kubernetes plus every staging module replaced by its
# published v0.X.Y).  The binary is named after the go.mod's hash, so a new pin rebuilds.
# kube-scheduler is built from the same release by a module of its own, scheduler/go.mod (the same
# versions, its own go.sum: kube-scheduler needs a few modules kube-apiserver does not, and
# tools/go.sum, hence the API server binary's name, stays as it is).  Built right after
# kube-apiserver it compiles only its own 64 of its 1,418 packages (the rest are in Go's build
# cache): about 30 s here on 2 cores, link included (2026-12-04).
# kube-scheduler runs with leader election off, the admin kubeconfig, and its secure port on
# 127.0.0.1 serving the API server's certificate, /healthz and /metrics open to anyone there (no
# delegated authentication: the API server has no front-proxy CA for it to read)
# (DIR/kube-scheduler.yaml, log DIR/scheduler.log).
# Authentication is by static tokens (DIR/tokens.csv): "admin" (system:masters, kubeconfig
# DIR/admin.kubeconfig) and "fleetlog-scheduler" with no rights until the ClusterRole of
# docs/kubernetes.md is bound (DIR/scheduler.kubeconfig).  Authorization is RBAC.
# Two admission plugins are off because no controller runs: ServiceAccount (no controller makes
# the default service account) and TaintNodesByCondition (no node lifecycle controller would
# ever lift the not-ready taint it puts on every new node).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${FLEETLOG_KUBE_DIR:-$REPO/var/kube}"
CACHE="${FLEETLOG_CACHE:-$HOME/.cache/fleetlog}/kubernetes"
START_TIMEOUT="${FLEETLOG_KUBE_START_TIMEOUT:-120}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

say() { echo "kube.sh: $*" >&2; }
die() { say "$*"; exit 1; }

release_of() { awk '$1 == "k8s.io/kubernetes" {print $2}' "$HERE/$1/go.mod" | head -n 1; }

# binary_of NAME MODULE: the cached binary NAME built from module directory MODULE, named after
# the release it pins and the hash of its go.mod and go.sum (a new pin rebuilds)
binary_of() {
  local hash
  hash="$(cat "$HERE/$2/go.mod" "$HERE/$2/go.sum" | sha256sum | cut -c1-12)"
  echo "$CACHE/$1-$(release_of "$2")-$hash"
}

release() { release_of tools; }
binary() { binary_of kube-apiserver tools; }

# The version the binary reports (what `kubectl version` shows), as the upstream build stamps it.
version_flags() {
  local v minor
  v="$(release)"
  minor="$(echo "$v" | cut -d. -f2)"
  echo "-s -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1" \
    "-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

# kube-scheduler: its own module pinning the same release (scheduler/go.mod), so its binary's
# name is the release plus the hash of that module's go.mod and go.sum.
scheduler_release() { release_of scheduler; }
scheduler_binary() { binary_of kube-scheduler scheduler; }

build_scheduler() {
  local out
  [[ "$(scheduler_release)" == "$(release)" ]] ||
    die "scheduler/go.mod pins k8s.io/kubernetes $(scheduler_release), tools/go.mod $(release): pin both alike"
  out="$(scheduler_binary)"
  [[ -x "$out" ]] && return 0
  [[ -x "$GO" ]] || die "the Go toolchain is needed to build kube-scheduler (looked for $GO)"
  mkdir -p "$CACHE"
  say "building kube-scheduler into $out (once; minutes when kube-apiserver filled Go's build cache)"
  (cd "$HERE/scheduler" && nice -n 10 "$GO" build -trimpath -ldflags "$(version_flags)" -o "$out.partial" \
    k8s.io/kubernetes/cmd/kube-scheduler) || die "building kube-scheduler failed"
  mv "$out.partial" "$out"
}

build_apiserver() {
  local out
  out="$(binary)"
  [[ -x "$out" ]] && return 0
  [[ -x "$GO" ]] || die "the Go toolchain is needed to build kube-apiserver (looked for $GO)"
  mkdir -p "$CACHE"
  say "building kube-apiserver into $out (once; about 10 minutes on 2 cores)"
  (cd "$HERE/tools" && nice -n 10 "$GO" build -trimpath -ldflags "$(version_flags)" -o "$out.partial" \
    k8s.io/kubernetes/cmd/kube-apiserver) || die "building kube-apiserver failed"
  mv "$out.partial" "$out"
}

ensure_etcd() {
  command -v etcd >/dev/null && return 0
  [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null || die "etcd not found: install etcd-server"
  say "installing etcd-server with apt-get"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
}

fetch() {
  ensure_etcd
  build_apiserver
  build_scheduler
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports are chosen once per directory and kept, so a restarted API server keeps its address.
load_ports() {
  if [[ ! -f "$DIR/ports" ]]; then
    echo "API_PORT=${FLEETLOG_KUBE_PORT:-$(free_port)}" >"$DIR/ports"
    echo "ETCD_PORT=${FLEETLOG_KUBE_ETCD_PORT:-$(free_port)}" >>"$DIR/ports"
    echo "PEER_PORT=$(free_port)" >>"$DIR/ports"
  fi
  # shellcheck disable=SC1091
  source "$DIR/ports"
}

# Whether process $1 still runs: one that exited but is not reaped yet (a zombie; here init
# reaps the detached daemons up to 2 s late) holds no port or file any more, and counts as gone.
alive() {
  local state
  state="$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$state" && "$state" != Z ]]
}

# The PID in DIR/NAME.pid if that process is alive and runs from DIR, else nothing.
running_pid() {
  local file="$DIR/$1.pid" pid
  [[ -f "$file" ]] || return 0
  pid="$(cat "$file")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$DIR"; then
    echo "$pid"
  fi
}

make_certs() {
  local c="$DIR/certs"
  [[ -f "$c/apiserver.crt" ]] && return 0
  mkdir -p "$c"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=fleetlog-test-ca" \
    -keyout "$c/ca.key" -out "$c/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$c/apiserver.key" -out "$c/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$c/san.ext"
  openssl x509 -req -in "$c/apiserver.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
    -days 3650 -extfile "$c/san.ext" -out "$c/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$c/sa.key" 2048 2>/dev/null
  openssl rsa -in "$c/sa.key" -pubout -out "$c/sa.pub" 2>/dev/null
}

make_tokens() {
  [[ -f "$DIR/tokens.csv" ]] && return 0
  local admin scheduler
  admin="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  scheduler="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  {
    echo "$admin,admin,admin-uid,\"system:masters\""
    echo "$scheduler,fleetlog-scheduler,fleetlog-scheduler-uid"
  } >"$DIR/tokens.csv"
  chmod 600 "$DIR/tokens.csv"
}

write_kubeconfig() {  # write_kubeconfig FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fleetlog-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $DIR/certs/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@fleetlog-test
  context: {cluster: fleetlog-test, user: $2}
current-context: $2@fleetlog-test
EOF
}

write_kubeconfigs() {
  write_kubeconfig "$DIR/admin.kubeconfig" admin "$(sed -n 1p "$DIR/tokens.csv" | cut -d, -f1)"
  write_kubeconfig "$DIR/scheduler.kubeconfig" fleetlog-scheduler "$(sed -n 2p "$DIR/tokens.csv" | cut -d, -f1)"
}

start_scheduler() {
  local wait=1
  [[ "${1:-}" == "--no-wait" ]] && wait=0
  [[ -d "$DIR" && -n "$(running_pid apiserver)" ]] || die "no API server runs from $DIR: kube.sh start first"
  [[ -n "$(running_pid scheduler)" ]] && return 0
  build_scheduler
  load_ports
  if [[ -z "${SCHED_PORT:-}" ]]; then
    SCHED_PORT="${FLEETLOG_KUBE_SCHEDULER_PORT:-$(free_port)}"
    echo "SCHED_PORT=$SCHED_PORT" >>"$DIR/ports"
  fi
  port_open "$SCHED_PORT" && die "kube-scheduler port $SCHED_PORT is already in use by another process"
  local qps="${FLEETLOG_KUBE_SCHEDULER_QPS:-5000}" c="$DIR/certs"
  cat >"$DIR/kube-scheduler.yaml" <<YAML
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $DIR/admin.kubeconfig
  qps: $qps
  burst: $qps
leaderElection:
  leaderElect: false
YAML
  setsid "$(scheduler_binary)" --config "$DIR/kube-scheduler.yaml" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
    --tls-cert-file "$c/apiserver.crt" --tls-private-key-file "$c/apiserver.key" \
    --authorization-always-allow-paths /healthz,/readyz,/livez,/metrics \
    </dev/null >>"$DIR/scheduler.log" 2>&1 &
  echo $! >"$DIR/scheduler.pid"
  ((wait)) || return 0
  wait_until "kube-scheduler" "$(cat "$DIR/scheduler.pid")" "$DIR/scheduler.log" scheduler_ready
  say "running: kube-scheduler pid $(cat "$DIR/scheduler.pid"), /healthz on https://127.0.0.1:$SCHED_PORT"
}

scheduler_ready() {
  [[ "$(curl -s --cacert "$DIR/certs/ca.crt" "https://127.0.0.1:$SCHED_PORT/healthz" 2>/dev/null)" == "ok" ]]
}

start_etcd() {
  [[ -n "$(running_pid etcd)" ]] && return 0
  port_open "$ETCD_PORT" && die "etcd port $ETCD_PORT is already in use by another process"
  setsid etcd --name fleetlog-test --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
    --initial-cluster "fleetlog-test=http://127.0.0.1:$PEER_PORT" \
    --quota-backend-bytes 4294967296 </dev/null >>"$DIR/etcd.log" 2>&1 &
  echo $! >"$DIR/etcd.pid"
  wait_until "etcd" "$(cat "$DIR/etcd.pid")" "$DIR/etcd.log" etcd_ready
}

etcd_ready() { curl -sf "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }

start_apiserver() {
  [[ -n "$(running_pid apiserver)" ]] && return 0
  port_open "$API_PORT" && die "API server port $API_PORT is already in use by another process"
  local c="$DIR/certs"
  setsid "$(binary)" --etcd-servers "http://127.0.0.1:$ETCD_PORT" --etcd-prefix /registry \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --cert-dir "$c" --tls-cert-file "$c/apiserver.crt" --tls-private-key-file "$c/apiserver.key" \
    --client-ca-file "$c/ca.crt" --token-auth-file "$DIR/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$c/sa.pub" \
    --service-account-signing-key-file "$c/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount,TaintNodesByCondition --profiling=false --max-requests-inflight 1000 \
    --max-mutating-requests-inflight 1000 --event-ttl 1h --endpoint-reconciler-type none \
    </dev/null >>"$DIR/apiserver.log" 2>&1 &
  echo $! >"$DIR/apiserver.pid"
  wait_until "kube-apiserver" "$(cat "$DIR/apiserver.pid")" "$DIR/apiserver.log" apiserver_ready
}

apiserver_ready() {
  local token
  token="$(sed -n 1p "$DIR/tokens.csv" | cut -d, -f1)"
  [[ "$(curl -s --cacert "$DIR/certs/ca.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" == "ok" ]]
}

wait_until() {  # wait_until WHAT PID LOG CHECK
  local deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$2" 2>/dev/null; then
      tail -n 40 "$3" >&2
      die "$1 exited during start-up (log: $3)"
    fi
    "$4" && return 0
    sleep 0.3
  done
  tail -n 40 "$3" >&2
  die "$1 was not ready within ${START_TIMEOUT}s (log: $3)"
}

start() {
  if [[ "${1:-}" == "--fresh" && -d "$DIR" ]]; then
    [[ -n "$(running_pid etcd)$(running_pid apiserver)" ]] && die "--fresh asked but servers run from $DIR"
    # Wipe only a directory this script made (or an empty one), never an arbitrary path.
    [[ -f "$DIR/ports" || -z "$(ls -A "$DIR")" ]] || die "--fresh refuses to wipe $DIR: kube.sh did not make it"
    rm -rf "$DIR"
  fi
  fetch
  mkdir -p "$DIR"
  load_ports
  make_certs
  make_tokens
  write_kubeconfigs
  start_etcd
  start_apiserver
  say "running: etcd pid $(cat "$DIR/etcd.pid"), kube-apiserver pid $(cat "$DIR/apiserver.pid") on 127.0.0.1:$API_PORT"
  echo "$DIR/admin.kubeconfig"
}

stop_one() {
  local pid
  pid="$(running_pid "$1")"
  if [[ -z "$pid" ]]; then
    rm -f "$DIR/$1.pid"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local grace="${FLEETLOG_KUBE_STOP_GRACE:-30}"
  local deadline=$((SECONDS + grace))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
  if alive "$pid"; then
    say "$1 (pid $pid) did not stop within ${grace}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  fi
  rm -f "$DIR/$1.pid"
  say "stopped $1 (pid $pid)"
}

stop() {
  [[ "${1:-}" == "apiserver" ]] || stop_one scheduler
  stop_one apiserver
  [[ "${1:-}" == "apiserver" ]] || stop_one etcd
}

status() {
  local api etcd_pid
  api="$(running_pid apiserver)"
  etcd_pid="$(running_pid etcd)"
  if [[ -n "$api" && -n "$etcd_pid" ]]; then
    load_ports
    echo "running apiserver=$api etcd=$etcd_pid server=https://127.0.0.1:$API_PORT" \
      "kube-scheduler=$(running_pid scheduler | grep . || echo -) dir=$DIR"
  else
    echo "stopped apiserver=${api:--} etcd=${etcd_pid:--} dir=$DIR"
    return 3
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  fetch-scheduler) build_scheduler ;;
  binary) binary ;;
  scheduler-binary) scheduler_binary ;;
  start) shift; start "$@" ;;
  start-scheduler) shift; start_scheduler "$@" ;;
  stop-scheduler) stop_one scheduler ;;
  stop) shift; stop "$@" ;;
  status) status ;;
  *)
    echo "usage: $0 fetch|fetch-scheduler|binary|scheduler-binary|start [--fresh]" \
      "|start-scheduler [--no-wait]|stop-scheduler|stop [apiserver]|status" >&2
    exit 2
    ;;
esac
