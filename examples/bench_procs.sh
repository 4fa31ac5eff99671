# Sourced by the scripts that start proxies themselves (bench_overhead.sh, bench_memory.sh):
# their temp dir ($TMP, removed on exit unless KEEP_TMP=1), logging, the bookkeeping that stops
# every process they started on exit, error or signal, and free ports and readiness. The
# sourcing script sets LOG_TAG first.

TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpulb-${LOG_TAG:-bench}.XXXXXX")
chmod 755 "$TMP" # nginx workers may run as another user

log() { printf '[%s %s] %s\n' "${LOG_TAG:-bench}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- process bookkeeping
PIDS=()

# Stops processes and their children: TERM, then KILL what is left after $1 tenths of a second.
terminate() {
    local tenths=$1 pid all=() child alive
    shift
    for pid in "$@"; do
        [[ -n $pid ]] || continue
        all+=("$pid")
        for child in $(pgrep -P "$pid" 2>/dev/null || true); do all+=("$child"); done
    done
    [[ ${#all[@]} -gt 0 ]] || return 0
    kill -TERM "${all[@]}" 2>/dev/null || true
    for _ in $(seq "$tenths"); do
        alive=0
        for pid in "${all[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    kill -KILL "${all[@]}" 2>/dev/null || true
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    terminate 30 "${PIDS[@]}"
    wait 2>/dev/null || true
    if [[ ${KEEP_TMP:-0} == 1 ]]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget() { # drop a finished pid from PIDS
    local p keep=()
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

stop() { # stop one process this script started (and its children), within 5 s, and forget it
    terminate 50 "$1"
    wait "$1" 2>/dev/null || true
    forget "$1"
}

# ---------------------------------------------------------------- ports and readiness
# Listening ports are taken below the ephemeral range (32768-60999 by default): tens of
# thousands of client sockets may come and go there, and a port any socket holds cannot be bound.
port_in_use() { ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
USED_PORTS=" "
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 12000))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if ! port_in_use "$p"; then USED_PORTS+="$p "; echo "$p"; return; fi
    done
    die "no free port found"
}

# Waits (up to 20 s) until a one-token completion POSTed to http://$1 answers 200.
wait_ready() {
    local addr=$1 name=$2 pid=$3 code
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || die "$name exited at start-up (see its log in $TMP; rerun with KEEP_TMP=1)"
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -X POST \
            -H 'content-type: application/json' -d '{"model":"bench","prompt":"ready?","max_tokens":1}' \
            "http://$addr/v1/completions" 2>/dev/null || true)
        [[ $code == 200 ]] && return 0
        sleep 0.2
    done
    die "$name at $addr did not answer 200 within 20 s (last code: ${code:-none})"
}
