//! Command line: `gpulb serve | check | demo | agent`.

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

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
