# Sourced by scripts/run, scripts/test and scripts/bench: installs what a fresh Debian machine
# lacks (Debian's redis-server, a .venv with the project: the service alone for run, with its
# test extras for test and bench), then returns.
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

# faketime (libfaketime) for the tests that run a replica with its clock off
# (tests/integration/faults/test_clock_skew.py, tests/servers.py `skewed`): preloaded into
# that replica's process only.
ensure_faketime() {
  if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    log "installing Debian's faketime"
    apt_install faketime
  fi
}

# etcd for the floor bench's reference (benchmarks/floor_strict.py, issue 24): Debian's
# etcd-server, started per run by the bench on free ports. scripts/bench only: the tests never
# need it.
ensure_etcd() {
  if ! command -v etcd >/dev/null 2>&1; then
    log "installing Debian's etcd-server"
    apt_install etcd-server
    # Debian's package may start a system member; the bench starts its own, so stop it.
    if command -v service >/dev/null 2>&1; then service etcd stop >/dev/null 2>&1 || true; fi
  fi
}

# NATS JetStream for the peers section (benchmarks/bench_peers.py): Debian's nats-server,
# started per run by the bench with -js on free ports. scripts/bench only.
ensure_nats() {
  if ! command -v nats-server >/dev/null 2>&1; then
    log "installing Debian's nats-server"
    apt_install nats-server
    # Debian's package may start a system server; the bench starts its own, so stop it.
    if command -v service >/dev/null 2>&1; then service nats-server stop >/dev/null 2>&1 || true; fi
  fi
}

# ensure_venv service|test|bench: a .venv with the project installed (editable): `service`
# (the service and its command alone: ./scripts/run), `test` (with the test and lint tools:
# ./scripts/test) or `bench` (those and the benchmarks' etcd and NATS clients: ./scripts/bench). Each
# has its stamp, the hash of pyproject.toml it was installed for; `test` covers `service`,
# `bench` covers both. pip's output goes to .venv/install.log, shown
# only when the install fails.
ensure_venv() {
  local what="$1" extras="" want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ "$what" = test ]; then extras="[test]"; fi
  if [ "$what" = bench ]; then extras="[test,bench]"; fi
  if [ "$(cat ".venv/.installed-$what" 2>/dev/null)" = "$want" ] \
     || [ "$(cat .venv/.installed-bench 2>/dev/null)" = "$want" ] \
     || { [ "$what" != bench ] && [ "$(cat .venv/.installed-test 2>/dev/null)" = "$want" ]; }; then
    return
  fi
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  log "installing stateworker${extras} into .venv (pip's output: .venv/install.log)"
  if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".${extras}" \
       >.venv/install.log 2>&1; then
    tail -n 30 .venv/install.log >&2
    log "pip install -e .${extras} failed (the whole output: .venv/install.log)"
    exit 1
  fi
  echo "$want" > ".venv/.installed-$what"
}

# PostgreSQL for the tests (they start their own cluster with initdb/pg_ctl in a temporary
# directory): Debian keeps the tools in /usr/lib/postgresql/<version>/bin, not on PATH. As
# root, the tests run them as `nobody` (root cannot run initdb) through runuser.
# Debian's chromium and its chromedriver: the console's tests and its benchmark drive a real
# headless browser (benchmarks/browser.py, Selenium).
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then return; fi
  log "installing Debian's chromium and chromium-driver"
  apt_install chromium chromium-driver
}

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

ensure_compose() {
  # The compose tests check compose.yaml and compose.cluster.yaml with a Compose checker
  # (`docker-compose config`, which needs no Docker engine).
  if ! command -v docker-compose >/dev/null 2>&1; then
    log "installing Debian's docker-compose (to check the compose files)"
    apt_install docker-compose
  fi
}

# Node.js for the test of a client and a worker in another language (tests/node/, run by
# tests/integration/bus/test_polyglot.py) and for Dapr's JavaScript SDK (tests/dapr-js/, run by
# tests/integration/http/test_dapr_sdk.py): Debian's nodejs and npm, then the npm packages of
# each directory's package-lock.json into its node_modules (git-ignored).
ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing Debian's nodejs and npm"
    apt_install nodejs npm
  fi
  local dir installed
  for dir in tests/node tests/dapr-js; do
    installed="$dir/node_modules/.package-lock.json"
    if [ ! -f "$installed" ] || [ "$dir/package-lock.json" -nt "$installed" ]; then
      log "installing the npm packages of $dir"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    fi
  done
}
