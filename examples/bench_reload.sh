#!/usr/bin/env bash
# Reload benchmark: each target serves the routing trace twice from a fresh start, steady and
# while its config file is rewritten with a real change and reloaded every 100 ms (gpulb:
# POST /reload; nginx: SIGHUP to the master, what `nginx -s reload` sends; HAProxy in
# master-worker mode: SIGUSR2 to the master), and the run prints one table: interactive TTFT
# and E2E p50/p99 steady vs reloading, errors, reloads done and the worker processes they
# started. gpulb vs nginx least_conn vs HAProxy leastconn, as configured by
# examples/bench_routing (targets.rs). Results: BENCHMARKS.md, "Reload under load".
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   examples/bench_reload.sh                        # build, then one run (~5 min)
#   SEED=2 EVERY=250ms examples/bench_reload.sh --duration 20   # extra flags go to bench_routing
# Knobs (environment): SEED (1), EVERY (100ms), TARGETS (gpulb,nginx-lc,haproxy-lc),
#   SKIP_BUILD=1, OUT (target/bench_reload).
set -euo pipefail

SEED=${SEED:-1}
EVERY=${EVERY:-100ms}
TARGETS=${TARGETS:-gpulb,nginx-lc,haproxy-lc}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/target/bench_reload}
cd "$ROOT"

# shellcheck source=examples/bench_setup.sh
source "$ROOT/examples/bench_setup.sh"
require_peers
# Old nginx and HAProxy workers keep their connections open while they drain.
ulimit -n "$(ulimit -Hn)"
build_release
mkdir -p "$OUT"
target/release/examples/bench_routing --reload-every "$EVERY" --seed "$SEED" \
    --targets "$TARGETS" --out-dir "$OUT" "$@" | tee "$OUT/summary.md"
echo "[bench_reload.sh] table: $OUT/summary.md" >&2
