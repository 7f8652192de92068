//! Continue-as-new on SQLite: the statements of [`ChainTx`] (what the next run inherits,
//! written side by side) and the continuation itself, one transaction on the writer. The
//! decision (fence, lock order, what is recorded) is the shared policy's
//! (`store::sql::policy::chain`).

use rusqlite::params;

use super::tx::{exec, now, one, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self, ChainTx, NextRunRow};
use crate::store::sql::rows::RunRow;
use crate::store::sql::{EncodedAppend, EncodedInbox};
use crate::store::{check_continuation, Append, Lease, LeasedRun, NewRun, CHILD_NOTICE_TOKEN};

/// `?1` the old run, `?2` the next run, `?3` its workflow, `?4` its input, `?5` its admission,
/// `?6` whether it is leased (under the old run's lease). The inherited columns are copied
/// here (a column a run keeps through its chain is added to both lists), the trace context
/// among them. Returns the next run's row (`RunRow`).
const INSERT_NEXT: &str = "
INSERT INTO runs (id, workflow, status, input, created_at, updated_at, wake_at,
                  epoch, lease_until,
                  hook_token, deadline, parent_id, detached, queue, partition_key, priority,
                  began_at, version, trace_context, previous_run, origin)
SELECT ?2, ?3, CASE WHEN ?6 THEN 'running' ELSE 'pending' END, ?4, ?5, ?5, ?5,
       CASE WHEN ?6 THEN 1 ELSE 0 END, CASE WHEN ?6 THEN lease_until END,
       hook_token, deadline, parent_id, detached, queue, partition_key, priority,
       began_at, version, trace_context, id, COALESCE(origin, id)
FROM runs WHERE id = ?1
RETURNING id, workflow, status, input, output, error, created_at, updated_at,
          hook_token, deadline, parent_id, queue, partition_key, priority, start_at,
          version, previous_run, next_run, trace_context, origin";

/// `?1` the old run, `?2` the next run, `?3` now.
const END_OLD: &str = "
UPDATE runs SET status = 'continued_as_new', next_run = ?2, lease_until = NULL, updated_at = ?3
WHERE id = ?1";

/// `?1` the old run, `?2` the next run (`?3`: the token of children's ends, which stay).
const MOVE: [&str; 5] = [
    "UPDATE hooks SET run_id = ?2, inherited = 1 WHERE run_id = ?1 AND active = 1",
    "UPDATE hook_inbox SET run_id = ?2 WHERE run_id = ?1 AND token <> ?3",
    "UPDATE message_keys SET run_id = ?2 WHERE run_id = ?1",
    "UPDATE run_requests SET run_id = ?2 WHERE run_id = ?1 AND reply IS NULL",
    "UPDATE schedule_ticks SET run_id = ?2 WHERE run_id = ?1",
];

/// `?1` the old run, `?2` the next run.
const COPY_EVENTS: &str = "
INSERT INTO run_events (run_id, key, value, at)
SELECT ?2, key, value, at FROM run_events WHERE run_id = ?1";

/// `?1` its id, `?2` the run, `?3` token, `?4` topic, `?5` payload, `?6` now, `?7` whether
/// it is a hook's payload (kept only when the run owns the token).
const REQUEUE: &str = "INSERT INTO hook_inbox (id, run_id, token, topic, payload, at)
                       SELECT ?1, ?2, ?3, ?4, ?5, ?6
                       WHERE NOT ?7 OR EXISTS (SELECT 1 FROM hooks
                                               WHERE token = ?3 AND run_id = ?2 AND active = 1)";

impl ChainTx for Lite<'_> {
    async fn requeue(&mut self, run: &str, e: &EncodedInbox, now: i64) -> Result<(), StoreError> {
        let hook = e.topic.is_none();
        let args = params![e.id, run, e.token, e.topic, e.payload, now, hook];
        exec(self.0, REQUEUE, args)?;
        Ok(())
    }

    async fn continue_run(
        &mut self,
        old: &str,
        next: &NextRunRow,
        at: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        let args = params![
            old,
            next.key,
            next.workflow,
            next.input,
            next.at,
            next.leased
        ];
        let Some(row) = one(self.0, INSERT_NEXT, args, RunRow::from_sqlite)? else {
            return Ok(None);
        };
        exec(self.0, END_OLD, params![old, next.key, at])?;
        for sql in MOVE {
            // Each statement names the parameters it uses.
            let mut stmt = self.0.prepare_cached(sql)?;
            let count = stmt.parameter_count();
            match count {
                3 => stmt.execute(params![old, next.key, CHILD_NOTICE_TOKEN])?,
                _ => stmt.execute(params![old, next.key])?,
            };
        }
        exec(self.0, COPY_EVENTS, params![old, next.key])?;
        Ok(Some(row))
    }
}

impl SqliteStore {
    /// [`crate::store::RunStore::continue_as_new`] on the writer.
    /// The next run leased to the caller when `leased`, and then returned.
    pub(super) async fn continue_chain(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
        leased: bool,
    ) -> Result<Option<LeasedRun>, StoreError> {
        check_continuation(write, &next)?;
        let lease = lease.clone();
        let write = EncodedAppend::new(write)?;
        let next = NextRunRow::new(&next, leased)?;
        self.write(move |tx| {
            now(policy::continue_as_new(
                &mut Lite(tx),
                &lease,
                &write,
                &next,
            ))
        })
        .await
    }
}
