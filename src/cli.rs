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
    /// Look at, replay or purge the parked messages.
    #[command(subcommand)]
    Parked(ParkedCommand),
}

#[derive(Debug, Subcommand)]
pub enum ParkedCommand {
    /// List parked messages (reason, source queue, attempts, age); removes nothing.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// Show at most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Send parked messages back to their destination, each removed from the
    /// park only after its republish is confirmed.
    Replay {
        #[command(flatten)]
        config: ConfigArg,
        /// Only messages rejected by this queue.
        #[arg(long)]
        source_queue: Option<String>,
        /// Only messages whose x-park-reason contains this text.
        #[arg(long)]
        reason: Option<String>,
        /// Replay at most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Delete every parked message.
    Purge {
        #[command(flatten)]
        config: ConfigArg,
        /// Required: purging cannot be undone.
        #[arg(long)]
        yes: bool,
    },
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
            let conn =
                broker::connect(&config.url, config.ca_file.as_ref(), "delay-router declare")
                    .await?;
            let plan = crate::decision::Plan::from_config(&config);
            let names = &plan.names;
            broker::declare(&conn, names, plan.queue_type, &plan.bucket_queues()).await?;
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
        Command::Parked(cmd) => parked(cmd).await?,
        Command::Status(arg) => {
            let config = load(&arg)?;
            let rows = status::collect(&config).await?;
            print!("{}", status::render(&config, &rows));
        }
    }
    Ok(())
}

async fn parked(cmd: ParkedCommand) -> anyhow::Result<()> {
    let arg = match &cmd {
        ParkedCommand::List { config, .. }
        | ParkedCommand::Replay { config, .. }
        | ParkedCommand::Purge { config, .. } => config,
    };
    let config = load(arg)?;
    let names = crate::topology::Names::new(&config.prefix);
    let conn = broker::connect(&config.url, config.ca_file.as_ref(), "delay-router parked").await?;
    let result = match cmd {
        ParkedCommand::List { limit, .. } => {
            let rows = crate::parked::list(&conn, &names, limit).await?;
            print!("{}", crate::parked::render(&rows, router::now_ms()));
            Ok(())
        }
        ParkedCommand::Replay {
            source_queue,
            reason,
            limit,
            ..
        } => {
            let filter = crate::parked::Filter {
                source_queue,
                reason_contains: reason,
                limit,
            };
            let done = crate::parked::replay(&conn, &names, &filter).await?;
            println!(
                "replayed {}, skipped {} (not matching), failed {} (no destination, or refused by it; still parked)",
                done.replayed, done.skipped, done.failed
            );
            Ok(())
        }
        ParkedCommand::Purge { yes, .. } => {
            if yes {
                let n = crate::parked::purge(&conn, &names).await?;
                println!("purged {n} parked message(s) from {}", names.parked);
                Ok(())
            } else {
                let n = broker::depth(&conn, &names.parked).await?.unwrap_or(0);
                Err(anyhow::anyhow!(
                    "refusing to purge {n} parked message(s) from {} without --yes",
                    names.parked
                ))
            }
        }
    };
    let _ = broker::timed(
        "connection.close",
        broker::RPC_TIMEOUT,
        conn.close(200, "done".into()),
    )
    .await;
    result
}
