//! Paused-clock unit tests of the continuous-batching engine.

use super::*;
use tokio::time::{sleep, Instant};

fn cfg(max_running: usize, kv: usize) -> EngineConfig {
    EngineConfig {
        decode_step: Duration::from_millis(10),
        step_per_running: Duration::from_micros(500),
        prefill_per_token: Duration::from_micros(50),
        max_running,
        kv_budget_tokens: kv,
        prefix_caching: true,
    }
}

async fn drain(mut rx: mpsc::UnboundedReceiver<u32>) -> Vec<u32> {
    let mut v = Vec::new();
    while let Some(t) = rx.recv().await {
        v.push(t);
    }
    v
}

#[tokio::test(start_paused = true)]
async fn single_sequence_timing_and_tokens() {
    let (eng, _task) = Engine::spawn(cfg(4, 1000));
    let start = Instant::now();
    let mut rx = eng.submit(20, vec![], 3).unwrap();
    assert_eq!(rx.recv().await, Some(0));
    // First step pays 10ms decode + 20 * 50us prefill.
    assert_eq!(start.elapsed(), Duration::from_millis(11));
    assert_eq!(rx.recv().await, Some(1));
    assert_eq!(start.elapsed(), Duration::from_millis(21));
    assert_eq!(drain(rx).await, vec![2]);
    sleep(Duration::from_millis(1)).await;
    let st = eng.state();
    assert_eq!(st.running.load(Ordering::Relaxed), 0);
    assert_eq!(st.kv_used.load(Ordering::Relaxed), 0);
    assert_eq!(st.generation_tokens_total.load(Ordering::Relaxed), 3);
    assert_eq!(st.prompt_tokens_total.load(Ordering::Relaxed), 20);
    assert_eq!(st.finished_total.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn at_most_max_running() {
    let (eng, _task) = Engine::spawn(cfg(2, 100_000));
    let rxs: Vec<_> = (0..5).map(|_| eng.submit(4, vec![], 10).unwrap()).collect();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(eng.state().running.load(Ordering::Relaxed), 2);
    assert_eq!(eng.state().waiting.load(Ordering::Relaxed), 3);
    let handles: Vec<_> = rxs.into_iter().map(|rx| tokio::spawn(drain(rx))).collect();
    for _ in 0..40 {
        sleep(Duration::from_millis(5)).await;
        assert!(eng.state().running.load(Ordering::Relaxed) <= 2);
    }
    for h in handles {
        assert_eq!(h.await.unwrap().len(), 10);
    }
    assert_eq!(eng.state().waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn kv_budget_blocks_admission_and_rejects_oversized() {
    let (eng, _task) = Engine::spawn(cfg(16, 100));
    assert_eq!(
        eng.submit(95, vec![], 10).unwrap_err(),
        SubmitError::TooLarge {
            need: 105,
            budget: 100
        }
    );
    let a = eng.submit(50, vec![], 10).unwrap(); // needs 60
    let b = eng.submit(40, vec![], 10).unwrap(); // needs 50: does not fit beside a
    let c = eng.submit(10, vec![], 10).unwrap(); // FIFO: waits behind b
    sleep(Duration::from_millis(1)).await;
    assert_eq!(eng.state().running.load(Ordering::Relaxed), 1);
    assert_eq!(eng.state().waiting.load(Ordering::Relaxed), 2);
    assert_eq!(eng.state().kv_used.load(Ordering::Relaxed), 60);
    let (ta, tb, tc) = (
        tokio::spawn(drain(a)),
        tokio::spawn(drain(b)),
        tokio::spawn(drain(c)),
    );
    assert_eq!(ta.await.unwrap().len(), 10);
    sleep(Duration::from_millis(1)).await;
    // a finished: b and c (50 + 20 = 70) now run together.
    assert_eq!(eng.state().running.load(Ordering::Relaxed), 2);
    assert_eq!(eng.state().kv_used.load(Ordering::Relaxed), 70);
    assert_eq!(tb.await.unwrap().len(), 10);
    assert_eq!(tc.await.unwrap().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn step_time_grows_with_batch() {
    let (eng, _task) = Engine::spawn(cfg(16, 100_000));
    let mut rxs: Vec<_> = (0..5).map(|_| eng.submit(4, vec![], 3).unwrap()).collect();
    let start = Instant::now();
    for rx in rxs.iter_mut() {
        rx.recv().await.unwrap();
    }
    // 10ms + 4 * 0.5ms + 5 * 4 * 50us prefill (the paused clock has 1ms resolution).
    assert_eq!(start.elapsed(), Duration::from_millis(13));
    // The second step already started; the slow factor applies from the third.
    eng.state().set_slow_factor(2.0);
    let t1 = Instant::now();
    for rx in rxs.iter_mut() {
        rx.recv().await.unwrap();
    }
    assert_eq!(t1.elapsed(), Duration::from_micros(12_000));
    let t2 = Instant::now();
    for rx in rxs.iter_mut() {
        rx.recv().await.unwrap();
    }
    assert_eq!(t2.elapsed(), Duration::from_micros(24_000));
}

#[tokio::test(start_paused = true)]
async fn cancelled_sequence_frees_slot() {
    let (eng, _task) = Engine::spawn(cfg(1, 100_000));
    let a = eng.submit(4, vec![], 1000).unwrap();
    let b = eng.submit(4, vec![], 2).unwrap();
    sleep(Duration::from_millis(15)).await;
    assert_eq!(eng.state().running.load(Ordering::Relaxed), 1);
    assert_eq!(eng.state().waiting.load(Ordering::Relaxed), 1);
    drop(a);
    let got = tokio::time::timeout(Duration::from_millis(100), drain(b))
        .await
        .unwrap();
    assert_eq!(got, vec![0, 1]);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(eng.state().running.load(Ordering::Relaxed), 0);
    assert_eq!(eng.state().kv_used.load(Ordering::Relaxed), 0);
}

/// A prompt of `blocks` full blocks of `c` and a partial one: its tokens and block hashes.
fn long_prompt(c: char, blocks: usize) -> (usize, Vec<u64>) {
    let text = c.to_string().repeat(blocks * 64 + 8);
    (
        text.len().div_ceil(4),
        super::super::prefix::block_hashes(&text),
    )
}

/// Time to the first token of a sequence submitted alone (it then runs to completion).
async fn ttft(eng: &Engine, (tokens, blocks): &(usize, Vec<u64>), max: u32) -> Duration {
    let start = Instant::now();
    let mut rx = eng.submit(*tokens, blocks.clone(), max).unwrap();
    rx.recv().await.unwrap();
    let took = start.elapsed();
    drain(rx).await;
    sleep(Duration::from_millis(1)).await;
    took
}

fn slow_prefill(kv: usize, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        prefill_per_token: Duration::from_millis(1),
        prefix_caching,
        ..cfg(4, kv)
    }
}

fn prefix_counters(eng: &Engine) -> (u64, u64) {
    let st = eng.state();
    (
        st.prefix_queries_total.load(Ordering::Relaxed),
        st.prefix_hits_total.load(Ordering::Relaxed),
    )
}

#[tokio::test(start_paused = true)]
async fn repeated_prompt_skips_the_prefill_of_its_cached_blocks() {
    let (eng, _task) = Engine::spawn(slow_prefill(1000, true));
    let prompt = long_prompt('a', 4); // 66 tokens: 4 full blocks and 2 more
    assert_eq!(prompt.0, 66);
    // 10ms decode + 66 * 1ms prefill.
    assert_eq!(ttft(&eng, &prompt, 2).await, Duration::from_millis(76));
    assert_eq!(prefix_counters(&eng), (66, 0));
    // The 4 blocks (64 tokens) stay cached: only 2 tokens are prefilled.
    assert_eq!(ttft(&eng, &prompt, 2).await, Duration::from_millis(12));
    assert_eq!(prefix_counters(&eng), (132, 64));
    // Cached blocks are not counted as used KV.
    assert_eq!(eng.state().kv_used.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn prefix_caching_off_prefills_every_time() {
    let (eng, _task) = Engine::spawn(slow_prefill(1000, false));
    let prompt = long_prompt('a', 4);
    for _ in 0..2 {
        assert_eq!(ttft(&eng, &prompt, 2).await, Duration::from_millis(76));
    }
    assert_eq!(prefix_counters(&eng), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn cached_blocks_yield_to_running_sequences_lru_first() {
    let (eng, _task) = Engine::spawn(slow_prefill(100, true));
    let a = long_prompt('a', 4); // needs 66 + 1
    ttft(&eng, &a, 1).await;
    // 64 cached tokens do not keep a 50-token sequence out; one block of a's
    // (its last) makes room for it.
    let b = (40, vec![]);
    assert_eq!(ttft(&eng, &b, 10).await, Duration::from_millis(50));
    assert_eq!(ttft(&eng, &a, 1).await, Duration::from_millis(10 + 66 - 48));
    assert_eq!(prefix_counters(&eng), (66 + 40 + 66, 48));
}
