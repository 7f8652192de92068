//! The command line's arguments (clap): the commands and their options, with the value
//! parsers that check them as they are read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use workflow_core::RunStatus;

use crate::error::CliError;
use crate::ops;
use crate::text;

const AFTER_HELP: &str = "\
The database is --db (or WORKFLOW_DB), else --database-url (or WORKFLOW_DATABASE_URL), else
workflows.db in the current directory. --db wins when both are set.

Exit status: 0 done; 1 not found (no such run, no open hook for the token); 2 invalid
arguments (including a malformed run id or JSON payload); 3 the database cannot be opened;
4 refused, nothing changed (retry of a run that neither failed nor is blocked, a fork past the
run's steps).";

/// Inspect durable workflow runs, cancel, retry or fork them, resume their hooks, export their
/// histories, prune the old ones, or serve a dashboard.
#[derive(Debug, Parser)]
#[command(name = "workflow", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// The SQLite file your workflows use.
    #[arg(long, global = true, env = "WORKFLOW_DB", value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// A PostgreSQL URL (postgres://user@host:port/db); needs the `postgres` feature.
    // hide_env_values: `--help` would otherwise print the URL, password included.
    #[arg(
        long,
        global = true,
        env = "WORKFLOW_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// The PostgreSQL schema holding the tables.
    #[arg(
        long,
        global = true,
        env = "WORKFLOW_SCHEMA",
        default_value = "workflow",
        value_name = "NAME"
    )]
    pub schema: String,
    /// The payload encryption keys, a file of `current <id> <key>` and
    /// `old <id> <key>` lines: payloads are shown decrypted. Without them an encrypted payload
    /// shows as `encrypted (key <id>)`.
    #[arg(long, global = true, env = "WORKFLOW_KEYS", value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Show times in this zone: an IANA name (Europe/Paris), UTC, or local. JSON keeps UTC.
    #[arg(
        long,
        global = true,
        default_value = "UTC",
        value_name = "ZONE",
        value_parser = text::parse_zone
    )]
    pub tz: jiff::tz::TimeZone,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List runs, newest first.
    Runs {
        /// Only runs in this state.
        #[arg(long, value_name = "STATUS")]
        status: Option<StatusArg>,
        /// Only runs of this workflow.
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// Only runs started in this queue; shows the queue's limits and occupancy and each
        /// waiting run's position (1 begins next).
        #[arg(long, value_name = "NAME")]
        queue: Option<String>,
        /// Only runs started by a build of this version (`Runtime::builder().version(v)`),
        /// e.g. the runs that predate a deploy.
        #[arg(long, value_name = "V")]
        version: Option<String>,
        /// At most this many runs.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The page after this run: the runs listed after it, newest first. A full page of
        /// the table is followed by the command for the next one (on stderr).
        #[arg(long, value_name = "RUN_ID")]
        after: Option<String>,
    },
    /// List the declared queues: limits, occupied slots, waiting runs, begins in the rate
    /// window.
    Queues,
    /// List the schedules: workflow, cron expression and zone or period, paused or active,
    /// last and next nominal times.
    Schedules,
    /// Show a schedule (spec, next times, latest ticks), or pause, resume, trigger or
    /// backfill it.
    Schedule {
        /// The schedule's name.
        name: String,
        #[command(subcommand)]
        action: Option<crate::schedules::ScheduleAction>,
    },
    /// Show a run: status, input, result, steps with attempts and durations, hooks and sleeps.
    Run {
        /// The run's id.
        id: String,
    },
    /// Show a run's event history; with --published, the latest value of each key the run
    /// published with `set_event`.
    Events {
        /// The run's id.
        run_id: String,
        /// Show the values the run published (`set_event`), one per key, instead.
        #[arg(long)]
        published: bool,
    },
    /// List open hooks (the tokens `resume` can reach).
    Hooks {
        /// Only the hook owning this token.
        #[arg(long)]
        token: Option<String>,
        /// Only hooks of this run.
        #[arg(long, value_name = "RUN_ID")]
        run: Option<String>,
        /// At most this many hooks.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Cancel a run.
    Cancel {
        /// The run's id.
        run_id: String,
    },
    /// Retry a run now: a blocked run is handed to a worker (it goes on if the deployed code
    /// fits its history again); a failed run is re-opened, its recorded steps kept and the step
    /// that failed it given a fresh set of attempts.
    Retry {
        /// The run's id.
        run_id: String,
    },
    /// Start a copy of a run that keeps the recorded results of its first N steps and runs the
    /// rest with the deployed code; prints the new run's id.
    Fork {
        /// The run's id.
        run_id: String,
        /// How many of its steps (in the order they were scheduled) the copy keeps.
        #[arg(long, value_name = "N")]
        from_step: usize,
    },
    /// Print a run's history as versioned JSON, for `workflow_core::testing::replay` in tests.
    Export {
        /// The run's id.
        run_id: String,
        /// Write it to FILE instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Write encrypted payloads decrypted (needs --keys); by default they stay encrypted,
        /// as stored.
        #[arg(long)]
        decrypt: bool,
    },
    /// Print a run's stream NAME, a chunk per line: its index, the attempt of the step that
    /// wrote it and its value as JSON (--json: a JSON object per line). With --follow, wait
    /// for the chunks still to come, until the stream is closed or the run ends.
    Stream {
        /// The run's id.
        run_id: String,
        /// The stream's name.
        name: String,
        /// Start at this chunk index.
        #[arg(long, default_value_t = 0, value_name = "N")]
        from: u64,
        /// Keep printing chunks as they are written, until the stream is closed or the run
        /// ends.
        #[arg(long)]
        follow: bool,
    },
    /// Send a JSON payload to the run whose open hook owns TOKEN.
    Resume {
        /// The hook's token.
        token: String,
        /// The payload as JSON, e.g. '{"approved": true}'; `-` reads it from standard input.
        payload: String,
    },
    /// Send a JSON message to run RUN_ID on TOPIC, for its workflow's `recv(topic)`.
    Send {
        /// The run's id.
        run_id: String,
        /// The topic.
        topic: String,
        /// The message as JSON, e.g. '{"by": "ana"}'; `-` reads it from standard input.
        payload: String,
        /// An idempotency key: at most one message per run and key is stored.
        #[arg(long, value_name = "K")]
        key: Option<String>,
    },
    /// Delete runs that ended (completed, failed, cancelled) longer ago than --older-than,
    /// with their events, payloads and released hooks. Runs that have not ended, and runs
    /// whose hook token is still retained, are kept.
    Prune {
        /// How long ago a run must have ended: numbers with units, e.g. 30d, 12h, 90m, 45s,
        /// 1h30m, 2 weeks (the grammar of `#[step(timeout = "..")]`).
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age)]
        older_than: ops::Age,
    },
    /// Re-encrypt every stored payload sealed under an old key with the current key of
    /// --keys (required), so the old keys can go. Safe beside live workers; a rerun after an
    /// interruption goes on, and on a done store rewrites nothing.
    Rekey {
        /// Rows read per page.
        #[arg(long, value_name = "N")]
        batch: Option<usize>,
        /// Stop after rewriting N rows (a rerun goes on).
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// Serve the dashboard: runs, a timeline per run, cancel and resume buttons.
    Web {
        /// Where to listen: IP:PORT (an IPv6 address in brackets), or an IP alone for port
        /// 8080. An address other than loopback needs --token.
        #[arg(long, value_name = "ADDR", value_parser = parse_listen, conflicts_with = "port")]
        listen: Option<SocketAddr>,
        /// Listen on 127.0.0.1:PORT (0 picks a free one); the default is 8080.
        #[arg(long)]
        port: Option<u16>,
        /// A secret every request must carry (`Authorization: Bearer SECRET`, or the cookie the
        /// login page sets). Prefer WORKFLOW_WEB_TOKEN: arguments show in `ps`.
        #[arg(
            long,
            env = "WORKFLOW_WEB_TOKEN",
            hide_env_values = true,
            value_name = "SECRET"
        )]
        token: Option<String>,
    },
}

/// `--status`: a run's status, as the tables and the JSON print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StatusArg {
    /// Admitted, not yet begun.
    Pending,
    /// Begun and not ended (it may be waiting).
    Running,
    /// Stopped because the deployed code does not fit its history.
    Blocked,
    /// Ended with its value.
    Completed,
    /// Ended with an error.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Ended by `continue_as_new(..)`, carried on by another run.
    ContinuedAsNew,
}

impl From<StatusArg> for RunStatus {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Pending => RunStatus::Pending,
            StatusArg::Running => RunStatus::Running,
            StatusArg::Blocked => RunStatus::Blocked,
            StatusArg::Completed => RunStatus::Completed,
            StatusArg::Failed => RunStatus::Failed,
            StatusArg::Cancelled => RunStatus::Cancelled,
            StatusArg::ContinuedAsNew => RunStatus::ContinuedAsNew,
        }
    }
}

/// `--listen`: a socket address, or an IP alone meaning its port 8080.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| (ip, 8080).into()))
        .map_err(|_| format!("`{s}` is not an address: use IP:PORT, e.g. 127.0.0.1:8080"))
}

/// Where `workflow web` listens, refusing what would expose runs to the network unguarded.
pub(crate) fn web_address(
    listen: Option<SocketAddr>,
    port: Option<u16>,
    token: Option<&str>,
) -> Result<SocketAddr, CliError> {
    let addr = listen.unwrap_or_else(|| (Ipv4Addr::LOCALHOST, port.unwrap_or(8080)).into());
    match token {
        Some("") => Err(CliError::Usage(
            "--token (or WORKFLOW_WEB_TOKEN) is empty; give it a secret or unset it".to_owned(),
        )),
        None if !addr.ip().is_loopback() => Err(CliError::Usage(format!(
            "--listen {addr} is reachable from other machines, and the dashboard shows every \
             run and can cancel them: set a secret with --token or WORKFLOW_WEB_TOKEN, or \
             listen on 127.0.0.1"
        ))),
        _ => Ok(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_listen_addresses() {
        assert_eq!(
            parse_listen("0.0.0.0:9000"),
            Ok(([0, 0, 0, 0], 9000).into())
        );
        assert_eq!(parse_listen("0.0.0.0"), Ok(([0, 0, 0, 0], 8080).into()));
        assert_eq!(
            parse_listen("[::1]:81"),
            Ok((std::net::Ipv6Addr::LOCALHOST, 81).into())
        );
        assert!(parse_listen("localhost:80").is_err());
    }

    #[test]
    fn only_loopback_goes_without_a_token() {
        let any: SocketAddr = ([0, 0, 0, 0], 8080).into();
        let lan: SocketAddr = ([192, 168, 1, 5], 8080).into();
        assert_eq!(
            web_address(None, None, None).unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 8080))
        );
        assert_eq!(
            web_address(None, Some(0), None).unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 0))
        );
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        assert_eq!(web_address(Some(v6), None, None).unwrap(), v6);
        for addr in [any, lan, "[::]:8080".parse().unwrap()] {
            let e = web_address(Some(addr), None, None).unwrap_err();
            assert!(
                matches!(&e, CliError::Usage(m) if m.contains("--token") && m.contains("WORKFLOW_WEB_TOKEN")),
                "{e}"
            );
            assert_eq!(web_address(Some(addr), None, Some("s")).unwrap(), addr);
        }
        assert!(web_address(None, None, Some("")).is_err());
        assert!(web_address(Some(any), None, Some("")).is_err());
    }
}
