//! Command line: `run`, `declare` and `status`, each reading `--config` (default `./buckets.toml`).

use crate::config::Config;
use crate::{broker, router, shutdown, status};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// delay-router: delayed retries and delayed delivery for RabbitMQ.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Declare the topology and route messages until SIGINT or SIGTERM.
    Run(ConfigArg),
    /// Declare the exchanges and queues, then exit (idempotent).
    Declare(ConfigArg),
    /// Print each bucket's TTL and depth, and the ingress, expired and parked depths.
    Status(ConfigArg),
}

#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    /// The ladder file.
    #[arg(long, short, default_value = "buckets.toml")]
    pub config: PathBuf,
}

fn load(arg: &ConfigArg) -> anyhow::Result<Config> {
    Config::load(&arg.config)
        .with_context(|| format!("invalid configuration {}", arg.config.display()))
}

/// Runs one command to completion.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(arg) => {
            let config = load(&arg)?;
            router::run(config, shutdown::signal()).await?;
        }
        Command::Declare(arg) => {
            let config = load(&arg)?;
            let conn = broker::connect(&config.url, "delay-router declare").await?;
            let plan = crate::decision::Plan::new(
                &config.ladder,
                config.strategy,
                &config.prefix,
                config.url.username(),
            );
            let names = &plan.names;
            broker::declare(&conn, names, &plan.bucket_queues()).await?;
            let _ = broker::timed(
                "connection.close",
                broker::RPC_TIMEOUT,
                conn.close(200, "declared".into()),
            )
            .await;
            println!(
                "declared {} buckets, {}, {}, {} and {} on {}",
                plan.ladder.rungs().len(),
                names.router_exchange,
                names.ingress,
                names.expired,
                names.parked,
                config.url
            );
        }
        Command::Status(arg) => {
            let config = load(&arg)?;
            let rows = status::collect(&config).await?;
            print!("{}", status::render(&config, &rows));
        }
    }
    Ok(())
}
