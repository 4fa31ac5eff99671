#!/usr/bin/env bash
# Abuse benchmark: each target serves the routing trace twice, clean and beside hostile clients
# (1,000 slowloris connections, 2,000 idle keep-alive connections, 20 stalled uploads), and the
# run prints one table: interactive TTFT p99 clean vs abused, healthy backends ejected, the
# proxy's RSS, and how much of the abuse each target still held. gpulb vs nginx least_conn vs
# HAProxy leastconn, as configured by examples/bench_routing (targets.rs). Results: BENCHMARKS.md.
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   examples/bench_abuse.sh                       # build, then one run (~6 min)
#   SEED=2 examples/bench_abuse.sh --duration 20  # extra flags go to bench_routing
# Knobs (environment): SEED (1), TARGETS (gpulb,nginx-lc,haproxy-lc), SKIP_BUILD=1,
#   OUT (target/bench_abuse).
set -euo pipefail

SEED=${SEED:-1}
TARGETS=${TARGETS:-gpulb,nginx-lc,haproxy-lc}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/target/bench_abuse}
cd "$ROOT"

# shellcheck source=examples/bench_setup.sh
source "$ROOT/examples/bench_setup.sh"
require_peers
# Both ends of 3,000 abusive connections, the trace's and the upstream ones live in this
# process tree: raise the soft open-file limit to the hard one (gpulb sizes its default
# limits.max_connections from it).
ulimit -n "$(ulimit -Hn)"
if (($(ulimit -n) < 8192)); then
    echo "[bench_abuse.sh] warning: open-file limit $(ulimit -n) is low for 3,000 connections a side" >&2
fi
build_release
mkdir -p "$OUT"
target/release/examples/bench_routing --abuse --seed "$SEED" --targets "$TARGETS" \
    --out-dir "$OUT" "$@" | tee "$OUT/summary.md"
echo "[bench_abuse.sh] table: $OUT/summary.md" >&2
