//! Replaying the trace open loop against one target (one task per request, sent at its
//! scheduled time whatever earlier requests are doing), with samplers of the workers' own
//! queues and of gpulb's `/status` running alongside.

use crate::client::{self, Outcome, Status};
use crate::procs::SelfCpu;
use crate::report::TargetRun;
use crate::trace::Req;
use crate::Args;
use gpulb::tools::sim::SimWorker;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore, SemaphorePermit};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Where the trace goes: the target (one base URL per replica: each request goes to one of
/// them, drawn at random from the seed), and gpulb's admin addresses for the `/status` samplers.
pub struct Endpoint {
    pub bases: Vec<String>,
    /// gpulb only: one per replica, in the order of `bases`.
    pub admins: Vec<String>,
    /// JSON lines of the sampled `/status` go here (gpulb only; replica N > 0 adds `.N`).
    pub status_log: PathBuf,
    /// Whether interactive requests carry `x-priority: interactive`.
    pub priority_header: bool,
}

/// What one replay measured.
pub struct Replay {
    outcomes: Vec<Outcome>,
    unfinished: usize,
    max_inflight: usize,
    cap_hits: usize,
    sim_max_waiting: Vec<usize>,
    sim_mean_running: Vec<f64>,
    sim_max_outstanding: Vec<usize>,
    gpulb_max_queue: BTreeMap<String, usize>,
    gpulb_answered: BTreeMap<String, u64>,
}

impl Replay {
    /// The target's record, with the CPU seconds measured around the replay.
    pub fn into_run(self, name: &str, self_cpu: SelfCpu, proxy_cpu: f64) -> TargetRun {
        let makespan = self
            .outcomes
            .iter()
            .map(|o| o.at + o.e2e)
            .fold(0.0, f64::max);
        TargetRun {
            name: name.to_string(),
            outcomes: self.outcomes,
            unfinished: self.unfinished,
            self_cpu,
            proxy_cpu,
            max_inflight: self.max_inflight,
            cap_hits: self.cap_hits,
            sim_max_waiting: self.sim_max_waiting,
            sim_mean_running: self.sim_mean_running,
            sim_max_outstanding: self.sim_max_outstanding,
            prefix_cache: Vec::new(),
            gpulb_max_queue: self.gpulb_max_queue,
            gpulb_answered: self.gpulb_answered,
            makespan,
        }
    }
}

/// Replays the trace against `to`, open loop, with the samplers running alongside; gives up on
/// what is still unanswered --drain seconds after the arrival window.
pub async fn replay(
    a: &Args,
    to: Endpoint,
    trace: Arc<Vec<Req>>,
    bodies: Arc<Vec<String>>,
    fleet: Arc<Vec<SimWorker>>,
) -> Replay {
    let client = client::client(Duration::from_secs_f64(a.request_timeout));
    let t0 = Instant::now() + Duration::from_millis(300);
    let (stop_tx, stop_rx) = watch::channel(false);
    let sim_sampler = tokio::spawn(sample_fleet(fleet, stop_rx.clone()));
    let status_samplers: Vec<_> = to
        .admins
        .into_iter()
        .enumerate()
        .map(|(i, admin)| {
            let client = client::client(Duration::from_secs(2));
            let mut log = to.status_log.clone().into_os_string();
            if i > 0 {
                log.push(format!(".{i}"));
            }
            let stop = stop_rx.clone();
            tokio::spawn(sample_status(client, admin, log.into(), t0, stop))
        })
        .collect();

    let shared = Arc::new(Shared {
        client,
        seed: a.seed,
        bases: to.bases,
        priority_header: to.priority_header,
        trace: trace.clone(),
        bodies,
        gate: Gate::new(a.max_inflight),
        t0,
    });
    let set = launch(&shared);
    let limit = a.duration + a.drain;
    let mut outcomes = collect(set, t0 + Duration::from_secs_f64(limit)).await;
    let unfinished = add_unfinished(&mut outcomes, &trace, limit);
    outcomes.sort_by_key(|o| o.index);

    let _ = stop_tx.send(true);
    let (sim_max_waiting, sim_mean_running, sim_max_outstanding) =
        sim_sampler.await.unwrap_or_default();
    // Over replicas: the sum of each one's largest queue, and of what each answered.
    let (mut gpulb_max_queue, mut gpulb_answered) = (BTreeMap::new(), BTreeMap::new());
    for h in status_samplers {
        let (queues, answered): (BTreeMap<String, usize>, BTreeMap<String, u64>) =
            h.await.unwrap_or_default();
        for (class, q) in queues {
            *gpulb_max_queue.entry(class).or_default() += q;
        }
        for (class, n) in answered {
            *gpulb_answered.entry(class).or_default() += n;
        }
    }
    Replay {
        outcomes,
        unfinished,
        max_inflight: shared.gate.max.load(Ordering::Relaxed),
        cap_hits: shared.gate.cap_hits.load(Ordering::Relaxed),
        sim_max_waiting,
        sim_mean_running,
        sim_max_outstanding,
        gpulb_max_queue,
        gpulb_answered,
    }
}

/// What every request task reads.
struct Shared {
    client: reqwest::Client,
    /// The trace's seed, from which each request's replica is drawn.
    seed: u64,
    bases: Vec<String>,
    priority_header: bool,
    trace: Arc<Vec<Req>>,
    bodies: Arc<Vec<String>>,
    gate: Gate,
    /// The trace's time zero.
    t0: Instant,
}

/// The harness's cap on requests in flight (protects the machine), and what it saw.
struct Gate {
    sem: Semaphore,
    now: AtomicUsize,
    max: AtomicUsize,
    /// Times a request had to wait for the cap.
    cap_hits: AtomicUsize,
}

impl Gate {
    fn new(cap: usize) -> Gate {
        Gate {
            sem: Semaphore::new(cap.max(1)),
            now: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            cap_hits: AtomicUsize::new(0),
        }
    }

    /// Waits for room under the cap; the request counts as in flight while the pass lives.
    async fn enter(&self) -> Pass<'_> {
        let permit = match self.sem.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                self.cap_hits.fetch_add(1, Ordering::Relaxed);
                self.sem.acquire().await.expect("semaphore open")
            }
        };
        let now = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.max.fetch_max(now, Ordering::Relaxed);
        Pass {
            gate: self,
            _permit: permit,
        }
    }
}

/// One request's place under the cap.
struct Pass<'a> {
    gate: &'a Gate,
    _permit: SemaphorePermit<'a>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.now.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One task per request of the trace, each sleeping until its scheduled time.
fn launch(shared: &Arc<Shared>) -> JoinSet<Outcome> {
    let mut set = JoinSet::new();
    for index in 0..shared.trace.len() {
        set.spawn(send_at(shared.clone(), index));
    }
    set
}

/// Sends request `index` at its scheduled time, once there is room under the cap.
async fn send_at(s: Arc<Shared>, index: usize) -> Outcome {
    let req = &s.trace[index];
    let scheduled = s.t0 + Duration::from_secs_f64(req.at);
    tokio::time::sleep_until(scheduled).await;
    let _pass = s.gate.enter().await;
    client::send(
        &s.client,
        &s.bases[replica_of(s.seed, index, s.bases.len())],
        index,
        req,
        s.bodies[index].clone(),
        s.priority_header,
        scheduled,
    )
    .await
}

/// The replica (of `n`) request `index` goes to: a hash of the seed and the index, so the
/// split is random, the same for every target of a run and every run of a seed.
fn replica_of(seed: u64, index: usize, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    // splitmix64's finalizer.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % n as u64) as usize
}

/// The outcomes as requests finish, until every task has or `deadline` passes (the rest are
/// then aborted).
async fn collect(mut set: JoinSet<Outcome>, deadline: Instant) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(set.len());
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(Ok(o))) => outcomes.push(o),
            Ok(Some(Err(e))) => eprintln!("[bench] request task failed: {e}"),
            Ok(None) => break,
            Err(_) => {
                set.abort_all();
                while set.join_next().await.is_some() {}
                break;
            }
        }
    }
    outcomes
}

/// Requests without an outcome (drain limit, or a failed task) count as errors lasting until
/// `limit`; returns how many there were.
fn add_unfinished(outcomes: &mut Vec<Outcome>, trace: &[Req], limit: f64) -> usize {
    let seen: HashSet<usize> = outcomes.iter().map(|o| o.index).collect();
    let before = outcomes.len();
    for (index, req) in trace.iter().enumerate() {
        if !seen.contains(&index) {
            let status = Status::Error("unfinished at the drain limit".into());
            outcomes.push(Outcome {
                e2e: limit - req.at,
                ..Outcome::new(index, req, status, 0.0)
            });
        }
    }
    outcomes.len() - before
}

/// The workers' own queues every 100 ms until `stop`: each one's largest `waiting`, mean
/// `running` and largest `running + waiting` (requests it held).
async fn sample_fleet(
    fleet: Arc<Vec<SimWorker>>,
    mut stop: watch::Receiver<bool>,
) -> (Vec<usize>, Vec<f64>, Vec<usize>) {
    let n = fleet.len();
    let (mut max_wait, mut sum_run, mut samples) = (vec![0usize; n], vec![0f64; n], 0u64);
    let mut max_held = vec![0usize; n];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        samples += 1;
        for (i, w) in fleet.iter().enumerate() {
            let s = w.stats();
            max_wait[i] = max_wait[i].max(s.waiting);
            sum_run[i] += s.running as f64;
            max_held[i] = max_held[i].max(s.running + s.waiting);
        }
    }
    let mean = sum_run
        .iter()
        .map(|s| s / samples.max(1) as f64)
        .collect::<Vec<_>>();
    (max_wait, mean, max_held)
}

/// gpulb's `/status` every 500 ms until `stop`, kept as JSON lines in `log` for later reading;
/// returns the largest queue depth seen per class, and each class's `requests_total` read once
/// more after `stop` (the requests gpulb put in that class, readiness probes included).
async fn sample_status(
    client: reqwest::Client,
    admin: String,
    log: PathBuf,
    t0: Instant,
    mut stop: watch::Receiver<bool>,
) -> (BTreeMap<String, usize>, BTreeMap<String, u64>) {
    let mut max_q: BTreeMap<String, usize> = BTreeMap::new();
    let mut lines = String::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let Some(v) = client::gpulb_status(&client, &admin).await else {
            continue;
        };
        for c in v["classes"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or("?").to_string();
            let depth = c["queue_depth"].as_u64().unwrap_or(0) as usize;
            let e = max_q.entry(name).or_default();
            *e = (*e).max(depth);
        }
        let t = Instant::now().saturating_duration_since(t0).as_secs_f64();
        let _ = writeln!(lines, "{{\"t\":{t:.2},\"status\":{v}}}");
    }
    let _ = std::fs::write(&log, lines);
    let answered = client::gpulb_status(&client, &admin)
        .await
        .and_then(|v| v["classes"].as_array().cloned())
        .into_iter()
        .flatten()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or("?").to_string();
            (name, c["requests_total"].as_u64().unwrap_or(0))
        })
        .collect();
    (max_q, answered)
}
