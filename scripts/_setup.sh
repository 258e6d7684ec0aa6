# Sourced by scripts/run, scripts/test and scripts/bench: installs what a fresh Debian machine
# lacks (Debian's redis-server, a .venv with the project and its test extras), then returns.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[setup] %s\n' "$*" >&2; }

apt_install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      log "need root (or sudo) to install Debian packages: $*"; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 || {
    log "apt-get install $* failed; refreshing the package lists and trying again"
    $sudo apt-get update >/dev/null
    $sudo apt-get install -y --no-install-recommends "$@" >/dev/null
  }
}

ensure_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    log "installing Debian's redis-server"
    apt_install redis-server
    # Debian's package may start a system instance; ours are started per use, so stop it.
    if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
  fi
}

ensure_venv() {
  local stamp=".venv/.installed"
  local want
  want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing the project and its test extras into .venv"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[test]"
    echo "$want" > "$stamp"
  fi
}

# PostgreSQL for the tests (they start their own cluster with initdb/pg_ctl in a temporary
# directory): Debian keeps the tools in /usr/lib/postgresql/<version>/bin, not on PATH. As
# root, the tests run them as `nobody` (root cannot run initdb) through runuser.
ensure_postgres() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then return; fi
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    log "installing Debian's postgresql"
    apt_install postgresql
    # Debian's package starts a system cluster; ours are started per test run, so stop it.
    if command -v service >/dev/null 2>&1; then service postgresql stop >/dev/null 2>&1 || true; fi
  fi
  if [ "$(id -u)" -eq 0 ] && ! command -v runuser >/dev/null 2>&1; then
    apt_install util-linux
  fi
}

# Node.js for the test of a client and a worker in another language (tests/node/, run by
# tests/integration/bus/test_polyglot.py): Debian's nodejs and npm, then the npm packages of
# tests/node's package-lock.json into tests/node/node_modules (git-ignored).
ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing Debian's nodejs and npm"
    apt_install nodejs npm
  fi
  local installed="tests/node/node_modules/.package-lock.json"
  if [ ! -f "$installed" ] || [ tests/node/package-lock.json -nt "$installed" ]; then
    log "installing the npm packages of tests/node"
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
}
