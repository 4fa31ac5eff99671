//! One target's turn: started on fresh ports, waited for (with an idle fleet), sent the trace,
//! measured and stopped; its per-request CSV written.

use super::fleet::{self, Bench};
use super::ready::wait_ready;
use super::replay::{self, Endpoint};
use crate::abuse::{Abuse, AbuseReport, AbuseSpec};
use crate::procs::{self, ChildGuard, SelfCpu};
use crate::reloader::{self, Reloader};
use crate::report::{self, TargetRun};
use crate::targets::{self, GpulbKnobs, Target};
use crate::trace::{Class, Req};
use crate::{client, Args};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every target's turn shares: the arguments, the run directory, the fleet and the trace.
pub struct Plan<'a> {
    a: &'a Args,
    dir: &'a Path,
    gpulb_bin: &'a Path,
    knobs: GpulbKnobs,
    /// `127.0.0.1:PORT` of each worker.
    workers: Vec<String>,
    trace: Arc<Vec<Req>>,
}

impl<'a> Plan<'a> {
    /// The plan for sending `trace` to targets in front of the workers at `workers`.
    pub fn new(
        a: &'a Args,
        dir: &'a Path,
        gpulb_bin: &'a Path,
        trace: Arc<Vec<Req>>,
        workers: Vec<String>,
    ) -> Plan<'a> {
        Plan {
            a,
            dir,
            gpulb_bin,
            knobs: knobs(a),
            workers,
            trace,
        }
    }

    /// The request bodies for `target` (index = trace index), salted with its name.
    fn bodies(&self, target: &str) -> Arc<Vec<String>> {
        Arc::new(self.trace.iter().map(|r| client::body(r, target)).collect())
    }

    fn setup(&self, listen_port: u16, admin_port: u16) -> targets::Setup<'_> {
        let a = self.a;
        targets::Setup {
            dir: self.dir,
            listen_port,
            admin_port,
            workers: &self.workers,
            threads: a.threads,
            gpulb: &self.knobs,
            prio_maxconn: a.prio_maxconn.unwrap_or(a.max_running),
            weights: (!a.weights.is_empty()).then_some(&a.weights[..]),
            sglang_router: &a.sglang_router,
            reloads: a.reload_every.is_some(),
        }
    }
}

/// The generated gpulb config's knobs, from the arguments.
fn knobs(a: &Args) -> GpulbKnobs {
    GpulbKnobs {
        max_outstanding: a.gpulb_max_outstanding.unwrap_or(a.max_running),
        bulk_share: a.bulk_share,
        bulk_placement: a.bulk_placement.clone(),
        interactive_placement: a.interactive_placement.clone(),
        interactive_max_wait: a.interactive_max_wait.clone(),
        bulk_max_wait: a.bulk_max_wait.clone(),
        telemetry_interval: a.telemetry_interval.clone(),
        max_server_queue: a.max_server_queue,
        interactive_guard_queue: a.interactive_guard_queue,
        interactive_guard_kv: a.interactive_guard_kv,
        bulk_guard_kv: a.bulk_guard_kv,
        access_log: a.gpulb_access_log,
        body_match: a.body_match.clone(),
        template: a.gpulb_config.clone(),
        count_others: true,
        waiting_interval: a.waiting_interval.clone(),
    }
}

/// With `--abuse`, how long every turn waits after readiness before the trace starts.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// What a turn measured beside the trace: the proxy's memory and, for gpulb, ejections.
#[derive(Clone, Debug, Default)]
pub struct Beside {
    /// The proxy's resident memory at the end of the trace (every process of it), KiB.
    pub rss_kb: u64,
    /// Backend ejections gpulb counted during the turn (`None` for peers: not observable).
    pub ejections: Option<u64>,
    /// What the abuse found, when there was abuse.
    pub abuse: Option<AbuseReport>,
    /// What the config reloads did, when the turn reloaded.
    pub reloads: Option<reloader::Count>,
}

/// Sum of `ejections_total` over the backends in gpulb's `/status` at each of `admins`.
async fn ejections(admins: &[String]) -> Option<u64> {
    let mut total = 0;
    for admin in admins {
        total += ejections_at(admin).await?;
    }
    Some(total)
}

/// Sum of `ejections_total` over the backends in gpulb's `/status` at `admin`.
async fn ejections_at(admin: &str) -> Option<u64> {
    let status: serde_json::Value = reqwest::get(format!("{admin}/status"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let backends = status["backends"].as_array()?;
    Some(
        backends
            .iter()
            .filter_map(|b| b["ejections_total"].as_u64())
            .sum(),
    )
}

/// Runs `target` through the trace on a fresh fleet, beside `abuse` when given (against its
/// first replica), its config reloaded every --reload-every when `reload`; returns what was measured and the
/// path of its config (the first replica's, when it runs several).
pub fn run_target(
    bench: &mut Bench,
    plan: &Plan,
    target: Target,
    abuse: Option<AbuseSpec>,
    reload: bool,
) -> Result<(TargetRun, PathBuf, Beside), String> {
    let name = match (abuse, reload) {
        (Some(_), _) => format!("{}+abuse", target.name()),
        (None, true) => format!("{}+reload", target.name()),
        (None, false) => target.name().to_string(),
    };
    let name = name.as_str();
    bench.fresh_fleet()?;
    let mut children = Vec::new();
    let mut config_path = None;
    let mut first_listen = None;
    let mut reload_plan = None;
    let mut to = Endpoint {
        bases: Vec::new(),
        admins: Vec::new(),
        priority_header: target.priority_header(),
        status_log: plan.dir.join(format!("{name}-status.jsonl")),
    };
    for replica in 0..target.replicas() {
        let listen_port = free_port().map_err(|e| e.to_string())?;
        let admin_port = free_port().map_err(|e| e.to_string())?;
        let setup = plan.setup(listen_port, admin_port);
        let (mut child, path) = targets::start(target, &setup, plan.gpulb_bin, replica)?;
        first_listen.get_or_insert(listen_port);
        if reload && reload_plan.is_none() {
            let (toggle, trigger) = targets::reload_how(target, child.pid(), admin_port)
                .ok_or_else(|| format!("--reload-every cannot reload {}", target.name()))?;
            reload_plan = Some(reloader::Plan {
                every: plan
                    .a
                    .reload_every
                    .unwrap_or(std::time::Duration::from_millis(100)),
                config: path.clone(),
                toggle,
                trigger,
                pgid: child.pid(),
            });
        }
        let base = format!("http://127.0.0.1:{listen_port}");
        let admin = target
            .is_gpulb()
            .then(|| format!("http://127.0.0.1:{admin_port}"));
        eprintln!(
            "[bench] {}: starting (pid {}), config {}",
            child.name,
            child.pid(),
            path.display()
        );
        let log = plan.dir.join(format!("{}.log", child.name));
        bench.block_on(wait_ready(
            &mut child,
            &base,
            admin.as_deref(),
            plan.a.workers,
            &log,
        ))?;
        to.bases.push(base);
        to.admins.extend(admin);
        config_path.get_or_insert(path);
        children.push(child);
    }
    if !bench.block_on(fleet::wait_idle(&bench.fleet)) {
        eprintln!("[bench] warning: the fleet was still busy after 60 s before {name}");
    }
    let admins = to.admins.clone();
    // With --abuse, clean and abused turns alike wait SETTLE after readiness (the abuse
    // connects meanwhile), so both start with the same warm-up.
    let abuse = match abuse {
        Some(spec) => {
            eprintln!("[bench] {name}: {spec:?}");
            let port = first_listen.expect("at least one replica");
            Some(Abuse::start(([127, 0, 0, 1], port).into(), spec)?)
        }
        None => None,
    };
    if plan.a.abuse {
        bench.block_on(async { tokio::time::sleep(SETTLE).await });
    }
    let reloader = reload_plan.map(Reloader::start).transpose()?;
    let run = measure(bench, plan, name, &mut children, to);
    let reloads = reloader.map(Reloader::finish);
    let beside = Beside {
        rss_kb: children.iter().map(|c| procs::group_rss_kb(c.pid())).sum(),
        ejections: match target.is_gpulb() {
            true => bench.block_on(ejections(&admins)),
            false => None,
        },
        abuse: abuse.map(Abuse::finish),
        reloads,
    };
    for child in children.iter_mut() {
        child.stop();
    }
    let _ = std::fs::write(
        plan.dir.join(format!("{name}-requests.csv")),
        report::csv(&run),
    );
    log_summary(&run);
    Ok((run, config_path.expect("at least one replica"), beside))
}

/// Replays the trace against the running `children` (the target's replicas), with the CPU
/// they and the harness spent meanwhile.
fn measure(
    bench: &Bench,
    plan: &Plan,
    name: &str,
    children: &mut [ChildGuard],
    to: Endpoint,
) -> TargetRun {
    let bodies = plan.bodies(name);
    let cache_before = fleet::cache_counters(&bench.fleet);
    let cpu_before = SelfCpu::read();
    let proxy_cpu = || -> f64 { children.iter().map(|c| procs::group_cpu(c.pid())).sum() };
    let proxy_before = proxy_cpu();
    eprintln!("[bench] {name}: replaying {} requests", plan.trace.len());
    let r = bench.block_on(replay::replay(
        plan.a,
        to,
        plan.trace.clone(),
        bodies,
        bench.fleet.clone(),
    ));
    let cache_after = fleet::cache_counters(&bench.fleet);
    let proxy_cpu = proxy_cpu() - proxy_before;
    let self_cpu = SelfCpu::read().since(cpu_before);
    for child in children.iter_mut() {
        if let Some(how) = child.exited() {
            eprintln!(
                "[bench] warning: {} exited during the run ({how})",
                child.name
            );
        }
    }
    let mut run = r.into_run(name, self_cpu, proxy_cpu);
    run.prefix_cache = cache_after
        .iter()
        .zip(&cache_before)
        .map(|(a, b)| (a.0 - b.0, a.1 - b.1, a.2 - b.2))
        .collect();
    run
}

/// One progress line: the run's headline figures.
fn log_summary(run: &TargetRun) {
    let i = report::class_stats(&run.outcomes, Class::Interactive, None);
    let b = report::class_stats(&run.outcomes, Class::Bulk, None);
    eprintln!(
        "[bench] {}: interactive TTFT p99 {:.0} ms, bulk ok {}/{}, makespan {:.1} s",
        run.name,
        i.ttft_p99.unwrap_or(f64::NAN) * 1000.0,
        b.ok,
        b.sent,
        run.makespan
    );
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
