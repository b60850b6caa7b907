//! The command line (binary only): parses the arguments, runs the command
//! from [`delay_router::commands`] or [`delay_router::router`], prints.

use anyhow::Context;
use clap::{Parser, Subcommand};
use delay_router::commands::{cancel, declare, parked, permissions, status};
use delay_router::config::{Config, LogFormat};
use delay_router::core::decision::Rules;
use delay_router::router::clock;
use delay_router::{broker, router, shutdown};
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Cancel waiting messages by message-id: each is parked (reason
    /// cancelled) at its next bucket expiry instead of being delivered.
    Cancel {
        #[command(flatten)]
        config: ConfigArg,
        /// The message-ids to cancel.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print the rabbitmqctl commands that give the router's user and the
    /// publishers the least privileges they need.
    Permissions {
        #[command(flatten)]
        config: ConfigArg,
        /// The publishers' broker user.
        #[arg(long, default_value = "PUBLISHER")]
        publisher: String,
        /// The broker user who may cancel waiting messages.
        #[arg(long, default_value = "CONTROLLER")]
        controller: String,
    },
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

impl Cli {
    /// The log format of the command's configuration (text when it has none,
    /// or it cannot be read: loading it again reports that).
    pub fn log_format(&self) -> LogFormat {
        let arg = match &self.command {
            Command::Run(arg) | Command::Declare(arg) | Command::Status(arg) => arg,
            Command::Cancel { config, .. } | Command::Permissions { config, .. } => config,
            Command::Parked(
                ParkedCommand::List { config, .. }
                | ParkedCommand::Replay { config, .. }
                | ParkedCommand::Purge { config, .. },
            ) => config,
        };
        Config::load(&arg.config).map_or(LogFormat::Text, |c| c.log_format)
    }
}

fn load(arg: &ConfigArg) -> anyhow::Result<Config> {
    Config::load(&arg.config)
        .with_context(|| format!("invalid configuration {}", arg.config.display()))
}

/// Runs one command to completion.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(arg) => router::run(load(&arg)?, shutdown::signal()).await?,
        Command::Declare(arg) => println!("{}", declare::declare(&load(&arg)?).await?),
        Command::Status(arg) => {
            let config = load(&arg)?;
            let report = status::collect(&config).await?;
            print!("{}", status::render(&config, &report));
        }
        Command::Parked(cmd) => parked_command(cmd).await?,
        Command::Cancel { config, ids } => {
            let config = load(&config)?;
            let until = cancel::cancel(&config, &ids).await?;
            let until = humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_millis(u64::try_from(until).unwrap_or(0)),
            );
            println!(
                "cancelled {} message-id(s); each is removed at its next bucket expiry (tombstones kept until {until})",
                ids.len()
            );
        }
        Command::Permissions {
            config,
            publisher,
            controller,
        } => {
            let config = load(&config)?;
            print!("{}", permissions::report(&config, &publisher, &controller));
        }
    }
    Ok(())
}

async fn parked_command(cmd: ParkedCommand) -> anyhow::Result<()> {
    let arg = match &cmd {
        ParkedCommand::List { config, .. }
        | ParkedCommand::Replay { config, .. }
        | ParkedCommand::Purge { config, .. } => config,
    };
    let config = load(arg)?;
    let rules = Rules::from_config(&config);
    let names = &rules.names;
    let ca = config.ca_file.as_ref();
    let (conn, _) = broker::connect_any(&config.urls, 0, ca, "delay-router parked").await?;
    let conn = Arc::new(conn);
    let result = match cmd {
        ParkedCommand::List { limit, .. } => {
            let rows = parked::list(&conn, names, limit).await?;
            print!("{}", parked::render(&rows, clock::now_ms()));
            Ok(())
        }
        ParkedCommand::Replay {
            source_queue,
            reason,
            limit,
            ..
        } => {
            let filter = parked::Filter {
                source_queue,
                reason_contains: reason,
                limit,
            };
            let done = parked::replay(conn.clone(), &rules, &filter).await?;
            println!(
                "replayed {}, skipped {} (not matching), failed {} (no destination, not allowed, or refused by it; still parked)",
                done.replayed, done.skipped, done.failed
            );
            Ok(())
        }
        ParkedCommand::Purge { yes, .. } => {
            if yes {
                let n = parked::purge(&conn, names).await?;
                println!("purged {n} parked message(s) from {}", names.parked);
                Ok(())
            } else {
                let n = broker::probe::depth(&conn, &names.parked)
                    .await?
                    .unwrap_or(0);
                Err(anyhow::anyhow!(
                    "refusing to purge {n} parked message(s) from {} without --yes",
                    names.parked
                ))
            }
        }
    };
    broker::close_connection(&conn, "done").await;
    result
}
