//! The statements of continue-as-new on PostgreSQL, built once per schema with the rest of
//! the store's statements (`statements.rs`) and run by `chain.rs`.

/// The statements of a continuation in schema `s`.
pub(super) struct ChainSql {
    /// `$1` the old run, `$2` the next run, `$3` its workflow, `$4` its input, `$5` its
    /// admission, `$6` now, `$7` the token of children's ends (which stay with the old run),
    /// `$8` whether the next run is leased (under the old run's lease: epoch 1, its
    /// `lease_until`). The inherited columns are copied in `next` (a column a run keeps
    /// through its chain is added to both of its lists), the trace context among them. The
    /// next run's row (`RunRow`) as inserted; none when the old run has no row.
    pub(super) continue_run: String,
    /// `Tx::bind_inherited`: `$1` token, `$2` run.
    pub(super) bind_inherited: String,
    /// `ChainTx::requeue`: `$1` the entry's own id, `$2` the run, `$3` token, `$4` topic,
    /// `$5` payload, `$6` now, `$7` whether it is a hook's payload (kept only when the run
    /// owns the token).
    pub(super) requeue: String,
}

impl ChainSql {
    pub(super) fn new(s: &str) -> Self {
        ChainSql {
            continue_run: format!(
                "WITH next AS (
                     INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at,
                          epoch, lease_until,
                          hook_token, deadline, parent_id, detached, queue, partition_key,
                          priority, began_at, version, trace_context, previous_run, origin)
                     SELECT $2, $3, CASE WHEN $8 THEN 'running' ELSE 'pending' END, $4, $5,
                            $5, $5, CASE WHEN $8 THEN 1 ELSE 0 END,
                            CASE WHEN $8 THEN lease_until END,
                            hook_token, deadline, parent_id, detached, queue, partition_key,
                            priority, began_at, version, trace_context, id, COALESCE(origin, id)
                     FROM {s}.runs WHERE id = $1
                     RETURNING id, workflow, status, input, output, error, created_at,
                               updated_at, hook_token, deadline, parent_id, queue,
                               partition_key, priority, start_at, version, previous_run,
                               next_run, trace_context, origin),
                 ended AS (
                     UPDATE {s}.runs SET status = 'continued_as_new', next_run = $2,
                         lease_until = NULL, updated_at = $6
                     WHERE id = $1),
                 hooks AS (
                     UPDATE {s}.hooks SET run_id = $2, inherited = TRUE
                     WHERE run_id = $1 AND active),
                 inbox AS (
                     UPDATE {s}.hook_inbox SET run_id = $2 WHERE run_id = $1 AND token <> $7),
                 message_keys AS (
                     UPDATE {s}.message_keys SET run_id = $2 WHERE run_id = $1),
                 requests AS (
                     UPDATE {s}.run_requests SET run_id = $2
                     WHERE run_id = $1 AND reply IS NULL),
                 published AS (
                     INSERT INTO {s}.run_events (run_id, key, value, at)
                     SELECT $2, key, value, at FROM {s}.run_events WHERE run_id = $1),
                 ticks AS (
                     UPDATE {s}.schedule_ticks SET run_id = $2 WHERE run_id = $1)
                 SELECT * FROM next"
            ),
            requeue: format!(
                "INSERT INTO {s}.hook_inbox (id, run_id, token, topic, payload, at)
                 OVERRIDING SYSTEM VALUE
                 SELECT $1, $2, $3, $4, $5, $6
                 WHERE NOT $7 OR EXISTS (SELECT 1 FROM {s}.hooks
                                         WHERE token = $3 AND run_id = $2 AND active)"
            ),
            bind_inherited: format!(
                "UPDATE {s}.hooks SET inherited = FALSE
                 WHERE token = $1 AND run_id = $2 AND active AND inherited"
            ),
        }
    }
}
