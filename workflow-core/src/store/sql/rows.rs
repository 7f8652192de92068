//! The rows both dialects read, as plain values, and their decoding into the store's records:
//! a column that does not hold what this crate writes there is reported as
//! [`StoreError::Corrupt`] naming the run, never as a panic or a silently wrong value. Also
//! what `acquire` does with the rows it leased: skip the undecodable ones, order the rest,
//! and attach each run's history.

use std::collections::HashMap;

use super::{corrupt, json, owner_of, payload_id_of, status_of, time_of, CHILD_NOTICE_TOKEN};
use super::{MESSAGE_TOKEN, REQUEST_TOKEN};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{
    EventRecord, HookRecord, Inbound, InboxEntry, Lease, LeasedRun, QueueDef, QueueEntry,
    QueueInfo, RunRecord, StoredChunk, StreamInfo, StreamPage, TraceContext,
};

/// Declares a row struct whose fields are the statement's columns in order, readable by
/// each driver: by name in PostgreSQL (`sqlx::FromRow`), by position in SQLite.
macro_rules! row {
    ($(#[$doc:meta])* $name:ident { $($field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Debug)]
        #[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
        pub(in crate::store) struct $name {
            $(pub $field: $ty,)*
        }

        #[cfg(feature = "sqlite")]
        impl $name {
            /// The row's columns from the start of `row`.
            pub fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
                let mut column = 0;
                Ok($name {
                    $($field: {
                        column += 1;
                        row.get(column - 1)?
                    },)*
                })
            }
        }
    };
}

row! {
    /// A `runs` row: `id, workflow, status, input, output, error, created_at, updated_at,
    /// hook_token, deadline, parent_id, queue, partition_key, priority, start_at, version,
    /// previous_run, next_run, trace_context, origin`.
    RunRow {
        id: String,
        workflow: String,
        status: String,
        input: String,
        output: Option<String>,
        error: Option<String>,
        created_at: i64,
        updated_at: i64,
        hook_token: Option<String>,
        deadline: Option<i64>,
        parent_id: Option<String>,
        queue: Option<String>,
        partition_key: Option<String>,
        priority: i32,
        start_at: Option<i64>,
        version: Option<String>,
        previous_run: Option<String>,
        next_run: Option<String>,
        trace_context: Option<String>,
        origin: Option<String>,
    }
}

impl RunRow {
    pub fn decode(self) -> Result<RunRecord, StoreError> {
        let run = self.id.as_str();
        Ok(RunRecord {
            trace_context: self.trace_context.as_deref().and_then(TraceContext::parse),
            id: run.parse::<RunId>().map_err(|e| corrupt(run, "id", e))?,
            status: status_of(&self.status, run)?,
            input: json(&self.input, run, "input")?,
            output: self.output.map(|v| json(&v, run, "output")).transpose()?,
            error: self.error.map(|v| json(&v, run, "error")).transpose()?,
            created_at: time_of(self.created_at, run, "created_at")?,
            updated_at: time_of(self.updated_at, run, "updated_at")?,
            workflow: self.workflow,
            hook_token: self.hook_token,
            deadline: self
                .deadline
                .map(|t| time_of(t, run, "deadline"))
                .transpose()?,
            parent: self
                .parent_id
                .map(|p| p.parse::<RunId>().map_err(|e| corrupt(run, "parent_id", e)))
                .transpose()?,
            queue: self.queue.map(|name| QueueEntry {
                name,
                partition_key: self.partition_key,
                priority: self.priority,
            }),
            start_at: self
                .start_at
                .map(|t| time_of(t, run, "start_at"))
                .transpose()?,
            version: self.version,
            previous_run: self
                .previous_run
                .map(|p| {
                    p.parse::<RunId>()
                        .map_err(|e| corrupt(run, "previous_run", e))
                })
                .transpose()?,
            next_run: self
                .next_run
                .map(|p| p.parse::<RunId>().map_err(|e| corrupt(run, "next_run", e)))
                .transpose()?,
            origin: self
                .origin
                .map(|p| p.parse::<RunId>().map_err(|e| corrupt(run, "origin", e)))
                .transpose()?,
        })
    }
}

/// A run `acquire` just leased: its row, then `epoch, wake_at, took_over` (whether the lease
/// it replaced had expired while set, see [`LeasedRun::took_over`]).
#[derive(Debug)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
pub(in crate::store) struct LeasedRow {
    #[cfg_attr(feature = "postgres", sqlx(flatten))]
    pub run: RunRow,
    pub epoch: i64,
    pub wake_at: i64,
    pub took_over: bool,
    /// Whether the run has recorded events: 0 for a run never driven, whose history need
    /// not be read. PostgreSQL reads its count (`runs.last_seq`, which numbers every event
    /// written), SQLite whether one exists.
    pub last_seq: i64,
}

row! {
    /// An `events` row: `run_id, seq, at, data`.
    EventRow {
        run_id: String,
        seq: i64,
        at: i64,
        data: String,
    }
}

impl EventRow {
    pub fn decode(self) -> Result<EventRecord, StoreError> {
        let (run, what) = (self.run_id.as_str(), format!("event {}", self.seq));
        Ok(EventRecord {
            seq: u64::try_from(self.seq).map_err(|e| corrupt(run, &what, e))?,
            at: time_of(self.at, run, &what)?,
            event: json(&self.data, run, &what)?,
        })
    }
}

/// A history, in order.
pub(in crate::store) fn decode_events(rows: Vec<EventRow>) -> Result<Vec<EventRecord>, StoreError> {
    rows.into_iter().map(EventRow::decode).collect()
}

row! {
    /// A `hooks` row of an active hook: `token, run_id, created_at`.
    HookRow {
        token: String,
        run_id: String,
        created_at: i64,
    }
}

impl HookRow {
    pub fn decode(self) -> Result<HookRecord, StoreError> {
        let what = format!("hook {:?}: created_at", self.token);
        Ok(HookRecord {
            run_id: owner_of(&self.run_id, &self.token)?,
            created_at: time_of(self.created_at, &self.run_id, &what)?,
            token: self.token,
        })
    }
}

row! {
    /// A `hook_inbox` row of one run: `id, token, topic, payload`.
    PayloadRow {
        id: i64,
        token: String,
        topic: Option<String>,
        payload: String,
    }
}

impl PayloadRow {
    /// The inbox entry of run `run`: a child's end when the row holds one under
    /// [`CHILD_NOTICE_TOKEN`], a message under [`MESSAGE_TOKEN`], a request under
    /// [`REQUEST_TOKEN`], a hook's payload otherwise.
    pub fn decode(self, run: &str) -> Result<InboxEntry, StoreError> {
        let what = format!("payload {}", self.id);
        let what = if self.token == CHILD_NOTICE_TOKEN {
            Inbound::ChildEnded(json(&self.payload, run, &what)?)
        } else if self.token == MESSAGE_TOKEN {
            Inbound::Message {
                payload: json(&self.payload, run, &what)?,
                topic: self
                    .topic
                    .ok_or_else(|| corrupt(run, &what, "a message without a topic"))?,
            }
        } else if self.token == REQUEST_TOKEN {
            Inbound::Request {
                payload: json(&self.payload, run, &what)?,
                name: self
                    .topic
                    .ok_or_else(|| corrupt(run, &what, "a request without a name"))?,
            }
        } else {
            Inbound::Hook {
                payload: json(&self.payload, run, &what)?,
                token: self.token,
            }
        };
        Ok(InboxEntry {
            id: payload_id_of(self.id)?,
            what,
        })
    }
}

row! {
    /// A `hook_inbox` row by its id and run: `id, run_id`.
    InboxRow {
        id: i64,
        run_id: String,
    }
}

impl InboxRow {
    pub fn decode(self) -> Result<(u64, RunId), StoreError> {
        let run = self
            .run_id
            .parse::<RunId>()
            .map_err(|e| StoreError::Corrupt(format!("payload {}: run_id: {e}", self.id)))?;
        Ok((payload_id_of(self.id)?, run))
    }
}

row! {
    /// A `stream_chunks` row of one stream: `idx, attempt, at, value`.
    ChunkRow {
        idx: i64,
        attempt: i64,
        at: i64,
        value: String,
    }
}

impl ChunkRow {
    /// A chunk of stream `stream` of run `run`.
    pub fn decode(self, run: &str, stream: &str) -> Result<StoredChunk, StoreError> {
        let what = format!("stream {stream:?}, chunk {}", self.idx);
        Ok(StoredChunk {
            index: u64::try_from(self.idx).map_err(|e| corrupt(run, &what, e))?,
            attempt: u32::try_from(self.attempt).map_err(|e| corrupt(run, &what, e))?,
            at: time_of(self.at, run, &what)?,
            value: json(&self.value, run, &what)?,
        })
    }
}

row! {
    /// What a stream reader reads before the chunks: `status` (of the run), `len`, `closed`
    /// (of the stream), each NULL when absent.
    StreamStateRow {
        status: Option<String>,
        len: Option<i64>,
        closed: Option<bool>,
    }
}

impl StreamStateRow {
    /// The page of stream `stream` of run `run` this state and these chunks make.
    pub fn page(
        self,
        run: &str,
        stream: &str,
        chunks: Vec<ChunkRow>,
    ) -> Result<StreamPage, StoreError> {
        let what = format!("stream {stream:?}: len");
        Ok(StreamPage {
            run: self.status.map(|s| status_of(&s, run)).transpose()?,
            closed: self.closed.unwrap_or(false),
            len: u64::try_from(self.len.unwrap_or(0)).map_err(|e| corrupt(run, &what, e))?,
            chunks: chunks
                .into_iter()
                .map(|c| c.decode(run, stream))
                .collect::<Result<_, _>>()?,
        })
    }
}

row! {
    /// A `streams` row of one run: `name, len, closed`.
    StreamRow {
        name: String,
        len: i64,
        closed: bool,
    }
}

impl StreamRow {
    /// A stream of run `run`.
    pub fn decode(self, run: &str) -> Result<StreamInfo, StoreError> {
        let what = format!("stream {:?}: len", self.name);
        Ok(StreamInfo {
            len: u64::try_from(self.len).map_err(|e| corrupt(run, &what, e))?,
            name: self.name,
            closed: self.closed,
        })
    }
}

/// The runs one `acquire` leased, decoded and ordered, waiting for their histories.
///
/// A run whose row or history cannot be decoded is not handed out: it is returned as
/// [`Acquired::failed`], and the store records the failed try ([`super::policy::record_failure`]),
/// so the run is retried a few times and then fails, instead of stalling the call for every
/// other run or coming back forever. (A row whose id or epoch cannot be read at all is only
/// logged: it cannot even be named to the database; its lease expires.)
pub(in crate::store) struct Picked {
    /// Earliest wake time first.
    runs: Vec<PickedRun>,
    failed: Vec<(Lease, StoreError)>,
}

/// A run one acquire leased and decoded.
struct PickedRun {
    wake_at: i64,
    /// Its id as the database holds it (the key of its history rows).
    key: String,
    run: RunRecord,
    epoch: u64,
    took_over: bool,
    /// It recorded events (`runs.last_seq > 0`): its history is read.
    has_history: bool,
}

/// What [`Picked::attach`] makes of one acquire.
pub(in crate::store) struct Acquired {
    /// The runs to hand out.
    pub runs: Vec<LeasedRun>,
    /// Leased runs that cannot be decoded, with why.
    pub failed: Vec<(Lease, StoreError)>,
}

impl Picked {
    /// `rows` as the acquire statement returned them (in no particular order); an `Err` is a
    /// row that could not even be read, with the run id for the log.
    pub fn new(rows: Vec<Result<LeasedRow, (String, StoreError)>>) -> Picked {
        let mut picked = Picked {
            runs: Vec::with_capacity(rows.len()),
            failed: Vec::new(),
        };
        for row in rows {
            let row = match row {
                Ok(row) => row,
                Err((run, e)) => {
                    skip_run(&run, &e);
                    continue;
                }
            };
            let key = row.run.id.clone();
            let lease = match (key.parse(), u64::try_from(row.epoch)) {
                (Ok(run_id), Ok(epoch)) => Lease { run_id, epoch },
                (Err(e), _) => {
                    skip_run(&key, &corrupt(&key, "id", e));
                    continue;
                }
                (_, Err(e)) => {
                    skip_run(&key, &corrupt(&key, "epoch", e));
                    continue;
                }
            };
            match row.run.decode() {
                Ok(run) => picked.runs.push(PickedRun {
                    wake_at: row.wake_at,
                    key,
                    run,
                    epoch: lease.epoch,
                    took_over: row.took_over,
                    has_history: row.last_seq > 0,
                }),
                Err(e) => picked.failed.push((lease, e)),
            }
        }
        // The database hands leased rows back in no particular order.
        picked
            .runs
            .sort_by(|a, b| (a.wake_at, &a.key).cmp(&(b.wake_at, &b.key)));
        picked
    }

    /// The ids whose histories [`Picked::attach`] needs: those of the runs that recorded
    /// events. A run never driven (admitted for any worker, a queued run begun now) has none,
    /// so an acquire of only such runs reads no history at all.
    pub fn ids(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter(|p| p.has_history)
            .map(|p| p.key.clone())
            .collect()
    }

    /// The leased runs with their histories (`events`: the rows of every picked run, each
    /// run's in order); a run whose history cannot be decoded fails like a bad row.
    pub fn attach(self, events: Vec<EventRow>) -> Acquired {
        let mut histories: HashMap<String, Result<Vec<EventRecord>, StoreError>> = HashMap::new();
        for row in events {
            let entry = histories
                .entry(row.run_id.clone())
                .or_insert_with(|| Ok(Vec::new()));
            if let Ok(events) = entry {
                match row.decode() {
                    Ok(e) => events.push(e),
                    Err(e) => *entry = Err(e),
                }
            }
        }
        let mut out = Acquired {
            runs: Vec::with_capacity(self.runs.len()),
            failed: self.failed,
        };
        for PickedRun {
            key,
            run,
            epoch,
            took_over,
            ..
        } in self.runs
        {
            let lease = Lease {
                run_id: run.id,
                epoch,
            };
            match histories.remove(&key).unwrap_or_else(|| Ok(Vec::new())) {
                Ok(events) => out.runs.push(LeasedRun {
                    lease,
                    run,
                    events,
                    took_over,
                }),
                Err(e) => out.failed.push((lease, e)),
            }
        }
        out
    }
}

fn skip_run(run: &str, e: &StoreError) {
    tracing::error!(
        run_id = %run,
        error = %e,
        "skipping a leased run whose id or epoch cannot be read; its lease will expire"
    );
}

row! {
    /// A `queues` row with its occupancy: `name, concurrency, rate_limit, rate_period,
    /// occupied, waiting, begun_in_window, oldest_waiting`.
    QueueRow {
        name: String,
        concurrency: Option<i64>,
        rate_limit: Option<i64>,
        rate_period: Option<i64>,
        occupied: i64,
        waiting: i64,
        begun_in_window: i64,
        oldest_waiting: Option<i64>,
    }
}

impl QueueRow {
    pub fn decode(self) -> Result<QueueInfo, StoreError> {
        let bad = |what: &str, v: i64| {
            StoreError::Corrupt(format!("queue {:?}: {what} is {v}", self.name))
        };
        let count = |what: &str, v: i64| u32::try_from(v).map_err(|_| bad(what, v));
        let concurrency = self
            .concurrency
            .map(|c| count("concurrency", c))
            .transpose()?;
        let rate_limit = match (self.rate_limit, self.rate_period) {
            (Some(n), Some(ms)) => Some((
                count("rate_limit", n)?,
                std::time::Duration::from_millis(
                    u64::try_from(ms).map_err(|_| bad("rate_period", ms))?,
                ),
            )),
            _ => None,
        };
        let oldest_waiting = self
            .oldest_waiting
            .map(|ms| time_of(ms, "-", "oldest waiting run"))
            .transpose()?;
        Ok(QueueInfo {
            oldest_waiting,
            occupied: self.occupied.unsigned_abs(),
            waiting: self.waiting.unsigned_abs(),
            begun_in_window: self.begun_in_window.unsigned_abs(),
            def: QueueDef {
                name: self.name,
                concurrency,
                rate_limit,
            },
        })
    }
}

row! {
    /// A `queues` row's limits: `concurrency, rate_limit, rate_period`.
    QueueLimits {
        concurrency: Option<i64>,
        rate_limit: Option<i64>,
        rate_period: Option<i64>,
    }
}
