//! The reload benchmark's result: for each target, the trace served steady and while its config
//! was rewritten and reloaded on a fixed cadence, side by side — interactive time to first
//! token and end-to-end latency, errors, and what the reloads did.

use crate::report::{self, class_stats, ClassStats, TargetRun};
use crate::run::Beside;
use crate::trace::Class;
use std::fmt::Write as _;
use std::time::Duration;

/// One target's steady and reloading turns.
pub struct Pair {
    pub steady: (TargetRun, Beside),
    pub reloading: (TargetRun, Beside),
}

/// The allowed rise of the interactive p99s while reloading (the target: within 10%).
const WITHIN: f64 = 1.10;

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.0}", s * 1000.0))
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.2}"))
}

fn ratio(steady: Option<f64>, reloading: Option<f64>) -> Option<f64> {
    match (steady, reloading) {
        (Some(s), Some(r)) if s > 0.0 => Some(r / s),
        _ => None,
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.3}"))
}

/// Errors and sheds over every class of a turn.
fn failures(run: &TargetRun) -> (usize, usize) {
    Class::ALL
        .into_iter()
        .map(|c| class_stats(&run.outcomes, c, None))
        .fold((0, 0), |(e, s), c| (e + c.errors, s + c.shed))
}

/// The figures a verdict needs for one target.
struct Verdict {
    ttft: Option<f64>,
    e2e: Option<f64>,
    errors: usize,
    shed_added: bool,
}

impl Verdict {
    fn of(p: &Pair) -> Verdict {
        let (si, ri) = interactive(p);
        let (_, steady_shed) = failures(&p.steady.0);
        let (errors, shed) = failures(&p.reloading.0);
        Verdict {
            ttft: ratio(si.ttft_p99, ri.ttft_p99),
            e2e: ratio(si.e2e_p99, ri.e2e_p99),
            errors,
            shed_added: shed > steady_shed,
        }
    }

    fn p99_met(&self) -> bool {
        matches!((self.ttft, self.e2e), (Some(t), Some(e)) if t <= WITHIN && e <= WITHIN)
    }

    /// The worse of the two p99 ratios (what "within 10%" is judged on).
    fn worst(&self) -> f64 {
        self.ttft
            .unwrap_or(f64::INFINITY)
            .max(self.e2e.unwrap_or(f64::INFINITY))
    }
}

fn interactive(p: &Pair) -> (ClassStats, ClassStats) {
    (
        class_stats(&p.steady.0.outcomes, Class::Interactive, None),
        class_stats(&p.reloading.0.outcomes, Class::Interactive, None),
    )
}

/// The markdown document: the header, the comparison table, the error breakdown and the
/// verdicts against the target (interactive p99s within 10% of steady, zero errors, better
/// than every peer).
pub fn document(head: &str, every: Duration, pairs: &[Pair]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{head}");
    let _ = writeln!(
        md,
        "Each target serves the trace twice from a fresh start: steady, then while its config file is rewritten with a real change and reloaded every {} ms (gpulb: POST /reload, the answer must say `applied`; nginx: SIGHUP to the master, as `nginx -s reload` sends; HAProxy -W: SIGUSR2 to the master, listeners handed over through `expose-fd listeners`).\n",
        every.as_millis()
    );
    let _ = writeln!(md, "| target | interactive TTFT p50 steady / reloading, ms | TTFT p99 steady / reloading, ms | TTFT p99 ratio | interactive E2E p50 steady / reloading, s | E2E p99 steady / reloading, s | E2E p99 ratio | bulk ok steady / reloading | errors steady / reloading | sheds steady / reloading | reloads sent / applied (failed) | new processes / most alive | RSS steady / reloading end, MiB |");
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for p in pairs {
        let (si, ri) = interactive(p);
        let sb = class_stats(&p.steady.0.outcomes, Class::Bulk, None);
        let rb = class_stats(&p.reloading.0.outcomes, Class::Bulk, None);
        let (se, ss) = failures(&p.steady.0);
        let (re, rs) = failures(&p.reloading.0);
        let r = p.reloading.1.reloads.clone().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} / {} | {} / {} | {} | {} / {} | {} / {} | {} | {}/{} / {}/{} | {} / {} | {} / {} | {} / {} ({}) | {} / {} | {:.1} / {:.1} |",
            p.steady.0.name,
            ms(si.ttft_p50),
            ms(ri.ttft_p50),
            ms(si.ttft_p99),
            ms(ri.ttft_p99),
            fmt_ratio(ratio(si.ttft_p99, ri.ttft_p99)),
            secs(si.e2e_p50),
            secs(ri.e2e_p50),
            secs(si.e2e_p99),
            secs(ri.e2e_p99),
            fmt_ratio(ratio(si.e2e_p99, ri.e2e_p99)),
            sb.ok,
            sb.sent,
            rb.ok,
            rb.sent,
            se,
            re,
            ss,
            rs,
            r.sent,
            r.applied,
            r.failed,
            r.new_processes,
            r.max_processes,
            p.steady.1.rss_kb as f64 / 1024.0,
            p.reloading.1.rss_kb as f64 / 1024.0,
        );
    }
    let _ = writeln!(md);
    let mut breakdown = String::new();
    for p in pairs {
        breakdown.push_str(&report::error_breakdown(std::slice::from_ref(&p.steady.0)));
        breakdown.push_str(&report::error_breakdown(std::slice::from_ref(
            &p.reloading.0,
        )));
        if let Some(e) = p
            .reloading
            .1
            .reloads
            .as_ref()
            .and_then(|r| r.last_error.clone())
        {
            let _ = writeln!(
                breakdown,
                "- {}: last failed reload: {e}",
                p.reloading.0.name
            );
        }
    }
    if !breakdown.is_empty() {
        let _ = writeln!(md, "Errors and sheds:\n\n{breakdown}");
    }
    verdicts(&mut md, pairs);
    md
}

/// One line per target against the target, then gpulb against its peers.
fn verdicts(md: &mut String, pairs: &[Pair]) {
    let _ = writeln!(md, "Target: while reloading, interactive TTFT p99 and E2E p99 within 10% of steady (ratio <= {WITHIN:.2}), zero errors; better than both peers.\n");
    for p in pairs {
        let v = Verdict::of(p);
        let _ = writeln!(
            md,
            "- {}: p99 {} (TTFT {}, E2E {}); errors while reloading {} ({}){}",
            p.steady.0.name,
            if v.p99_met() { "met" } else { "not met" },
            fmt_ratio(v.ttft),
            fmt_ratio(v.e2e),
            v.errors,
            if v.errors == 0 { "met" } else { "not met" },
            if v.shed_added {
                "; more sheds than steady"
            } else {
                ""
            },
        );
    }
    let gpulb = pairs.iter().find(|p| p.steady.0.name.starts_with("gpulb"));
    let peers: Vec<&Pair> = pairs
        .iter()
        .filter(|p| !p.steady.0.name.starts_with("gpulb"))
        .collect();
    if let (Some(g), false) = (gpulb, peers.is_empty()) {
        let gv = Verdict::of(g);
        for peer in peers {
            let pv = Verdict::of(peer);
            let _ = writeln!(
                md,
                "- {} vs {}: worse p99 ratio {:.3} vs {:.3}, errors {} vs {}: {}",
                g.steady.0.name,
                peer.steady.0.name,
                gv.worst(),
                pv.worst(),
                gv.errors,
                pv.errors,
                if gv.worst() <= pv.worst() && gv.errors <= pv.errors {
                    "not worse"
                } else {
                    "worse"
                }
            );
        }
    }
}
