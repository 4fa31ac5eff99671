//! Continuous-batching GPU model: one step loop per worker, FIFO admission under slot and KV limits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::prefix::PrefixCache;

/// Timing and capacity parameters of the simulated engine.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    /// Step time with one running sequence.
    pub decode_step: Duration,
    /// Extra step time per additional running sequence.
    pub step_per_running: Duration,
    /// Prefill cost per uncached prompt token, paid in the admission step.
    pub prefill_per_token: Duration,
    /// Maximum number of concurrently running sequences.
    pub max_running: usize,
    /// KV budget in tokens (prompt + max_tokens summed over running sequences).
    pub kv_budget_tokens: usize,
    /// Keep finished prompts' blocks in the free KV budget so later prompts skip their prefill.
    pub prefix_caching: bool,
}

/// Why a sequence could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The sequence alone needs more KV than the whole budget.
    #[error("this request needs {need} tokens of KV cache but the worker only has {budget}")]
    TooLarge { need: usize, budget: usize },
    /// The step loop is gone.
    #[error("the engine is not running")]
    Closed,
}

/// Live counters and gauges shared between the step loop and readers.
#[derive(Debug, Default)]
pub(crate) struct EngineState {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_used: AtomicUsize,
    pub prompt_tokens_total: AtomicU64,
    pub generation_tokens_total: AtomicU64,
    pub finished_total: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries_total: AtomicU64,
    /// Prompt tokens found in the prefix cache (their prefill skipped).
    pub prefix_hits_total: AtomicU64,
    /// Slow factor as f64 bits (1.0 = normal speed).
    slow_bits: AtomicU64,
}

impl EngineState {
    /// Current slow factor.
    pub fn slow_factor(&self) -> f64 {
        f64::from_bits(self.slow_bits.load(Ordering::Relaxed))
    }
    /// Sets the slow factor (non-finite or non-positive values mean 1.0).
    pub fn set_slow_factor(&self, f: f64) {
        let f = if f.is_finite() && f > 0.0 { f } else { 1.0 };
        self.slow_bits.store(f.to_bits(), Ordering::Relaxed);
    }
}

struct Seq {
    prompt_tokens: usize,
    /// Chained hashes of the prompt's full blocks.
    blocks: Vec<u64>,
    max_tokens: u32,
    generated: u32,
    tx: mpsc::UnboundedSender<u32>,
}

impl Seq {
    fn need(&self) -> usize {
        self.prompt_tokens + self.max_tokens as usize
    }
}

/// Handle used to submit sequences to the step loop.
#[derive(Clone)]
pub(crate) struct Engine {
    tx: mpsc::UnboundedSender<Seq>,
    state: Arc<EngineState>,
    budget: usize,
}

impl Engine {
    /// Spawns the step loop on the current runtime.
    pub fn spawn(cfg: EngineConfig) -> (Engine, JoinHandle<()>) {
        let state = Arc::new(EngineState::default());
        state.set_slow_factor(1.0);
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = cfg.kv_budget_tokens;
        let task = tokio::spawn(step_loop(cfg, rx, state.clone()));
        (Engine { tx, state, budget }, task)
    }

    /// Shared gauges and counters.
    pub fn state(&self) -> &Arc<EngineState> {
        &self.state
    }

    /// KV budget in tokens.
    pub fn kv_budget(&self) -> usize {
        self.budget
    }

    /// Queues a sequence (`blocks`: its prompt's block hashes); the receiver yields token
    /// indices 0..max_tokens, then closes.
    pub fn submit(
        &self,
        prompt_tokens: usize,
        blocks: Vec<u64>,
        max_tokens: u32,
    ) -> Result<mpsc::UnboundedReceiver<u32>, SubmitError> {
        let prompt_tokens = prompt_tokens.max(1);
        let max_tokens = max_tokens.max(1);
        let need = prompt_tokens.saturating_add(max_tokens as usize);
        if need > self.budget {
            return Err(SubmitError::TooLarge {
                need,
                budget: self.budget,
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let seq = Seq {
            prompt_tokens,
            blocks,
            max_tokens,
            generated: 0,
            tx,
        };
        self.state.waiting.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(seq).is_err() {
            self.state.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::Closed);
        }
        Ok(rx)
    }
}

/// KV held by the running batch, with the prefix cache living in what it leaves free.
struct Kv {
    budget: usize,
    used: usize,
    cache: Option<PrefixCache>,
}

impl Kv {
    fn new(cfg: &EngineConfig) -> Self {
        let budget = cfg.kv_budget_tokens;
        let cache = cfg.prefix_caching.then(|| PrefixCache::new(budget));
        Kv {
            budget,
            used: 0,
            cache,
        }
    }

    fn fits(&self, seq: &Seq) -> bool {
        self.used + seq.need() <= self.budget
    }

    /// Reserves an admitted sequence's KV; returns the prompt tokens it must prefill.
    fn admit(&mut self, seq: &Seq, st: &EngineState) -> usize {
        self.used += seq.need();
        let Some(cache) = self.cache.as_mut() else {
            return seq.prompt_tokens;
        };
        let cached = cache.acquire(&seq.blocks, seq.prompt_tokens);
        cache.evict_to_fit(self.used);
        st.prefix_queries_total
            .fetch_add(seq.prompt_tokens as u64, Ordering::Relaxed);
        st.prefix_hits_total
            .fetch_add(cached as u64, Ordering::Relaxed);
        seq.prompt_tokens - cached
    }

    /// Frees a finished or abandoned sequence's KV; its blocks stay cached.
    fn free(&mut self, seq: &Seq) {
        self.used -= seq.need();
        if let Some(cache) = self.cache.as_mut() {
            cache.release(&seq.blocks);
        }
    }
}

fn step_time(cfg: &EngineConfig, running: usize, prefill_tokens: usize, slow: f64) -> Duration {
    let extra = u32::try_from(running.saturating_sub(1)).unwrap_or(u32::MAX);
    let prefill = u32::try_from(prefill_tokens).unwrap_or(u32::MAX);
    let base = cfg.decode_step
        + cfg.step_per_running.saturating_mul(extra)
        + cfg.prefill_per_token.saturating_mul(prefill);
    Duration::try_from_secs_f64(base.as_secs_f64() * slow).unwrap_or(base)
}

async fn step_loop(cfg: EngineConfig, mut rx: mpsc::UnboundedReceiver<Seq>, st: Arc<EngineState>) {
    let mut waiting: VecDeque<Seq> = VecDeque::new();
    let mut running: Vec<Seq> = Vec::new();
    let mut kv = Kv::new(&cfg);
    loop {
        if running.is_empty() && waiting.is_empty() {
            match rx.recv().await {
                Some(seq) => waiting.push_back(seq),
                None => return,
            }
        }
        while let Ok(seq) = rx.try_recv() {
            waiting.push_back(seq);
        }
        // Drop sequences whose client went away, freeing their slot and KV.
        running.retain(|s| {
            let keep = !s.tx.is_closed();
            if !keep {
                kv.free(s);
            }
            keep
        });
        let before = waiting.len();
        waiting.retain(|s| !s.tx.is_closed());
        st.waiting
            .fetch_sub(before - waiting.len(), Ordering::Relaxed);
        // Admit in FIFO order while slots and KV allow.
        let mut prefill = 0usize;
        while let Some(front) = waiting.front() {
            if running.len() >= cfg.max_running || !kv.fits(front) {
                break;
            }
            let Some(seq) = waiting.pop_front() else {
                break;
            };
            prefill += kv.admit(&seq, &st);
            st.waiting.fetch_sub(1, Ordering::Relaxed);
            st.prompt_tokens_total
                .fetch_add(seq.prompt_tokens as u64, Ordering::Relaxed);
            running.push(seq);
        }
        st.running.store(running.len(), Ordering::Relaxed);
        st.kv_used.store(kv.used, Ordering::Relaxed);
        if running.is_empty() {
            continue;
        }
        tokio::time::sleep(step_time(&cfg, running.len(), prefill, st.slow_factor())).await;
        // One token for every running sequence; finished or abandoned ones leave.
        let mut emitted = 0u64;
        running.retain_mut(|s| {
            let sent = s.tx.send(s.generated).is_ok();
            if sent {
                emitted += 1;
                s.generated += 1;
            }
            let keep = sent && s.generated < s.max_tokens;
            if !keep {
                kv.free(s);
                if sent {
                    st.finished_total.fetch_add(1, Ordering::Relaxed);
                }
            }
            keep
        });
        st.generation_tokens_total
            .fetch_add(emitted, Ordering::Relaxed);
        st.running.store(running.len(), Ordering::Relaxed);
        st.kv_used.store(kv.used, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
