//! The `gpulb` binary: parse the command line, load config, hand over to the library.

use clap::Parser;
use gpulb::cli::{Cli, Command};
use gpulb::config::Config;
use std::process::ExitCode;

mod allocator;

/// mimalloc: pingora allocates per request and per chunk; it is faster than glibc's malloc here,
/// and faster still called as `allocator` does (3.8k fewer instructions per request). Built
/// without transparent huge pages (`no_thp` in Cargo.toml): each huge page it touched stayed
/// resident whole, 12 MiB at rest (BENCHMARKS.md, "Memory").
#[global_allocator]
static GLOBAL: allocator::Mimalloc = allocator::Mimalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        gpulb::access_log::init(None);
    }
    let result = match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(parsed) => {
                // A name that does not resolve now is no error (the backend waits, unhealthy,
                // until it does), but the operator should hear of it.
                for (backend, upstream) in parsed.backends.iter().zip(&parsed.compiled.upstreams) {
                    if let Err(e) = upstream.resolve() {
                        eprintln!(
                            "{}: warning: backends {:?}: {e}; it gets no traffic until it resolves",
                            config.display(),
                            backend.name
                        );
                    }
                }
                println!("{}: ok: {}", config.display(), parsed.summary());
                Ok(())
            }
            Err(e) => Err(format!("{}: invalid:\n{e}", config.display())),
        },
        Command::Serve {
            config,
            upgrade,
            upgrade_socket,
        } => Config::load(&config)
            .map_err(|e| format!("{}: invalid:\n{e}", config.display()))
            .and_then(|c| {
                gpulb::access_log::init(c.access_log.format());
                let handover = gpulb::lifecycle::Handover {
                    socket: upgrade_socket,
                    take_over: upgrade,
                };
                let source = gpulb::server::Source::File(config);
                gpulb::server::run(c, source, None, handover).map_err(|e| e.to_string())
            }),
        Command::Demo {
            listen,
            admin,
            workers,
        } => gpulb::tools::demo::run(gpulb::tools::demo::DemoOptions {
            listen,
            admin,
            workers: usize::from(workers),
        })
        .map_err(|e| e.to_string()),
        Command::Sim {
            listen,
            name,
            models,
            decode_step,
            max_running,
            kv_budget_tokens,
            gpu_index,
        } => gpulb::tools::sim_serve::run(gpulb::tools::sim_serve::SimOptions {
            listen,
            name,
            models,
            decode_step,
            max_running: usize::from(max_running),
            kv_budget_tokens: kv_budget_tokens as usize,
            gpu_index,
        })
        .map_err(|e| e.to_string()),
        Command::Probe { url, timeout } => {
            gpulb::tools::probe::run(&url, timeout).map_err(|e| e.to_string())
        }
        Command::Agent { listen, gpus } => {
            gpulb::tools::agent::run(gpulb::tools::agent::AgentOptions { listen, gpus })
                .map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gpulb: {message}");
            ExitCode::FAILURE
        }
    }
}
