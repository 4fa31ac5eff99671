#!/usr/bin/env bash
# Proxy-overhead benchmark: the same wrk load, in one run, against
#   direct   the fast backend itself (examples/fast_backend.rs): the physical limit here
#   gpulb    target/release/gpulb serve, one backend, threads = PROXY_THREADS
#   gpulb-nobody  the same with body reading off (`request_body: {paths: []}`); not a default
#            target: TARGETS="direct gpulb gpulb-nobody nginx" shows what reading costs
#   gpulb-base  another gpulb binary (BASE_GPULB=PATH, e.g. a build of an earlier commit) with
#            gpulb's config: not a default target; TARGETS="direct gpulb gpulb-base nginx" compares
#            two builds in one run
#   nginx    reverse proxy, worker_processes = PROXY_THREADS, upstream keepalive 64
#   haproxy  mode http, nbthread = PROXY_THREADS (skipped when haproxy is not installed)
# and prints a markdown table (req/s, p50, p99, each as a ratio to direct, CPU per request).
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   examples/bench_overhead.sh
# Knobs (environment):
#   WRK_THREADS=2 WRK_CONNS=64 DURATION=10s  the wrk load: wrk -tT -cC -dD --latency
#   WARMUP=3s        un-measured run against each target right before its measured run
#   ROUNDS=3         the whole set of targets is repeated, interleaved; the median is reported
#   PROXY_THREADS=1  worker threads of every proxy (gpulb threads, nginx worker_processes,
#                    HAProxy nbthread): the same core budget for each
#   BACKEND_THREADS=1  tokio worker threads of the fast backend
#   TARGETS="direct gpulb nginx haproxy"   which targets, in this order each round
#   BODY_BYTES=N     POST a completion body of exactly N bytes (its prompt padded) instead of
#                    post.lua's 66-byte one
#   PACE_MS=N        each wrk connection pauses N ms after every response before its next
#                    request (wrk's delay()): the offered load is about
#                    WRK_CONNS x 1000 / (N + latency) req/s for every target, so the backend's
#                    CPU per request is compared at (nearly) the same rate, not at each
#                    proxy's own saturation, where a faster proxy feeds the backend bigger
#                    batches per wake-up
#   SYSCALLS=1       also count the system calls of the proxy and of the backend over each
#                    measured run with `perf stat` (needs perf and access to the syscall
#                    tracepoints) and print them per request for each target's median run
#   LOAD=first-byte  time each answer's first streamed byte instead of the whole answer: the
#                    fast backend streams (an SSE event at once, `[DONE]` STREAM_MS later,
#                    default 20), the body says "stream":true, and the load tool is
#                    examples/first_byte.rs (WRK_CONNS connections, PACE_MS pauses) in place of
#                    wrk; p50/p99 in the report are then of the time to the first body byte.
#                    With BODY_BYTES and TARGETS="direct gpulb gpulb-nobody nginx haproxy" it
#                    shows what reading the body adds before the first token reaches a client
#   SKIP_BUILD=1     use the existing release binaries
#   KEEP_TMP=1       keep the temp dir (configs, raw wrk output, logs) and print its path
#   RESULTS=FILE     also write the report to FILE
# Config templates: examples/bench/{gpulb.yaml,nginx.conf,haproxy.cfg}.in; wrk script:
# examples/bench/post.lua. The report goes to stdout, progress to stderr.
set -euo pipefail

WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNS=${WRK_CONNS:-64}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
PROXY_THREADS=${PROXY_THREADS:-1}
BACKEND_THREADS=${BACKEND_THREADS:-1}
TARGETS=${TARGETS:-direct gpulb nginx haproxy}
BODY_BYTES=${BODY_BYTES:-}
PACE_MS=${PACE_MS:-}
LOAD=${LOAD:-wrk}
STREAM_MS=${STREAM_MS:-20}
WRK_PATH=/v1/completions

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR=$ROOT/examples/bench
INVOCATION="$0${*:+ $*}"

LOG_TAG=bench
# shellcheck source=examples/bench_procs.sh
source "$ROOT/examples/bench_procs.sh"

# ---------------------------------------------------------------- helpers
seconds() { # 10s | 2m | 10 -> whole seconds
    local d=$1
    case $d in
        *ms) echo 1 ;;
        *s) echo "${d%s}" ;;
        *m) echo $(("${d%m}" * 60)) ;;
        *h) echo $(("${d%h}" * 3600)) ;;
        *) echo "$d" ;;
    esac
}

# utime+stime, in clock ticks, of a process and its children.
cpu_ticks() {
    local total=0 pid stat rest
    for pid in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        rest=${stat##*) }
        read -r -a f <<<"$rest"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}
CLK_TCK=$(getconf CLK_TCK)

machine_ticks() { # clock ticks of all cores: "busy-except-softirq softirq" from /proc/stat
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $9, $8; exit }' /proc/stat
}

backend_stats() { # prints "connections requests reads"
    curl -s --max-time 2 "http://$BACKEND/__stats" |
        sed -E 's/.*"connections":([0-9]+).*"requests":([0-9]+).*"reads":([0-9]+).*/\1 \2 \3/'
}

fill() { # template out: substitute placeholders
    sed -e "s|@LISTEN@|$3|g" -e "s|@BACKEND@|$BACKEND|g" -e "s|@THREADS@|$PROXY_THREADS|g" \
        -e "s|@DIR@|$2|g" -e "s|@USER@|$(id -un)|g" "$1"
}

# ---------------------------------------------------------------- build
case $LOAD in
    wrk) command -v wrk >/dev/null || die "wrk is not installed (apt-get install -y wrk)" ;;
    first-byte) [[ $STREAM_MS =~ ^[0-9]+$ ]] || die "STREAM_MS must be whole milliseconds, not '$STREAM_MS'" ;;
    *) die "LOAD must be wrk or first-byte, not '$LOAD'" ;;
esac
command -v curl >/dev/null || die "curl is not installed"
cd "$ROOT"
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "cargo build --release --bin gpulb --example fast_backend --example first_byte"
    cargo build --release --bin gpulb --example fast_backend --example first_byte >&2
fi
GPULB_BIN=$ROOT/target/release/gpulb
BACKEND_BIN=$ROOT/target/release/examples/fast_backend
FIRST_BYTE_BIN=$ROOT/target/release/examples/first_byte
[[ -x $GPULB_BIN && -x $BACKEND_BIN ]] || die "release binaries missing; build without SKIP_BUILD"
[[ $LOAD != first-byte || -x $FIRST_BYTE_BIN ]] || die "$FIRST_BYTE_BIN missing; build without SKIP_BUILD"

# ---------------------------------------------------------------- start everything
BACKEND_ARGS=(--threads "$BACKEND_THREADS")
[[ $LOAD == first-byte ]] && BACKEND_ARGS+=(--stream-ms "$STREAM_MS")
"$BACKEND_BIN" "${BACKEND_ARGS[@]}" >"$TMP/backend.out" 2>"$TMP/backend.err" &
BACKEND_PID=$!
PIDS+=("$BACKEND_PID")
for _ in $(seq 100); do [[ -s $TMP/backend.out ]] && break; sleep 0.1; done
BACKEND=$(head -n1 "$TMP/backend.out")
[[ -n $BACKEND ]] || die "fast_backend printed no address"
USED_PORTS+="${BACKEND##*:} "
wait_ready "$BACKEND" fast_backend "$BACKEND_PID"
log "fast_backend on $BACKEND (pid $BACKEND_PID, $BACKEND_THREADS thread(s))"

declare -A ADDR PID
ACTIVE=()
for target in $TARGETS; do
    case $target in
        direct)
            ADDR[direct]=$BACKEND PID[direct]=""
            ;;
        gpulb | gpulb-nobody | gpulb-base)
            bin=$GPULB_BIN
            if [[ $target == gpulb-base ]]; then
                bin=${BASE_GPULB:-}
                [[ -x $bin ]] || die "gpulb-base needs BASE_GPULB=PATH to a gpulb binary"
            fi
            port=$(free_port)
            fill "$BENCH_DIR/gpulb.yaml.in" "$TMP" "127.0.0.1:$port" >"$TMP/$target.yaml"
            if [[ $target == gpulb-nobody ]]; then
                echo "request_body: {paths: []}  # body reading off" >>"$TMP/$target.yaml"
            fi
            RUST_LOG=warn "$bin" serve --config "$TMP/$target.yaml" >"$TMP/$target.log" 2>&1 &
            PID[$target]=$! ADDR[$target]=127.0.0.1:$port
            PIDS+=("${PID[$target]}")
            ;;
        nginx)
            command -v nginx >/dev/null || { log "nginx not installed: skipped"; continue; }
            port=$(free_port)
            mkdir -p "$TMP/nginx"
            fill "$BENCH_DIR/nginx.conf.in" "$TMP/nginx" "127.0.0.1:$port" >"$TMP/nginx/nginx.conf"
            nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' \
                >"$TMP/nginx/stdout.log" 2>&1 &
            PID[nginx]=$! ADDR[nginx]=127.0.0.1:$port
            PIDS+=("${PID[nginx]}")
            ;;
        haproxy)
            command -v haproxy >/dev/null || { log "haproxy not installed: skipped"; continue; }
            port=$(free_port)
            mkdir -p "$TMP/haproxy"
            fill "$BENCH_DIR/haproxy.cfg.in" "$TMP/haproxy" "127.0.0.1:$port" >"$TMP/haproxy/haproxy.cfg"
            haproxy -db -f "$TMP/haproxy/haproxy.cfg" >"$TMP/haproxy/stdout.log" 2>&1 &
            PID[haproxy]=$! ADDR[haproxy]=127.0.0.1:$port
            PIDS+=("${PID[haproxy]}")
            ;;
        *) die "unknown target $target (known: direct gpulb gpulb-nobody gpulb-base nginx haproxy)" ;;
    esac
    if [[ -n ${PID[$target]} ]]; then
        wait_ready "${ADDR[$target]}" "$target" "${PID[$target]}"
        log "$target on ${ADDR[$target]} (pid ${PID[$target]})"
    fi
    ACTIVE+=("$target")
done
[[ ${ACTIVE[0]:-} == direct ]] || die "TARGETS must start with direct (ratios are to direct)"

# ---------------------------------------------------------------- measure
WRK_LIMIT=$(($(seconds "$DURATION") + 30))
WARM_LIMIT=$(($(seconds "$WARMUP") + 30))
LUA=$BENCH_DIR/post.lua LUA_SHOWN=examples/bench/post.lua
STREAM_FLAG=$([[ $LOAD == first-byte ]] && echo true || echo false)
# The request body, in $TMP/body.json for the first-byte client: post.lua's own, or with
# BODY_BYTES a completion body of exactly that many bytes (its prompt padded), which then
# replaces post.lua's too. "stream" is true in the first-byte mode.
python3 - "$BODY_BYTES" "$LUA" "$TMP/body.json" "$STREAM_FLAG" >"$TMP/post.lua" <<'PY' ||
import re, sys
size, lua, body_file, stream = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
if size:
    head = '{"model":"bench","max_tokens":1,"stream":' + stream + ',"prompt":"'
    tail = '"}'
    pad = int(size) - len(head) - len(tail)
    if pad < 0:
        sys.exit(f"BODY_BYTES below {len(head) + len(tail)}")
    body = head + ("lorem ipsum dolor sit amet " * (pad // 27 + 1))[:pad] + tail
else:
    body = re.search(r"^wrk\.body = '(.*)'$", lua, re.M).group(1)
    body = body.replace('"stream":false', '"stream":' + stream)
open(body_file, "w").write(body)
lines = [f"wrk.body = '{body}'" if l.startswith("wrk.body") else l for l in lua.splitlines()]
print("\n".join(lines))
PY
    die "cannot make a ${BODY_BYTES:-default} body"
if [[ -n $BODY_BYTES ]]; then
    LUA=$TMP/post.lua LUA_SHOWN="examples/bench/post.lua with a $BODY_BYTES-byte wrk.body"
fi
if [[ -n $PACE_MS ]]; then
    [[ $PACE_MS =~ ^[0-9]+$ ]] || die "PACE_MS must be whole milliseconds, not '$PACE_MS'"
    { cat "$LUA"; printf '\nfunction delay()\n  return %d\nend\n' "$PACE_MS"; } >"$TMP/paced.lua"
    LUA=$TMP/paced.lua LUA_SHOWN="$LUA_SHOWN with delay() = $PACE_MS ms"
fi
WRK_ARGS=(-t"$WRK_THREADS" -c"$WRK_CONNS" --latency --timeout 5s -s "$LUA")
wrk_cmd() { echo "wrk -t$WRK_THREADS -c$WRK_CONNS -d$1 --latency --timeout 5s -s $LUA_SHOWN http://ADDR$WRK_PATH"; }
# The first-byte client instead: `load_cmd URL DURATION` prints the command for one run.
load_cmd() {
    if [[ $LOAD == first-byte ]]; then
        echo "$FIRST_BYTE_BIN" --url "$1" --body-file "$TMP/body.json" --connections "$WRK_CONNS" \
            --duration "$2" --pace-ms "${PACE_MS:-0}"
    else
        echo wrk "${WRK_ARGS[@]}" -d"$2" "$1"
    fi
}
if [[ $LOAD == first-byte ]]; then
    BODY_SHOWN=${BODY_BYTES:+$BODY_BYTES bytes}
    BODY_SHOWN=${BODY_SHOWN:-the body of post.lua}
    wrk_cmd() {
        echo "examples/first_byte.rs --url http://ADDR$WRK_PATH --body-file BODY --connections $WRK_CONNS --duration $1 --pace-ms ${PACE_MS:-0}, BODY: $BODY_SHOWN with \"stream\":true; fast_backend --stream-ms $STREAM_MS"
    }
fi

# Runs the load tool (wrk, or the first-byte client) in the background and waits, so that a
# signal reaches the trap at once. A wrapper shell reports the tool's own CPU time (bash
# `times`, children line) to $4.times.
run_wrk() { # duration limit_s url out
    local cmd
    read -r -a cmd <<<"$(load_cmd "$3" "$1")"
    TIMES_TO="$4.times" timeout "$2" bash -c '"$@"; rc=$?; times >"$TIMES_TO"; exit $rc' load \
        "${cmd[@]}" >"$4" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait "$pid" || die "wrk failed against $3 (output: $(tail -n3 "$4" | tr '\n' ' '))"
    forget "$pid"
}

# `perf stat` over a measured run: the system calls of a process and its children, per kind.
SYSCALL_KINDS="sendto writev recvfrom epoll_wait fcntl close"
PERF_PID=""
perf_start() { # out pid...
    local out=$1 pids ev
    shift
    pids=$(for pid in "$@" $(for pid in "$@"; do pgrep -P "$pid" 2>/dev/null || true; done); do
        printf '%s,' "$pid"; done)
    ev=$(for kind in $SYSCALL_KINDS; do printf 'syscalls:sys_enter_%s,' "$kind"; done)
    perf stat -x, -e "${ev%,}" -p "${pids%,}" -o "$out" 2>/dev/null &
    PERF_PID=$!
    PIDS+=("$PERF_PID")
}
PERF_COUNTS=""
perf_stop() { # out -> PERF_COUNTS="kind=count ..." of the run just measured (not in a subshell:
    # it waits for perf to write its counts)
    local out=$1
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    forget "$PERF_PID"
    PERF_COUNTS=$(awk -F, '/sys_enter_/ { sub(/.*sys_enter_/, "", $3); printf "%s=%s ", $3, $1 }' "$out")
}
if [[ ${SYSCALLS:-0} == 1 ]]; then
    command -v perf >/dev/null || die "SYSCALLS=1 needs perf"
fi

declare -A R # R[target,round,field]
for round in $(seq "$ROUNDS"); do
    for target in "${ACTIVE[@]}"; do
        url="http://${ADDR[$target]}$WRK_PATH"
        out=$TMP/wrk.$target.$round.txt
        log "round $round/$ROUNDS: $target: warm-up $WARMUP, then $DURATION"
        if [[ $(seconds "$WARMUP") -gt 0 ]]; then
            run_wrk "$WARMUP" "$WARM_LIMIT" "$url" "$TMP/warmup.$target.$round.txt"
        fi
        read -r conns0 breq0 breads0 <<<"$(backend_stats)"
        b0=$(cpu_ticks "$BACKEND_PID")
        p0=0
        [[ -n ${PID[$target]} ]] && p0=$(cpu_ticks "${PID[$target]}")
        read -r m0 sq0 <<<"$(machine_ticks)"
        if [[ ${SYSCALLS:-0} == 1 ]]; then
            [[ -n ${PID[$target]} ]] && { perf_start "$out.perf-proxy" "${PID[$target]}"; proxy_perf=$PERF_PID; }
            perf_start "$out.perf-backend" "$BACKEND_PID"
            backend_perf=$PERF_PID
        fi
        run_wrk "$DURATION" "$WRK_LIMIT" "$url" "$out"
        if [[ ${SYSCALLS:-0} == 1 ]]; then
            PERF_PID=$backend_perf
            perf_stop "$out.perf-backend"
            R[$target,$round,sys_backend]=$PERF_COUNTS
            R[$target,$round,sys_proxy]=""
            if [[ -n ${PID[$target]} ]]; then
                PERF_PID=$proxy_perf
                perf_stop "$out.perf-proxy"
                R[$target,$round,sys_proxy]=$PERF_COUNTS
            fi
        fi
        read -r m1 sq1 <<<"$(machine_ticks)"
        p1=0
        [[ -n ${PID[$target]} ]] && p1=$(cpu_ticks "${PID[$target]}")
        b1=$(cpu_ticks "$BACKEND_PID")
        read -r conns1 breq1 breads1 <<<"$(backend_stats)"
        line=$(grep '^BENCH_RESULT' "$out") || die "no BENCH_RESULT line in $out"
        for kv in ${line#BENCH_RESULT }; do R[$target,$round,${kv%%=*}]=${kv#*=}; done
        R[$target,$round,proxy_ticks]=$((p1 - p0))
        R[$target,$round,backend_ticks]=$((b1 - b0))
        wrk_ticks=$(tail -n1 "$out.times" | awk -v hz="$CLK_TCK" '{
            for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%d", t * hz }')
        R[$target,$round,wrk_ticks]=$wrk_ticks
        # As shares of all the machine's cores: softirq time (loopback TCP work not charged to
        # any process), and busy time charged to neither wrk, the backend nor the proxy (other
        # processes, steal): the latter high means the run was disturbed.
        pct() { awk -v x="$1" -v hz="$CLK_TCK" -v d="${R[$target,$round,duration_us]}" -v n="$(nproc)" \
            'BEGIN { x = x / hz / (d / 1e6) / n * 100; if (x < 0) x = 0; printf "%.0f", x }'; }
        R[$target,$round,softirq_pct]=$(pct "$((sq1 - sq0))")
        R[$target,$round,other_pct]=$(pct "$((m1 - m0 - (p1 - p0) - (b1 - b0) - wrk_ticks))")
        # The stats request itself opens one connection, counted in conns1.
        R[$target,$round,conns]=$((conns1 - conns0 - 1))
        # Socket reads that returned bytes per request served, at the backend: 1.0 when every
        # request arrives in one piece; more when its header and body come in separate writes.
        R[$target,$round,reads_per_req]=$(awk -v r="$((breads1 - breads0))" -v n="$((breq1 - breq0))" \
            'BEGIN { printf "%.2f", (n > 0 ? r / n : 0) }')
    done
done

# ---------------------------------------------------------------- report
# Per-run derived figures, as text for awk.
fig() { # target round -> "rps p50_ms p99_ms errors proxy_us/req backend_us/req conns wrk_us/req other% softirq% backend_reads/req"
    local t=$1 r=$2
    awk -v req="${R[$t,$r,requests]}" -v dur="${R[$t,$r,duration_us]}" \
        -v p50="${R[$t,$r,p50_us]}" -v p99="${R[$t,$r,p99_us]}" \
        -v e="$((R[$t,$r,err_connect] + R[$t,$r,err_read] + R[$t,$r,err_write] + R[$t,$r,err_status] + R[$t,$r,err_timeout]))" \
        -v pt="${R[$t,$r,proxy_ticks]}" -v bt="${R[$t,$r,backend_ticks]}" -v hz="$CLK_TCK" \
        -v proxied="$([[ $t == direct ]] && echo 0 || echo 1)" -v conns="${R[$t,$r,conns]}" \
        -v wt="${R[$t,$r,wrk_ticks]}" -v other="${R[$t,$r,other_pct]}" -v sq="${R[$t,$r,softirq_pct]}" \
        -v brr="${R[$t,$r,reads_per_req]}" \
        'BEGIN {
            rps = req / (dur / 1e6)
            pcpu = proxied ? sprintf("%.1f", pt / hz * 1e6 / req) : "-"
            printf "%.0f %.3f %.3f %d %s %.1f %d %.1f %d %d %s\n", rps, p50 / 1000, p99 / 1000, e, pcpu,
                bt / hz * 1e6 / req, conns, wt / hz * 1e6 / req, other, sq, brr
        }'
}

# The round whose req/s is the median for a target (lower median for an even count).
median_round() {
    local t=$1 r
    for r in $(seq "$ROUNDS"); do echo "$(fig "$t" "$r" | cut -d' ' -f1) $r"; done |
        sort -n | sed -n "$(((ROUNDS + 1) / 2))p" | cut -d' ' -f2
}

cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml 2>/dev/null || rev="$rev (+ uncommitted changes in src/)"
{
    if [[ $LOAD == first-byte ]]; then
        echo "### Time to the first streamed byte: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "p50 and p99 below are of the time from sending a request to its answer's first body byte;"
        echo "the wrk columns are the first-byte client's (examples/first_byte.rs)."
    else
        echo "### Proxy overhead: $(date -u '+%Y-%m-%d %H:%M UTC')"
    fi
    echo
    echo "- command: \`$(for v in WRK_THREADS WRK_CONNS DURATION WARMUP ROUNDS PROXY_THREADS BACKEND_THREADS BODY_BYTES PACE_MS LOAD STREAM_MS; do printf '%s=%s ' "$v" "${!v}"; done)$INVOCATION\`"
    echo "- load, each target: \`$(wrk_cmd "$DURATION")\` after a \`-d$WARMUP\` warm-up; $ROUNDS interleaved round(s)"
    echo "- machine: nproc $(nproc), $cpu_model, $(uname -sr), load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- versions: gpulb $rev${ADDR[gpulb-base]:+ (gpulb-base: $BASE_GPULB)}, $(nginx -v 2>&1 | sed 's/nginx version: //' || true), $(haproxy -v 2>/dev/null | head -n1 | cut -d' ' -f1-3 || true), $(wrk -v 2>&1 | head -n1 | cut -d' ' -f1-2)"
    echo "- proxies: $PROXY_THREADS worker thread(s) each; fast_backend: $BACKEND_THREADS thread(s); all on 127.0.0.1, sharing the same $(nproc) cores with wrk"
    echo
    echo "| target | req/s | p50 ms | p99 ms | req/s vs direct | p50 vs direct | p99 vs direct | proxy CPU µs/req | backend CPU µs/req | backend reads/req | wrk CPU µs/req | softirq % | other CPU % | new backend conns | errors |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    dr=$(median_round direct)
    read -r d_rps d_p50 d_p99 _ <<<"$(fig direct "$dr")"
    for t in "${ACTIVE[@]}"; do
        r=$(median_round "$t")
        read -r rps p50 p99 errs pcpu bcpu conns wcpu other sq brr <<<"$(fig "$t" "$r")"
        awk -v t="$t" -v rps="$rps" -v p50="$p50" -v p99="$p99" -v d_rps="$d_rps" -v d_p50="$d_p50" \
            -v d_p99="$d_p99" -v pcpu="$pcpu" -v bcpu="$bcpu" -v conns="$conns" -v errs="$errs" \
            -v wcpu="$wcpu" -v other="$other" -v sq="$sq" -v brr="$brr" \
            'BEGIN { printf "| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %d | %d |\n",
                t, rps, p50, p99, rps / d_rps, p50 / d_p50, p99 / d_p99, pcpu, bcpu, brr, wcpu, sq, other, conns, errs }'
    done
    if [[ -n ${ADDR[gpulb]:-} && -n ${ADDR[gpulb-nobody]:-} ]]; then
        read -r g_rps g_p50 g_p99 _ g_cpu _ <<<"$(fig gpulb "$(median_round gpulb)")"
        read -r n_rps n_p50 n_p99 _ n_cpu _ <<<"$(fig gpulb-nobody "$(median_round gpulb-nobody)")"
        echo
        awk -v a="$g_rps" -v b="$n_rps" -v c="$g_p50" -v d="$n_p50" -v e="$g_p99" -v f="$n_p99" \
            -v g="$g_cpu" -v h="$n_cpu" 'BEGIN {
            printf "gpulb (body read) vs gpulb-nobody (median runs): req/s %.3fx, p50 %.3fx, p99 %.3fx, proxy CPU µs/req %.3fx\n",
                a / b, c / d, e / f, g / h }'
    fi
    if [[ ${SYSCALLS:-0} == 1 ]]; then
        echo
        echo "System calls per request in each target's median run (\`perf stat\` on the syscall tracepoints over the measured run; a proxy's process and its children):"
        echo
        echo "| target |$(for k in $SYSCALL_KINDS; do printf ' proxy %s |' "$k"; done) proxy total |$(for k in $SYSCALL_KINDS; do printf ' backend %s |' "$k"; done)"
        echo "|---|$(for _ in $SYSCALL_KINDS; do printf -- '---:|'; done)---:|$(for _ in $SYSCALL_KINDS; do printf -- '---:|'; done)"
        for t in "${ACTIVE[@]}"; do
            r=$(median_round "$t")
            awk -v t="$t" -v kinds="$SYSCALL_KINDS" -v n="${R[$t,$r,requests]}" \
                -v proxy="${R[$t,$r,sys_proxy]}" -v backend="${R[$t,$r,sys_backend]}" '
                function per(list, kind,   i, a, kv) {
                    split(list, a, " ")
                    for (i in a) { split(a[i], kv, "="); if (kv[1] == kind) return kv[2] / n }
                    return -1
                }
                BEGIN {
                    k = split(kinds, kind, " "); line = "| " t " |"; total = 0
                    for (i = 1; i <= k; i++) {
                        v = per(proxy, kind[i]); if (v >= 0) total += v
                        line = line (v < 0 ? " - |" : sprintf(" %.2f |", v))
                    }
                    line = line (proxy == "" ? " - |" : sprintf(" %.2f |", total))
                    for (i = 1; i <= k; i++) { v = per(backend, kind[i]); line = line (v < 0 ? " - |" : sprintf(" %.2f |", v)) }
                    print line
                }'
        done
    fi
    echo
    echo "Every run (req/s, p50 ms, p99 ms, proxy CPU µs/req, other CPU %):"
    echo
    echo "| target |$(for r in $(seq "$ROUNDS"); do printf ' round %d |' "$r"; done)"
    echo "|---|$(for _ in $(seq "$ROUNDS"); do printf -- '---|'; done)"
    for t in "${ACTIVE[@]}"; do
        printf '| %s |' "$t"
        for r in $(seq "$ROUNDS"); do
            read -r rps p50 p99 _ pcpu _ _ _ other _ <<<"$(fig "$t" "$r")"
            printf ' %s, %s, %s, %s, %s%% |' "$rps" "$p50" "$p99" "$pcpu" "$other"
        done
        echo
    done
    echo
    echo "Each row is that target's median run by req/s; ratios divide it by direct's median run."
    echo "CPU µs/req: utime+stime from /proc/PID/stat over the measured run (a proxy: its process and"
    echo "children), divided by the requests served; clock ticks are $((1000 / CLK_TCK)) ms; wrk's comes"
    echo "from bash \`times\` around it. Softirq %: the machine's softirq time (loopback TCP delivery,"
    echo "charged to no process). Other CPU %: busy time charged to none of wrk, backend, proxy (other"
    echo "processes, steal). Both from /proc/stat, as a share of all $(nproc) cores during the measured run;"
    echo "a high other CPU % means a disturbed run. New backend conns: connections the backend accepted"
    echo "during the measured run (a proxy that reuses its keep-alive pool opens few). Backend reads/req:"
    echo "the backend's socket reads that returned bytes, per request it served (1.00 when each request"
    echo "arrives in one piece; up to 2 when a proxy writes a request's header and body apart)."
} >"$TMP/report.md"

cat "$TMP/report.md"
if [[ -n ${RESULTS:-} ]]; then cp "$TMP/report.md" "$RESULTS"; log "report written to $RESULTS"; fi
