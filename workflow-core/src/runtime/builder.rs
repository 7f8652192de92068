//! Configuring and building a runtime: the choice of store, the [`Config`] options, and
//! `build`, which registers the linked workflows and starts the worker's loops.

#[cfg(feature = "sqlite")]
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use tokio::sync::{watch, Notify};

use super::clock::Clock;
use super::schedules::schedule_loop;
use super::worker::{heartbeat_loop, notice_loop, worker_loop};
use super::{Inner, Runtime};
use crate::config::Config;
use crate::crypto::Keys;
use crate::error::BuildError;
use crate::ids::RunId;
use crate::queue::Queue;
use crate::registry::{StepRegistration, WorkflowRegistration};
use crate::schedule::Schedule;
use crate::store::memory::MemoryStore;
use crate::store::{QueueDef, Store};

/// Where the runtime keeps its state.
enum StoreChoice {
    Memory,
    /// The file, and whether it may hold the application's own tables (`sqlite_shared`).
    #[cfg(feature = "sqlite")]
    Sqlite(PathBuf, bool),
    #[cfg(feature = "postgres")]
    Postgres(String),
    Custom(Arc<dyn Store>),
}

/// Configures and builds a [`Runtime`]; from [`Runtime::builder`].
#[must_use]
pub struct RuntimeBuilder {
    store: StoreChoice,
    config: Config,
    queues: Vec<Queue>,
    schedules: Vec<Schedule>,
    keys: Option<Keys>,
    /// `history_limits(events, bytes)` as given, checked by `build`.
    history_limits: Option<(u64, u64)>,
    #[cfg(feature = "postgres")]
    schema: String,
}

impl RuntimeBuilder {
    /// Keep everything in memory (tests; nothing survives the process).
    pub fn in_memory(mut self) -> Self {
        self.store = StoreChoice::Memory;
        self
    }

    /// Use the SQLite database at `path`, created if absent (the embedded default).
    #[cfg(feature = "sqlite")]
    pub fn sqlite(mut self, path: impl Into<PathBuf>) -> Self {
        self.store = StoreChoice::Sqlite(path.into(), false);
        self
    }

    /// Use the SQLite database at `path` like [`RuntimeBuilder::sqlite`], which may already
    /// hold the application's own tables: the store's are created beside them (see
    /// [`SqliteStore::open_shared`](crate::store::sqlite::SqliteStore::open_shared)), so
    /// transactional steps write to the application's database.
    #[cfg(feature = "sqlite")]
    pub fn sqlite_shared(mut self, path: impl Into<PathBuf>) -> Self {
        self.store = StoreChoice::Sqlite(path.into(), true);
        self
    }

    /// Use the PostgreSQL database at `url` (`postgres://user@host:port/db`): many worker
    /// processes on many machines share its work. Tables live in the schema set with
    /// [`RuntimeBuilder::schema`] (default `workflow`), created or migrated on connect.
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Postgres(url.into());
        self
    }

    /// The PostgreSQL schema holding the tables (default `workflow`).
    #[cfg(feature = "postgres")]
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = name.into();
        self
    }

    /// Use a store built elsewhere (e.g. a [`MemoryStore`] shared by several runtimes).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = StoreChoice::Custom(Arc::new(store));
        self
    }

    /// How long a worker's claim on a run lasts without a heartbeat before another worker may
    /// take the run over (default 30 s). Heartbeats renew it every third of this; a run
    /// cancelled by another process stops here within that third at the latest.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease.max(Duration::from_millis(30));
        self
    }

    /// How often the worker looks for work created by other processes (default 200 ms); work
    /// created in this process is picked up at once.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.config.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// The first retry delay of a failing step (default 1 s); it doubles with each further
    /// failure, capped at one hour. `Error::retry_after` overrides it per failure.
    pub fn retry_backoff(mut self, base: Duration) -> Self {
        self.config.retry_backoff = base;
        self
    }

    /// The version of this build (e.g. `env!("CARGO_PKG_VERSION")` of the application; none
    /// by default), recorded on every run this runtime starts — its children and the runs
    /// its schedules fire included — as [`RunRecord::version`](crate::RunRecord::version),
    /// so that the runs which predate a deploy can be listed with
    /// [`RunFilter::version`](crate::RunFilter::version).
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn greet(name: String) -> Result<String> {
    ///     Ok(format!("hello {name}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().version("1.4.2").build().await?;
    /// let run = rt.start(greet, ("ada".to_owned(),)).await?;
    /// assert_eq!(run.info().await?.version.as_deref(), Some("1.4.2"));
    /// let old = rt.runs(RunFilter::new().version("1.4.1")).await?;
    /// assert!(old.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn version(mut self, v: impl Into<String>) -> Self {
        self.config.version = Some(v.into());
        self
    }

    /// At most this many runs are driven at once by this process (default 1000).
    pub fn max_active_runs(mut self, n: usize) -> Self {
        self.config.max_active_runs = n.max(1);
        self
    }

    /// A run whose only pending work is durable sleeps ending later than this from now is
    /// evicted from memory and replayed when the first one is due (default 30 s).
    pub fn evict_after(mut self, d: Duration) -> Self {
        self.config.evict_after = d;
        self
    }

    /// The largest workflow arguments, step arguments and results, hook payloads and stream
    /// chunks accepted, as serialized JSON (default 8 MiB). Over it, `start` and `resume_hook` fail with
    /// `TooLarge` and write nothing; a step call with larger arguments fails without running,
    /// and a larger step result fails its attempt as fatal.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.config.payloads = self.config.payloads.with_max_bytes(n);
        self
    }

    /// Whether this process executes runs (default `true`). A client-only runtime starts and
    /// inspects runs that worker processes execute.
    pub fn worker(mut self, enabled: bool) -> Self {
        self.config.worker = enabled;
        self
    }

    /// Encrypts every payload this runtime stores: new payloads are sealed with the
    /// current key of `keys`, stored ones open with any of its keys. `build()` checks the keys
    /// (32 bytes each, one current key, ids given once) and names the key at fault. Clients
    /// built with `.worker(false)` need the keys too, to read what the runs store. See
    /// [`Keys`].
    pub fn encryption(mut self, keys: Keys) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Applies `codec` to every payload's serialized bytes before it is stored (and before
    /// encryption, when [`RuntimeBuilder::encryption`] is set too); see [`Codec`](crate::Codec).
    /// Every runtime on the store needs the same codec to read what it wrote.
    pub fn codec(mut self, codec: impl crate::Codec) -> Self {
        let codec = crate::crypto::SharedCodec(Arc::new(codec));
        self.config.payloads = self.config.payloads.with_codec(codec);
        self
    }

    /// The soft limit of a run's history: `events` events or `bytes` bytes of
    /// payloads (default 10,000 events or 10 MiB). Past it, [`continue_as_new_suggested`]
    /// is true in the workflow body; past the hard limit, five times as large (default
    /// 50,000 events or 50 MiB), the run fails with an error naming the limit. A workflow
    /// that loops for long ends each stretch with `continue_as_new` once it is suggested.
    /// `build()` refuses a limit of 0, or one whose hard limit does not fit in a `u64`.
    /// What is counted: [`WorkflowMetadata::history_events`] and
    /// [`WorkflowMetadata::history_bytes`].
    ///
    /// [`continue_as_new_suggested`]: crate::continue_as_new_suggested
    /// [`WorkflowMetadata::history_events`]: crate::WorkflowMetadata::history_events
    /// [`WorkflowMetadata::history_bytes`]: crate::WorkflowMetadata::history_bytes
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[step]
    /// async fn poll_once(i: u32) -> Result<u32> { Ok(i) }
    ///
    /// #[workflow]
    /// async fn poller(rounds: u32) -> Result<(u32, bool)> {
    ///     let mut i = 0;
    ///     while i < rounds && !continue_as_new_suggested() {
    ///         i = poll_once(i + 1).await?;
    ///     }
    ///     Ok((i, continue_as_new_suggested()))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// // Each round records two events (the step's scheduling and its result).
    /// let rt = Runtime::builder().in_memory().history_limits(10, 1 << 20).build().await?;
    /// let (rounds, suggested) = rt.start(poller, (100,)).await?.return_value().await?;
    /// assert_eq!((rounds, suggested), (6, true));
    ///
    /// let refused = Runtime::builder().in_memory().history_limits(0, 1 << 20).build().await;
    /// assert!(refused.unwrap_err().to_string().contains("at least 1"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn history_limits(mut self, events: u64, bytes: u64) -> Self {
        self.history_limits = Some((events, bytes));
        self
    }

    /// Declares a queue, which bounds how many of its runs run at once: at `build` its limits are stored, replacing any earlier
    /// declaration of the same name, and every worker on the store enforces them. Runs enter
    /// it with `start(..).queue(name)` or `#[workflow(queue = "..")]`. See [`Queue`].
    pub fn queue(mut self, queue: Queue) -> Self {
        self.queues.push(queue);
        self
    }

    /// Declares a schedule, stored at `build` (the last declaration of a name on the builder
    /// wins; a schedule already in the store keeps its ticks). Every worker on the store fires
    /// it. See [`Schedule`].
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn ping(tick: ScheduleTick) -> Result<()> {
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder()
    ///     .in_memory()
    ///     .schedule(Schedule::every("heartbeat", ping, Duration::from_secs(60)))
    ///     .build()
    ///     .await?;
    /// assert_eq!(rt.schedules().await?.len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Opens the store, registers every workflow and step linked into the binary and, unless
    /// disabled, starts the worker. Must be called inside a tokio runtime.
    pub async fn build(mut self) -> Result<Runtime, BuildError> {
        if let Some(keys) = &self.keys {
            self.config.payloads = self.config.payloads.with_keys(keys.ring()?);
        }
        if let Some((events, bytes)) = self.history_limits {
            self.config.history = crate::config::HistoryLimits::new(events, bytes)
                .map_err(|why| BuildError::HistoryLimits { events, bytes, why })?;
        }
        let mut workflows = HashMap::new();
        for reg in inventory::iter::<WorkflowRegistration> {
            if workflows.insert(reg.name, reg).is_some() {
                return Err(BuildError::DuplicateName {
                    kind: "workflow",
                    name: reg.name.to_owned(),
                });
            }
        }
        let mut steps = HashMap::new();
        for reg in inventory::iter::<StepRegistration> {
            if steps.insert(reg.def.name, ()).is_some() {
                return Err(BuildError::DuplicateName {
                    kind: "step",
                    name: reg.def.name.to_owned(),
                });
            }
        }
        let mut queues = Vec::with_capacity(self.queues.len());
        for q in self.queues {
            let def = q.into_def()?;
            if queues.iter().any(|d: &QueueDef| d.name == def.name) {
                return Err(BuildError::InvalidQueue {
                    name: def.name,
                    why: "declared twice on one builder".to_owned(),
                });
            }
            queues.push(def);
        }
        let store: Arc<dyn Store> = match self.store {
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            #[cfg(feature = "sqlite")]
            StoreChoice::Sqlite(path, false) => {
                Arc::new(crate::store::sqlite::SqliteStore::open(path).await?)
            }
            #[cfg(feature = "sqlite")]
            StoreChoice::Sqlite(path, true) => {
                Arc::new(crate::store::sqlite::SqliteStore::open_shared(path).await?)
            }
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(url) => {
                Arc::new(crate::store::postgres::PostgresStore::connect(&url, &self.schema).await?)
            }
            StoreChoice::Custom(s) => s,
        };
        if !queues.is_empty() {
            store.define_queues(&queues).await?;
        }
        let mut workflow_names: Vec<String> = workflows.keys().map(|s| s.to_string()).collect();
        workflow_names.sort();
        let notices = store.notices();
        // Read before anything is admitted, leased or compared: a store with a clock of its
        // own puts every process on that clock.
        let clock = Clock::new(store.clone()).await?;
        let inner = Arc::new(Inner {
            store,
            clock,
            config: self.config,
            worker_id: format!("w-{}", RunId::new()),
            workflows,
            workflow_names,
            active: Mutex::new(HashMap::new()),
            work: Arc::new(Notify::new()),
            checking_slots: Arc::default(),
            pushed: notices.is_some(),
            waiting: Mutex::new(HashMap::new()),
            completed: Mutex::default(),
            stream_readers: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
            starting: Mutex::new(HashMap::new()),
            tasks: tokio::runtime::Handle::current(),
            handles: AtomicUsize::new(0),
            abandoned: AtomicBool::new(false),
            queued: AtomicBool::new(!queues.is_empty()),
            rate_limited: queues.iter().any(|q| q.rate_limit.is_some()),
            queues: Mutex::new(queues.into_iter().map(|q| q.name).collect()),
            schedules_changed: Notify::new(),
        });
        // The last declaration of a name wins.
        for (i, s) in self.schedules.iter().enumerate() {
            if !self.schedules[i + 1..].iter().any(|l| l.name() == s.name()) {
                inner.define_schedule(s).await?;
            }
        }
        if let Some(rx) = notices {
            tokio::spawn(notice_loop(inner.clone(), rx));
        }
        if inner.config.worker {
            tokio::spawn(worker_loop(inner.clone()));
            tokio::spawn(heartbeat_loop(inner.clone()));
            tokio::spawn(schedule_loop(inner.clone()));
        }
        let rt = Runtime::attach(inner);
        super::register_built(&rt.inner);
        Ok(rt)
    }
}

impl Runtime {
    /// A builder; the default store is SQLite at `workflows.db` when the `sqlite` feature is on
    /// (it is by default), memory otherwise.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            #[cfg(feature = "sqlite")]
            store: StoreChoice::Sqlite(PathBuf::from("workflows.db"), false),
            #[cfg(not(feature = "sqlite"))]
            store: StoreChoice::Memory,
            config: Config::default(),
            queues: Vec::new(),
            schedules: Vec::new(),
            keys: None,
            history_limits: None,
            #[cfg(feature = "postgres")]
            schema: "workflow".to_owned(),
        }
    }
}
