//! One open-loop step: Poisson arrivals of one-sentence embedding requests at a fixed rate for a
//! fixed time, each sent at its scheduled instant whatever the earlier ones are doing, timed from
//! that instant to its last byte.

use rand::{Rng, SeedableRng};
use std::time::Duration;
use tokio::time::Instant;

/// What one step measured.
#[derive(Debug, Clone)]
pub struct Step {
    /// Arrival rate asked for, per second.
    pub offered: f64,
    /// Requests sent.
    pub sent: usize,
    /// Requests sent per second (the offered rate as the random arrivals realized it).
    pub realized: f64,
    /// Answered 200 with one embedding.
    pub ok: usize,
    /// ok requests per second, from the first arrival to the last completion.
    pub goodput: f64,
    /// Latency percentiles of the ok requests, seconds (nearest rank).
    pub p50: f64,
    pub p99: f64,
}

impl Step {
    /// The setup kept up: at least 99% answered, at 95% of the rate they were sent at or more
    /// (a backlog that drains after the arrivals stop stretches the span and fails this).
    pub fn sustained(&self) -> bool {
        self.ok as f64 >= 0.99 * self.sent as f64 && self.goodput >= 0.95 * self.realized
    }
}

/// The body of request `i`: one short sentence.
fn body(i: usize) -> String {
    format!(
        r#"{{"model":"embed-model","input":"Sentence {i} of the flood, a short line of text to embed."}}"#
    )
}

/// Whether an answer is a 200 carrying exactly one embedding.
fn one_embedding(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["data"].as_array().map(Vec::len))
        == Some(1)
}

/// Sends Poisson arrivals at `rate` per second for `duration` to `base`, from `seed`.
pub async fn step(
    client: &reqwest::Client,
    base: &str,
    rate: f64,
    duration: Duration,
    seed: u64,
) -> Step {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut offsets = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if t >= duration.as_secs_f64() {
            break;
        }
        offsets.push(Duration::from_secs_f64(t));
    }
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(offsets.len());
    for (i, offset) in offsets.iter().enumerate() {
        let at = start + *offset;
        tokio::time::sleep_until(at).await;
        let request = client
            .post(format!("{base}/v1/embeddings"))
            .header("content-type", "application/json")
            .body(body(i));
        tasks.push(tokio::spawn(async move {
            let ok = match request.send().await {
                Ok(r) if r.status() == 200 => r.bytes().await.is_ok_and(|b| one_embedding(&b)),
                _ => false,
            };
            (ok, Instant::now(), at)
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    let mut last = start;
    for task in tasks {
        if let Ok((ok, done, at)) = task.await {
            if ok {
                latencies.push(done.duration_since(at).as_secs_f64());
                last = last.max(done);
            }
        }
    }
    latencies.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        let n = latencies.len();
        if n == 0 {
            return f64::NAN;
        }
        latencies[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
    };
    let span = last
        .duration_since(start)
        .as_secs_f64()
        .max(duration.as_secs_f64());
    Step {
        offered: rate,
        sent: offsets.len(),
        realized: offsets.len() as f64 / duration.as_secs_f64(),
        ok: latencies.len(),
        goodput: latencies.len() as f64 / span,
        p50: rank(0.5),
        p99: rank(0.99),
    }
}
