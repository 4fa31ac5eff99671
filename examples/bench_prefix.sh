#!/usr/bin/env bash
# Prefix-affinity benchmark: gpulb `placement: prefix_affinity` vs gpulb `least_loaded` vs
# SGLang's router (`--policy cache_aware`) vs nginx `least_conn`, in front of the same uneven
# simulated fleet with prefix caching (vLLM-like, 16-token blocks, LRU in free KV), each sent
# the identical open-loop shared-prefix trace (examples/bench_routing --workload prefix; see
# examples/bench_routing/prefix.rs). Results: BENCHMARKS.md ("Prefix affinity").
#
# Usage (everything on 127.0.0.1 with free ports, torn down afterwards; ~5 min per seed):
#   examples/bench_prefix.sh                 # build, then seed 1
#   SEEDS="1 2 3" examples/bench_prefix.sh   # more seeds
#   examples/bench_prefix.sh --zipf 0.8      # extra flags go to every run
# Knobs (environment): SEEDS, SKIP_BUILD=1, OUT=target/bench_prefix,
#   TARGETS=gpulb-prefix,gpulb-ll,sglang-cache-aware,nginx-lc
# Needs nginx (apt-get install -y nginx-light) and sglang-router
# (python3 -m pip install sglang-router); without the latter, drop it from TARGETS.
set -euo pipefail

SEEDS=${SEEDS:-1}
TARGETS=${TARGETS:-gpulb-prefix,gpulb-ll,sglang-cache-aware,nginx-lc}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/target/bench_prefix}
cd "$ROOT"

if [[ -z ${SKIP_BUILD:-} ]]; then
    cargo build --release --bin gpulb --examples >&2
fi
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
# Workload: 40 shared prefixes of 1,000-3,000 tokens, Zipf 1.1; sessions of 1-4 turns, 2-6 s
# apart, starting at 1.6/s (x3 in 4 s bursts every 15 s); answers of 8-32 tokens, so prefill
# (200 µs per uncached token, x2 on the half-speed gpu1) dominates TTFT. KV 32,768 tokens per
# worker (half on gpu2). gpulb's class guards are off for both gpulb targets (max_outstanding
# 8 = max_running still caps each backend), so the two differ only in placement.
for seed in $SEEDS; do
    echo "[bench_prefix.sh] seed $seed" >&2
    target/release/examples/bench_routing --workload prefix --seed "$seed" \
        --out-dir "$OUT" --targets "$TARGETS" \
        --duration 30 --interactive-rps 1.6 --burst-factor 3 \
        --interactive-tokens 8-32 --prefill-us 200 --kv-tokens 32768 \
        --interactive-guard-queue -1 --interactive-guard-kv -1 \
        "$@" | tee -a "$SUMMARY"
done
echo "[bench_prefix.sh] all tables: $SUMMARY" >&2
