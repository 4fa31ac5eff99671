#!/usr/bin/env bash
# Scaling with worker threads: examples/bench_overhead.sh once per thread count, every proxy
# given that many worker threads (gpulb `threads`, nginx `worker_processes`, HAProxy `nbthread`),
# then one summary table: req/s per target and thread count, gpulb's req/s as a share of nginx's
# and HAProxy's, and each proxy's CPU per request.
#
# Usage:
#   examples/bench_threads.sh
# Knobs (environment): THREAD_COUNTS="1 2 4" (more threads than cores shows what
# oversubscription costs: the machine's cores bound everything); CPUS=LIST pins the whole run
# (wrk, backend, proxies) to those cores with `taskset -c LIST` (e.g. CPUS=0 for one core);
# RESULTS=FILE also writes the summary and the full reports to FILE. Every other knob of
# bench_overhead.sh (ROUNDS, DURATION, WRK_CONNS, TARGETS, SKIP_BUILD, ...) passes through.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREAD_COUNTS=${THREAD_COUNTS:-1 2 4}
CPUS=${CPUS:-}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpulb-threads.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log() { printf '[threads %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

pin=()
[[ -n $CPUS ]] && pin=(taskset -c "$CPUS")
built=${SKIP_BUILD:-0}
for threads in $THREAD_COUNTS; do
    log "proxies with $threads worker thread(s)${CPUS:+, pinned to CPUs $CPUS}"
    PROXY_THREADS=$threads SKIP_BUILD=$built RESULTS="$TMP/report.$threads.md" \
        "${pin[@]}" bash "$ROOT/examples/bench_overhead.sh" >/dev/null
    built=1
done

# A target's median-run row of one report: "req/s proxy_cpu_us_per_req".
row() {
    awk -F'|' -v t="$2" '$2 ~ "^ " t " $" { gsub(/ /, "", $3); gsub(/ /, "", $9); print $3, $9; exit }' "$1"
}

{
    echo "### Thread scaling: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- command: \`THREAD_COUNTS=\"$THREAD_COUNTS\"${CPUS:+ CPUS=$CPUS} examples/bench_threads.sh\`, each thread count one \`examples/bench_overhead.sh\` run (its reports follow)"
    echo "- machine: nproc $(nproc)${CPUS:+, pinned to CPUs $CPUS}; wrk, the backend and the proxies share the cores"
    echo
    echo "| threads | gpulb req/s | nginx req/s | HAProxy req/s | gpulb / nginx | gpulb / HAProxy | gpulb CPU µs/req | nginx CPU µs/req | HAProxy CPU µs/req |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for threads in $THREAD_COUNTS; do
        report=$TMP/report.$threads.md
        read -r g gc <<<"$(row "$report" gpulb)"
        read -r n nc <<<"$(row "$report" nginx)"
        read -r h hc <<<"$(row "$report" haproxy)"
        awk -v t="$threads" -v g="${g:-0}" -v n="${n:-0}" -v h="${h:-0}" -v gc="${gc:--}" -v nc="${nc:--}" -v hc="${hc:--}" \
            'function r(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
             BEGIN { printf "| %d | %d | %d | %d | %s | %s | %s | %s | %s |\n", t, g, n, h, r(g, n), r(g, h), gc, nc, hc }'
    done
    echo
    echo "Each figure is that target's median round in the report of its thread count, below."
    for threads in $THREAD_COUNTS; do
        echo
        sed 's/^### /#### /' "$TMP/report.$threads.md"
    done
} >"$TMP/summary.md"
cat "$TMP/summary.md"
if [[ -n ${RESULTS:-} ]]; then cp "$TMP/summary.md" "$RESULTS"; log "written to $RESULTS"; fi
