//! The simulated GPU fleet (uneven like the demo fleet, slowed down) and the two runtimes: the
//! fleet's own, and the harness client's.

use crate::procs;
use crate::Args;
use gpulb::tools::sim::{SimWorker, WorkerProfile};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::time::Instant;

/// Worker `i`: the demo fleet's unevenness (relative to `WorkerProfile::new`) applied to the
/// benchmark's slower base timings.
pub fn profile(i: usize, a: &Args) -> WorkerProfile {
    let demo = gpulb::tools::demo::demo_profile(i);
    let base = WorkerProfile::new("base");
    let speed = demo.decode_step.as_secs_f64() / base.decode_step.as_secs_f64();
    let prefill = demo.prefill_per_token.as_secs_f64() / base.prefill_per_token.as_secs_f64();
    let kv = demo.kv_budget_tokens as f64 / base.kv_budget_tokens as f64;
    let mut p = demo.clone();
    p.decode_step = Duration::from_secs_f64(a.decode_ms / 1000.0 * speed);
    p.step_per_running = Duration::from_secs_f64(a.step_per_running_us / 1e6 * speed);
    p.prefill_per_token = Duration::from_secs_f64(a.prefill_us / 1e6 * prefill);
    p.max_running = a.max_running;
    p.kv_budget_tokens = (a.kv_tokens as f64 * kv) as usize;
    p.gpu_index = i as u32;
    p
}

/// Every worker's profile, gpu0 first.
pub fn profiles(a: &Args) -> Vec<WorkerProfile> {
    (0..a.workers).map(|i| profile(i, a)).collect()
}

/// The running fleet and the runtimes; the fleet has its own thread so the harness client
/// cannot starve it. Fields drop in order: the fleet first, then the runtimes.
pub struct Bench {
    pub fleet: Arc<Vec<SimWorker>>,
    profiles: Vec<WorkerProfile>,
    client_rt: Runtime,
    sim_rt: Runtime,
}

impl Bench {
    /// Starts the runtimes, binds one worker per profile on loopback, and arms the handler
    /// that stops the proxies on Ctrl-C or SIGTERM.
    pub fn start(client_threads: usize, profiles: &[WorkerProfile]) -> Result<Bench, String> {
        let sim_rt = runtime(1, "bench-sim")?;
        let client_rt = runtime(client_threads.max(1), "bench-client")?;
        let anywhere = vec![SocketAddr::from(([127, 0, 0, 1], 0)); profiles.len()];
        let fleet = sim_rt
            .block_on(bind(&anywhere, profiles))
            .map_err(|e| format!("cannot start the fleet: {e}"))?;
        stop_children_on_signal(&client_rt);
        Ok(Bench {
            fleet: Arc::new(fleet),
            profiles: profiles.to_vec(),
            client_rt,
            sim_rt,
        })
    }

    /// Replaces every worker with a new one on the same address, so that each target meets the
    /// fleet as the first one did: prefix caches empty (a worker keeps the blocks of every
    /// prompt it served, and every target is sent the same prompts), nothing running, counters
    /// at zero.
    pub fn fresh_fleet(&mut self) -> Result<(), String> {
        let old = std::mem::take(&mut self.fleet);
        let addrs: Vec<SocketAddr> = old.iter().map(SimWorker::addr).collect();
        self.sim_rt.block_on(async {
            for worker in old.iter() {
                worker.kill_and_wait().await;
            }
        });
        drop(old);
        let fleet = self
            .sim_rt
            .block_on(bind(&addrs, &self.profiles))
            .map_err(|e| format!("cannot restart the fleet: {e}"))?;
        self.fleet = Arc::new(fleet);
        Ok(())
    }

    /// `127.0.0.1:PORT` of each worker.
    pub fn addrs(&self) -> Vec<String> {
        self.fleet.iter().map(|w| w.addr().to_string()).collect()
    }

    /// Runs `f` on the harness client's runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.client_rt.block_on(f)
    }

    /// Drops the fleet, then gives each runtime a second to wind down.
    pub fn shutdown(self) {
        let Bench {
            fleet,
            client_rt,
            sim_rt,
            ..
        } = self;
        drop(fleet);
        client_rt.shutdown_timeout(Duration::from_secs(1));
        sim_rt.shutdown_timeout(Duration::from_secs(1));
    }
}

fn runtime(threads: usize, name: &str) -> Result<Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// One worker per profile, listening on the address beside it (port 0: any free port).
async fn bind(addrs: &[SocketAddr], profiles: &[WorkerProfile]) -> Result<Vec<SimWorker>, String> {
    let mut v = Vec::new();
    for (addr, p) in addrs.iter().zip(profiles) {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        v.push(SimWorker::start(listener, p.clone()).map_err(|e| e.to_string())?);
    }
    Ok(v)
}

/// Ctrl-C / SIGTERM: kill every child group, then exit.
fn stop_children_on_signal(rt: &Runtime) {
    rt.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated => {}
        }
        eprintln!("[bench] interrupted: stopping the proxies");
        procs::kill_all_live();
        std::process::exit(130);
    });
}

/// Waits (bounded) until no worker runs or queues anything.
pub async fn wait_idle(fleet: &[SimWorker]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if fleet.iter().all(|w| {
            let s = w.stats();
            s.running == 0 && s.waiting == 0
        }) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Each worker's counters: (prompt tokens looked up in its prefix cache, prompt tokens found
/// there, requests received).
pub fn cache_counters(fleet: &[SimWorker]) -> Vec<(u64, u64, u64)> {
    fleet
        .iter()
        .map(|w| {
            let s = w.stats();
            (
                s.prefix_cache_queries_total,
                s.prefix_cache_hits_total,
                s.received_total,
            )
        })
        .collect()
}
