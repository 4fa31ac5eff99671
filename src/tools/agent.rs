//! `gpulb agent`: serves this host's NVML readings as dcgm-exporter-style `/metrics`.
//!
//! For GPU hosts without dcgm-exporter: same `DCGM_FI_DEV_*` names, units and label layout,
//! so a `dcgm` telemetry source reads it unchanged. Without NVML it answers 503 with a
//! comment saying why, and never a made-up value.

use std::convert::Infallible;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header::CONTENT_TYPE, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::telemetry::dcgm::{FB_FREE, FB_USED, GPU_TEMP, GPU_UTIL, POWER_USAGE};
use crate::telemetry::nvml::{self, DeviceReading};
use crate::telemetry::{GpuSelector, TelemetryError};

/// Content type of the exposition.
const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const MIB: u64 = 1024 * 1024;

/// What `gpulb agent` was asked to do.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Address to serve `/metrics` on.
    pub listen: SocketAddr,
    /// GPUs to report (empty = all).
    pub gpus: Vec<GpuSelector>,
}

pub use super::ServeError as AgentError;

/// Where the agent's readings come from (NVML in production, a fake in tests).
pub trait GpuSource: Send + Sync + 'static {
    /// Reads the GPUs now; may block.
    fn read(&self) -> Result<Vec<DeviceReading>, TelemetryError>;
}

impl<F> GpuSource for F
where
    F: Fn() -> Result<Vec<DeviceReading>, TelemetryError> + Send + Sync + 'static,
{
    fn read(&self) -> Result<Vec<DeviceReading>, TelemetryError> {
        self()
    }
}

/// The GPUs of this host, read through NVML.
#[derive(Debug, Clone)]
pub struct NvmlSource {
    /// GPUs to report (empty = all).
    pub gpus: Vec<GpuSelector>,
}

impl GpuSource for NvmlSource {
    fn read(&self) -> Result<Vec<DeviceReading>, TelemetryError> {
        nvml::read_devices(&self.gpus)
    }
}

/// Runs the agent until Ctrl-C or SIGTERM.
pub fn run(options: AgentOptions) -> Result<(), AgentError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    runtime.block_on(async {
        let listener =
            TcpListener::bind(options.listen)
                .await
                .map_err(|source| AgentError::Bind {
                    addr: options.listen,
                    source,
                })?;
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            super::until_stopped().await;
            let _ = stop.send(true);
        });
        let source = Arc::new(NvmlSource { gpus: options.gpus });
        tracing::info!(listen = %options.listen, "gpulb agent serving /metrics");
        serve(listener, source, stopped).await;
        Ok(())
    })
}

/// Serves `GET /metrics` and `GET /health` on `listener` until `shutdown` turns true.
///
/// Reads the source once at start so a host without GPUs is reported at once (one line),
/// then on every scrape; later changes between working and failing log one line each.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn GpuSource>,
    mut shutdown: watch::Receiver<bool>,
) {
    let state = Arc::new(State {
        source,
        hostname: hostname(),
        failing: AtomicBool::new(false),
    });
    let _ = state.scrape().await;
    let mut conns = JoinSet::new();
    while !*shutdown.borrow() {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let state = state.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| handle(state.clone(), req));
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, "agent accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = crate::telemetry::stopped(&mut shutdown) => break,
        }
    }
}

struct State {
    source: Arc<dyn GpuSource>,
    hostname: String,
    failing: AtomicBool,
}

impl State {
    /// Reads the source off the runtime and logs a change between working and failing.
    async fn scrape(&self) -> Result<Vec<DeviceReading>, TelemetryError> {
        let source = self.source.clone();
        let result = tokio::task::spawn_blocking(move || source.read())
            .await
            .unwrap_or_else(|e| Err(TelemetryError::Nvml(format!("read task failed: {e}"))));
        let was_failing = self.failing.swap(result.is_err(), Ordering::Relaxed);
        match &result {
            Err(error) if !was_failing => {
                tracing::warn!(%error, "gpulb agent: no GPU readings; /metrics answers 503")
            }
            Ok(_) if was_failing => tracing::info!("gpulb agent: GPU readings available again"),
            _ => {}
        }
        result
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => match state.scrape().await {
            Ok(gpus) => (StatusCode::OK, render(&gpus, &state.hostname)),
            Err(error) => (StatusCode::SERVICE_UNAVAILABLE, render_error(&error)),
        },
        (&Method::GET, "/health") => (StatusCode::OK, "OK\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static(CONTENT_TYPE_TEXT),
    );
    Ok(resp)
}

/// The page served when there is nothing to report: one comment line naming the cause.
pub fn render_error(error: &TelemetryError) -> String {
    let one_line = error.to_string().replace(['\n', '\r'], " ");
    format!("# gpulb agent: {one_line}\n")
}

/// Formats one figure of a GPU as a sample value, `None` when unknown.
type Figure = fn(&DeviceReading) -> Option<String>;

/// Renders readings in dcgm-exporter's format; figures that are unknown are left out.
pub fn render(gpus: &[DeviceReading], hostname: &str) -> String {
    let labels: Vec<String> = gpus
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let index = d.reading.index.unwrap_or(i as u32);
            format!(
                "gpu=\"{index}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{index}\",modelName=\"{}\",Hostname=\"{}\"",
                escape(d.reading.uuid.as_deref().unwrap_or("")),
                escape(d.pci_bus_id.as_deref().unwrap_or("")),
                escape(d.model_name.as_deref().unwrap_or("")),
                escape(hostname),
            )
        })
        .collect();
    let families: [(&str, &str, Figure); 5] = [
        (GPU_TEMP, "GPU temperature (in C).", |d| {
            d.reading
                .temperature_celsius
                .map(|t| format!("{}", t.round() as i64))
        }),
        (POWER_USAGE, "Power draw (in W).", |d| {
            d.reading.power_watts.map(|w| format!("{w:.6}"))
        }),
        (GPU_UTIL, "GPU utilization (in %).", |d| {
            d.reading
                .utilization
                .map(|u| format!("{}", (u * 100.0).round() as i64))
        }),
        (FB_FREE, "Framebuffer memory free (in MiB).", |d| {
            let total = d.reading.memory_total_bytes?;
            let used = d.reading.memory_used_bytes?;
            Some((total.saturating_sub(used) / MIB).to_string())
        }),
        (FB_USED, "Framebuffer memory used (in MiB).", |d| {
            d.reading.memory_used_bytes.map(|b| (b / MIB).to_string())
        }),
    ];
    let mut out = String::new();
    for (name, help, value) in families {
        let samples: Vec<(usize, String)> = gpus
            .iter()
            .enumerate()
            .filter_map(|(i, d)| Some((i, value(d)?)))
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (i, v) in samples {
            let _ = writeln!(out, "{name}{{{}}} {v}", labels[i]);
        }
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// This host's name, as dcgm-exporter's `Hostname` label carries it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuReading;

    #[test]
    fn renders_dcgm_layout_and_leaves_unknowns_out() {
        let gpus = [
            DeviceReading {
                reading: GpuReading {
                    index: Some(1),
                    uuid: Some("GPU-x".into()),
                    utilization: Some(0.426),
                    memory_used_bytes: Some(3 * MIB + 5),
                    memory_total_bytes: Some(10 * MIB),
                    temperature_celsius: Some(41.4),
                    power_watts: Some(16.365),
                },
                model_name: Some("NVIDIA H200".into()),
                pci_bus_id: Some("00000000:31:00.0".into()),
            },
            DeviceReading::default(),
        ];
        let text = render(&gpus, "host\"1");
        let labels = "gpu=\"1\",UUID=\"GPU-x\",pci_bus_id=\"00000000:31:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H200\",Hostname=\"host\\\"1\"";
        for line in [
            format!("DCGM_FI_DEV_GPU_TEMP{{{labels}}} 41"),
            format!("DCGM_FI_DEV_POWER_USAGE{{{labels}}} 16.365000"),
            format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 43"),
            format!("DCGM_FI_DEV_FB_FREE{{{labels}}} 6"),
            format!("DCGM_FI_DEV_FB_USED{{{labels}}} 3"),
            "# TYPE DCGM_FI_DEV_FB_USED gauge".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            5,
            "{text}"
        );
        assert_eq!(render(&[], "h"), "");
        let e = render_error(&TelemetryError::NvmlUnavailable("no\nlib".into()));
        assert_eq!(e, "# gpulb agent: NVML unavailable: no lib\n");
    }
}
