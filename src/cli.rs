//! Command line: `gpulb serve | check | demo | sim | agent | probe`.

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// gpulb: a load balancer for GPU inference fleets.
#[derive(Debug, Parser)]
#[command(name = "gpulb", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy with a config file.
    Serve {
        /// YAML config file (see conf/gpulb.yaml).
        #[arg(long, short)]
        config: PathBuf,
        /// Take the listening sockets over from the running gpulb (send it SIGQUIT next): a
        /// binary upgrade without a refused connection.
        #[arg(long)]
        upgrade: bool,
        /// Unix socket the listening sockets are handed over through, on SIGQUIT and --upgrade.
        #[arg(long, default_value = crate::lifecycle::handover::DEFAULT_SOCKET)]
        upgrade_socket: PathBuf,
    },
    /// Validate a config file: print a summary, or every error with its field path.
    Check {
        /// YAML config file to check.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Start a simulated fleet of GPU workers with the proxy in front, until Ctrl-C.
    Demo {
        /// Proxy listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Admin listen address.
        #[arg(long, default_value = "127.0.0.1:8081")]
        admin: SocketAddr,
        /// Number of simulated workers.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
        workers: u16,
    },
    /// Serve one simulated GPU worker (OpenAI API, vLLM-style /metrics, /dcgm/metrics) until
    /// SIGTERM or Ctrl-C.
    Sim {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        /// Worker name (the `x-sim-worker` header and the metrics label).
        #[arg(long, default_value = "sim")]
        name: String,
        /// Models served, comma-separated; others get 404 (default: one model, any name accepted).
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// Time of one decode step with one running sequence.
        #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
        decode_step: Duration,
        /// Most sequences running at once.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
        max_running: u16,
        /// KV-cache budget in tokens.
        #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(u32).range(1..))]
        kv_budget_tokens: u32,
        /// GPU index reported in /dcgm/metrics.
        #[arg(long, default_value_t = 0)]
        gpu_index: u32,
    },
    /// GET a URL and exit 0 on a 2xx answer (a container HEALTHCHECK without curl).
    Probe {
        /// The URL to GET.
        #[arg(default_value = "http://127.0.0.1:8081/livez")]
        url: String,
        /// Longest wait for the answer.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Serve this host's GPU readings (NVML) as dcgm-exporter-style /metrics, until Ctrl-C.
    Agent {
        /// Listen address of the metrics endpoint.
        #[arg(long, default_value = "127.0.0.1:9400")]
        listen: SocketAddr,
        /// GPUs to report, by index or UUID, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        gpus: Vec<crate::telemetry::GpuSelector>,
    },
}
