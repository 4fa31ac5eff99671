//! The run header: command, machine, peers, fleet, trace and offered load, as markdown list
//! items (printed at the start and atop results.md).

use crate::trace::{Class, Req, TraceSpec};
use crate::Args;
use gpulb::tools::sim::WorkerProfile;
use std::fmt::Write as _;
use std::path::Path;

/// The header of a run with these arguments, trace and fleet.
pub fn header(
    a: &Args,
    spec: &TraceSpec,
    trace: &[Req],
    profiles: &[WorkerProfile],
    gpulb_bin: &Path,
) -> String {
    let mut head = String::new();
    setup_lines(&mut head, a, gpulb_bin);
    fleet_lines(&mut head, a.workers, profiles);
    trace_line(&mut head, a, spec, trace);
    load_line(&mut head, a, spec, trace, profiles);
    head
}

/// Command, machine, peer versions and the proxies' and harness's threads.
fn setup_lines(head: &mut String, a: &Args, gpulb_bin: &Path) {
    let invocation: Vec<String> = std::env::args().collect();
    let _ = writeln!(head, "- command: `{}`", invocation.join(" "));
    let _ = writeln!(head, "- machine: {}", machine());
    let _ = writeln!(
        head,
        "- peers: {}; {}; gpulb: {} (git {})",
        command_line("nginx", &["-v"]),
        command_line("haproxy", &["-v"]),
        gpulb_bin.display(),
        command_line("git", &["describe", "--always", "--dirty"]),
    );
    let _ = writeln!(
        head,
        "- every proxy: {} worker thread(s)/process(es), logs off, backend weights {}; harness client: {} tokio thread(s); fleet: its own 1-thread runtime in the harness process",
        a.threads,
        if a.weights.is_empty() {
            "all equal".to_string()
        } else {
            a.weights.iter().map(ToString::to_string).collect::<Vec<_>>().join("/")
        },
        a.client_threads
    );
}

/// One line per simulated worker.
fn fleet_lines(head: &mut String, workers: usize, profiles: &[WorkerProfile]) {
    let _ = writeln!(head, "- fleet ({workers} simulated workers):");
    for p in profiles {
        let _ = writeln!(
            head,
            "  - {}: decode step {:.0} ms + {:.1} ms per extra running sequence, prefill {:.0} µs/token, max_running {}, KV budget {} tokens",
            p.name,
            p.decode_step.as_secs_f64() * 1e3,
            p.step_per_running.as_secs_f64() * 1e3,
            p.prefill_per_token.as_secs_f64() * 1e6,
            p.max_running,
            p.kv_budget_tokens
        );
    }
}

/// The trace: requests per class, their shapes and the burst windows.
fn trace_line(head: &mut String, a: &Args, spec: &TraceSpec, trace: &[Req]) {
    let count = |c: Class| trace.iter().filter(|r| r.class == c).count();
    let _ = writeln!(
        head,
        "- trace: seed {}, {} s of arrivals; interactive {} requests (Poisson {}/s; streaming chat, max_tokens {}-{}, prompt {}-{} chars, tenants a:b:c = 6:3:1), bulk {} requests (Poisson {}/s; non-streaming, max_tokens {}-{}, prompt {}-{} chars, tenants x:y = 3:1); bursts (interactive x{}, bulk x{}) at {} s",
        a.seed,
        a.duration,
        count(Class::Interactive),
        a.interactive_rps,
        a.interactive_tokens.0,
        a.interactive_tokens.1,
        a.interactive_prompt.0,
        a.interactive_prompt.1,
        count(Class::Bulk),
        a.bulk_rps,
        a.bulk_tokens.0,
        a.bulk_tokens.1,
        a.bulk_prompt.0,
        a.bulk_prompt.1,
        spec.interactive_burst,
        spec.bulk_burst,
        spec.burst_windows()
            .iter()
            .map(|(s, e)| format!("{s:.0}-{e:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
}

/// Offered decode load (base and burst rates, total tokens) against the fleet's capacity.
fn load_line(
    head: &mut String,
    a: &Args,
    spec: &TraceSpec,
    trace: &[Req],
    profiles: &[WorkerProfile],
) {
    let capacity: f64 = profiles
        .iter()
        .map(|p| {
            let step =
                p.decode_step + p.step_per_running * (p.max_running.saturating_sub(1)) as u32;
            p.max_running as f64 / step.as_secs_f64()
        })
        .sum();
    let tokens: u64 = trace.iter().map(|r| u64::from(r.max_tokens)).sum();
    let avg = |lo: u32, hi: u32| f64::from(lo + hi) / 2.0;
    let interactive_load = a.interactive_rps * avg(a.interactive_tokens.0, a.interactive_tokens.1);
    let bulk_load = a.bulk_rps * avg(a.bulk_tokens.0, a.bulk_tokens.1);
    let base_load = interactive_load + bulk_load;
    let burst_load = interactive_load * spec.interactive_burst + bulk_load * spec.bulk_burst;
    let _ = writeln!(
        head,
        "- offered decode load: {:.0} tokens/s at base rates, {:.0} tokens/s in bursts, {} tokens in all; fleet decode capacity with full batches about {:.0} tokens/s (ignores prefill and KV limits)",
        base_load,
        burst_load,
        tokens,
        capacity
    );
}

/// First line of `cmd args` (stdout, else stderr), e.g. a version string.
fn command_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| format!("unavailable ({e})"))
}

/// Cores, CPU model and load average of this machine.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), load average at start {load}")
}
