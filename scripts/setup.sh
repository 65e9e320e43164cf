#!/usr/bin/env bash
# Prepare this machine for Stockade (Debian 12; see docs/operations.md, "Set-up", and the
# README's "Two commands"). Idempotent: a second run only checks, and is quick.
#
#   scripts/setup.sh run    what `make run` needs: one usable engine (installs Podman
#                           if neither Podman nor Docker works), .venv, the sandbox image
#                           for the engine that will be used (STOCKADE_ENGINE=podman|docker
#                           to choose; else Podman if it works, else Docker)
#   scripts/setup.sh test   what `make test` needs: both engines (starts dockerd), .venv,
#                           the sandbox image for Podman and for Docker, and the toolchains of
#                           the client examples (Go and protoc from Debian, Node and npm
#                           packages for the TypeScript ones)
#
# Logs go to $STOCKADE_LOG_DIR (default /var/tmp/stockade/logs).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-}
LOG_DIR=${STOCKADE_LOG_DIR:-/var/tmp/stockade/logs}
DROP_IN=/etc/containers/containers.conf.d/stockade.conf
VENV=.venv
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
APT_UPDATED=""

step() { printf '%-9s %s\n' "$1:" "$2"; }
fail() { printf 'setup: %s\n' "$1" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
podman_ok() { have podman && podman info >/dev/null 2>&1; }
docker_ok() { have docker && timeout 10 docker version >/dev/null 2>&1; }

# Install the Debian packages among "$@" that are missing (apt-get update only then).
ensure_packages() {
    local missing=() pkg
    for pkg in "$@"; do installed "$pkg" || missing+=("$pkg"); done
    if [ ${#missing[@]} -eq 0 ]; then
        step packages "present: $*"
        return
    fi
    step packages "installing ${missing[*]} (log: $LOG_DIR/apt.log)"
    if [ -z "$APT_UPDATED" ]; then
        $SUDO apt-get update >>"$LOG_DIR/apt.log" 2>&1 || fail "apt-get update failed; see $LOG_DIR/apt.log"
        APT_UPDATED=1
    fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1 || fail "apt-get install failed; see $LOG_DIR/apt.log"
}

# Podman here needs runc (crun fails on the hybrid cgroup v1 layout) and default
# ulimits at or below the hard limits. Podman 4.3 reads this drop-in after containers.conf.
configure_podman() {
    have podman || return 0
    local want
    want=$(cat <<'EOF'
# Written by Stockade's scripts/setup.sh; see docs/operations.md, "Set-up".
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
EOF
)
    if [ -f "$DROP_IN" ] && [ "$(cat "$DROP_IN")" = "$want" ]; then
        step podman "$DROP_IN up to date"
        return
    fi
    $SUDO mkdir -p "$(dirname "$DROP_IN")"
    printf '%s\n' "$want" | $SUDO tee "$DROP_IN" >/dev/null
    step podman "wrote $DROP_IN (runtime runc, nofile/nproc 1024)"
}

# sandbox.user_namespace on Podman (--userns=auto, rootful) allocates each sandbox's ids from
# the `containers` ranges in /etc/subuid and /etc/subgid: the range Podman's documentation
# suggests, far above any real user's ids. Added once; an existing entry is left as it is.
# (Rootful Podman writes the maps itself: no newuidmap, so no uidmap package, is needed.)
ensure_subids() {
    have podman || return 0
    local file added=""
    for file in /etc/subuid /etc/subgid; do
        if ! grep -q '^containers:' "$file" 2>/dev/null; then
            echo 'containers:2147483647:2147483648' | $SUDO tee -a "$file" >/dev/null
            added="$added $file"
        fi
    done
    if [ -n "$added" ]; then
        step podman "added the 'containers' id range to$added (sandbox.user_namespace)"
    else
        step podman "'containers' id range present in /etc/subuid and /etc/subgid"
    fi
}

find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3.11 python3.12 python3.13 python3; do
        if have "$candidate" && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    return 1
}

# .venv with an editable install of the project and its dev tools; redone when
# pyproject.toml changes (its hash is kept in .venv/.stockade-setup).
ensure_venv() {
    local stamp python
    stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.stockade-setup" 2>/dev/null)" = "$stamp" ]; then
        step venv "$VENV up to date"
        return
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        python=$(find_python) || { ensure_packages python3 python3-venv; python=python3; }
        "$python" -c 'import ensurepip' 2>/dev/null || ensure_packages python3-venv
        "$python" -m venv "$VENV" || fail "could not create $VENV with $python"
    fi
    step venv "pip install -e '.[dev]' (log: $LOG_DIR/pip.log)"
    "$VENV/bin/python" -m pip install -e '.[dev]' >>"$LOG_DIR/pip.log" 2>&1 \
        || fail "pip install failed; see $LOG_DIR/pip.log"
    echo "$stamp" >"$VENV/.stockade-setup"
}

# The capture's stat loop in C (supervisor/sandboxes/snapshots/statdir.c, loaded by statdir.py
# through ctypes): built when the source is newer than the library. Without a compiler the
# captures stat in Python (slower, the same entries).
build_statdir() {
    local dir=supervisor/sandboxes/snapshots
    if [ "$dir/_statdir.so" -nt "$dir/statdir.c" ]; then
        step statdir "$dir/_statdir.so up to date"
        return
    fi
    if ! command -v cc >/dev/null; then
        step statdir "no C compiler: captures stat each entry in Python"
        return
    fi
    make --no-print-directory statdir >>"$LOG_DIR/statdir.log" 2>&1 \
        || fail "building $dir/_statdir.so failed; see $LOG_DIR/statdir.log"
    step statdir "built $dir/_statdir.so"
}

# `stockade` on PATH, pointing at this checkout's venv (replaces only an earlier such link).
link_cli() {
    local link=/usr/local/bin/stockade target
    target="$(pwd)/$VENV/bin/stockade"
    if [ "$(readlink "$link" 2>/dev/null)" = "$target" ]; then
        return
    fi
    if [ -e "$link" ] && ! readlink "$link" | grep -q '/bin/stockade$'; then
        step cli "$link exists and is not ours; use $target"
        return
    fi
    $SUDO ln -sfn "$target" "$link" && step cli "$link -> $target"
}

start_dockerd() {
    if docker_ok; then
        step docker "engine answers"
        return
    fi
    step docker "starting dockerd (log: $LOG_DIR/dockerd.log)"
    $SUDO "$VENV/bin/python" -c 'import sys; from pathlib import Path
from stockade.supervisor.engines.services import EngineServiceError, ensure_dockerd
try:
    ensure_dockerd(Path(sys.argv[1]))
except EngineServiceError as exc:
    sys.exit(f"setup: {exc}")' "$LOG_DIR/dockerd.log"
}

build_image() {
    "$VENV/bin/python" scripts/build_image.py --engine "$1" --log-file "$LOG_DIR/image-$1.log" \
        | sed 's/^/image:    /'
}

# The engine `make run` will use.
run_engine() {
    if [ -n "${STOCKADE_ENGINE:-}" ]; then
        echo "$STOCKADE_ENGINE"
    elif podman_ok; then
        echo podman
    elif docker_ok; then
        echo docker
    else
        return 1
    fi
}

setup_run() {
    local engine
    case "${STOCKADE_ENGINE:-podman}" in
        podman | docker) ;;
        *) fail "STOCKADE_ENGINE must be podman or docker, not '$STOCKADE_ENGINE'" ;;
    esac
    if engine=$(run_engine); then
        ensure_packages debootstrap
    else
        ensure_packages podman runc catatonit netavark aardvark-dns iptables debootstrap
        engine=podman
    fi
    configure_podman
    ensure_subids
    ensure_venv
    build_statdir
    case "$engine" in
        podman) podman_ok || fail "podman does not work: run 'podman info' to see why" ;;
        docker) docker_ok || fail "docker does not answer: start dockerd, or STOCKADE_ENGINE=podman" ;;
    esac
    build_image "$engine"
    link_cli
    echo "$engine" >"$VENV/.stockade-engine"
    step engine "make run serves with $engine"
}

# The examples in examples/ are built and run by tests/integration/test_clients.py.
# Go in GOPATH mode from Debian's packages (the Go module proxy is not needed); protobuf 1.5's
# github.com/golang/protobuf is named explicitly: with 1.3 (apt's first choice for
# golang-google-grpc-dev) grpc-go cannot decode the messages protoc-gen-go now generates.
# The npm examples (the gRPC client in examples/typescript, the MCP client in
# examples/mcp-typescript, E2B JS SDK code in examples/e2b-typescript): npm ci in each whose
# package-lock.json changed since its last one
# (the lock file's hash is kept in its node_modules). tests/browser: playwright-core, which
# drives Debian's chromium in the console's browser tests (tests/integration/test_console_browser.py).
NPM_EXAMPLES="examples/typescript examples/mcp-typescript examples/e2b-typescript tests/browser"
setup_clients() {
    local ts stamp
    ensure_packages golang-go golang-google-grpc-dev golang-google-protobuf-dev \
        golang-github-golang-protobuf-1-5-dev protobuf-compiler protoc-gen-go protoc-gen-go-grpc
    if ! have node || ! have npm; then
        ensure_packages nodejs npm
    fi
    for ts in $NPM_EXAMPLES; do
        stamp=$(sha256sum "$ts/package-lock.json" | cut -d' ' -f1)
        if [ "$(cat "$ts/node_modules/.stockade-setup" 2>/dev/null)" = "$stamp" ]; then
            step npm "$ts/node_modules up to date"
            continue
        fi
        step npm "npm ci in $ts (log: $LOG_DIR/npm.log)"
        (cd "$ts" && npm ci --ignore-scripts --no-audit --no-fund) >>"$LOG_DIR/npm.log" 2>&1 \
            || fail "npm ci in $ts failed; see $LOG_DIR/npm.log"
        echo "$stamp" >"$ts/node_modules/.stockade-setup"
    done
}

setup_test() {
    # runsc: gVisor, for tests/security/test_gvisor.py (sandbox.runtime = "runsc"; skipped without);
    # gcc: tests/unit/test_drop.py builds stockade-drop on the host as the image build does;
    # postgresql-15: the server binaries the shared-state tests start (tests/pg.py), not a service;
    # chromium: the headless browser of the console's tests (tests/browser, playwright-core)
    ensure_packages podman runc catatonit netavark aardvark-dns iptables docker.io debootstrap ripgrep tini runsc gcc postgresql-15 chromium
    configure_podman
    ensure_subids
    ensure_venv
    build_statdir
    start_dockerd
    build_image podman
    build_image docker
    setup_clients
}

mkdir -p "$LOG_DIR"
case "$MODE" in
    run) setup_run ;;
    test) setup_test ;;
    *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac
