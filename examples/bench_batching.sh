#!/usr/bin/env bash
# Batching benchmark: a flood of one-sentence embedding requests on simulated embedding workers,
# open loop at rising rates, through gpulb with batching, gpulb without batching and nginx
# least_conn, in one run; prints the results table and the verdict on the targets. See
# examples/bench_batching/main.rs for what is measured, BENCHMARKS.md ("Batching") for results.
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   bash examples/bench_batching.sh                  # build, then every target (~4 min)
#   bash examples/bench_batching.sh --seconds 10     # extra flags go to the harness (--help)
# Knobs (environment): SKIP_BUILD=1 uses the existing release binaries;
# OUT=target/bench_batching is the run directory (configs, logs, results.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/target/bench_batching}
cd "$ROOT"
command -v nginx >/dev/null || {
    echo "nginx is missing: apt-get install -y nginx-light" >&2
    exit 1
}
if [[ -z ${SKIP_BUILD:-} ]]; then
    cargo build --release --bin gpulb --example bench_batching >&2
fi
target/release/examples/bench_batching --out-dir "$OUT" "$@"
