//! Payload encryption and key rotation. With keys given to the builder, every payload is
//! stored sealed (AES-256-GCM under a key derived per run): arguments, results, messages,
//! hook payloads, stream chunks. Rotating is adding a new current key and keeping the old
//! one while payloads sealed under it remain; `rt.rekey(..)` seals those again under the
//! current key, after which the old key can go.
//!
//! ```text
//! cargo run --example rotation
//! ```
//!
//! The keys here are fixed demo bytes; load real ones from your secret store. The database is
//! a fresh SQLite file in the temporary directory.

use std::path::Path;

use workflow_core::prelude::*;
use workflow_core::{Keys, RekeyOptions};

const JUNE_KEY: [u8; 32] = [6; 32];
const DECEMBER_KEY: [u8; 32] = [12; 32];

/// A secret that must never be stored in the clear.
pub const SECRET: &str = "card 4242-4242-4242-4242";

#[step(name = "rotation.mask")]
async fn mask(card: String) -> Result<String> {
    Ok(format!(
        "card ending {}",
        &card[card.len().saturating_sub(4)..]
    ))
}

#[workflow(name = "rotation.checkout")]
pub async fn checkout(card: String) -> Result<String> {
    mask(card).await
}

/// What the demo saw.
#[derive(Debug)]
pub struct Outcome {
    /// The first run's output, read under each key set in turn.
    pub outputs: Vec<String>,
    /// Rows `rekey` sealed again under the December key.
    pub rekeyed: u64,
    /// Whether the secret appears anywhere in the database file.
    pub secret_in_file: bool,
}

async fn runtime(path: &Path, keys: Keys) -> anyhow::Result<Runtime> {
    Ok(Runtime::builder()
        .sqlite(path)
        .encryption(keys)
        .build()
        .await?)
}

/// Runs a checkout under the June key, rotates to the December key (June kept as old),
/// re-seals the stored payloads, then drops the June key: the first run stays readable
/// throughout.
pub async fn demo(path: &Path) -> anyhow::Result<Outcome> {
    let june = runtime(path, Keys::new().current("2026-06", JUNE_KEY)).await?;
    let run = june.start(checkout, (SECRET.to_string(),)).await?;
    let mut outputs = vec![run.return_value().await?];
    let id = run.id();
    june.shutdown();

    // Rotation: new payloads under December, June's still readable.
    let rotated = Keys::new()
        .current("2026-12", DECEMBER_KEY)
        .old("2026-06", JUNE_KEY);
    let both = runtime(path, rotated).await?;
    outputs.push(both.get_run(&id).typed::<String>().return_value().await?);
    let report = both.rekey(RekeyOptions::default()).await?;
    both.shutdown();

    // June's key is gone: everything was sealed again under December's.
    let december = runtime(path, Keys::new().current("2026-12", DECEMBER_KEY)).await?;
    outputs.push(
        december
            .get_run(&id)
            .typed::<String>()
            .return_value()
            .await?,
    );
    december.shutdown();

    let mut secret_in_file = false;
    for file in [path.to_path_buf(), path.with_extension("db-wal")] {
        if let Ok(bytes) = std::fs::read(&file) {
            secret_in_file |= bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes());
        }
    }
    Ok(Outcome {
        outputs,
        rekeyed: report.rows_rewritten,
        secret_in_file,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("rotation-{}.db", std::process::id()));
    let out = demo(&path).await?;
    for (keys, output) in ["June", "June and December", "December"]
        .iter()
        .zip(&out.outputs)
    {
        println!("read with {keys}: {output}");
    }
    println!(
        "{} rows sealed again under December; the secret is {} in the database file",
        out.rekeyed,
        if out.secret_in_file {
            "STORED IN THE CLEAR"
        } else {
            "stored nowhere in the clear"
        }
    );
    Ok(())
}
