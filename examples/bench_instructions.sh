#!/usr/bin/env bash
# CPU instructions per proxied request, counted by valgrind's callgrind: repeatable on a shared,
# noisy machine where wall-clock throughput is not. Counts user-space instructions of the proxy
# process only (the kernel's socket work is not included).
#
# Each target serves N1 and then, in a fresh process, N2 keep-alive POSTs from one client to the
# fast backend (examples/fast_backend.rs); (Ir(N2) - Ir(N1)) / (N2 - N1) removes start-up and
# shutdown from the figure.
#
# Usage:
#   examples/bench_instructions.sh [GPULB_BINARY ...]
# With no binary, measures target/release/gpulb (built first). nginx is measured beside them
# when installed (one process: master_process off, access_log off, upstream keepalive).
# Knobs: N1=500 N2=2500; FAST_BACKEND=PATH uses that backend binary instead of building it;
# BACKENDS=N lists the fast backend N times under different names (gpulb scores every member of
# the pool per request); PLACEMENT=least_loaded|speed_weighted|earliest_finish sets the class's
# placement (unset: the config has no pools or classes, gpulb's defaults).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N1=${N1:-500}
N2=${N2:-2500}
BACKENDS=${BACKENDS:-1}
PLACEMENT=${PLACEMENT:-}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpulb-instr.XXXXXX")
chmod 755 "$TMP"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
FAST_BACKEND=${FAST_BACKEND:-$ROOT/target/release/examples/fast_backend}
if [ $# -eq 0 ]; then
    (cd "$ROOT" && cargo build --release --bin gpulb --example fast_backend >&2)
    set -- "$ROOT/target/release/gpulb"
elif [ ! -x "$FAST_BACKEND" ]; then
    (cd "$ROOT" && cargo build --release --example fast_backend >&2)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 1 300); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null && return 0
        sleep 0.2
    done
    echo "nothing listens on $1" >&2
    return 1
}

# One keep-alive client sending N small POSTs, checking every answer is 200.
cat >"$TMP/load.py" <<'PY'
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"model":"m","prompt":"hello","max_tokens":8}'
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for _ in range(n):
    conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        sys.exit(f"status {resp.status}")
PY

BACKEND_PORT=$(free_port)
"$FAST_BACKEND" --listen "127.0.0.1:$BACKEND_PORT" >/dev/null &
PIDS+=($!)
wait_port "$BACKEND_PORT"

# Runs "$@" (a proxy listening on $PORT) under callgrind for N requests; prints its Ir total.
# Stops the script, with the proxy's own output, when the proxy or the load fails.
count() {
    local n=$1
    shift
    local out="$TMP/callgrind.$n.out" log="$TMP/proxy.$n.log"
    valgrind --tool=callgrind --trace-children=no --callgrind-out-file="$out" "$@" >"$log" 2>&1 &
    local pid=$!
    if ! wait_port "$PORT" || ! python3 "$TMP/load.py" "$PORT" "$n"; then
        kill -INT "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        echo "$* failed; its output:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    kill -INT "$pid"
    wait "$pid" 2>/dev/null || true
    grep -E '^(summary|totals):' "$out" | head -n1 | awk '{print $2}'
}

per_request() {
    local a b
    a=$(count "$N1" "$@") || exit 1
    b=$(count "$N2" "$@") || exit 1
    echo $(((b - a) / (N2 - N1)))
}

echo "| target | instructions per request |"
echo "|---|---:|"
for bin in "$@"; do
    PORT=$(free_port)
    {
        echo "listen: 127.0.0.1:$PORT"
        echo "threads: 1"
        echo "shutdown_timeout: 1s"
        echo "health_check: {enabled: false}"
        echo "access_log: {enabled: false}"
        echo "backends:"
        for i in $(seq 0 $((BACKENDS - 1))); do
            echo "  - {name: fast$i, url: \"http://127.0.0.1:$BACKEND_PORT\", max_outstanding: 4096}"
        done
        if [ -n "$PLACEMENT" ]; then
            echo "pools: [{name: all, backends: [$(seq -s, -f 'fast%g' 0 $((BACKENDS - 1)))]}]"
            echo "classes: [{name: all, pool: all, placement: $PLACEMENT}]"
        fi
    } >"$TMP/gpulb.yaml"
    ir=$(RUST_LOG=warn per_request "$bin" serve --config "$TMP/gpulb.yaml")
    echo "| gpulb \`$bin\` | $ir |"
done
if command -v nginx >/dev/null; then
    PORT=$(free_port)
    mkdir -p "$TMP/nginx"
    sed -e "s|@LISTEN@|127.0.0.1:$PORT|g" -e "s|@BACKEND@|127.0.0.1:$BACKEND_PORT|g" \
        -e "s|@THREADS@|1|g" -e "s|@DIR@|$TMP/nginx|g" -e "s|@USER@|$(id -un)|g" \
        "$ROOT/examples/bench/nginx.conf.in" >"$TMP/nginx/nginx.conf"
    ir=$(per_request nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off; master_process off;')
    echo "| nginx $(nginx -v 2>&1 | sed 's/nginx version: //') | $ir |"
fi
echo
echo "command: $0 $*; N1=$N1 N2=$N2 BACKENDS=$BACKENDS PLACEMENT=${PLACEMENT:-(default)}; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), valgrind $(valgrind --version)"
