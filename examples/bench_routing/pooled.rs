//! The target verdict over every seed of a scenario at once, read back from the per-request CSVs.
//!
//! One run's interactive p99 is its 2nd or 3rd slowest request and its bulk completed/s hinges on
//! its last bulk completion, so single runs swing widely. Pooling the seeds gives a p99 over
//! every interactive request of the scenario and a completed/s over the summed spans.

use crate::report::{is_gpulb, pct, variant_target};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One request as the CSV has it (ok requests only matter here).
struct Row {
    interactive: bool,
    ok: bool,
    ttft: Option<f64>,
    end: f64,
    e2e: f64,
}

fn parse_csv(text: &str, path: &Path) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| -> Result<f64, String> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{}: line {}: bad field {i}", path.display(), n + 1))
        };
        if f.len() < 10 {
            return Err(format!(
                "{}: line {}: {} fields, want 10",
                path.display(),
                n + 1,
                f.len()
            ));
        }
        let (at, e2e) = (num(3)?, num(6)?);
        rows.push(Row {
            interactive: f[1] == "interactive",
            ok: f[4] == "ok",
            ttft: f[5].parse().ok(),
            end: at + e2e,
            e2e,
        });
    }
    Ok(rows)
}

/// One target's figures over one seed, or pooled over several.
#[derive(Default, Clone)]
struct Figures {
    ttft: Vec<f64>,
    bulk_ok: usize,
    bulk_span: f64,
    bulk_e2e: Vec<f64>,
}

impl Figures {
    fn from_rows(rows: &[Row]) -> Figures {
        let ok = rows.iter().filter(|r| r.ok);
        let mut ttft: Vec<f64> = ok
            .clone()
            .filter(|r| r.interactive)
            .filter_map(|r| r.ttft)
            .collect();
        ttft.sort_by(f64::total_cmp);
        let bulk: Vec<&Row> = ok.filter(|r| !r.interactive).collect();
        Figures {
            ttft,
            bulk_ok: bulk.len(),
            bulk_span: bulk.iter().map(|r| r.end).fold(0.0, f64::max),
            bulk_e2e: bulk.iter().map(|r| r.e2e).collect(),
        }
    }

    fn add(&mut self, other: &Figures) {
        self.ttft.extend_from_slice(&other.ttft);
        self.ttft.sort_by(f64::total_cmp);
        self.bulk_ok += other.bulk_ok;
        self.bulk_span += other.bulk_span;
        self.bulk_e2e.extend_from_slice(&other.bulk_e2e);
    }

    fn ttft_p99(&self) -> f64 {
        pct(&self.ttft, 0.99).unwrap_or(f64::NAN)
    }

    fn bulk_per_s(&self) -> f64 {
        if self.bulk_span > 0.0 {
            self.bulk_ok as f64 / self.bulk_span
        } else {
            0.0
        }
    }

    fn bulk_e2e_mean(&self) -> f64 {
        self.bulk_e2e.iter().sum::<f64>() / self.bulk_e2e.len().max(1) as f64
    }
}

/// gpulb variant `name`'s ratios against the best baseline of `figures` (target name ->
/// figures; every gpulb variant is left out of the baselines): interactive p99 TTFT (lower is
/// better), bulk completed/s and bulk mean E2E, with the baselines' names.
fn ratios(figures: &BTreeMap<String, Figures>, name: &str) -> Option<[(f64, String); 3]> {
    let g = figures.get(name)?;
    let peers = figures.iter().filter(|(n, _)| !is_gpulb(n));
    let best = |key: &dyn Fn(&Figures) -> f64, lower: bool| {
        peers
            .clone()
            .map(|(n, f)| (key(f), n.clone()))
            .reduce(|a, b| if (b.0 < a.0) == lower { b } else { a })
    };
    let (ttft, ttft_by) = best(&Figures::ttft_p99, true)?;
    let (bulk, bulk_by) = best(&Figures::bulk_per_s, false)?;
    let (mean, mean_by) = best(&Figures::bulk_e2e_mean, true)?;
    Some([
        (g.ttft_p99() / ttft, ttft_by),
        (g.bulk_per_s() / bulk, bulk_by),
        (g.bulk_e2e_mean() / mean, mean_by),
    ])
}

/// The pooled table and verdict for the runs under `dir` (a scenario's `--out-dir`: `seed-N/`
/// directories holding `TARGET-requests.csv`), as markdown.
pub fn report(dir: &Path) -> Result<String, String> {
    let read = |p: &Path| std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut seeds: Vec<_> = read(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .collect();
    seeds.sort();
    let mut per_seed: Vec<(String, BTreeMap<String, Figures>)> = Vec::new();
    for seed in &seeds {
        let mut figures = BTreeMap::new();
        for entry in read(seed)?.filter_map(|e| e.ok().map(|e| e.path())) {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(target) = name
                .as_deref()
                .and_then(|n| n.strip_suffix("-requests.csv"))
            else {
                continue;
            };
            let text =
                std::fs::read_to_string(&entry).map_err(|e| format!("{}: {e}", entry.display()))?;
            figures.insert(
                target.to_string(),
                Figures::from_rows(&parse_csv(&text, &entry)?),
            );
        }
        let label = seed
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        per_seed.push((label, figures));
    }
    // Pool only targets present in every seed, so each is judged on the same requests.
    let mut pooled: BTreeMap<String, Figures> = BTreeMap::new();
    if let Some((_, first)) = per_seed.first() {
        for name in first.keys() {
            if per_seed.iter().all(|(_, f)| f.contains_key(name)) {
                let mut sum = Figures::default();
                per_seed.iter().for_each(|(_, f)| sum.add(&f[name]));
                pooled.insert(name.clone(), sum);
            }
        }
    }
    if pooled.is_empty() {
        return Err(format!(
            "no seed-N/TARGET-requests.csv under {}",
            dir.display()
        ));
    }
    let mut t = String::new();
    let labels: Vec<&str> = per_seed.iter().map(|(l, _)| l.as_str()).collect();
    let _ = writeln!(
        t,
        "Pooled over {} ({} runs):\n",
        labels.join(", "),
        labels.len()
    );
    let _ = writeln!(t, "| target | interactive ok | interactive TTFT p99 ms | bulk ok | bulk completed/s (summed spans) | bulk E2E mean s |");
    let _ = writeln!(t, "|---|--:|--:|--:|--:|--:|");
    for (name, f) in &pooled {
        let _ = writeln!(
            t,
            "| {name} | {} | {:.0} | {} | {:.3} | {:.2} |",
            f.ttft.len(),
            f.ttft_p99() * 1000.0,
            f.bulk_ok,
            f.bulk_per_s(),
            f.bulk_e2e_mean()
        );
    }
    for name in pooled.keys().filter(|n| is_gpulb(n)) {
        against_baselines(&mut t, name, &pooled, &per_seed);
    }
    if pooled.contains_key("gpulb") {
        for name in pooled.keys().filter(|n| is_gpulb(n) && *n != "gpulb") {
            against_gpulb(&mut t, name, &pooled, &per_seed);
        }
    }
    Ok(t)
}

/// Per-seed figures: (seed-N label, target name -> figures).
type PerSeed = [(String, BTreeMap<String, Figures>)];

fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "NOT MET"
    }
}

fn list(ratios: &[f64]) -> String {
    ratios
        .iter()
        .map(|r| format!("{r:.3}x"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// gpulb variant `name` against the best baseline, pooled and per run (nothing without a
/// baseline).
fn against_baselines(
    t: &mut String,
    name: &str,
    pooled: &BTreeMap<String, Figures>,
    per_seed: &PerSeed,
) {
    let Some([(ti, ti_by), (tb, tb_by), (tm, tm_by)]) = ratios(pooled, name) else {
        return;
    };
    let per_run: Vec<[(f64, String); 3]> = per_seed
        .iter()
        .filter_map(|(_, f)| ratios(f, name))
        .collect();
    let count =
        |i: usize, met: &dyn Fn(f64) -> bool| per_run.iter().filter(|r| met(r[i].0)).count();
    let column = |i: usize| list(&per_run.iter().map(|r| r[i].0).collect::<Vec<_>>());
    let _ = writeln!(t, "\n{name} against the target, pooled:\n");
    let _ = writeln!(
        t,
        "- interactive p99 TTFT: {name} {:.3}x of the best baseline ({ti_by}) (target <= 0.5x): {}",
        ti,
        verdict(ti <= 0.5)
    );
    let _ = writeln!(
        t,
        "- bulk completed/s: {name} {:.3}x of the best baseline ({tb_by}) (target >= 1x): {}",
        tb,
        verdict(tb >= 1.0)
    );
    let _ = writeln!(t, "- (not part of the target) bulk mean E2E: {name} {:.3}x of the best baseline ({tm_by}) (lower is better)", tm);
    let _ = writeln!(
        t,
        "\n{name} per run (each against the best baseline of that run):\n"
    );
    let _ = writeln!(
        t,
        "- interactive p99 TTFT: {} (met in {} of {})",
        column(0),
        count(0, &|r| r <= 0.5),
        per_run.len()
    );
    let _ = writeln!(
        t,
        "- bulk completed/s: {} (met in {} of {})",
        column(1),
        count(1, &|r| r >= 1.0),
        per_run.len()
    );
    let _ = writeln!(t, "- bulk mean E2E: {}", column(2));
}

/// gpulb variant `name` against header-classified gpulb: interactive p99 TTFT and bulk
/// completed/s ratios (target: no worse, <= 1x and >= 1x), pooled and per run.
fn against_gpulb(
    t: &mut String,
    name: &str,
    pooled: &BTreeMap<String, Figures>,
    per_seed: &PerSeed,
) {
    let pair = |f: &BTreeMap<String, Figures>| -> Option<(f64, f64)> {
        let (v, g) = (f.get(name)?, f.get("gpulb")?);
        Some((v.ttft_p99() / g.ttft_p99(), v.bulk_per_s() / g.bulk_per_s()))
    };
    let Some((ti, tb)) = pair(pooled) else {
        return;
    };
    let (ttft_max, bulk_min) = variant_target(name);
    let per_run: Vec<(f64, f64)> = per_seed.iter().filter_map(|(_, f)| pair(f)).collect();
    let ttft: Vec<f64> = per_run.iter().map(|r| r.0).collect();
    let bulk: Vec<f64> = per_run.iter().map(|r| r.1).collect();
    let _ = writeln!(t, "\n{name} against gpulb (header-classified), pooled:\n");
    let _ = writeln!(
        t,
        "- interactive p99 TTFT: {name} {:.3}x of gpulb (target <= {ttft_max}x): {}",
        ti,
        verdict(ti <= ttft_max)
    );
    let _ = writeln!(
        t,
        "- bulk completed/s: {name} {:.3}x of gpulb (target >= {bulk_min}x): {}",
        tb,
        verdict(tb >= bulk_min)
    );
    let _ = writeln!(t, "\n{name} against gpulb, per run:\n");
    let _ = writeln!(
        t,
        "- interactive p99 TTFT: {} (met in {} of {})",
        list(&ttft),
        ttft.iter().filter(|r| **r <= ttft_max).count(),
        per_run.len()
    );
    let _ = writeln!(
        t,
        "- bulk completed/s: {} (met in {} of {})",
        list(&bulk),
        bulk.iter().filter(|r| **r >= bulk_min).count(),
        per_run.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "index,class,tenant,at_s,status,ttft_s,e2e_s,tokens,worker,lateness_s\n";

    fn figures(lines: &[&str]) -> Figures {
        let text = format!("{HEAD}{}\n", lines.join("\n"));
        Figures::from_rows(&parse_csv(&text, Path::new("t.csv")).unwrap())
    }

    #[test]
    fn pools_p99_over_all_requests_and_bulk_over_summed_spans() {
        // Seed A: bulk ends at 10 s (2 ok); seed B: bulk ends at 30 s (1 ok, 1 error).
        let mut g = figures(&[
            "0,interactive,a,0.0,ok,0.1,1.0,10,gpu0,0",
            "1,bulk,x,1.0,ok,9.0,9.0,100,gpu0,0",
            "2,bulk,x,2.0,ok,8.0,8.0,100,gpu1,0",
        ]);
        g.add(&figures(&[
            "0,interactive,a,0.0,ok,0.3,1.0,10,gpu0,0",
            "1,interactive,a,0.0,error:timeout,,1.0,0,gpu0,0",
            "2,bulk,x,5.0,ok,25.0,25.0,100,gpu0,0",
            "3,bulk,x,6.0,error:short,,40.0,10,gpu0,0",
        ]));
        assert_eq!(g.ttft, vec![0.1, 0.3]);
        assert_eq!(g.ttft_p99(), 0.3);
        assert_eq!(g.bulk_ok, 3);
        assert_eq!(g.bulk_span, 40.0);
        assert!((g.bulk_per_s() - 3.0 / 40.0).abs() < 1e-12);
        assert!((g.bulk_e2e_mean() - 14.0).abs() < 1e-12);
    }

    #[test]
    fn ratios_take_each_figure_from_its_best_peer() {
        let mut all = BTreeMap::new();
        all.insert(
            "gpulb".to_string(),
            figures(&[
                "0,interactive,a,0,ok,0.2,1,1,g,0",
                "1,bulk,x,0,ok,10,10,1,g,0",
            ]),
        );
        // peer-a: better TTFT; peer-b: better bulk.
        all.insert(
            "peer-a".to_string(),
            figures(&[
                "0,interactive,a,0,ok,0.4,1,1,g,0",
                "1,bulk,x,0,ok,20,20,1,g,0",
            ]),
        );
        all.insert(
            "peer-b".to_string(),
            figures(&[
                "0,interactive,a,0,ok,0.8,1,1,g,0",
                "1,bulk,x,0,ok,8,8,1,g,0",
            ]),
        );
        let got = ratios(&all, "gpulb").unwrap();
        let want = [(0.5, "peer-a"), (0.8, "peer-b"), (1.25, "peer-b")];
        for ((ratio, by), (want_ratio, want_by)) in got.iter().zip(want) {
            assert!(
                (ratio - want_ratio).abs() < 1e-9 && by == want_by,
                "{got:?}"
            );
        }
    }

    #[test]
    fn a_gpulb_variant_is_no_baseline_and_is_judged_against_gpulb() {
        let mut all = BTreeMap::new();
        let one = |ttft: &str, e2e: &str| {
            figures(&[
                &format!("0,interactive,a,0,ok,{ttft},1,1,g,0"),
                &format!("1,bulk,x,0,ok,{e2e},{e2e},1,g,0"),
            ])
        };
        all.insert("gpulb".to_string(), one("0.2", "10"));
        all.insert("gpulb-body".to_string(), one("0.1", "5"));
        all.insert("peer".to_string(), one("0.4", "20"));
        // gpulb-body is better than the peer, but gpulb is judged against the peer only.
        let got = ratios(&all, "gpulb").unwrap();
        assert!(
            (got[0].0 - 0.5).abs() < 1e-9 && got[0].1 == "peer",
            "{got:?}"
        );
        let per_seed = vec![("seed-1".to_string(), all.clone())];
        let mut t = String::new();
        against_gpulb(&mut t, "gpulb-body", &all, &per_seed);
        assert!(
            t.contains("interactive p99 TTFT: gpulb-body 0.500x of gpulb (target <= 1x): MET"),
            "{t}"
        );
        assert!(
            t.contains("bulk completed/s: gpulb-body 2.000x of gpulb (target >= 1x): MET"),
            "{t}"
        );
        // Replicas are held to 1.2x and 0.9x of one gpulb carrying the whole trace.
        all.insert("gpulb-x2".to_string(), one("0.22", "12.5"));
        let mut t = String::new();
        against_gpulb(&mut t, "gpulb-x2", &all, &per_seed);
        assert!(
            t.contains("gpulb-x2 1.100x of gpulb (target <= 1.2x): MET"),
            "{t}"
        );
        assert!(
            t.contains("gpulb-x2 0.800x of gpulb (target >= 0.9x): NOT MET"),
            "{t}"
        );
    }

    #[test]
    fn a_malformed_line_is_an_error_naming_the_file_and_line() {
        let err = parse_csv(&format!("{HEAD}0,bulk,x\n"), Path::new("t.csv"))
            .err()
            .unwrap();
        assert!(err.contains("t.csv: line 2"), "{err}");
    }
}
