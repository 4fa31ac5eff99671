//! The `gpulb` binary: parse the command line, load config, hand over to the library.

use clap::Parser;
use gpulb::cli::{Cli, Command};
use gpulb::config::Config;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(parsed) => {
                println!("{}: ok: {}", config.display(), parsed.summary());
                Ok(())
            }
            Err(e) => Err(format!("{}: invalid:\n{e}", config.display())),
        },
        Command::Serve { config } => Config::load(&config)
            .map_err(|e| format!("{}: invalid:\n{e}", config.display()))
            .and_then(|c| gpulb::server::run(c, None).map_err(|e| e.to_string())),
        Command::Demo {
            listen,
            admin,
            workers,
        } => gpulb::demo::run(gpulb::demo::DemoOptions {
            listen,
            admin,
            workers: usize::from(workers),
        })
        .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gpulb: {message}");
            ExitCode::FAILURE
        }
    }
}
