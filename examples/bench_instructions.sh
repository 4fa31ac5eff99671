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
# Request bodies: BODY_BYTES="1024 262144" POSTs a JSON completion body of exactly that many
# bytes (its prompt padded), one set of rows per size (unset: a 45-byte body); BODY_READ="on
# off" measures each gpulb binary with body reading on (gpulb's default `request_body`, which
# reads and parses /v1/completions bodies before routing) and off (`request_body: {paths: []}`),
# one row each, plus a line with what reading costs (default: on only). TIMEOUTS="{read: 300s}"
# writes that `timeouts:` map into gpulb's config (unset: gpulb's defaults, whose first_byte and
# idle differ, so each request runs the upstream watchdog; equal ones run none).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N1=${N1:-500}
N2=${N2:-2500}
BACKENDS=${BACKENDS:-1}
PLACEMENT=${PLACEMENT:-}
BODY_BYTES=${BODY_BYTES:-}
BODY_READ=${BODY_READ:-on}
for read in $BODY_READ; do
    [[ $read == on || $read == off ]] || { echo "BODY_READ: on and/or off, not $read" >&2; exit 1; }
done
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

# One keep-alive client sending N POSTs of a completion body of SIZE bytes (0: the 45-byte
# one), checking every answer is 200.
cat >"$TMP/load.py" <<'PY'
import http.client, sys
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = b'{"model":"m","prompt":"hello","max_tokens":8}'
if size:
    head, tail = b'{"model":"m","max_tokens":8,"prompt":"', b'"}'
    pad = size - len(head) - len(tail)
    if pad < 0:
        sys.exit(f"BODY_BYTES {size} is below the smallest body, {len(head) + len(tail)}")
    body = head + (b"lorem ipsum dolor sit amet " * (pad // 27 + 1))[:pad] + tail
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
    if ! wait_port "$PORT" || ! python3 "$TMP/load.py" "$PORT" "$n" "$SIZE"; then
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

# gpulb's config for this run: $PORT, $BACKENDS fast backends, $PLACEMENT, body reading $1.
gpulb_config() {
    echo "listen: 127.0.0.1:$PORT"
    echo "threads: 1"
    echo "shutdown_timeout: 1s"
    echo "health_check: {enabled: false}"
    echo "access_log: {enabled: false}"
    if [ "$1" = off ]; then
        echo "request_body: {paths: []}"
    fi
    if [ -n "${TIMEOUTS:-}" ]; then
        echo "timeouts: $TIMEOUTS"
    fi
    echo "backends:"
    for i in $(seq 0 $((BACKENDS - 1))); do
        echo "  - {name: fast$i, url: \"http://127.0.0.1:$BACKEND_PORT\", max_outstanding: 4096}"
    done
    if [ -n "$PLACEMENT" ]; then
        echo "pools: [{name: all, backends: [$(seq -s, -f 'fast%g' 0 $((BACKENDS - 1)))]}]"
        echo "classes: [{name: all, pool: all, placement: $PLACEMENT}]"
    fi
}

echo "| target | body bytes | body read | instructions per request |"
echo "|---|---:|---|---:|"
NOTES=()
for SIZE in ${BODY_BYTES:-0}; do
    size_label=$SIZE
    [ "$SIZE" = 0 ] && size_label=45
    for bin in "$@"; do
        declare -A IR=()
        for read in $BODY_READ; do
            PORT=$(free_port)
            gpulb_config "$read" >"$TMP/gpulb.yaml"
            IR[$read]=$(RUST_LOG=warn per_request "$bin" serve --config "$TMP/gpulb.yaml")
            echo "| gpulb \`$bin\` | $size_label | $read | ${IR[$read]} |"
        done
        if [ -n "${IR[on]:-}" ] && [ -n "${IR[off]:-}" ]; then
            NOTES+=("- gpulb \`$bin\`, $size_label-byte body: reading it costs $((IR[on] - IR[off])) instructions per request, $(awk -v a="${IR[on]}" -v b="${IR[off]}" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }') over body reading off")
        fi
        unset IR
    done
    if command -v nginx >/dev/null; then
        PORT=$(free_port)
        mkdir -p "$TMP/nginx"
        sed -e "s|@LISTEN@|127.0.0.1:$PORT|g" -e "s|@BACKEND@|127.0.0.1:$BACKEND_PORT|g" \
            -e "s|@THREADS@|1|g" -e "s|@DIR@|$TMP/nginx|g" -e "s|@USER@|$(id -un)|g" \
            "$ROOT/examples/bench/nginx.conf.in" >"$TMP/nginx/nginx.conf"
        ir=$(per_request nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off; master_process off;')
        echo "| nginx $(nginx -v 2>&1 | sed 's/nginx version: //') | $size_label | - | $ir |"
    fi
done
if [ ${#NOTES[@]} -gt 0 ]; then
    echo
    printf '%s\n' "${NOTES[@]}"
fi
echo
echo "command: $0 $*; N1=$N1 N2=$N2 BACKENDS=$BACKENDS PLACEMENT=${PLACEMENT:-(default)} BODY_BYTES=${BODY_BYTES:-(45)} BODY_READ=\"$BODY_READ\" TIMEOUTS=${TIMEOUTS:-(default)}; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), valgrind $(valgrind --version)"
