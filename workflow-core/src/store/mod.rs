//! The storage contract, as capabilities. A store holds runs and their event histories; every
//! decision that must be atomic across workers and processes (admitting a run, leasing it,
//! fencing a stale worker's writes, recording a run's end) is one call of a capability trait,
//! made atomic by the database:
//!
//! - [`RunStore`]: runs, their histories, leases, children.
//! - [`HookStore`]: hook tokens and the inbox.
//! - [`MessageStore`]: messages sent to runs by id, through the inbox.
//! - [`StreamStore`]: streams of chunks.
//! - [`QueueStore`]: queue limits and occupancy.
//! - [`AdminStore`]: listing and pruning.
//! - [`RekeyStore`]: reading and rewriting the rows that hold sealed payloads.
//! - [`ScheduleStore`]: schedules and the records of their ticks.
//! - [`TransactionalStore`]: transactions of transactional steps, whose
//!   writes commit with the step's recorded result.
//!
//! [`Store`] is all of them together, implemented for every type that has them; the runtime
//! holds an `Arc<dyn Store>` and never knows which implementation it talks to:
//! [`memory::MemoryStore`] for tests, [`sqlite::SqliteStore`] as the embedded default,
//! `postgres::PostgresStore` (feature `postgres`) for many workers on many machines. Each
//! backend is a folder with one file per capability; a new capability is one trait here, one
//! file per backend and one file of conformance cases in `testing::store`.
//!
//! The capability traits are in the prelude, so `rt.store().get_run(..)` needs no import.

pub use crate::history::{from_millis, never, to_millis, Event, EventRecord, NewEvent};
pub use crate::model::{
    ChildNotice, Inbound, InboxEntry, NewRun, ParentLink, QueueEntry, RunOutcome, RunRecord,
    RunStatus, StartHook, TraceContext,
};

mod admin;
mod hooks;
mod messages;
mod queues;
mod rekey;
mod runs;
mod schedules;
mod streams;
mod transactional;

pub use admin::*;
pub use hooks::*;
pub use messages::*;
pub use queues::*;
pub use rekey::*;
pub use runs::*;
pub use schedules::*;
pub use streams::*;
pub use transactional::*;

#[cfg(any(test, feature = "testing"))]
mod inspect;
#[cfg(any(test, feature = "testing"))]
pub use inspect::Inspect;

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use sql::CHILD_NOTICE_TOKEN;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// A storage backend: every capability, as one trait object the runtime talks to. See the module
/// docs.
///
/// Every method of every capability is one atomic operation. Implementations must make the
/// guarantees below hold across processes (and for PostgreSQL, machines), never by a check in
/// Rust alone.
///
/// # Time
///
/// Times are given to the store, never read by it for a decision the caller can time: the
/// admission time (`created_at`, also the run's first wake time), lease ends (`now + lease`)
/// and their expiry, wake times, claim and payload times, retention windows, cancellation and
/// pruning horizons all come from the caller. The runtime reads every one of them from one
/// clock: [`RunStore::now`] when the store has a clock of its own (sampled when the runtime is
/// built and every few seconds, carried forward between samples with the local monotonic
/// clock), else the local wall clock. So on a store shared by several machines, processes
/// whose system clocks are wrong still write and compare times on the store's time line.
/// What a store decides without a caller's time (a run woken at once by a payload) it
/// decides on that same clock.
pub trait Store:
    RunStore
    + HookStore
    + MessageStore
    + StreamStore
    + QueueStore
    + AdminStore
    + ScheduleStore
    + RekeyStore
    + TransactionalStore
{
}

impl<
        S: RunStore
            + HookStore
            + MessageStore
            + StreamStore
            + QueueStore
            + AdminStore
            + ScheduleStore
            + RekeyStore
            + TransactionalStore,
    > Store for S
{
}
