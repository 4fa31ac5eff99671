//! The prefix-affinity workload (`--workload prefix`): shared system prompts of thousands of
//! tokens with Zipf popularity, multi-turn sessions that resend their growing history, short
//! streamed answers; and what it is judged by: the workers' prefix-cache hit rate against an
//! offline oracle's, TTFT, throughput and load spread.

use crate::report::{class_stats, pct, TargetRun};
use crate::trace::{self, Class, Req, TraceSpec, INTERACTIVE_TENANTS};
use crate::Args;
use gpulb::tools::sim::WorkerProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::Hasher;
use std::sync::Arc;

/// Characters in one cache block: 16 sim tokens of 4 characters (the sim's and gpulb's block).
pub const BLOCK_CHARS: usize = 64;

/// The one block each target's requests start with (see `client::body`): it names the target
/// and the shared prefix that follows, so no target finds blocks an earlier target's run left in
/// the workers' caches, and prompts with different prefixes share no block.
pub fn salt(target: &str, prefix: &str) -> String {
    let mut h = DefaultHasher::new();
    h.write(prefix.as_bytes());
    format!(
        "{:<64.64}",
        format!("[{target} prefix {:016x}]", h.finish())
    )
}

/// `chars` characters of words drawn at random (so different texts differ from the first block).
fn text(rng: &mut StdRng, chars: usize) -> String {
    const WORDS: [&str; 24] = [
        "tensor", "kernel", "token", "cache", "prefix", "batch", "decode", "prefill", "shard",
        "router", "tenant", "stream", "latency", "budget", "queue", "worker", "model", "prompt",
        "system", "policy", "answer", "context", "memory", "block",
    ];
    let mut s = String::with_capacity(chars + 16);
    while s.len() < chars {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        s.push(' ');
    }
    s.truncate(chars);
    s
}

/// The trace: sessions start as Poisson arrivals at --interactive-rps (times the burst factor
/// inside burst windows); each picks a shared prefix by Zipf popularity (rank k has weight
/// 1/k^s) and sends --turns turns, --think-ms apart, each resending the whole history (prefix,
/// earlier questions and answers) plus a new question. Turns after the arrival window are cut.
pub fn generate(a: &Args, spec: &TraceSpec) -> Vec<Req> {
    let mut rng = StdRng::seed_from_u64(spec.seed ^ 0x3_0000_0003);
    let prefixes: Vec<String> = (0..a.prefixes.max(1))
        .map(|_| {
            let n = rng.random_range(a.prefix_chars.0..=a.prefix_chars.1);
            text(&mut rng, n)
        })
        .collect();
    let weights: Vec<f64> = (1..=prefixes.len())
        .map(|k| 1.0 / (k as f64).powf(a.zipf))
        .collect();
    let total: f64 = weights.iter().sum();
    let starts = trace::arrivals(spec, spec.interactive_rps, spec.interactive_burst, &mut rng);
    let mut reqs = Vec::new();
    for start in starts {
        let mut x = rng.random::<f64>() * total;
        let p = weights
            .iter()
            .position(|w| {
                x -= w;
                x < 0.0
            })
            .unwrap_or(0);
        let tenant = trace::pick_tenant(&mut rng, &INTERACTIVE_TENANTS);
        let turns = rng.random_range(a.turns.0..=a.turns.1);
        let mut messages = vec![prefixes[p].clone()];
        let mut at = start;
        for turn in 0..turns {
            if turn > 0 {
                let reply = rng.random_range(a.reply_chars.0..=a.reply_chars.1);
                messages.push(text(&mut rng, reply));
                at += rng.random_range(a.think_ms.0..=a.think_ms.1) as f64 / 1000.0;
            }
            if at >= spec.duration {
                break;
            }
            let question = rng.random_range(a.question_chars.0..=a.question_chars.1);
            messages.push(text(&mut rng, question));
            reqs.push(Req {
                at,
                class: Class::Interactive,
                tenant,
                prompt_chars: BLOCK_CHARS + messages.iter().map(String::len).sum::<usize>(),
                max_tokens: rng.random_range(
                    a.interactive_tokens.0..=a.interactive_tokens.1.max(a.interactive_tokens.0),
                ),
                messages: Some(Arc::new(messages.clone())),
            });
        }
    }
    reqs.sort_by(|a, b| a.at.total_cmp(&b.at));
    reqs
}

/// The header line describing the prefix workload.
pub fn describe(a: &Args, trace: &[Req]) -> String {
    let sessions = trace
        .iter()
        .filter(|r| r.messages.as_ref().is_some_and(|m| m.len() == 2))
        .count();
    format!(
        "- prefix workload: {} shared prefixes of {}-{} chars (Zipf s = {}), {} sessions of {}-{} turns {}-{} ms apart (question {}-{} chars, previous answer {}-{} chars resent), {} requests, all streaming chat with x-priority: interactive, max_tokens {}-{}\n",
        a.prefixes,
        a.prefix_chars.0,
        a.prefix_chars.1,
        a.zipf,
        sessions,
        a.turns.0,
        a.turns.1,
        a.think_ms.0,
        a.think_ms.1,
        a.question_chars.0,
        a.question_chars.1,
        a.reply_chars.0,
        a.reply_chars.1,
        trace.len(),
        a.interactive_tokens.0,
        a.interactive_tokens.1,
    )
}

/// Chained keys of a text's full blocks: equal keys mean equal prefixes up to that block.
fn block_keys(text: &str) -> Vec<u64> {
    let mut prev = 0u64;
    text.as_bytes()
        .chunks_exact(BLOCK_CHARS)
        .map(|chunk| {
            let mut h = DefaultHasher::new();
            h.write_u64(prev);
            h.write(chunk);
            prev = h.finish();
            prev
        })
        .collect()
}

/// One worker's cache in the oracle: blocks, least recently used evicted beyond `cap`.
struct Lru {
    cap: usize,
    tick: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn cached(&self, keys: &[u64]) -> usize {
        keys.iter().take_while(|k| self.at.contains_key(k)).count()
    }

    /// Uses `keys`: all cached afterwards, the first most recently (as the sim frees a
    /// sequence's blocks last first), then the least recently used evicted to fit.
    fn touch(&mut self, keys: &[u64]) {
        for &k in keys.iter().rev() {
            if let Some(old) = self.at.insert(k, self.tick) {
                self.order.remove(&old);
            }
            self.order.insert(self.tick, k);
            self.tick += 1;
        }
        while self.order.len() > self.cap {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            self.at.remove(&k);
        }
    }
}

/// The oracle's hit rate (tokens found / tokens looked up), computed offline from the trace:
/// requests in arrival order, each sent to the worker whose cache holds the longest prefix of it
/// (ties: the one sent fewest requests so far, then the first), every worker an LRU of blocks as large as its
/// whole KV budget, hits counted as the sim counts them (whole cached leading blocks, never the
/// last prompt token). It ignores time: no KV held by running sequences, no load limit.
pub fn oracle(trace: &[Req], profiles: &[WorkerProfile]) -> (u64, u64, Vec<u64>) {
    let mut caches: Vec<Lru> = profiles
        .iter()
        .map(|p| Lru {
            cap: p.kv_budget_tokens / (BLOCK_CHARS / 4),
            tick: 0,
            at: HashMap::new(),
            order: BTreeMap::new(),
        })
        .collect();
    let mut sent = vec![0u64; caches.len()];
    let (mut queries, mut hits) = (0u64, 0u64);
    for r in trace {
        let Some(messages) = &r.messages else {
            continue;
        };
        let text = salted("oracle", messages);
        let keys = block_keys(&text);
        let best = (0..caches.len())
            .rev()
            .max_by_key(|&i| (caches[i].cached(&keys), std::cmp::Reverse(sent[i])))
            .unwrap_or(0);
        let tokens = sim_tokens(&text);
        queries += tokens as u64;
        hits += cached_tokens(caches[best].cached(&keys), tokens) as u64;
        caches[best].touch(&keys);
        sent[best] += 1;
    }
    (queries, hits, sent)
}

/// A request's prompt as target `target` sends it: its salt block, then its messages.
fn salted(target: &str, messages: &[String]) -> String {
    let salt = salt(target, &messages[0]);
    std::iter::once(salt.as_str())
        .chain(messages.iter().map(String::as_str))
        .collect()
}

/// Prompt tokens of `text` as the sim counts them (4 characters each).
fn sim_tokens(text: &str) -> usize {
    text.len().div_ceil(4).max(1)
}

/// Prompt tokens the sim finds cached when `found` leading blocks of a `tokens`-token prompt
/// are: whole blocks, never the last prompt token.
fn cached_tokens(found: usize, tokens: usize) -> usize {
    let block_tokens = BLOCK_CHARS / 4;
    found.min(tokens.saturating_sub(1) / block_tokens) * block_tokens
}

/// The least TTFT (seconds) each request of the trace could get from any router, in trace
/// order: one step of the fastest worker running it alone, prefilling only the blocks no
/// earlier request carried, as if every worker shared one unbounded cache. Whatever the router,
/// its k-th slowest TTFT is at least the k-th largest of these, so their percentiles bound every
/// target's from below (on the sim's cost model; queueing, networking and the proxy only add).
pub fn ttft_floor(trace: &[Req], profiles: &[WorkerProfile]) -> Vec<f64> {
    let mut seen: HashSet<u64> = HashSet::new();
    trace
        .iter()
        .filter_map(|r| {
            let text = salted("floor", r.messages.as_ref()?);
            let keys = block_keys(&text);
            let found = keys.iter().take_while(|k| seen.contains(k)).count();
            let tokens = sim_tokens(&text);
            let prefill = u32::try_from(tokens - cached_tokens(found, tokens)).unwrap_or(u32::MAX);
            seen.extend(keys);
            profiles
                .iter()
                .map(|p| (p.decode_step + p.prefill_per_token * prefill).as_secs_f64())
                .min_by(f64::total_cmp)
        })
        .collect()
}

/// The header line with what no router can beat on this trace: the oracle's hit rate and the
/// TTFT floor.
pub fn describe_bounds(trace: &[Req], profiles: &[WorkerProfile]) -> String {
    let (queries, hits, _) = oracle(trace, profiles);
    let (p50, p99) = floor_percentiles(trace, profiles);
    format!(
        "- offline bounds: oracle hit rate {:.3}; TTFT floor (any router) p50 {} ms, p99 {} ms\n",
        rate(queries, hits),
        fmt_ms(p50),
        fmt_ms(p99)
    )
}

/// The p50 and p99 of [`ttft_floor`], seconds.
fn floor_percentiles(trace: &[Req], profiles: &[WorkerProfile]) -> (Option<f64>, Option<f64>) {
    let mut floor = ttft_floor(trace, profiles);
    floor.sort_by(f64::total_cmp);
    (pct(&floor, 0.5), pct(&floor, 0.99))
}

fn rate(queries: u64, hits: u64) -> f64 {
    if queries == 0 {
        0.0
    } else {
        hits as f64 / queries as f64
    }
}

fn list<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

/// The prefix section of results.md: one row per target, the oracle, and the verdict.
pub fn section(a: &Args, trace: &[Req], profiles: &[WorkerProfile], runs: &[TargetRun]) -> String {
    let (oq, oh, osent) = oracle(trace, profiles);
    let oracle_rate = rate(oq, oh);
    let cap = a.gpulb_max_outstanding.unwrap_or(a.max_running);
    let mut t = String::new();
    let _ = writeln!(t, "\nPrefix affinity (latency percentiles over ok requests; hit rate = prompt tokens found in the workers' prefix caches / looked up, summed over workers, counters read before and after each target's replay; requests per worker = requests the worker received during the replay; max held = largest running + waiting inside the worker, sampled every 100 ms):\n");
    let _ = writeln!(t, "| target | sent | ok | shed | errors | TTFT p50 ms | TTFT p99 ms | E2E p50 s | E2E p99 s | completed/s | hit rate | hit rate / oracle | requests per worker | max held per worker |");
    let _ = writeln!(
        t,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"
    );
    for run in runs {
        let s = class_stats(&run.outcomes, Class::Interactive, None);
        let (q, h) = run
            .prefix_cache
            .iter()
            .fold((0, 0), |acc, c| (acc.0 + c.0, acc.1 + c.1));
        let received: Vec<u64> = run.prefix_cache.iter().map(|c| c.2).collect();
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.3} | {:.3} | {} | {} |",
            run.name,
            s.sent,
            s.ok,
            s.shed,
            s.errors,
            fmt_ms(s.ttft_p50),
            fmt_ms(s.ttft_p99),
            fmt_s(s.e2e_p50),
            fmt_s(s.e2e_p99),
            s.completed_per_s,
            rate(q, h),
            if oracle_rate > 0.0 {
                rate(q, h) / oracle_rate
            } else {
                0.0
            },
            list(&received),
            list(&run.sim_max_outstanding),
        );
    }
    let _ = writeln!(
        t,
        "| oracle (offline) | {} | | | | | | | | | {:.3} | 1.000 | {} | |",
        trace.len(),
        oracle_rate,
        list(&osent)
    );
    let floor = floor_percentiles(trace, profiles);
    let _ = writeln!(
        t,
        "| TTFT floor (offline, any router) | {} | | | | {} | {} | | | | | | | |",
        trace.len(),
        fmt_ms(floor.0),
        fmt_ms(floor.1),
    );
    let _ = writeln!(t, "\nAgainst the targets (gpulb-prefix: TTFT p99 at most half the best peer's; hit rate at least 0.9x the oracle's; no worker holding more than its cap of {cap}; completed/s no worse than gpulb-ll):\n");
    t.push_str(&verdict(runs, oracle_rate, cap, floor.1));
    t
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}", v * 1000.0))
}

fn fmt_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn met(ok: bool) -> &'static str {
    if ok {
        "MET"
    } else {
        "NOT MET"
    }
}

/// The four targets, each computed from the runs (nothing when gpulb-prefix did not run).
fn verdict(runs: &[TargetRun], oracle_rate: f64, cap: usize, floor_p99: Option<f64>) -> String {
    let Some(g) = runs.iter().find(|r| r.name == "gpulb-prefix") else {
        return String::new();
    };
    let gs = class_stats(&g.outcomes, Class::Interactive, None);
    let mut t = String::new();
    let best = runs
        .iter()
        .filter(|r| r.name != g.name)
        .filter_map(|r| {
            class_stats(&r.outcomes, Class::Interactive, None)
                .ttft_p99
                .map(|v| (v, r.name.clone()))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some(gv), Some((bv, bn))) = (gs.ttft_p99, best) {
        let _ = writeln!(
            t,
            "- TTFT p99: gpulb-prefix {:.0} ms vs best peer {bn} {:.0} ms = {:.3}x (target <= 0.5x): {}",
            gv * 1000.0,
            bv * 1000.0,
            gv / bv,
            met(gv / bv <= 0.5)
        );
        if let Some(floor) = floor_p99 {
            let _ = writeln!(
                t,
                "  - TTFT p99 floor of this trace (offline, any router) {:.0} ms = {:.3}x the best peer's p99: {}",
                floor * 1000.0,
                floor / bv,
                if floor / bv > 0.5 {
                    "half the best peer's p99 is out of reach of any router on this trace"
                } else {
                    "half the best peer's p99 is above the floor"
                }
            );
        }
    }
    let (q, h) = g
        .prefix_cache
        .iter()
        .fold((0, 0), |acc, c| (acc.0 + c.0, acc.1 + c.1));
    let ratio = if oracle_rate > 0.0 {
        rate(q, h) / oracle_rate
    } else {
        0.0
    };
    let _ = writeln!(
        t,
        "- hit rate: gpulb-prefix {:.3} vs oracle {:.3} = {:.3}x (target >= 0.9x): {}",
        rate(q, h),
        oracle_rate,
        ratio,
        met(ratio >= 0.9)
    );
    let held = g.sim_max_outstanding.iter().copied().max().unwrap_or(0);
    let _ = writeln!(
        t,
        "- cap: most requests any worker held under gpulb-prefix (sampled) {held}, cap {cap} (gpulb max_outstanding): {}",
        met(held <= cap)
    );
    if let Some(l) = runs.iter().find(|r| r.name == "gpulb-ll") {
        let ls = class_stats(&l.outcomes, Class::Interactive, None);
        let _ = writeln!(
            t,
            "- completed/s: gpulb-prefix {:.3} ({} ok) vs gpulb-ll {:.3} ({} ok) = {:.3}x (target >= 1x): {}",
            gs.completed_per_s,
            gs.ok,
            ls.completed_per_s,
            ls.ok,
            gs.completed_per_s / ls.completed_per_s.max(1e-9),
            met(gs.completed_per_s >= ls.completed_per_s && gs.ok >= ls.ok)
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(at: f64, messages: &[&str]) -> Req {
        Req {
            at,
            class: Class::Interactive,
            tenant: "tenant-a",
            prompt_chars: 0,
            max_tokens: 8,
            messages: Some(Arc::new(messages.iter().map(|m| m.to_string()).collect())),
        }
    }

    #[test]
    fn the_oracle_finds_a_resent_prefix_and_spreads_new_ones() {
        let p = "x".repeat(640);
        let q = "y".repeat(640);
        let profiles = vec![WorkerProfile::new("a"), WorkerProfile::new("b")];
        let trace = [req(0.0, &[&p]), req(1.0, &[&q]), req(2.0, &[&p, "more"])];
        let (queries, hits, sent) = oracle(&trace, &profiles);
        // Salt block + 10 blocks each; the third finds its salt and the whole prefix (11 blocks).
        assert_eq!(queries, (704 / 4 * 2 + 708 / 4) as u64);
        assert_eq!(hits, 11 * 16);
        assert_eq!(sent, vec![2, 1]);
    }

    #[test]
    fn the_floor_prefills_only_blocks_no_earlier_request_carried_on_the_fastest_worker() {
        let p = "x".repeat(640);
        let mut fast = WorkerProfile::new("fast");
        fast.decode_step = std::time::Duration::from_millis(10);
        fast.prefill_per_token = std::time::Duration::from_millis(1);
        let mut slow = fast.clone();
        slow.decode_step *= 2;
        slow.prefill_per_token *= 2;
        let trace = [req(0.0, &[&p]), req(1.0, &[&p, "more"]), req(2.0, &[&p])];
        let floor = ttft_floor(&trace, &[slow, fast]);
        // First: all 176 tokens. Second: its 11 cached blocks skipped, 1 token left. Third: the
        // same 11 blocks, but never the last token: 10 blocks skipped, 16 tokens left.
        let ms = |v: f64| (v * 1000.0).round();
        assert_eq!(
            floor.iter().map(|&v| ms(v)).collect::<Vec<_>>(),
            [186.0, 11.0, 26.0]
        );
    }

    #[test]
    fn sessions_resend_their_history() {
        let a = <Args as clap::Parser>::parse_from(["bench", "--workload", "prefix"]);
        let spec = TraceSpec {
            seed: 3,
            duration: 20.0,
            interactive_rps: 1.0,
            bulk_rps: 0.0,
            interactive_burst: 1.0,
            bulk_burst: 1.0,
            burst_start: 0.0,
            burst_every: 0.0,
            burst_len: 0.0,
            interactive_max_tokens: (8, 8),
            interactive_prompt_chars: (1, 1),
            bulk_max_tokens: (1, 1),
            bulk_prompt_chars: (1, 1),
        };
        let trace = generate(&a, &spec);
        assert!(!trace.is_empty());
        let later: Vec<&Req> = trace
            .iter()
            .filter(|r| r.messages.as_ref().unwrap().len() > 2)
            .collect();
        assert!(!later.is_empty(), "some session has a second turn");
        for r in later {
            let m = r.messages.as_ref().unwrap();
            let first = trace
                .iter()
                .find(|f| {
                    let fm = f.messages.as_ref().unwrap();
                    fm.len() == 2 && fm[..] == m[..2]
                })
                .expect("the session's first turn is in the trace");
            assert!(first.at < r.at);
        }
    }
}
