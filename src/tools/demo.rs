//! `gpulb demo`: a simulated, deliberately uneven fleet of GPU workers with the real proxy in front.

use crate::config::{Config, LoadError};
use crate::server;
use crate::tools::sim::{SimWorker, WorkerProfile};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the demo listens on and how many workers it simulates.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Proxy listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin: SocketAddr,
    /// Number of simulated GPU workers.
    pub workers: usize,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The simulated workers could not start.
    #[error("cannot start the simulated workers: {0}")]
    Fleet(String),
    /// The generated config was refused (a bug).
    #[error("demo config refused: {0}")]
    Config(#[from] LoadError),
    /// The proxy could not start.
    #[error(transparent)]
    Start(#[from] server::StartError),
    /// The admin token file could not be written.
    #[error("cannot write the admin token file {0}: {1}")]
    Token(String, std::io::Error),
}

/// Worker `i` of the demo fleet: every second worker is uneven on purpose.
pub fn demo_profile(i: usize) -> WorkerProfile {
    let mut profile = WorkerProfile::new(format!("gpu{i}"));
    match i % 4 {
        1 => {
            // Half speed: an older or throttled GPU.
            profile.decode_step *= 2;
            profile.prefill_per_token *= 2;
        }
        2 => profile.kv_budget_tokens /= 2, // half the KV-cache budget
        _ => {}
    }
    profile
}

/// The models the demo fleet serves: the first two GPUs of every four serve the first, the
/// other two the second, so each model has one uneven GPU.
pub const DEMO_MODELS: [&str; 2] = ["llama-3.1-8b", "qwen2.5-32b"];

/// The model demo worker `i` serves.
pub fn demo_model(i: usize) -> &'static str {
    DEMO_MODELS[(i % 4) / 2]
}

/// The demo's config: one pool of every worker, interactive chat and bulk completions classes,
/// models discovered from the workers, and an OpenAI name as an alias. `admin_token_file`
/// holds the admin token a non-loopback admin listener needs.
pub fn demo_config(
    worker_urls: &[String],
    listen: SocketAddr,
    admin: SocketAddr,
    admin_token_file: Option<&Path>,
) -> Result<Config, LoadError> {
    let backends: String = worker_urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            format!(
                "  - name: gpu{i}\n    url: \"{url}\"\n    max_outstanding: 32\n    telemetry:\n      \
                 - {{kind: model_server, server: vllm, interval: 500ms}}\n      \
                 - {{kind: dcgm, url: \"{url}/dcgm/metrics\", interval: 500ms}}\n"
            )
        })
        .collect();
    let names = (0..worker_urls.len())
        .map(|i| format!("gpu{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let token = admin_token_file
        .map(|path| format!(", token_file: {:?}", path.display().to_string()))
        .unwrap_or_default();
    let yaml = format!(
        "listen: \"{listen}\"\nadmin: {{listen: \"{admin}\"{token}}}\nbackends:\n{backends}\
         pools:\n  - name: fleet\n    backends: [{names}]\n    \
         guards: {{max_gpu_memory: 0.97, max_kv_cache: 0.97}}\n\
         classes:\n  \
         - name: interactive\n    pool: fleet\n    match: {{path_prefix: /v1/chat/}}\n    \
         placement: speed_weighted\n    \
         queue: {{max_depth: 256, max_wait: 5s}}\n    fairness: {{policy: equal_share}}\n  \
         - name: bulk\n    pool: fleet\n    backend_share: 0.75\n    placement: earliest_finish\n    \
         queue: {{max_depth: 1024, max_wait: 1m}}\n    fairness: {{policy: equal_share}}\n\
         default_class: bulk\n\
         models: {{interval: 2s, aliases: {{gpt-4o-mini: {}}}, rewrite_aliases: true}}\n",
        DEMO_MODELS[0]
    );
    Config::from_yaml(&yaml)
}

/// Starts the fleet on a background runtime and returns the workers' URLs.
fn start_fleet(workers: usize) -> Result<Vec<String>, DemoError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpulb-demo-fleet".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(tx.send(Err(e.to_string()))),
            };
            runtime.block_on(async move {
                let mut fleet = Vec::new();
                for i in 0..workers {
                    let profile = demo_profile(i).serving(&[demo_model(i)]);
                    match SimWorker::bind_loopback(profile).await {
                        Ok(w) => fleet.push(w),
                        Err(e) => return drop(tx.send(Err(e.to_string()))),
                    }
                }
                let _ = tx.send(Ok(fleet.iter().map(SimWorker::url).collect()));
                // Serve until the process exits.
                std::future::pending::<()>().await;
            });
        })
        .map_err(|e| DemoError::Fleet(e.to_string()))?;
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|e| DemoError::Fleet(e.to_string()))?
        .map_err(DemoError::Fleet)
}

/// Environment variable a non-loopback demo admin listener takes its token from.
pub const DEMO_TOKEN_ENV: &str = "GPULB_ADMIN_TOKEN";

/// The admin token of a non-loopback demo admin listener (from [`DEMO_TOKEN_ENV`], else made
/// up), written to a private file for the config to read; `None` on loopback.
fn admin_token(admin: SocketAddr) -> Result<Option<(String, PathBuf)>, DemoError> {
    if admin.ip().is_loopback() {
        return Ok(None);
    }
    let token = std::env::var(DEMO_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| {
            let bytes: [u8; 16] = rand::random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        });
    let path = std::env::temp_dir().join(format!("gpulb-demo-{}.token", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(&path)?.write_all(token.as_bytes())
    };
    write().map_err(|e| DemoError::Token(path.display().to_string(), e))?;
    Ok(Some((token, path)))
}

/// Runs the demo until Ctrl-C.
pub fn run(options: DemoOptions) -> Result<(), DemoError> {
    let token = admin_token(options.admin)?;
    let urls = start_fleet(options.workers)?;
    let token_file = token.as_ref().map(|(_, path)| path.as_path());
    let config = demo_config(&urls, options.listen, options.admin, token_file)?;
    println!(
        "gpulb demo: {} simulated GPU workers behind the proxy",
        urls.len()
    );
    for (i, url) in urls.iter().enumerate() {
        let note = match i % 4 {
            1 => " (half speed)",
            2 => " (half KV-cache)",
            _ => "",
        };
        println!("  gpu{i}: {url} serves {}{note}", demo_model(i));
    }
    println!("  proxy:  http://{}", options.listen);
    match &token {
        Some((token, _)) => println!(
            "  dashboard: http://{}/dashboard#token={token}   (admin token; set {DEMO_TOKEN_ENV} to choose it)",
            options.admin
        ),
        None => println!("  dashboard: http://{}/dashboard", options.admin),
    }
    println!(
        "  status: http://{}/status   metrics: http://{}/metrics",
        options.admin, options.admin
    );
    println!("try:");
    println!(
        "  curl -N http://{}/v1/chat/completions -H 'content-type: application/json' \\\n    \
         -d '{{\"model\":\"{}\",\"stream\":true,\"max_tokens\":8,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'",
        options.listen, DEMO_MODELS[1]
    );
    println!(
        "  curl http://{}/v1/models    (gpt-4o-mini is an alias of {})",
        options.listen, DEMO_MODELS[0]
    );
    println!("Ctrl-C stops it.");
    let served = server::run(config, server::Source::Builtin, None, Default::default());
    if let Some((_, path)) = &token {
        let _ = std::fs::remove_file(path);
    }
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_config_is_valid_and_uneven() {
        let urls: Vec<String> = (0..4)
            .map(|i| format!("http://127.0.0.1:{}", 9100 + i))
            .collect();
        let config = demo_config(
            &urls,
            "127.0.0.1:18080".parse().unwrap(),
            "127.0.0.1:18081".parse().unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(config.backends.len(), 4);
        assert_eq!(config.classes.len(), 2);
        assert_eq!(config.backends[0].telemetry.len(), 2);
        assert!(demo_profile(1).decode_step > demo_profile(0).decode_step);
        assert!(demo_profile(2).kv_budget_tokens < demo_profile(0).kv_budget_tokens);
        let models: Vec<&str> = (0..4).map(demo_model).collect();
        assert_eq!(
            models,
            [
                DEMO_MODELS[0],
                DEMO_MODELS[0],
                DEMO_MODELS[1],
                DEMO_MODELS[1]
            ]
        );
        assert_eq!(config.models.aliases["gpt-4o-mini"], DEMO_MODELS[0]);
    }

    #[test]
    fn a_non_loopback_admin_listener_gets_a_token_file() {
        let urls = vec!["http://127.0.0.1:9100".to_string()];
        let (listen, admin) = (
            "0.0.0.0:18080".parse().unwrap(),
            "0.0.0.0:18081".parse().unwrap(),
        );
        assert!(demo_config(&urls, listen, admin, None).is_err());
        let dir = std::env::temp_dir().join(format!("gpulb-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let config = demo_config(&urls, listen, admin, Some(&file)).unwrap();
        let token = config.admin.as_ref().unwrap().token().unwrap();
        assert_eq!(token.as_deref(), Some("s3cret"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
