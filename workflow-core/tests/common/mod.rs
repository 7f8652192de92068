//! Shared by the behaviour tests: one store per test, for every backend.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use workflow_core::store::memory::MemoryStore;
use workflow_core::Runtime;

/// The stores every behaviour test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
}

/// One test's database: build several runtimes on it to act as successive or competing workers.
pub struct TestDb {
    pub backend: Backend,
    memory: MemoryStore,
    pub dir: tempfile::TempDir,
}

impl TestDb {
    pub fn new(backend: Backend) -> Self {
        TestDb {
            backend,
            memory: MemoryStore::new(),
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn sqlite_path(&self) -> std::path::PathBuf {
        self.dir.path().join("wf.db")
    }

    /// A runtime tuned for tests: fast polling, short backoff, `lease` as given.
    pub async fn runtime_with_lease(&self, lease: Duration) -> Runtime {
        let b = Runtime::builder()
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10))
            .lease(lease);
        let b = match self.backend {
            Backend::Memory => b.store(self.memory.clone()),
            Backend::Sqlite => b.sqlite(self.sqlite_path()),
        };
        b.build().await.expect("runtime builds")
    }

    pub async fn runtime(&self) -> Runtime {
        self.runtime_with_lease(Duration::from_secs(30)).await
    }
}

/// Bounds a test body so a bug fails instead of hanging CI.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test timed out after 60 s")
}

/// Generates one `#[tokio::test]` per backend for each listed `async fn name(Backend)`.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::common::bounded(super::$name($crate::common::Backend::Memory)).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::common::bounded(super::$name($crate::common::Backend::Sqlite)).await
                }
            )*
        }
    };
}
