//! A poller that runs forever in bounded history: every `ROUNDS_PER_RUN` polls it continues
//! as a new run (`continue_as_new`), which carries its cursor and its hook token on with a
//! fresh, empty history. However long it polls, no run's history grows past one batch of
//! rounds, so a worker that takes it over replays a few dozen events, never months of them.
//!
//! ```text
//! cargo run --example poller
//! ```
//!
//! The database is a fresh SQLite file in the temporary directory (`WORKFLOW_DB` overrides
//! it). The demo stops the poller after five runs (`Some(4)` more after the first; `None`
//! polls forever) and prints the chain: each run, its status and the size of its history.
//! Meanwhile it sends "pause" and "resume" commands to the poller's control hook, whose
//! token every run of the chain owns in turn.

use std::time::Duration;

use workflow_core::prelude::*;

/// Polls per run: the bound on each run's history (a few events per poll).
pub const ROUNDS_PER_RUN: u32 = 10;

/// How long the poller waits between polls.
pub const POLL_EVERY: Duration = Duration::from_millis(5);

/// The control hook's token: the chain keeps it from run to run.
pub const CONTROL: &str = "poller:control";

/// A stand-in for the polled source: the items after `cursor` (three per poll).
#[step(name = "poller.fetch")]
async fn fetch(cursor: u64) -> Result<Vec<u64>> {
    Ok((cursor..cursor + 3).collect())
}

/// Polls `ROUNDS_PER_RUN` times from `cursor`, then continues as a new run with the cursor
/// it reached; with `runs_left`, the chain ends after that many more runs and returns the
/// cursor. Control commands ("pause", "resume") on the hook [`CONTROL`] are counted in
/// `commands`, carried across runs like the cursor.
#[workflow(name = "poller.poll")]
pub async fn poll(cursor: u64, runs_left: Option<u32>, commands: u32) -> Result<(u64, u32)> {
    let mut control = create_hook::<String>(CONTROL);
    let (mut cursor, mut commands) = (cursor, commands);
    for _ in 0..ROUNDS_PER_RUN {
        let items = fetch(cursor).await?;
        cursor += items.len() as u64;
        // A command if one came, else the next poll after `POLL_EVERY`.
        if let Ok(Ok(cmd)) = timeout(POLL_EVERY, control.recv()).await {
            commands += 1;
            if cmd == "pause" {
                // Paused until "resume": a durable wait, across runs and restarts.
                while control.recv().await? != "resume" {}
                commands += 1;
            }
        }
    }
    match runs_left {
        Some(0) => Ok((cursor, commands)),
        left => continue_as_new(poll, (cursor, left.map(|n| n - 1), commands)).await,
    }
}

/// A run of the chain as the demo prints it.
#[derive(Debug)]
pub struct Link {
    pub id: RunId,
    pub status: RunStatus,
    pub events: usize,
}

/// Runs a chain of `runs` runs, sending a pause and a resume on the way, and returns the
/// final cursor and commands and the chain's runs.
pub async fn demo(
    rt: &Runtime,
    runs: u32,
) -> Result<((u64, u32), Vec<Link>), Box<dyn std::error::Error>> {
    let first = rt.start(poll, (0, Some(runs - 1), 0)).await?;
    // Commands go to whichever run of the chain owns the token now.
    for cmd in ["pause", "resume"] {
        loop {
            match rt.resume_hook(CONTROL, cmd).await {
                Ok(_) => break,
                Err(HookError::NotFound(_)) => tokio::time::sleep(POLL_EVERY).await,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let end = first.return_value().await?;
    let mut chain = Vec::new();
    let mut next = Some(first.id());
    while let Some(id) = next {
        let info = rt.get_run(&id).info().await?;
        chain.push(Link {
            id,
            status: info.status,
            events: rt.store().events(&id).await?.len(),
        });
        next = info.next_run;
    }
    Ok((end, chain))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").map_or_else(
        |_| std::env::temp_dir().join(format!("poller-{}.db", RunId::new())),
        Into::into,
    );
    let rt = Runtime::builder().sqlite(&db).build().await?;
    println!(
        "a poller of {ROUNDS_PER_RUN} polls per run, on {}",
        db.display()
    );
    let ((cursor, commands), chain) = demo(&rt, 5).await?;
    for link in &chain {
        println!(
            "  run {}  {:<16}  {} events",
            link.id, link.status, link.events
        );
    }
    println!(
        "cursor {cursor} after {} runs, {commands} commands received",
        chain.len()
    );
    Ok(())
}
