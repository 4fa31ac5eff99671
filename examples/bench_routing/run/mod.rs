//! One benchmark run: the trace set up once, every target in turn sent that same trace on a
//! fleet restarted for it (same addresses, cold caches), then the results written into the run
//! directory.

mod fleet;
mod header;
mod ready;
mod replay;
mod target;

pub use target::Beside;

use crate::abuse::AbuseSpec;
use crate::targets::Target;
use crate::trace::{self, TraceSpec};
use crate::Args;
use crate::{abuse_report, prefix, reload_report, report};
use fleet::Bench;
use std::path::PathBuf;
use std::sync::Arc;
use target::Plan;

/// Runs every target of `a` against the simulated fleet and writes DIR/seed-N/results.md.
pub fn run(a: &Args) -> Result<(), String> {
    let targets = checked_targets(a)?;
    let gpulb_bin = gpulb_bin(a, &targets)?;
    let dir = run_dir(a)?;
    let spec = trace_spec(a);
    let prefix_mode = a.workload == "prefix";
    let trace = Arc::new(if prefix_mode {
        prefix::generate(a, &spec)
    } else {
        trace::generate(&spec)
    });
    let profiles = fleet::profiles(a);
    let mut head = header::header(a, &spec, &trace, &profiles, &gpulb_bin);
    if prefix_mode {
        head.push_str(&prefix::describe(a, &trace));
        head.push_str(&prefix::describe_bounds(&trace, &profiles));
    }
    eprint!("{head}");
    if a.describe_only {
        return Ok(());
    }

    let mut bench = Bench::start(a.client_threads, &profiles)?;
    let plan = Plan::new(a, &dir, &gpulb_bin, trace.clone(), bench.addrs());
    let mut runs = Vec::new();
    let mut configs = Vec::new();
    let mut pairs = Vec::new();
    let mut reload_pairs = Vec::new();
    for &target in &targets {
        let (run, config, beside) = target::run_target(&mut bench, &plan, target, None, false)?;
        configs.push((target.name().to_string(), config));
        if a.reload_every.is_some() {
            let (reloading, _, reloading_beside) =
                target::run_target(&mut bench, &plan, target, None, true)?;
            reload_pairs.push(reload_report::Pair {
                steady: (run, beside),
                reloading: (reloading, reloading_beside),
            });
            continue;
        }
        match abuse_spec(a) {
            Some(spec) => {
                let (abused, _, abused_beside) =
                    target::run_target(&mut bench, &plan, target, Some(spec), false)?;
                pairs.push(abuse_report::Pair {
                    clean: (run, beside),
                    abused: (abused, abused_beside),
                });
            }
            None => runs.push(run),
        }
    }
    // Let the fleet settle before dropping it (bounded).
    let _ = bench.block_on(fleet::wait_idle(&bench.fleet));

    let mut md = match (abuse_spec(a), a.reload_every) {
        (_, Some(every)) => reload_report::document(&head, every, &reload_pairs),
        (Some(spec), None) => abuse_report::document(&head, spec, &pairs),
        (None, None) => report::document(a.seed, &head, &configs, &runs, a.workers),
    };
    if prefix_mode {
        md.push_str(&prefix::section(a, &trace, &profiles, &runs));
    }
    let out = dir.join("results.md");
    std::fs::write(&out, &md).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("{md}");
    eprintln!("[bench] written to {}", out.display());
    bench.shutdown();
    Ok(())
}

/// The abuse to send beside each target's second run, with `--abuse`.
fn abuse_spec(a: &Args) -> Option<AbuseSpec> {
    a.abuse.then(|| AbuseSpec {
        slowloris: a.slowloris,
        idle: a.idle,
        stalled: a.stalled,
        drip: std::time::Duration::from_millis(a.drip_ms),
    })
}

/// The targets to run, once the fleet and weight arguments are known to make sense.
fn checked_targets(a: &Args) -> Result<Vec<Target>, String> {
    let targets: Vec<Target> = a
        .targets
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<_, _>>()?;
    if a.abuse && a.reload_every.is_some() {
        return Err("--abuse and --reload-every are separate benchmarks: give one".into());
    }
    if a.workers == 0 || a.duration <= 0.0 {
        return Err("--workers and --duration must be > 0".into());
    }
    if !a.weights.is_empty() && (a.weights.len() != a.workers || a.weights.contains(&0)) {
        return Err(format!("--weights needs {} values, each >= 1", a.workers));
    }
    Ok(targets)
}

/// The gpulb binary to start, checked to exist when gpulb is among the targets.
fn gpulb_bin(a: &Args, targets: &[Target]) -> Result<PathBuf, String> {
    let gpulb_bin = a.gpulb_bin.clone().unwrap_or_else(default_gpulb_bin);
    if targets.iter().any(|t| t.is_gpulb()) && !gpulb_bin.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release --bin gpulb --examples` first",
            gpulb_bin.display()
        ));
    }
    Ok(gpulb_bin)
}

/// gpulb next to this example (target/PROFILE/gpulb), else target/release/gpulb.
fn default_gpulb_bin() -> PathBuf {
    if let Some(p) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|d| d.join("gpulb")))
        .filter(|p| p.exists())
    {
        return p;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/gpulb")
}

/// DIR/seed-N, emptied and created afresh, as an absolute path.
fn run_dir(a: &Args) -> Result<PathBuf, String> {
    let dir = a.out_dir.join(format!("seed-{}", a.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    // nginx workers may run as another user: let them into the run directory.
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    }
    Ok(dir)
}

/// The trace's shape from the arguments (a class's burst factor defaults to --burst-factor).
fn trace_spec(a: &Args) -> TraceSpec {
    TraceSpec {
        seed: a.seed,
        duration: a.duration,
        interactive_rps: a.interactive_rps,
        bulk_rps: a.bulk_rps,
        interactive_burst: a.interactive_burst.unwrap_or(a.burst_factor),
        bulk_burst: a.bulk_burst.unwrap_or(a.burst_factor),
        burst_start: a.burst_start,
        burst_every: a.burst_every,
        burst_len: a.burst_len,
        interactive_max_tokens: a.interactive_tokens,
        interactive_prompt_chars: a.interactive_prompt,
        bulk_max_tokens: a.bulk_tokens,
        bulk_prompt_chars: a.bulk_prompt,
    }
}
