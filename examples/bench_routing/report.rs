//! Per-target, per-class figures, the markdown tables, and the results document they make up.

use crate::client::{Outcome, Status};
use crate::procs::SelfCpu;
use crate::trace::{Class, INTERACTIVE_TENANTS};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Everything measured while one target served the trace.
pub struct TargetRun {
    pub name: String,
    pub outcomes: Vec<Outcome>,
    /// Requests the harness gave up on at the drain limit (counted as errors).
    pub unfinished: usize,
    pub self_cpu: SelfCpu,
    pub proxy_cpu: f64,
    /// Most requests in flight from the harness at once; times the cap made a request wait.
    pub max_inflight: usize,
    pub cap_hits: usize,
    /// Largest `waiting` seen inside each worker, and the mean `running` (sampled every 100 ms
    /// while the trace was being sent).
    pub sim_max_waiting: Vec<usize>,
    pub sim_mean_running: Vec<f64>,
    /// Largest `running + waiting` seen inside each worker (same samples).
    pub sim_max_outstanding: Vec<usize>,
    /// Each worker's counters over the replay: (prompt tokens looked up in its prefix cache,
    /// found there, requests received).
    pub prefix_cache: Vec<(u64, u64, u64)>,
    /// gpulb only: largest queue depth per class seen on /status (sampled every 500 ms).
    pub gpulb_max_queue: BTreeMap<String, usize>,
    /// gpulb only: requests answered per class at the end (`/status` `requests_total`), which
    /// shows how gpulb classified the trace (readiness probes count as bulk).
    pub gpulb_answered: BTreeMap<String, u64>,
    /// Seconds from the trace start to the last response.
    pub makespan: f64,
}

/// Nearest-rank percentile of sorted values.
pub fn pct(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The figures of one class on one target.
#[derive(Clone, Debug, Default)]
pub struct ClassStats {
    pub sent: usize,
    pub ok: usize,
    pub shed: usize,
    pub errors: usize,
    pub ttft_p50: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub e2e_p50: Option<f64>,
    pub e2e_p99: Option<f64>,
    /// Mean end-to-end time: for a fixed trace, the class's mean number in system divided by
    /// its arrival rate (Little), so a robust sign of how quickly its work was served.
    pub e2e_mean: Option<f64>,
    /// Completed requests and tokens per second of the class's span (trace start to its last
    /// completion).
    pub completed_per_s: f64,
    pub tokens_per_s: f64,
}

pub fn class_stats(outcomes: &[Outcome], class: Class, tenant: Option<&str>) -> ClassStats {
    let mine: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.class == class && tenant.is_none_or(|t| o.tenant == t))
        .collect();
    let ok: Vec<&Outcome> = mine
        .iter()
        .copied()
        .filter(|o| o.status == Status::Ok)
        .collect();
    let span = ok.iter().map(|o| o.at + o.e2e).fold(0.0, f64::max);
    let tokens: u64 = ok.iter().map(|o| u64::from(o.tokens)).sum();
    let ttft = sorted(ok.iter().filter_map(|o| o.ttft).collect());
    let e2e = sorted(ok.iter().map(|o| o.e2e).collect());
    ClassStats {
        sent: mine.len(),
        ok: ok.len(),
        shed: mine
            .iter()
            .filter(|o| matches!(o.status, Status::Shed(_)))
            .count(),
        errors: mine
            .iter()
            .filter(|o| matches!(o.status, Status::Error(_)))
            .count(),
        ttft_p50: pct(&ttft, 0.50),
        ttft_p99: pct(&ttft, 0.99),
        e2e_p50: pct(&e2e, 0.50),
        e2e_p99: pct(&e2e, 0.99),
        e2e_mean: (!e2e.is_empty()).then(|| e2e.iter().sum::<f64>() / e2e.len() as f64),
        completed_per_s: if span > 0.0 {
            ok.len() as f64 / span
        } else {
            0.0
        },
        tokens_per_s: if span > 0.0 {
            tokens as f64 / span
        } else {
            0.0
        },
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}", v * 1000.0))
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The main table: one row per target and class.
pub fn main_table(runs: &[TargetRun]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| target | class | sent | ok | shed | errors | TTFT p50 ms | TTFT p99 ms | E2E p50 s | E2E p99 s | E2E mean s | completed/s | tokens/s |"
    );
    let _ = writeln!(t, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for run in runs {
        for class in Class::ALL {
            let s = class_stats(&run.outcomes, class, None);
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0} |",
                run.name,
                class.name(),
                s.sent,
                s.ok,
                s.shed,
                s.errors,
                ms(s.ttft_p50),
                ms(s.ttft_p99),
                secs(s.e2e_p50),
                secs(s.e2e_p99),
                secs(s.e2e_mean),
                s.completed_per_s,
                s.tokens_per_s
            );
        }
    }
    t
}

/// Interactive p99 TTFT per tenant (tenants have uneven shares of the traffic).
pub fn tenant_table(runs: &[TargetRun]) -> String {
    let mut t = String::new();
    let mut head = "| target |".to_string();
    let mut rule = "|---|".to_string();
    for (name, w) in INTERACTIVE_TENANTS {
        let _ = write!(head, " {name} (weight {w}) ok / p50 / p99 ms |");
        rule.push_str("--:|");
    }
    let _ = writeln!(t, "{head}\n{rule}");
    for run in runs {
        let _ = write!(t, "| {} |", run.name);
        for (name, _) in INTERACTIVE_TENANTS {
            let s = class_stats(&run.outcomes, Class::Interactive, Some(name));
            let _ = write!(t, " {} / {} / {} |", s.ok, ms(s.ttft_p50), ms(s.ttft_p99));
        }
        t.push('\n');
    }
    t
}

/// Where requests went and what the harness itself cost.
pub fn diagnostics_table(runs: &[TargetRun], workers: usize) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| target | makespan s | interactive per gpu | bulk per gpu | max waiting inside gpu | mean running per gpu | gpulb max queue (i/b) | gpulb answered (i/b) | proxy CPU s | harness client CPU s | sim CPU s | max lateness ms | max in flight | cap hits |"
    );
    let _ = writeln!(
        t,
        "|---|--:|---|---|---|---|---|---|--:|--:|--:|--:|--:|--:|"
    );
    for run in runs {
        let per_gpu = |class: Class| {
            (0..workers)
                .map(|i| {
                    let name = format!("gpu{i}");
                    run.outcomes
                        .iter()
                        .filter(|o| o.class == class && o.worker.as_deref() == Some(name.as_str()))
                        .count()
                        .to_string()
                })
                .collect::<Vec<_>>()
                .join("/")
        };
        let waiting = run
            .sim_max_waiting
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("/");
        let running = run
            .sim_mean_running
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join("/");
        let queue = if run.gpulb_max_queue.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{}/{}",
                run.gpulb_max_queue.get("interactive").copied().unwrap_or(0),
                run.gpulb_max_queue.get("bulk").copied().unwrap_or(0)
            )
        };
        let answered = if run.gpulb_answered.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{}/{}",
                run.gpulb_answered.get("interactive").copied().unwrap_or(0),
                run.gpulb_answered.get("bulk").copied().unwrap_or(0)
            )
        };
        let lateness = run.outcomes.iter().map(|o| o.lateness).fold(0.0, f64::max);
        let _ = writeln!(
            t,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} |",
            run.name,
            run.makespan,
            per_gpu(Class::Interactive),
            per_gpu(Class::Bulk),
            waiting,
            running,
            queue,
            answered,
            run.proxy_cpu,
            run.self_cpu.client,
            run.self_cpu.sim,
            lateness * 1000.0,
            run.max_inflight,
            run.cap_hits
        );
    }
    t
}

/// Error messages by target, so "errors" is never an unexplained number.
pub fn error_breakdown(runs: &[TargetRun]) -> String {
    let mut t = String::new();
    for run in runs {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for o in &run.outcomes {
            if let Status::Error(e) = &o.status {
                *counts
                    .entry(format!("{} {}", o.class.name(), e))
                    .or_default() += 1;
            }
            if let Status::Shed(code) = &o.status {
                *counts
                    .entry(format!("{} shed HTTP {code}", o.class.name()))
                    .or_default() += 1;
            }
        }
        if run.unfinished > 0 {
            counts.insert("unfinished at the drain limit".into(), run.unfinished);
        }
        if !counts.is_empty() {
            let list: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let _ = writeln!(t, "- {}: {}", run.name, list.join("; "));
        }
    }
    t
}

/// Whether a target name is a gpulb variant (`gpulb`, `gpulb-body`): judged, never a baseline.
pub fn is_gpulb(name: &str) -> bool {
    name == "gpulb" || name.starts_with("gpulb-")
}

/// The target, computed for each gpulb variant: its interactive p99 TTFT against the
/// best baseline's, and its bulk throughput against the best baseline's; then each variant
/// other than `gpulb` against `gpulb` itself.
pub fn verdict(runs: &[TargetRun]) -> String {
    let baselines: Vec<&TargetRun> = runs.iter().filter(|r| !is_gpulb(&r.name)).collect();
    let mut t = String::new();
    if !baselines.is_empty() {
        for g in runs.iter().filter(|r| is_gpulb(&r.name)) {
            against_baselines(&mut t, g, &baselines);
        }
    }
    if let Some(g) = runs.iter().find(|r| r.name == "gpulb") {
        for v in runs
            .iter()
            .filter(|r| is_gpulb(&r.name) && r.name != "gpulb")
        {
            against_gpulb(&mut t, v, g);
        }
    }
    t
}

/// One gpulb variant's lines against the best of `baselines`.
fn against_baselines(t: &mut String, g: &TargetRun, baselines: &[&TargetRun]) {
    let name = &g.name;
    let gi = class_stats(&g.outcomes, Class::Interactive, None);
    let gb = class_stats(&g.outcomes, Class::Bulk, None);
    let best_ttft = baselines
        .iter()
        .filter_map(|r| {
            let s = class_stats(&r.outcomes, Class::Interactive, None);
            s.ttft_p99.map(|v| (v, r.name.clone()))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let best_bulk = baselines
        .iter()
        .map(|r| (class_stats(&r.outcomes, Class::Bulk, None), r.name.clone()))
        .max_by(|a, b| a.0.completed_per_s.total_cmp(&b.0.completed_per_s));
    if let (Some(gv), Some((bv, bn))) = (gi.ttft_p99, best_ttft) {
        let ratio = gv / bv;
        let _ = writeln!(
            t,
            "- interactive p99 TTFT: {name} {:.0} ms vs best baseline {bn} {:.0} ms = {:.3}x (target <= 0.5x): {}",
            gv * 1000.0,
            bv * 1000.0,
            ratio,
            if ratio <= 0.5 { "MET" } else { "NOT MET" }
        );
    }
    if let Some((bs, bn)) = best_bulk {
        let ratio = if bs.completed_per_s > 0.0 {
            gb.completed_per_s / bs.completed_per_s
        } else {
            0.0
        };
        let _ = writeln!(
            t,
            "- bulk completed/s: {name} {:.3} vs best baseline {bn} {:.3} = {:.3}x; bulk tokens/s {:.0} vs {:.0}; bulk ok {} vs {} (target >= 1x, i.e. no worse): {}",
            gb.completed_per_s,
            bs.completed_per_s,
            ratio,
            gb.tokens_per_s,
            bs.tokens_per_s,
            gb.ok,
            bs.ok,
            if ratio >= 1.0 && gb.ok >= bs.ok { "MET" } else { "NOT MET" }
        );
    }
    let best_mean = baselines
        .iter()
        .filter_map(|r| {
            class_stats(&r.outcomes, Class::Bulk, None)
                .e2e_mean
                .map(|v| (v, r.name.clone()))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some(gv), Some((bv, bn))) = (gb.e2e_mean, best_mean) {
        let _ = writeln!(
            t,
            "- (not part of the target) bulk mean E2E: {name} {gv:.2} s vs best baseline {bn} {bv:.2} s = {:.3}x (lower is better)",
            gv / bv
        );
    }
}

/// A gpulb variant (e.g. classes from the body) against header-classified `gpulb` on the same
/// trace: no worse on interactive p99 TTFT and on bulk completed/s.
fn against_gpulb(t: &mut String, v: &TargetRun, g: &TargetRun) {
    let name = &v.name;
    let (ttft_max, bulk_min) = variant_target(name);
    let (vi, gi) = (
        class_stats(&v.outcomes, Class::Interactive, None),
        class_stats(&g.outcomes, Class::Interactive, None),
    );
    if let (Some(vv), Some(gv)) = (vi.ttft_p99, gi.ttft_p99) {
        let ratio = vv / gv;
        let _ = writeln!(
            t,
            "- {name} vs gpulb, interactive p99 TTFT: {:.0} ms vs {:.0} ms = {:.3}x; interactive ok {} vs {} (target <= {ttft_max}x, every request ok): {}",
            vv * 1000.0,
            gv * 1000.0,
            ratio,
            vi.ok,
            gi.ok,
            if ratio <= ttft_max && vi.ok >= gi.ok { "MET" } else { "NOT MET" }
        );
    }
    let (vb, gb) = (
        class_stats(&v.outcomes, Class::Bulk, None),
        class_stats(&g.outcomes, Class::Bulk, None),
    );
    let ratio = if gb.completed_per_s > 0.0 {
        vb.completed_per_s / gb.completed_per_s
    } else {
        0.0
    };
    let _ = writeln!(
        t,
        "- {name} vs gpulb, bulk completed/s: {:.3} vs {:.3} = {:.3}x; bulk ok {} vs {} (target >= {bulk_min}x, every request ok): {}",
        vb.completed_per_s,
        gb.completed_per_s,
        ratio,
        vb.ok,
        gb.ok,
        if ratio >= bulk_min && vb.ok >= gb.ok { "MET" } else { "NOT MET" }
    );
}

/// What gpulb variant `name` is held to against one gpulb carrying the whole trace: the most
/// its interactive p99 TTFT may be and the least its bulk completed/s may be, as ratios.
/// Replicas (`gpulb-x2`, `gpulb-x3`...) may be 1.2x and 0.9x; every other variant no worse.
pub fn variant_target(name: &str) -> (f64, f64) {
    if name.starts_with("gpulb-x") {
        (1.2, 0.9)
    } else {
        (1.0, 1.0)
    }
}

/// One CSV line per request, for anyone who wants other figures.
pub fn csv(run: &TargetRun) -> String {
    let mut t =
        String::from("index,class,tenant,at_s,status,ttft_s,e2e_s,tokens,worker,lateness_s\n");
    for o in &run.outcomes {
        let status = match &o.status {
            Status::Ok => "ok".to_string(),
            Status::Shed(c) => format!("shed{c}"),
            Status::Error(e) => format!("error:{}", e.replace(',', ";")),
        };
        let _ = writeln!(
            t,
            "{},{},{},{:.4},{},{},{:.4},{},{},{:.4}",
            o.index,
            o.class.name(),
            o.tenant,
            o.at,
            status,
            o.ttft.map_or(String::new(), |v| format!("{v:.4}")),
            o.e2e,
            o.tokens,
            o.worker.as_deref().unwrap_or(""),
            o.lateness
        );
    }
    t
}

/// The whole results.md of a run: title, run header, configs, then every table.
pub fn document(
    seed: u64,
    head: &str,
    configs: &[(String, PathBuf)],
    runs: &[TargetRun],
    workers: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### Routing quality, seed {seed}\n");
    md.push_str(head);
    let _ = writeln!(
        md,
        "- configs: {}",
        configs
            .iter()
            .map(|(n, p)| format!("{n} `{}`", p.display()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(md, "\nPer target and class (latency percentiles over ok requests, measured from each request's scheduled time):\n");
    md.push_str(&main_table(runs));
    let _ = writeln!(md, "\nAgainst the target (\"interactive p99 TTFT at most half the best baseline's, bulk throughput no worse\"; a gpulb variant such as gpulb-body also against gpulb: no worse on either):\n");
    md.push_str(&verdict(runs));
    let _ = writeln!(md, "\nInteractive TTFT by tenant (ok requests):\n");
    md.push_str(&tenant_table(runs));
    let _ = writeln!(md, "\nRouting and harness diagnostics (per-gpu lists are gpu0/gpu1/..; waiting/running sampled every 100 ms inside the workers; CPU seconds over the replay):\n");
    md.push_str(&diagnostics_table(runs, workers));
    let errors = error_breakdown(runs);
    if !errors.is_empty() {
        let _ = writeln!(md, "\nSheds and errors:\n");
        md.push_str(&errors);
    }
    let _ = writeln!(
        md,
        "\nHarness process CPU in all (client + fleet + setup): {:.1} s",
        crate::procs::process_cpu()
    );
    md
}
