//! `workflow rekey` as a library call ([`Runtime::rekey`]): every stored payload sealed under
//! a key other than the current one is sealed again under the current key. It reads the rows
//! that hold sealed payloads table by table ([`RekeyStore::sealed_rows`]), finds each payload
//! of a row and its binding in the one table of places (`crypto::places`), and writes a row
//! back with [`RekeyStore::replace_sealed`], a compare-and-set: a row another writer changed
//! in between is left as that writer left it (and counted), so live workers lose nothing. A
//! rerun finds only what is left: payloads under the current key are not rewritten.

use std::collections::{BTreeMap, HashMap};

use super::Runtime;
use crate::crypto::places::{self, of_run, Owner, Slot};
use crate::crypto::OpenError;
use crate::error::StoreError;
use crate::payload::{Payloads, Rekeyed};
use crate::store::{PayloadTable, SealedAt, SealedRow, SealedValue};

/// How [`Runtime::rekey`] goes: rows read per page, and where it may stop early.
///
/// ```
/// use workflow_core::RekeyOptions;
///
/// // Pages of 100 rows; stop after rewriting 1,000 (a rerun goes on from there).
/// let options = RekeyOptions::new().batch(100).limit(1_000);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RekeyOptions {
    batch: usize,
    limit: Option<u64>,
}

impl Default for RekeyOptions {
    fn default() -> Self {
        RekeyOptions {
            batch: 500,
            limit: None,
        }
    }
}

impl RekeyOptions {
    /// Pages of 500 rows, no limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows read per page (at least 1).
    pub fn batch(mut self, rows: usize) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// Stop after rewriting `rows` rows; a later call rewrites the rest.
    pub fn limit(mut self, rows: u64) -> Self {
        self.limit = Some(rows);
        self
    }
}

/// Payloads of one kind that [`Runtime::rekey`] met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RekeyCount {
    /// Sealed again under the current key.
    pub rewritten: u64,
    /// Already under the current key.
    pub current: u64,
}

/// What [`Runtime::rekey`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RekeyReport {
    /// The current key's id.
    pub key: String,
    /// By kind of payload (`input`, `output`, `error`, `step_input`, `step_result`,
    /// `step_error`, `hook_payload`, `stream_chunk`, `message`, `event`, `request`, `reply`;
    /// a value kept in two places, as a published value or a reply is, counts in each).
    pub kinds: BTreeMap<&'static str, RekeyCount>,
    /// Rows written back.
    pub rows_rewritten: u64,
    /// Rows another writer changed between the read and the write (a payload delivered, a
    /// run ended): left as that writer left them; a rerun takes what they hold now.
    pub changed: u64,
    /// It stopped at [`RekeyOptions::limit`] before the end: a rerun finishes.
    pub stopped_early: bool,
}

impl RekeyReport {
    /// Payloads sealed again, of every kind.
    pub fn rewritten(&self) -> u64 {
        self.kinds.values().map(|c| c.rewritten).sum()
    }

    /// Payloads already under the current key, of every kind.
    pub fn current(&self) -> u64 {
        self.kinds.values().map(|c| c.current).sum()
    }

    /// Whether the store is done: nothing left behind by a stop or a concurrent writer.
    pub fn complete(&self) -> bool {
        !self.stopped_early && self.changed == 0
    }
}

/// Why [`Runtime::rekey`] stopped. What it rewrote before stays rewritten; a rerun goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RekeyError {
    /// The runtime was built without [`Keys`](crate::Keys).
    #[error("rekey needs the keys: build the runtime with `.encryption(keys)` (CLI: --keys FILE)")]
    NoKeys,
    /// A payload is sealed under a key that was not given.
    #[error(
        "the {kind} at {at} is encrypted with key {key:?}, which was not given: add it as \
         `old {key} <key>` (`Keys::old`) and run rekey again"
    )]
    MissingKey {
        /// The missing key's id.
        key: String,
        /// What the payload is.
        kind: &'static str,
        /// Where it is stored.
        at: String,
    },
    /// A payload does not open with its key (altered, or copied from elsewhere).
    #[error("the {kind} at {at} cannot be read: {why}")]
    Unreadable {
        /// What the payload is.
        kind: &'static str,
        /// Where it is stored.
        at: String,
        /// Why.
        why: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::error::from_own_errors!(RekeyError);

/// `at` as a person reads it.
fn describe(at: &SealedAt) -> String {
    match at {
        SealedAt::RunInput(r) => format!("run {r} (its arguments)"),
        SealedAt::RunOutput(r) => format!("run {r} (its return value)"),
        SealedAt::RunError(r) => format!("run {r} (its error)"),
        SealedAt::Event { run, seq } => format!("run {run}, event {seq}"),
        SealedAt::Inbox { run, id } => format!("run {run}, inbox entry {id}"),
        SealedAt::Chunk { run, stream, index } => {
            format!("run {run}, stream {stream:?}, chunk {index}")
        }
        SealedAt::Published { run, key } => format!("run {run}, published key {key:?}"),
        SealedAt::Reply { run, id } => format!("run {run}, the reply to request {id}"),
    }
}

/// Seals every payload of `value` (stored at `at`) under the current key: each payload's kind
/// and whether it was rewritten.
fn rekey_value(
    payloads: &Payloads,
    run: Owner,
    at: &SealedAt,
    value: &mut SealedValue,
) -> Result<Vec<(&'static str, Rekeyed)>, RekeyError> {
    use places::{ERROR, EVENT, INPUT, OUTPUT, REPLY, STREAM_CHUNK};
    let mut done = Vec::new();
    let mut failed = None;
    let mut each = |b: crate::crypto::Binding<'_>, slot: Slot<'_>| {
        if failed.is_some() {
            return;
        }
        match payloads.rekey_slot(&b, slot) {
            Ok(r) => done.push((b.kind, r)),
            Err(e) => failed = Some((b.kind, e)),
        }
    };
    match (at, &mut *value) {
        (SealedAt::RunInput(_), SealedValue::Value(v)) => {
            each(of_run(run, INPUT, ""), Slot::Value(v))
        }
        (SealedAt::RunOutput(_), SealedValue::Value(v)) => {
            each(of_run(run, OUTPUT, ""), Slot::Value(v))
        }
        (SealedAt::RunError(_), SealedValue::Error(e)) => {
            each(of_run(run, ERROR, ""), Slot::Error(e))
        }
        (SealedAt::Chunk { stream, .. }, SealedValue::Value(v)) => {
            each(of_run(run, STREAM_CHUNK, stream), Slot::Value(v))
        }
        (SealedAt::Published { key, .. }, SealedValue::Value(v)) => {
            each(of_run(run, EVENT, key), Slot::Value(v))
        }
        // Bound like the history's `RequestReplied`, which callers open it as.
        (SealedAt::Reply { id, .. }, SealedValue::Reply(reply)) => {
            let place = id.to_string();
            match reply {
                Ok(v) => each(of_run(run, REPLY, &place), Slot::Value(v)),
                Err(e) => each(of_run(run, REPLY, &place), Slot::Error(e)),
            }
        }
        (_, SealedValue::Event(e)) => places::visit_event(run, e, each),
        (_, SealedValue::Inbound(i)) => places::visit_inbound(run, i, each),
        (at, _) => {
            return Err(RekeyError::Store(StoreError::Corrupt(format!(
                "{}: the store read a value of another kind",
                describe(at)
            ))))
        }
    }
    match failed {
        None => Ok(done),
        Some((kind, OpenError::MissingKey(key))) => Err(RekeyError::MissingKey {
            key,
            kind,
            at: describe(at),
        }),
        Some((kind, why)) => Err(RekeyError::Unreadable {
            kind,
            at: describe(at),
            why: why.to_string(),
        }),
    }
}

impl Runtime {
    /// Seals every stored payload that is encrypted under a key other than the current one
    /// under the current key (`workflow rekey`): run arguments, outputs and errors, histories,
    /// inbox entries, stream chunks, published values, replies to requests. Once it returns a
    /// [complete](RekeyReport::complete) report, the old keys can go.
    ///
    /// Safe beside live workers: each row is replaced only while it holds what was read, so
    /// a payload delivered or a run ended meanwhile is never lost or overwritten (such a row
    /// is counted in [`RekeyReport::changed`] for a rerun). Resumable: a rerun after a stop
    /// rewrites only what is left, and on a done store rewrites nothing. A payload under a
    /// key that was not given stops it with [`RekeyError::MissingKey`], naming the key.
    /// Payloads stored before encryption was turned on are left as they are.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::RekeyOptions;
    ///
    /// #[workflow]
    /// async fn greet(name: String) -> Result<String> {
    ///     Ok(format!("hello {name}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let db = workflow_core::store::memory::MemoryStore::new();
    /// let old = Runtime::builder()
    ///     .store(db.clone())
    ///     .encryption(Keys::new().current("2025-06", [1u8; 32]))
    ///     .build()
    ///     .await?;
    /// let run = old.start(greet, ("ana".to_string(),)).await?;
    /// run.return_value().await?;
    /// old.shutdown();
    ///
    /// // The new key current, the old one to read what it sealed.
    /// let keys = Keys::new().current("2026-12", [2u8; 32]).old("2025-06", [1u8; 32]);
    /// let rt = Runtime::builder().store(db.clone()).encryption(keys).worker(false).build().await?;
    /// let report = rt.rekey(RekeyOptions::new()).await?;
    /// assert!(report.rewritten() >= 2 && report.complete());
    /// assert_eq!(rt.rekey(RekeyOptions::new()).await?.rewritten(), 0);
    ///
    /// // The new key alone reads the run.
    /// let new = Runtime::builder()
    ///     .store(db)
    ///     .encryption(Keys::new().current("2026-12", [2u8; 32]))
    ///     .worker(false)
    ///     .build()
    ///     .await?;
    /// let again = new.get_run(&run.id()).typed::<String>();
    /// assert_eq!(again.return_value().await?, "hello ana");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn rekey(&self, options: RekeyOptions) -> Result<RekeyReport, RekeyError> {
        let payloads = &self.inner.config.payloads;
        let Some(keys) = payloads.keys() else {
            return Err(RekeyError::NoKeys);
        };
        let store = &self.inner.store;
        let mut report = RekeyReport {
            key: keys.current().to_owned(),
            ..RekeyReport::default()
        };
        for table in PayloadTable::ALL {
            let mut cursor: Option<SealedAt> = None;
            loop {
                let rows = store
                    .sealed_rows(table, cursor.as_ref(), options.batch)
                    .await?;
                let read = match table {
                    PayloadTable::Runs => {
                        let mut runs: Vec<_> = rows.iter().map(|r| r.at.run()).collect();
                        runs.dedup();
                        runs.len()
                    }
                    _ => rows.len(),
                };
                // The first run of each row's chain, read once per page (see `Owner`).
                let mut owners = HashMap::new();
                for row in rows {
                    cursor = Some(row.at.clone());
                    let run = row.at.run();
                    let owner = match owners.get(&run) {
                        Some(owner) => *owner,
                        None => {
                            let owner = match store.get_run(&run).await? {
                                Some(record) => Owner::of(&record),
                                None => Owner::first(run),
                            };
                            owners.insert(run, owner);
                            owner
                        }
                    };
                    if !self
                        .rekey_row(payloads, owner, row, &options, &mut report)
                        .await?
                    {
                        report.stopped_early = true;
                        return Ok(report);
                    }
                }
                if read < options.batch {
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Rekeys one row into `report`; `false` when the limit stops the call before it.
    async fn rekey_row(
        &self,
        payloads: &Payloads,
        owner: Owner,
        row: SealedRow,
        options: &RekeyOptions,
        report: &mut RekeyReport,
    ) -> Result<bool, RekeyError> {
        let mut value = row.value.clone();
        let done = rekey_value(payloads, owner, &row.at, &mut value)?;
        let rewrites = done.iter().any(|(_, r)| *r == Rekeyed::Rewritten);
        if rewrites {
            if options.limit.is_some_and(|l| report.rows_rewritten >= l) {
                return Ok(false);
            }
            if !self.inner.store.replace_sealed(&row, &value).await? {
                report.changed += 1;
                return Ok(true);
            }
            report.rows_rewritten += 1;
        }
        for (kind, r) in done {
            let count = report.kinds.entry(kind).or_default();
            match r {
                Rekeyed::Rewritten => count.rewritten += 1,
                Rekeyed::Current => count.current += 1,
                Rekeyed::Plain => {}
            }
        }
        Ok(true)
    }
}
