//! A fresh database per trial: a temporary directory for SQLite, a new schema (dropped
//! afterwards) for PostgreSQL, a new store for memory.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use workflow_core::store::memory::MemoryStore;
use workflow_core::{Keys, Runtime, RuntimeBuilder};

use crate::BoxResult;

/// `--encrypt`: every runtime the trials build seals its payloads with one key.
pub static ENCRYPT: AtomicBool = AtomicBool::new(false);

/// `--compact-envelopes`: with `--encrypt`, payloads are sealed in the envelope's compact form
/// (`Keys::compact_envelopes`).
pub static COMPACT: AtomicBool = AtomicBool::new(false);

/// A store the scenarios can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum StoreKind {
    Memory,
    Sqlite,
    Postgres,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
        }
    }
}

/// One trial's database. Build as many runtimes on it as the scenario needs (a restart is a
/// second runtime on the same `Fresh`), then [`Fresh::cleanup`].
pub struct Fresh {
    pub kind: StoreKind,
    dir: Option<tempfile::TempDir>,
    memory: Option<MemoryStore>,
    #[cfg(feature = "postgres")]
    pg: Option<(String, workflow_core::store::postgres::PostgresStore)>,
}

static SCHEMAS: AtomicU64 = AtomicU64::new(0);

impl Fresh {
    /// A new, empty database of `kind`. For PostgreSQL, `pg_url` must be set (the caller
    /// checks).
    pub async fn new(kind: StoreKind, pg_url: Option<&str>) -> BoxResult<Fresh> {
        let mut fresh = Fresh {
            kind,
            dir: None,
            memory: None,
            #[cfg(feature = "postgres")]
            pg: None,
        };
        match kind {
            StoreKind::Memory => fresh.memory = Some(MemoryStore::new()),
            StoreKind::Sqlite => {
                fresh.dir = Some(tempfile::Builder::new().prefix("wf-bench-").tempdir()?)
            }
            StoreKind::Postgres => {
                #[cfg(feature = "postgres")]
                {
                    let url = pg_url.ok_or("no PostgreSQL URL")?;
                    let schema = format!(
                        "wf_bench_{}_{}",
                        std::process::id(),
                        SCHEMAS.fetch_add(1, Ordering::SeqCst)
                    );
                    let store =
                        workflow_core::store::postgres::PostgresStore::connect(url, &schema)
                            .await?;
                    fresh.pg = Some((url.to_owned(), store));
                }
                #[cfg(not(feature = "postgres"))]
                {
                    let _ = (pg_url, &SCHEMAS, Ordering::SeqCst);
                    return Err("built without the `postgres` feature".into());
                }
            }
        }
        Ok(fresh)
    }

    /// The SQLite file (for SQLite only).
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.path().join("bench.db"))
    }

    /// A builder for a runtime on this database; each `build()` opens the store anew (for
    /// memory: shares the one in-process store, as a restarted process would share a file).
    pub fn builder(&self) -> RuntimeBuilder {
        // The recovery and history scenarios record histories of up to 200,000 events, past
        // the default hard limit (50,000): measured here is replay, not the limit.
        let b = self.store_builder().history_limits(1_000_000, 1 << 32);
        if ENCRYPT.load(Ordering::Relaxed) {
            let keys = Keys::new().current("bench", [7u8; 32]);
            b.encryption(if COMPACT.load(Ordering::Relaxed) {
                keys.compact_envelopes()
            } else {
                keys
            })
        } else {
            b
        }
    }

    fn store_builder(&self) -> RuntimeBuilder {
        let b = Runtime::builder();
        match self.kind {
            StoreKind::Memory => b.store(self.memory.clone().unwrap_or_default()),
            StoreKind::Sqlite => match self.sqlite_path() {
                Some(p) => b.sqlite(p),
                None => b,
            },
            StoreKind::Postgres => {
                #[cfg(feature = "postgres")]
                if let Some((url, store)) = &self.pg {
                    return b.postgres(url.clone()).schema(store.schema());
                }
                b
            }
        }
    }

    /// The environment that tells another process where this database is (see
    /// `streams::child`).
    pub fn child_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.sqlite_path() {
            env.push(("WF_BENCH_DB", p.display().to_string()));
        }
        #[cfg(feature = "postgres")]
        if let Some((url, store)) = &self.pg {
            env.push(("WF_BENCH_PG_URL", url.clone()));
            env.push(("WF_BENCH_SCHEMA", store.schema().to_owned()));
        }
        env
    }

    /// The PostgreSQL store of this trial's schema (for store-level measurements).
    pub fn pg_store(&self) -> Option<std::sync::Arc<dyn workflow_core::store::Store>> {
        #[cfg(feature = "postgres")]
        if let Some((_, store)) = &self.pg {
            return Some(std::sync::Arc::new(store.clone()));
        }
        None
    }

    /// Removes the database (drops the PostgreSQL schema). Shut down its runtimes first.
    pub async fn cleanup(self) -> BoxResult<()> {
        #[cfg(feature = "postgres")]
        if let Some((_, store)) = self.pg {
            // `Runtime::shutdown` does not wait for the writes under way (a firing loop's,
            // a run's): dropping the schema can deadlock with one, which PostgreSQL reports
            // as a transient error. Such a drop is tried again.
            let mut tries = 0;
            loop {
                match store.clone().drop_schema().await {
                    Err(e) if e.is_transient() && tries < 5 => {
                        tries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                    done => break done?,
                }
            }
        }
        drop(self.dir);
        Ok(())
    }
}
