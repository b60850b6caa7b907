//! `delay-router`: parses the command line and runs it (see `cli`).

mod cli;

use clap::Parser;
use cli::{Cli, execute};
use tracing_subscriber::EnvFilter;

/// Log filter when `RUST_LOG` is unset. lapin logs every channel the broker
/// closes at ERROR, including the passive probes and the refused deliveries
/// the router handles on purpose; the router logs what matters itself.
const DEFAULT_LOG: &str = "info,lapin::channel=off";

// One thread: the router is I/O-bound and shares small machines with the
// broker; lapin runs its own I/O thread beside it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG)),
        )
        .with_writer(std::io::stderr)
        .init();
    match execute(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
