//! The open-loop trace: Poisson arrivals (with burst windows) of interactive and bulk requests,
//! generated from a seed, so every target is sent exactly the same requests at the same times.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Request class, as the harness labels it (and as gpulb classifies it: by header, or by body
/// for gpulb-body).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Short streaming chat, `x-priority: interactive`.
    Interactive,
    /// Long non-streaming completion, no priority header.
    Bulk,
}

impl Class {
    pub const ALL: [Class; 2] = [Class::Interactive, Class::Bulk];

    pub fn name(self) -> &'static str {
        match self {
            Class::Interactive => "interactive",
            Class::Bulk => "bulk",
        }
    }
}

/// One request of the trace.
#[derive(Clone, Debug)]
pub struct Req {
    /// Send time, seconds after the trace start.
    pub at: f64,
    pub class: Class,
    pub tenant: &'static str,
    /// Prompt length in characters (the sim counts ceil(chars / 4) tokens).
    pub prompt_chars: usize,
    pub max_tokens: u32,
    /// The chat messages' contents (system first, then user and assistant turns), when the
    /// text matters (the prefix workload); `None`: a filler prompt of `prompt_chars`.
    pub messages: Option<Arc<Vec<String>>>,
}

/// Interactive tenants and their shares of the interactive traffic.
pub const INTERACTIVE_TENANTS: [(&str, u32); 3] =
    [("tenant-a", 6), ("tenant-b", 3), ("tenant-c", 1)];
/// Bulk tenants and their shares of the bulk traffic.
pub const BULK_TENANTS: [(&str, u32); 2] = [("batch-x", 3), ("batch-y", 1)];

/// What the trace looks like.
#[derive(Clone, Debug)]
pub struct TraceSpec {
    pub seed: u64,
    /// Arrivals happen in [0, duration) seconds.
    pub duration: f64,
    pub interactive_rps: f64,
    pub bulk_rps: f64,
    /// Inside a burst window each class's rate is multiplied by its factor.
    pub interactive_burst: f64,
    pub bulk_burst: f64,
    /// First burst starts here (s); one every `burst_every` s, each `burst_len` s long.
    pub burst_start: f64,
    pub burst_every: f64,
    pub burst_len: f64,
    /// Inclusive ranges.
    pub interactive_max_tokens: (u32, u32),
    pub interactive_prompt_chars: (usize, usize),
    pub bulk_max_tokens: (u32, u32),
    pub bulk_prompt_chars: (usize, usize),
}

impl TraceSpec {
    pub fn in_burst(&self, t: f64) -> bool {
        self.burst_len > 0.0
            && self.burst_every > 0.0
            && t >= self.burst_start
            && (t - self.burst_start) % self.burst_every < self.burst_len
    }

    /// The burst windows inside the trace, for the report.
    pub fn burst_windows(&self) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        if self.burst_len <= 0.0
            || self.burst_every <= 0.0
            || (self.interactive_burst == 1.0 && self.bulk_burst == 1.0)
        {
            return out;
        }
        let mut s = self.burst_start;
        while s < self.duration && out.len() < 1000 {
            out.push((s, (s + self.burst_len).min(self.duration)));
            s += self.burst_every;
        }
        out
    }
}

pub fn pick_tenant(rng: &mut StdRng, tenants: &[(&'static str, u32)]) -> &'static str {
    let total: u32 = tenants.iter().map(|t| t.1).sum();
    let mut x = rng.random_range(0..total);
    for &(name, w) in tenants {
        if x < w {
            return name;
        }
        x -= w;
    }
    tenants[0].0
}

/// Non-homogeneous Poisson arrivals by thinning: candidates at the peak rate, each kept with
/// probability rate(t) / peak.
pub fn arrivals(spec: &TraceSpec, base: f64, factor: f64, rng: &mut StdRng) -> Vec<f64> {
    let mut out = Vec::new();
    if base <= 0.0 {
        return out;
    }
    let factor = factor.max(0.0);
    let peak = base * factor.max(1.0);
    let mut t = 0.0;
    loop {
        // Exponential gap; 1 - u is in (0, 1], so ln is finite.
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / peak;
        if t >= spec.duration {
            return out;
        }
        let rate = if spec.in_burst(t) {
            base * factor
        } else {
            base
        };
        if rng.random::<f64>() * peak < rate {
            out.push(t);
        }
    }
}

/// The trace for `spec`: each class from its own seeded stream (changing one class's rate does
/// not move the other's arrivals), merged in time order.
pub fn generate(spec: &TraceSpec) -> Vec<Req> {
    let mut reqs = Vec::new();
    for class in Class::ALL {
        let salt = match class {
            Class::Interactive => 0x1_0000_0001,
            Class::Bulk => 0x2_0000_0002,
        };
        let mut rng = StdRng::seed_from_u64(spec.seed ^ salt);
        let (rate, factor, tenants, tokens, chars) = match class {
            Class::Interactive => (
                spec.interactive_rps,
                spec.interactive_burst,
                &INTERACTIVE_TENANTS[..],
                spec.interactive_max_tokens,
                spec.interactive_prompt_chars,
            ),
            Class::Bulk => (
                spec.bulk_rps,
                spec.bulk_burst,
                &BULK_TENANTS[..],
                spec.bulk_max_tokens,
                spec.bulk_prompt_chars,
            ),
        };
        for at in arrivals(spec, rate, factor, &mut rng) {
            reqs.push(Req {
                at,
                class,
                tenant: pick_tenant(&mut rng, tenants),
                prompt_chars: rng.random_range(chars.0..=chars.1.max(chars.0)),
                max_tokens: rng.random_range(tokens.0..=tokens.1.max(tokens.0)),
                messages: None,
            });
        }
    }
    reqs.sort_by(|a, b| a.at.total_cmp(&b.at));
    reqs
}

/// A prompt of exactly `chars` characters (only its length matters to the sim).
pub fn prompt_text(chars: usize) -> String {
    const WORDS: &str = "the quick brown fox jumps over the lazy dog while the GPU fleet keeps \
                         streaming tokens to every tenant that asked for them ";
    WORDS.chars().cycle().take(chars).collect()
}
