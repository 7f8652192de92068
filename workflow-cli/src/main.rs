//! `workflow`: inspect durable workflow runs in a SQLite or PostgreSQL store, cancel, retry or
//! fork them, resume their hooks, export their histories, or serve a local dashboard with a
//! timeline per run.
//!
//! ```text
//! workflow --db orders.db runs --status failed
//! workflow --db orders.db run 01J9ZQ3K8V2X7B5N4M6P0R1S2T
//! workflow --db orders.db resume order:42 '{"approved": true}'
//! workflow --db orders.db retry 01J9ZQ3K8V2X7B5N4M6P0R1S2T
//! workflow --db orders.db export 01J9ZQ3K8V2X7B5N4M6P0R1S2T -o run.json
//! workflow --db orders.db prune --older-than 30d
//! workflow --db orders.db web --port 8080
//! ```

mod args;
mod cli;
mod commands;
mod connect;
mod error;
mod ops;
mod schedules;
mod show;
mod text;
mod view;
mod web;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Everything printed passes through `printable`: run names, tokens, errors and payloads come
    // from the store, and whoever wrote them must not get to drive the reader's terminal.
    match runtime.block_on(cli::run(cli)) {
        Ok(out) => {
            let out = text::printable(&out, true);
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // `workflow runs | head` closes the pipe early; that is not a failure.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("error: {}", text::printable(&e.to_string(), true));
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}
