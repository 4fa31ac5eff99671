//! The abuse benchmark's result: for each target, the trace served clean and beside hostile
//! clients, side by side — interactive time to first token, errors, healthy backends ejected,
//! the proxy's memory, and how much of the abuse it still held at the end.

use crate::abuse::AbuseSpec;
use crate::report::{class_stats, TargetRun};
use crate::run::Beside;
use crate::trace::Class;
use std::fmt::Write as _;

/// One target's clean and abused turns.
pub struct Pair {
    pub clean: (TargetRun, Beside),
    pub abused: (TargetRun, Beside),
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.0}", s * 1000.0))
}

fn mib(kb: u64) -> String {
    format!("{:.1}", kb as f64 / 1024.0)
}

/// The markdown document: the header, the comparison table, the abuse's own figures and the
/// verdict against the target (abused interactive TTFT p99 within 10% of clean, no ejection).
pub fn document(head: &str, spec: AbuseSpec, pairs: &[Pair]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{head}");
    let _ = writeln!(
        md,
        "Abuse beside the trace: {} slowloris connections (a header line every {} ms, reconnecting when cut), {} idle keep-alive connections (one GET /v1/models each), {} stalled uploads (100 kB announced, 1 kB sent; sent again when answered).\n",
        spec.slowloris,
        spec.drip.as_millis(),
        spec.idle,
        spec.stalled
    );
    let _ = writeln!(md, "| target | interactive TTFT p99 clean, ms | abused, ms | abused / clean | interactive ok clean / abused | bulk ok clean / abused | backends ejected (abused) | RSS clean, MiB | RSS abused, MiB |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for p in pairs {
        let (clean, abused) = (&p.clean.0, &p.abused.0);
        let ci = class_stats(&clean.outcomes, Class::Interactive, None);
        let ai = class_stats(&abused.outcomes, Class::Interactive, None);
        let cb = class_stats(&clean.outcomes, Class::Bulk, None);
        let ab = class_stats(&abused.outcomes, Class::Bulk, None);
        let ratio = match (ci.ttft_p99, ai.ttft_p99) {
            (Some(c), Some(a)) if c > 0.0 => format!("{:.3}", a / c),
            _ => "-".into(),
        };
        let ejected = p.abused.1.ejections.map_or("n/a".into(), |e| e.to_string());
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {}/{} / {}/{} | {}/{} / {}/{} | {} | {} | {} |",
            clean.name,
            ms(ci.ttft_p99),
            ms(ai.ttft_p99),
            ratio,
            ci.ok,
            ci.sent,
            ai.ok,
            ai.sent,
            cb.ok,
            cb.sent,
            ab.ok,
            ab.sent,
            ejected,
            mib(p.clean.1.rss_kb),
            mib(p.abused.1.rss_kb),
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "What the abuse found at the end of the trace:\n");
    let _ = writeln!(md, "| target | slowloris open / cut | idle open / refused | stalled uploads open | stalled uploads answered |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for p in pairs {
        let Some(r) = &p.abused.1.abuse else { continue };
        let answers: Vec<String> = r
            .stalled_answers
            .iter()
            .map(|(status, n)| format!("{status}: {n}"))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} / {} | {} / {} | {} | {} |",
            p.clean.0.name,
            r.slowloris_open,
            r.slowloris_cut,
            r.idle_open,
            r.idle_refused,
            r.stalled_open,
            if answers.is_empty() {
                "none".into()
            } else {
                answers.join(", ")
            },
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "Target: abused interactive TTFT p99 within 10% of clean (ratio <= 1.10), no healthy backend ejected.\n");
    for p in pairs {
        let ci = class_stats(&p.clean.0.outcomes, Class::Interactive, None);
        let ai = class_stats(&p.abused.0.outcomes, Class::Interactive, None);
        let within = matches!((ci.ttft_p99, ai.ttft_p99), (Some(c), Some(a)) if a <= c * 1.10);
        let no_ejection = p.abused.1.ejections.map(|e| e == 0);
        let _ = writeln!(
            md,
            "- {}: p99 {}; ejections {}",
            p.clean.0.name,
            if within { "met" } else { "not met" },
            match no_ejection {
                Some(true) => "0 (met)",
                Some(false) => "above 0 (not met)",
                None => "not observable",
            }
        );
    }
    md
}
