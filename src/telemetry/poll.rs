//! The telemetry loop of one backend: reads each source on its own cadence, merges, publishes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{dcgm, model_server, nvml};
use super::{Reading, ServerSample, SourceConfig, SourceKind, Telemetry, TelemetryError};

/// Largest metrics page read; vLLM's full page is a few hundred KiB.
pub const MAX_BODY: usize = 8 << 20;

/// The backend whose telemetry is read: its URL, and the `Authorization` its own server wants.
#[derive(Debug, Clone, Default)]
pub struct OwnServer {
    /// The backend's URL, which a model-server source without a `url` reads.
    pub url: String,
    /// Sent to the backend's own server only (its `auth`), never to another source's URL.
    pub auth: Option<crate::config::Credential>,
}

impl OwnServer {
    /// The backend at `url`, whose server wants no credential.
    pub fn at(url: &str) -> OwnServer {
        OwnServer {
            url: url.to_string(),
            auth: None,
        }
    }
}

/// Reads one source once, bounded by its timeout; HTTP sources with `client`, else the shared
/// scraping client.
pub async fn scrape(
    source: &SourceConfig,
    own: &OwnServer,
    client: Option<&reqwest::Client>,
) -> Result<Reading, TelemetryError> {
    match &source.kind {
        SourceKind::Nvml { gpus } => {
            let gpus = gpus.clone();
            let task = tokio::task::spawn_blocking(move || nvml::read_gpus(&gpus));
            match tokio::time::timeout(source.timeout, task).await {
                Ok(Ok(result)) => result.map(|gpus| Reading { gpus, server: None }),
                Ok(Err(join)) => Err(TelemetryError::Nvml(format!("read task failed: {join}"))),
                Err(_) => Err(TelemetryError::Timeout {
                    url: "nvml".to_string(),
                    timeout: source.timeout,
                }),
            }
        }
        SourceKind::Dcgm { url, gpus } => {
            let text = fetch(url, source.timeout, client, None).await?;
            dcgm::parse_dcgm(&text, gpus)
        }
        SourceKind::ModelServer { server, url: given } => {
            let url = source.url(&own.url).unwrap_or_default();
            let auth = own.auth.as_ref().filter(|_| given.is_none());
            let text = fetch(&url, source.timeout, client, auth).await?;
            model_server::parse_server_load(*server, &text)
        }
    }
}

/// The process-wide scraping client (keep-alive pool shared by every backend's loop); an
/// https URL is checked against the system's roots.
fn shared_client() -> Result<&'static reqwest::Client, TelemetryError> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            crate::tls::with_system_roots(reqwest::Client::builder())
                .connect_timeout(Duration::from_secs(2))
                .pool_idle_timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|message| TelemetryError::Http {
            url: String::new(),
            message: format!("cannot build HTTP client: {message}"),
        })
}

/// GETs a metrics page with `client` (else the shared one): success status, at most
/// [`MAX_BODY`] bytes, all within `timeout`.
pub(crate) async fn fetch(
    url: &str,
    timeout: Duration,
    client: Option<&reqwest::Client>,
    auth: Option<&crate::config::Credential>,
) -> Result<String, TelemetryError> {
    let http = |e: reqwest::Error| TelemetryError::Http {
        url: url.to_string(),
        message: e.without_url().to_string(),
    };
    let request = async {
        let client = match client {
            Some(client) => client,
            None => shared_client()?,
        };
        let request = crate::tls::authorized(client.get(url), auth);
        let mut resp = request.send().await.map_err(http)?;
        if !resp.status().is_success() {
            return Err(TelemetryError::Status {
                url: url.to_string(),
                status: resp.status().as_u16(),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(http)? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(TelemetryError::TooLarge {
                    url: url.to_string(),
                    limit: MAX_BODY,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or_else(|_| {
            Err(TelemetryError::Timeout {
                url: url.to_string(),
                timeout,
            })
        })
}

/// One source's schedule and last good reading.
struct Slot {
    config: SourceConfig,
    next: Instant,
    /// The last good reading, when it arrived, and this proxy's requests in flight then.
    last: Option<(Reading, Instant, u32)>,
    /// When it was last read, successfully or not.
    read_at: Option<Instant>,
    failing: bool,
}

impl Slot {
    /// Whether it is to be read at `now`: its interval is up, or it reads a model server that
    /// was last read at least `hurry` ago.
    fn due(&self, now: Instant, hurry: Option<Duration>) -> bool {
        let hurried = hurry.is_some_and(|every| {
            matches!(self.config.kind, SourceKind::ModelServer { .. })
                && self.read_at.is_none_or(|at| at + every <= now)
        });
        self.next <= now || hurried
    }
}

/// The backend a poll loop reads for, as the loop needs to see it.
pub trait PollTarget: Send + Sync + 'static {
    /// This proxy's requests in flight on the backend now (stored beside each reading, so the
    /// server's own counts can be split into this proxy's share and everyone else's).
    fn own_in_flight(&self) -> u32;
    /// A new reading was stored (capacity may have appeared: the server's load fell).
    fn stored(&self);
    /// How often to read the model server while someone waits on what it will say next
    /// (requests queued for room other replicas hold); `None`: each source's own interval.
    fn hurry(&self) -> Option<Duration> {
        None
    }
    /// The longest the loop may sleep before asking [`PollTarget::hurry`] again; `None`: it
    /// sleeps until a source is due.
    fn hurry_check(&self) -> Option<Duration> {
        None
    }
}

/// Polls a backend's sources until `shutdown` turns true (or its sender is dropped), with
/// `client` for HTTP sources (an https backend's own trust settings), else the shared one.
///
/// Each source is read every `interval`; after a round in which any source succeeded, the
/// merge of every source's last good reading is stored in `sink`, stamped with the oldest of
/// their times, and `target` is told. A failed read keeps that source's last reading (so the
/// stamp ages), adds one to `errors`, and is logged only when the source turns from ok to
/// failing and back.
pub async fn poll(
    sources: Vec<SourceConfig>,
    own: OwnServer,
    client: Option<reqwest::Client>,
    sink: Arc<ArcSwapOption<Telemetry>>,
    errors: Arc<AtomicU64>,
    target: Arc<dyn PollTarget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let start = Instant::now();
    let mut slots: Vec<Slot> = sources
        .into_iter()
        .map(|config| Slot {
            config,
            next: start,
            last: None,
            read_at: None,
            failing: false,
        })
        .collect();
    let mut others_share = OthersShare::default();
    while !slots.is_empty() && !*shutdown.borrow() {
        let round = Instant::now();
        let hurry = target.hurry();
        let due: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].due(round, hurry))
            .collect();
        let reads = join_all(
            due.iter()
                .map(|&i| scrape(&slots[i].config, &own, client.as_ref())),
        );
        let results = tokio::select! {
            results = reads => results,
            () = stopped(&mut shutdown) => return,
        };
        let own_in_flight = target.own_in_flight();
        let mut any_ok = false;
        for (&i, result) in due.iter().zip(results) {
            let slot = &mut slots[i];
            slot.next = (round + slot.config.interval).max(Instant::now());
            slot.read_at = Some(round);
            any_ok |= record(slot, result, own_in_flight, &own.url, &errors);
        }
        if any_ok {
            let mut telemetry = merged(&slots);
            others_share.observe(&mut telemetry);
            sink.store(Some(Arc::new(telemetry)));
            target.stored();
        }
        let mut wake = slots.iter().map(|s| s.next).min().unwrap_or(round);
        if let Some(check) = target.hurry_check() {
            wake = wake.min(Instant::now() + check);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// Resolves once shutdown is asked for, or its sender is gone.
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send: drop it here, inside this future.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Notes one read's outcome; true when it succeeded.
fn record(
    slot: &mut Slot,
    result: Result<Reading, TelemetryError>,
    own_in_flight: u32,
    backend: &str,
    errors: &AtomicU64,
) -> bool {
    let source = slot.config.label();
    match result {
        Ok(reading) => {
            if slot.failing {
                tracing::info!(backend, source, "telemetry source recovered");
                slot.failing = false;
            }
            slot.last = Some((reading, Instant::now(), own_in_flight));
            true
        }
        Err(error) => {
            errors.fetch_add(1, Ordering::Relaxed);
            if !slot.failing {
                tracing::warn!(backend, source, %error, "telemetry source failing; keeping its last reading");
                slot.failing = true;
            }
            false
        }
    }
}

/// Every source's last good reading, merged in config order, stamped with the oldest time;
/// the server sample is the first source's with server figures (the one whose counts win).
fn merged(slots: &[Slot]) -> Telemetry {
    let mut reading = Reading::default();
    let mut oldest: Option<Instant> = None;
    let mut server_sample = None;
    for (r, at, own_in_flight) in slots.iter().filter_map(|s| s.last.as_ref()) {
        if server_sample.is_none() && r.server.is_some() {
            server_sample = Some(ServerSample {
                taken_at: at.into_std(),
                own_in_flight: *own_in_flight,
                others_share: 0.0,
            });
        }
        reading.merge(r);
        oldest = Some(oldest.map_or(*at, |o| o.min(*at)));
    }
    Telemetry {
        reading,
        taken_at: oldest.unwrap_or_else(Instant::now).into_std(),
        server_sample,
    }
}

/// How far each new server reading moves the remembered share of everyone else's load.
const OTHERS_SHARE_STEP: f64 = 1.0 / 8.0;

/// Everyone else's share of one backend's load, remembered across its readings.
#[derive(Debug, Default)]
pub(super) struct OthersShare {
    share: f64,
    last_sample: Option<std::time::Instant>,
}

impl OthersShare {
    /// Moves the share toward what `telemetry`'s server sample shows (once per new sample, and
    /// only when the backend had load then) and writes it into that sample.
    pub(super) fn observe(&mut self, telemetry: &mut Telemetry) {
        let Some(sample) = telemetry.server_sample else {
            return;
        };
        if self.last_sample != Some(sample.taken_at) {
            self.last_sample = Some(sample.taken_at);
            let at_read = telemetry.others_at_read(Duration::MAX, sample.taken_at);
            if let Some(at_read) = at_read.filter(|a| a.own + a.others > 0) {
                let now = f64::from(at_read.others) / f64::from(at_read.own + at_read.others);
                self.share += (now - self.share) * OTHERS_SHARE_STEP;
            }
        }
        if let Some(sample) = telemetry.server_sample.as_mut() {
            sample.others_share = self.share;
        }
    }
}
