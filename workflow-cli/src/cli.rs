//! The command line: its arguments (`args`) checked before the store is opened, the store
//! opened, and the command handed to `commands`.

use std::io::Read as _;
use std::path::PathBuf;

pub use crate::args::Cli;
use crate::args::{web_address, Command};
use crate::commands;
use crate::connect::{self, Target};
use crate::error::CliError;
use crate::ops;
use crate::text;

impl Cli {
    /// Where the store is, by the precedence in `AFTER_HELP`.
    pub fn target(&self) -> Target {
        match (&self.db, &self.database_url) {
            (Some(path), _) => Target::Sqlite(path.clone()),
            (None, Some(url)) => Target::Postgres {
                url: url.clone(),
                schema: self.schema.clone(),
            },
            (None, None) => Target::Sqlite(PathBuf::from("workflows.db")),
        }
    }
}

/// The keys of `--keys FILE` (or `WORKFLOW_KEYS`).
fn read_keys(path: &std::path::Path) -> Result<workflow_core::Keys, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Usage(format!("cannot read the keys file {}: {e}", path.display()))
    })?;
    workflow_core::Keys::parse(&text)
        .map_err(|e| CliError::Usage(format!("the keys file {}: {e}", path.display())))
}

/// Runs the command; returns what to print on standard output.
pub async fn run(cli: Cli) -> Result<String, CliError> {
    text::set_zone(cli.tz.clone());
    let target = cli.target();
    execute(cli, &target)
        .await
        .map_err(|e| e.map_message(|m| target.scrub(m)))
}

async fn execute(cli: Cli, target: &Target) -> Result<String, CliError> {
    // Arguments are checked before the database is opened, so a typo costs no connection.
    check_arguments(&cli.command)?;
    let payload = payload_argument(&cli.command)?;
    let keys = keys_argument(&cli)?;
    let rt = connect::open(target, keys).await?;
    commands::dispatch(rt, target, cli.command, cli.json, payload).await
}

/// Refuses a malformed run id, or a `web` address that would expose the runs unguarded.
fn check_arguments(command: &Command) -> Result<(), CliError> {
    match command {
        Command::Run { id }
        | Command::Events { run_id: id, .. }
        | Command::Send { run_id: id, .. }
        | Command::Cancel { run_id: id }
        | Command::Retry { run_id: id }
        | Command::Fork { run_id: id, .. }
        | Command::Export { run_id: id, .. }
        | Command::Stream { run_id: id, .. } => {
            ops::parse_run_id(id)?;
        }
        Command::Hooks { run: Some(id), .. } => {
            ops::parse_run_id(id)?;
        }
        Command::Web {
            listen,
            port,
            token,
        } => {
            web_address(*listen, *port, token.as_deref())?;
        }
        _ => {}
    }
    Ok(())
}

/// The payload of `resume` and `send` (read from standard input for `-`), parsed.
fn payload_argument(command: &Command) -> Result<Option<serde_json::Value>, CliError> {
    Ok(match command {
        Command::Resume { payload, .. } | Command::Send { payload, .. } => {
            Some(ops::parse_payload(&read_payload(payload)?)?)
        }
        _ => None,
    })
}

/// The keys of `--keys`, refusing the commands that need them when they are missing.
fn keys_argument(cli: &Cli) -> Result<Option<workflow_core::Keys>, CliError> {
    let keys = match &cli.keys {
        Some(path) => Some(read_keys(path)?),
        None => None,
    };
    if matches!(cli.command, Command::Export { decrypt: true, .. }) && keys.is_none() {
        return Err(CliError::Usage(
            "--decrypt needs the keys: pass --keys FILE (or set WORKFLOW_KEYS)".to_owned(),
        ));
    }
    if matches!(cli.command, Command::Rekey { .. }) && keys.is_none() {
        return Err(CliError::Usage(
            "rekey needs the keys: pass --keys FILE (or set WORKFLOW_KEYS)".to_owned(),
        ));
    }
    Ok(keys)
}

fn read_payload(arg: &str) -> Result<String, CliError> {
    if arg != "-" {
        return Ok(arg.to_owned());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).map_err(|e| {
        CliError::Usage(format!("cannot read the payload from standard input: {e}"))
    })?;
    Ok(s)
}
