//! Measuring each target over the rate steps, reading gpulb's batch histograms, and the
//! results table with the verdict on the targets.

use crate::load::{self, Step};
use crate::procs;
use crate::targets::{self, Setup, Target};
use crate::Args;
use std::fmt::Write as _;
use std::time::Duration;

/// A Prometheus histogram of one class, read from `/metrics`: cumulative bucket counts by upper
/// bound, and its count and sum.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
    count: f64,
    sum: f64,
}

impl Histogram {
    /// Histogram `name` of class `embeddings` in the exposition `page`.
    fn read(page: &str, name: &str) -> Histogram {
        let mut h = Histogram::default();
        let bucket = format!("{name}_bucket{{class=\"embeddings\",le=\"");
        for line in page.lines() {
            let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let Some(rest) = line.strip_prefix(&bucket) {
                let le = rest.split('"').next().unwrap_or("");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                h.buckets.push((le, value(line).unwrap_or(0.0)));
            } else if line.starts_with(&format!("{name}_count{{class=\"embeddings\"}}")) {
                h.count = value(line).unwrap_or(0.0);
            } else if line.starts_with(&format!("{name}_sum{{class=\"embeddings\"}}")) {
                h.sum = value(line).unwrap_or(0.0);
            }
        }
        h
    }

    /// What was observed after `before` was read.
    fn since(&self, before: &Histogram) -> Histogram {
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|b| b.0 == le)
                .map_or(0.0, |b| b.1)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, n)| (le, n - earlier(le)))
                .collect(),
            count: self.count - before.count,
            sum: self.sum - before.sum,
        }
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// Upper bound of the bucket holding the `q` quantile.
    fn quantile_bound(&self, q: f64) -> Option<f64> {
        let wanted = q * self.count;
        self.buckets
            .iter()
            .find(|&&(_, n)| self.count > 0.0 && n >= wanted)
            .map(|&(le, _)| le)
    }
}

/// gpulb-batch's batch figures over one step.
#[derive(Debug, Clone)]
pub struct Batches {
    size: Histogram,
    delay: Histogram,
    /// How late batches' tasks woke past the end of their wait for company.
    late: Histogram,
}

/// One step of one target.
#[derive(Debug, Clone)]
pub struct Measured {
    pub step: Step,
    pub batches: Option<Batches>,
    /// CPU seconds the target's processes used during the step.
    pub cpu: f64,
}

async fn batch_histograms(client: &reqwest::Client, admin: &str) -> Option<Batches> {
    let page = client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(Batches {
        size: Histogram::read(&page, "gpulb_batch_size"),
        delay: Histogram::read(&page, "gpulb_batch_assembly_delay_seconds"),
        late: Histogram::read(&page, "gpulb_batch_timer_lateness_seconds"),
    })
}

/// Starts `target`, steps it through the rates (until a step is not sustained), stops it.
pub async fn measure(
    target: Target,
    setup: &Setup<'_>,
    args: &Args,
) -> Result<Vec<Measured>, String> {
    let (mut child, _config) = targets::start(target, setup, &args.gpulb)?;
    let base = format!("http://127.0.0.1:{}", setup.listen_port);
    let admin = format!("http://127.0.0.1:{}", setup.admin_port);
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    targets::wait_ready(&mut child, &client, &base).await?;
    let batching = target == Target::GpulbBatch;
    let mut steps = Vec::new();
    for (i, &rate) in args.rates.iter().enumerate() {
        let before = if batching {
            batch_histograms(&client, &admin).await
        } else {
            None
        };
        let cpu_before = procs::group_cpu(child.pid());
        let length = args.step_length(rate);
        let step = load::step(&client, &base, rate, length, args.seed + i as u64).await;
        let cpu = procs::group_cpu(child.pid()) - cpu_before;
        let after = if batching {
            batch_histograms(&client, &admin).await
        } else {
            None
        };
        let batches = before.zip(after).map(|(b, a)| Batches {
            size: a.size.since(&b.size),
            delay: a.delay.since(&b.delay),
            late: a.late.since(&b.late),
        });
        let sustained = step.sustained();
        eprintln!(
            "[bench_batching] {} at {rate}/s: {} of {} ok, {:.0}/s, p99 {:.1} ms{}",
            target.name(),
            step.ok,
            step.sent,
            step.goodput,
            step.p99 * 1000.0,
            if sustained {
                ""
            } else {
                " (not sustained: last step)"
            }
        );
        steps.push(Measured { step, batches, cpu });
        if !sustained {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    child.stop();
    Ok(steps)
}

fn ms(seconds: Option<f64>) -> String {
    seconds
        .filter(|s| s.is_finite())
        .map_or("–".into(), |s| format!("{:.1}", s * 1000.0))
}

/// The knee of a target: its highest sustained step.
fn knee(steps: &[Measured]) -> Option<&Measured> {
    steps.iter().rfind(|m| m.step.sustained())
}

/// The results table and the verdict.
pub fn render(args: &Args, results: &[(Target, Vec<Measured>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Workers: {} simulated embedding workers, each {} ms per call + {} ms per item, {} calls at once, at most {} items per call. gpulb-batch: batching {{max_batch: {}, max_wait: {}ms}}; gpulb: the same config without batching; both with max_outstanding {} per backend. gpulb threads = nginx worker_processes = {}. Poisson arrivals, {} s per step or long enough for {} requests, seed {}.\n",
        args.workers, args.call_ms, args.item_ms, args.concurrency, args.worker_max_batch,
        args.max_batch, args.max_wait_ms, args.concurrency, args.threads, args.seconds, args.min_requests, args.seed
    );
    let _ = writeln!(out, "| target | offered/s | sent | ok | answered/s | p50 ms | p99 ms | sustained | items per batch | assembly delay mean ms | assembly delay p99 ≤ ms | timer lateness p99 ≤ ms | target CPU s |");
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
    );
    for (target, steps) in results {
        for m in steps {
            let s = &m.step;
            let (size, delay_mean, delay_p99, late_p99) = match &m.batches {
                Some(b) => (
                    b.size.mean().map_or("–".into(), |v| format!("{v:.1}")),
                    ms(b.delay.mean()),
                    ms(b.delay.quantile_bound(0.99)),
                    ms(b.late.quantile_bound(0.99)),
                ),
                None => ("–".into(), "–".into(), "–".into(), "–".into()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {size} | {delay_mean} | {delay_p99} | {late_p99} | {:.1} |",
                target.name(), s.offered, s.sent, s.ok, s.goodput, ms(Some(s.p50)), ms(Some(s.p99)),
                if s.sustained() { "yes" } else { "no" }, m.cpu
            );
        }
    }
    let _ = writeln!(out);
    let find = |t: Target| {
        results
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, s)| s.as_slice())
    };
    for (target, steps) in results {
        let knee = knee(steps);
        let _ = writeln!(
            out,
            "- knee of {}: {}",
            target.name(),
            knee.map_or("none sustained".into(), |m| format!(
                "{:.0} answered/s at {}/s offered (p99 {} ms)",
                m.step.goodput,
                m.step.offered,
                ms(Some(m.step.p99))
            ))
        );
    }
    if let (Some(batch), Some(plain)) = (find(Target::GpulbBatch), find(Target::Gpulb)) {
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        let (kb, kp) = (knee(batch), knee(plain));
        if let (Some(kb), Some(kp)) = (kb, kp) {
            let ratio = kb.step.goodput / kp.step.goodput;
            let limit = if kb.step.offered == *args.rates.last().unwrap_or(&0.0) {
                " (gpulb-batch sustained the highest rate tried: its knee is at least this)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "- knee throughput gpulb-batch / gpulb: {ratio:.2}x (target ≥ 3x): {}{limit}",
                verdict(ratio >= 3.0)
            );
        }
        let compared: Vec<String> = plain
            .iter()
            .filter(|p| p.step.sustained())
            .filter_map(|p| {
                let b = batch.iter().find(|b| b.step.offered == p.step.offered)?;
                Some((
                    b.step.p99 < p.step.p99,
                    format!(
                        "{}/s: {} vs {} ms",
                        p.step.offered,
                        ms(Some(b.step.p99)),
                        ms(Some(p.step.p99))
                    ),
                ))
            })
            .map(|(lower, text)| format!("{text}{}", if lower { "" } else { " (not lower)" }))
            .collect();
        let all_lower =
            !compared.is_empty() && compared.iter().all(|c| !c.ends_with("(not lower)"));
        let _ = writeln!(
            out,
            "- p99 gpulb-batch vs gpulb at every rate gpulb sustains ({}): {}",
            compared.join("; "),
            verdict(all_lower)
        );
        let max_wait = args.max_wait_ms as f64 / 1000.0;
        // Judged where the setup keeps up: past its knee every wait, this one too, grows.
        let delays: Vec<f64> = batch
            .iter()
            .filter(|m| m.step.sustained())
            .filter_map(|m| m.batches.as_ref()?.delay.quantile_bound(0.99))
            .collect();
        let within = !delays.is_empty() && delays.iter().all(|&d| d <= max_wait + 1e-9);
        let worst = delays.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(out, "- batch assembly delay p99 ≤ max_wait ({} ms) at every sustained step (worst: p99 in the bucket up to {} ms): {}", args.max_wait_ms, ms(Some(worst)), verdict(within));
    }
    out
}
