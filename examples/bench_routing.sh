#!/usr/bin/env bash
# Routing-quality benchmark: gpulb vs nginx (round robin, least_conn) vs HAProxy (roundrobin,
# leastconn) in front of the same uneven simulated GPU fleet, the identical open-loop trace for
# each, repeated over several seeds and two burst scenarios. See examples/bench_routing/main.rs
# for what is measured and how, and BENCHMARKS.md ("Routing quality") for results.
#
# Usage (from anywhere; everything runs on 127.0.0.1 with free ports, then is torn down):
#   examples/bench_routing.sh                      # build, then 2 scenarios x 3 seeds (~25 min)
#   SEEDS=1 SCENARIOS=spike examples/bench_routing.sh           # one run (~4 min)
#   examples/bench_routing.sh --bulk-share 0.5     # extra flags go to every run
# Knobs (environment):
#   SEEDS="1 2 3"            trace seeds
#   SCENARIOS="spike flood"  spike: both classes x3 in the burst windows (the binary's default);
#                            flood: interactive steady, bulk x5 in the burst windows
#   SKIP_BUILD=1             use the existing release binaries
#   OUT=target/bench_routing where runs go (OUT/SCENARIO/seed-N/: configs, CSVs, results.md);
#                            every table is also appended to OUT/summary.md. OUT/SCENARIO is
#                            emptied first: after its seeds, the figures and verdict pooled over
#                            them are printed (bench_routing --pooled OUT/SCENARIO)
set -euo pipefail

SEEDS=${SEEDS:-1 2 3}
SCENARIOS=${SCENARIOS:-spike flood}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/target/bench_routing}
cd "$ROOT"

# shellcheck source=examples/bench_setup.sh
source "$ROOT/examples/bench_setup.sh"
require_peers
build_release

mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
for scenario in $SCENARIOS; do
    case $scenario in
        spike) flags=() ;;
        flood) flags=(--interactive-burst 1 --bulk-burst 5) ;;
        *) echo "unknown scenario $scenario (spike, flood)" >&2; exit 1 ;;
    esac
    rm -rf "${OUT:?}/$scenario" # the pooled verdict below reads every seed-N/ under it
    for seed in $SEEDS; do
        echo "[bench_routing.sh] scenario $scenario, seed $seed" >&2
        {
            echo "## Scenario $scenario"
            echo
            target/release/examples/bench_routing --seed "$seed" --out-dir "$OUT/$scenario" \
                ${flags[@]+"${flags[@]}"} "$@"
        } | tee -a "$SUMMARY"
    done
    {
        echo "## Scenario $scenario, every seed pooled"
        echo
        target/release/examples/bench_routing --pooled "$OUT/$scenario"
    } | tee -a "$SUMMARY"
done
echo "[bench_routing.sh] all tables: $SUMMARY" >&2
