# Sourced by scripts/demo and scripts/test: makes .venv with fleetlog installed.
# Needs only a Linux machine with Python >= 3.11 (installed with apt-get when missing and root).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
    local candidate
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

apt_install() {
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "fleetlog: missing $* and cannot install it (needs root and apt-get); install it and retry" >&2
        exit 1
    fi
    echo "fleetlog: installing $* with apt-get" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_venv() {  # ensure_venv EXTRAS  (e.g. "" or "dev")
    local extras="$1" python stamp want
    python="$(find_python)" || { apt_install python3 python3-venv python3-pip; python="$(find_python)"; }
    [ -x "$VENV/bin/python" ] || "$python" -m venv "$VENV"
    stamp="$VENV/.fleetlog-installed"
    want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)-$extras"
    # a .venv installed with the test tools ("dev") serves the demo ("") as it is: no reinstall
    # each time one switches between ./scripts/demo and ./scripts/test
    if [ ! -f "$stamp" ] || ! { grep -qx -- "$want" "$stamp" || { [ -z "$extras" ] && grep -qx -- "${want}dev" "$stamp"; }; }; then
        echo "fleetlog: installing Python packages into .venv (first run takes a minute)" >&2
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q -e "$ROOT${extras:+[$extras]}"
        echo "$want" >"$stamp"
    fi
}
