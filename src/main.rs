//! `delay-router`: parses the command line and runs it (see `cli`).

mod cli;

use clap::Parser;
use cli::{Cli, execute};
use delay_router::config::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Log filter when `RUST_LOG` is unset. lapin logs every channel the broker
/// closes at ERROR, including the passive probes and the refused deliveries
/// the router handles on purpose; the router logs what matters itself.
const DEFAULT_LOG: &str = "info,lapin::channel=off";

// glibc's malloc and free cost far more per message than mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread for the router's tasks: it is I/O-bound and shares small
// machines with the broker.
fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format() {
        LogFormat::Json => log.json().with_current_span(true).init(),
        // Colour codes only for a person at a terminal, never in a file or a journal.
        LogFormat::Text => log.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    match execute(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
