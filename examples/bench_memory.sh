#!/usr/bin/env bash
# Memory benchmark: each proxy's resident memory while it holds
#   streams  STREAMS concurrent SSE streams (slow token streams from `gpulb sim`, every one
#            running at once for the whole measurement), and
#   idle     IDLE idle keep-alive client connections (each sent one GET /v1/models, answered,
#            then left open and silent),
# for gpulb, nginx and HAProxy in one run, on the same core budget, and prints a markdown table:
# VmRSS at rest and at load, VmHWM, and bytes per connection ((RSS at load - RSS at rest) / N).
# Each (target, load) pair gets a freshly started proxy; the sim is shared. The load is
# target/release/examples/hold_connections (examples/hold_connections.rs).
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   examples/bench_memory.sh
# Knobs (environment):
#   STREAMS=2000     concurrent SSE streams (0: skip that load)
#   IDLE=10000       idle keep-alive connections (0: skip that load)
#   TARGETS="gpulb nginx haproxy"   which proxies, in this order
#   RATE=500         new connections per second opened by the load tool
#   DECODE_STEP=250ms  the sim's decode step; with STREAMS running a token comes every
#                    DECODE_STEP + 0.5 ms x (STREAMS - 1) (~1.25 s at 2,000)
#   SETTLE=5         seconds between the last connection answered and the first RSS sample
#   SAMPLES=5        RSS samples at load, one a second; the largest VmRSS is reported
#   PROXY_THREADS=1  worker threads of every proxy (gpulb threads, nginx worker_processes,
#                    HAProxy nbthread)
#   GPULB_BIN=PATH   the gpulb binary measured (default target/release/gpulb), e.g. an older
#                    build to compare with; the sim always runs target/release/gpulb
#   SKIP_BUILD=1     use the existing release binaries
#   KEEP_TMP=1       keep the temp dir (configs, load tool output, logs) and print its path
#   RESULTS=FILE     also write the report to FILE
# Config templates: examples/bench/memory-{gpulb.yaml,nginx.conf,haproxy.cfg}.in. RSS of nginx is
# master + worker summed (shared pages counted twice); gpulb and HAProxy (-db) are one process.
# The report goes to stdout, progress to stderr.
set -euo pipefail

STREAMS=${STREAMS:-2000}
IDLE=${IDLE:-10000}
TARGETS=${TARGETS:-gpulb nginx haproxy}
RATE=${RATE:-500}
DECODE_STEP=${DECODE_STEP:-250ms}
SETTLE=${SETTLE:-5}
SAMPLES=${SAMPLES:-5}
PROXY_THREADS=${PROXY_THREADS:-1}
# gpulb's targets from issue 17, MiB.
TARGET_STREAMS_MIB=64
TARGET_IDLE_MIB=128

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR=$ROOT/examples/bench
INVOCATION="$0${*:+ $*}"

LOG_TAG=bench_memory
# shellcheck source=examples/bench_procs.sh
source "$ROOT/examples/bench_procs.sh"

# "VmRSS VmHWM" in KiB of a process plus its children (nginx: master + worker).
mem_kib() {
    local rss=0 hwm=0 pid r h
    for pid in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
        read -r r h < <(awk '/^VmRSS:/ { r = $2 } /^VmHWM:/ { h = $2 } END { print r + 0, h + 0 }' \
            "/proc/$pid/status" 2>/dev/null || echo "0 0")
        rss=$((rss + r)) hwm=$((hwm + h))
    done
    echo "$rss $hwm"
}

# The value of key $2 in a hold_connections count line $1.
field() { sed -E "s/.*(^| )$2=([0-9]+).*/\2/" <<<"$1"; }

fill() { # template dir listen maxconn -> stdout
    sed -e "s|@LISTEN@|$3|g" -e "s|@BACKEND@|$BACKEND|g" -e "s|@THREADS@|$PROXY_THREADS|g" \
        -e "s|@DIR@|$2|g" -e "s|@USER@|$(id -un)|g" -e "s|@MAXCONN@|$4|g" \
        -e "s|@NOFILE@|$(ulimit -n)|g" -e "s|@WORKER_CONNECTIONS@|$(($4 * 2 + 256))|g" "$1"
}

# ---------------------------------------------------------------- checks and build
command -v curl >/dev/null || die "curl is not installed"
cd "$ROOT"
ulimit -n "$(ulimit -Hn)"
need=$((IDLE > STREAMS * 2 ? IDLE : STREAMS * 2))
(($(ulimit -n) >= need + 512)) ||
    die "open-file limit $(ulimit -n) is too low for $need connections in one process (lower IDLE/STREAMS)"
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "cargo build --release --bin gpulb --example hold_connections"
    cargo build --release --bin gpulb --example hold_connections >&2
fi
SIM_BIN=$ROOT/target/release/gpulb
GPULB_BIN=${GPULB_BIN:-$SIM_BIN}
HOLD_BIN=$ROOT/target/release/examples/hold_connections
[[ -x $SIM_BIN && -x $GPULB_BIN && -x $HOLD_BIN ]] || die "release binaries missing; build without SKIP_BUILD"

# ---------------------------------------------------------------- the simulated backend
SIM_PORT=$(free_port)
BACKEND=127.0.0.1:$SIM_PORT
MAX_RUNNING=$((STREAMS > 16 ? STREAMS + 16 : 32))
"$SIM_BIN" sim --listen "$BACKEND" --name sim0 --decode-step "$DECODE_STEP" \
    --max-running "$MAX_RUNNING" --kv-budget-tokens 4000000000 >"$TMP/sim.log" 2>&1 &
SIM_PID=$!
PIDS+=("$SIM_PID")
wait_ready "$BACKEND" sim "$SIM_PID"
log "sim on $BACKEND (pid $SIM_PID, decode step $DECODE_STEP, max running $MAX_RUNNING)"

# ---------------------------------------------------------------- one measurement
declare -A R # R[target,load,field]
LOADS=()
((STREAMS > 0)) && LOADS+=(streams)
((IDLE > 0)) && LOADS+=(idle)
((${#LOADS[@]} > 0)) || die "STREAMS and IDLE are both 0"

# Starts $1 for load $2 with a cap of $3 connections; sets PROXY_PID and PROXY_ADDR.
start_proxy() {
    local target=$1 load=$2 cap=$3 port dir
    port=$(free_port)
    dir=$TMP/$target.$load
    mkdir -p "$dir"
    PROXY_ADDR=127.0.0.1:$port
    case $target in
        gpulb)
            fill "$BENCH_DIR/memory-gpulb.yaml.in" "$dir" "$PROXY_ADDR" "$cap" >"$dir/gpulb.yaml"
            "$GPULB_BIN" check --config "$dir/gpulb.yaml" >/dev/null 2>"$dir/check.log" ||
                die "gpulb check refused $dir/gpulb.yaml: $(cat "$dir/check.log")"
            RUST_LOG=warn "$GPULB_BIN" serve --config "$dir/gpulb.yaml" >"$dir/gpulb.log" 2>&1 &
            ;;
        nginx)
            fill "$BENCH_DIR/memory-nginx.conf.in" "$dir" "$PROXY_ADDR" "$cap" >"$dir/nginx.conf"
            nginx -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' >"$dir/stdout.log" 2>&1 &
            ;;
        haproxy)
            fill "$BENCH_DIR/memory-haproxy.cfg.in" "$dir" "$PROXY_ADDR" "$cap" >"$dir/haproxy.cfg"
            haproxy -db -f "$dir/haproxy.cfg" >"$dir/stdout.log" 2>&1 &
            ;;
        *) die "unknown target $target (known: gpulb nginx haproxy)" ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_ready "$PROXY_ADDR" "$target" "$PROXY_PID"
}

measure() { # target load
    local target=$1 load=$2 n mode rest hold_pid status out line r h key max_rss=0 hwm=0 limit
    case $load in
        streams) n=$STREAMS mode=sse ;;
        idle) n=$IDLE mode=idle ;;
    esac
    start_proxy "$target" "$load" $((n + 100))
    log "$target ($load): pid $PROXY_PID on $PROXY_ADDR"
    sleep 2
    rest=$(mem_kib "$PROXY_PID")
    out=$TMP/$target.$load/hold.out status=$TMP/$target.$load/hold.status
    "$HOLD_BIN" --addr "$PROXY_ADDR" --mode "$mode" --count "$n" --rate "$RATE" \
        --ready-timeout "$((n / RATE + 60))s" --hold "$((n / RATE + 60 + SETTLE + SAMPLES + 60))s" \
        --status-file "$status" >"$out" 2>"$TMP/$target.$load/hold.err" &
    hold_pid=$!
    PIDS+=("$hold_pid")
    limit=$((n / RATE + 70))
    for _ in $(seq $((limit * 10))); do
        grep -q '^READY' "$out" 2>/dev/null && break
        kill -0 "$hold_pid" 2>/dev/null || die "hold_connections exited early: $(tail -n3 "$TMP/$target.$load/hold.err")"
        kill -0 "$PROXY_PID" 2>/dev/null || die "$target exited under load"
        sleep 0.1
    done
    grep -q '^READY' "$out" || die "hold_connections not ready within ${limit}s"
    log "$target ($load): $(grep '^READY' "$out")"
    sleep "$SETTLE"
    for _ in $(seq "$SAMPLES"); do
        read -r r h <<<"$(mem_kib "$PROXY_PID")"
        ((r > max_rss)) && max_rss=$r
        hwm=$h
        sleep 1
    done
    line=$(cat "$status")
    stop "$hold_pid"
    read -r R[$target,$load,rest] _ <<<"$rest"
    R[$target,$load,rss]=$max_rss
    R[$target,$load,hwm]=$hwm
    R[$target,$load,n]=$n
    for key in open failed streaming closed ended; do
        R[$target,$load,$key]=$(field "$line" "$key")
    done
    log "$target ($load): rest ${R[$target,$load,rest]} KiB, load $max_rss KiB, HWM $hwm KiB; $line"
    stop "$PROXY_PID"
    sleep 1 # let the sim drop the streams it was serving
}

for target in $TARGETS; do
    case $target in
        nginx | haproxy) command -v "$target" >/dev/null || { log "$target not installed: skipped"; continue; } ;;
    esac
    for load in "${LOADS[@]}"; do measure "$target" "$load"; done
done

# ---------------------------------------------------------------- report
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml 2>/dev/null || rev="$rev (+ uncommitted changes in src/)"
[[ $GPULB_BIN == "$SIM_BIN" ]] || rev="binary $GPULB_BIN (tree at $rev)"
{
    echo "### Memory: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- command: \`$(for v in STREAMS IDLE RATE DECODE_STEP SETTLE SAMPLES PROXY_THREADS; do printf '%s=%s ' "$v" "${!v}"; done)$INVOCATION\`"
    echo "- machine: nproc $(nproc), $cpu_model, $(uname -sr), $(free -m | awk '/^Mem:/ { print $2 }') MiB, load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- versions: gpulb $rev, $(nginx -v 2>&1 | sed 's/nginx version: //' || true), $(haproxy -v 2>/dev/null | head -n1 | cut -d' ' -f1-3 || true)"
    echo "- proxies: $PROXY_THREADS worker thread(s) each, a fresh process for each load; backend: gpulb sim, decode step $DECODE_STEP"
    echo
    echo "| target | load | connections held | streaming | failed | RSS at rest MiB | RSS at load MiB | VmHWM MiB | bytes per connection |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for target in $TARGETS; do
        for load in "${LOADS[@]}"; do
            [[ -n ${R[$target,$load,rss]:-} ]] || continue
            held=${R[$target,$load,open]}
            per=$(awk -v a="${R[$target,$load,rss]}" -v b="${R[$target,$load,rest]}" -v n="$held" \
                'BEGIN { if (n > 0) printf "%d", (a - b) * 1024 / n; else print "-" }')
            what="$STREAMS SSE streams"
            streaming=${R[$target,$load,streaming]}
            if [[ $load == idle ]]; then what="$IDLE idle keep-alive" streaming="-"; fi
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$target" "$what" "$held" \
                "$streaming" "${R[$target,$load,failed]}" "$(mib "${R[$target,$load,rest]}")" \
                "$(mib "${R[$target,$load,rss]}")" "$(mib "${R[$target,$load,hwm]}")" "$per"
        done
    done
    echo
    for load in "${LOADS[@]}"; do
        [[ -n ${R[gpulb,$load,rss]:-} ]] || continue
        case $load in
            streams) goal=$TARGET_STREAMS_MIB what="$STREAMS SSE streams" ;;
            idle) goal=$TARGET_IDLE_MIB what="$IDLE idle connections" ;;
        esac
        awk -v k="${R[gpulb,$load,rss]}" -v g="$goal" -v w="$what" 'BEGIN {
            printf "- gpulb at %s: %.1f MiB RSS, target <= %d MiB: %s\n", w, k / 1024, g, (k / 1024 <= g ? "met" : "NOT met") }'
    done
    echo
    echo "RSS at rest: VmRSS 2 s after the proxy answered its first request. RSS at load: the largest"
    echo "VmRSS of $SAMPLES samples, one a second, taken ${SETTLE}s after every connection was answered;"
    echo "VmHWM: the peak, read with the last sample. nginx: master + worker summed. Connections held:"
    echo "answered and still open at the last sample; streaming: SSE streams that received a token in"
    echo "the 5 s before it. Bytes per connection: (RSS at load - RSS at rest) / connections held."
} >"$TMP/report.md"

cat "$TMP/report.md"
if [[ -n ${RESULTS:-} ]]; then cp "$TMP/report.md" "$RESULTS"; log "report written to $RESULTS"; fi
