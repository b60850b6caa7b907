//! The command line (the `cli` feature): parses the arguments, runs the
//! command, prints. The `delay-router` binary is [`main`].

use crate::commands::{cancel, declare, parked, permissions, status};
use crate::config::{Config, LogFormat};
use crate::core::decision::Rules;
use crate::router::clock;
use crate::{broker, router, shutdown};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

/// Log filter when `RUST_LOG` is unset. lapin logs every channel the broker
/// closes at ERROR, including the passive probes and the refused deliveries
/// the router handles on purpose; the router logs what matters itself.
const DEFAULT_LOG: &str = "info,lapin::channel=off";

/// The `delay-router` binary: parses the command line, runs the command on
/// a single-threaded runtime (the router is I/O-bound and shares small
/// machines with the broker) and returns the exit status: 0, or 2 with the
/// error on stderr.
pub fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run_cli()),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run_cli() -> std::process::ExitCode {
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

/// delay-router: delayed retries and delayed delivery for RabbitMQ.
#[derive(Debug, Parser)]
#[command(version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
pub(crate) enum ParkedCommand {
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
pub(crate) struct ConfigArg {
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
pub(crate) async fn execute(cli: Cli) -> anyhow::Result<()> {
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
