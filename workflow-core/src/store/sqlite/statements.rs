//! Every statement the store runs besides the schema's, as SQLite spells it, in one table
//! (`SQL`) to be read side by side with PostgreSQL's. Text only: no code runs here.

/// Every statement the store runs (beside the schema's), as SQLite spells it; read it side
/// by side with PostgreSQL's. `?n` are the arguments in the order bound.
pub(super) type Statements = crate::store::sql::Statements<&'static str, SqliteOnly>;

/// The statements PostgreSQL does without: it inserts events with the append (and chunks
/// with theirs), wakes the
/// owner inside `resume`, and keeps its catalog queries with its migrations.
pub(super) struct SqliteOnly {
    pub(super) insert_event: &'static str,
    pub(super) insert_chunk: &'static str,
    pub(super) wake: &'static str,
    pub(super) child_notice: &'static str,
    pub(super) tables: &'static str,
    pub(super) migration_version: &'static str,
    pub(super) record_migration: &'static str,
    pub(super) legacy_meta: &'static str,
    pub(super) ended_among: &'static str,
    pub(super) may_begin: &'static str,
    pub(super) insert_begun: &'static str,
    /// Queue `?1` holds `?2` more slots (a negative number: fewer). Every statement that
    /// begins or ends a queued run is followed by this (or by `held_recount`) in the same
    /// transaction: `queues.held` is what `may_begin` and `queue_counts` read.
    pub(super) held_add: &'static str,
    /// Queue `?1`'s held slots counted again from its runs (on the paths that are not hot:
    /// a cancellation or failure, an end without a fence).
    pub(super) held_recount: &'static str,
    /// After `begin_queued` of the runs `?1` (a JSON array): each of their queues holds as
    /// many more slots as runs of it began (those of `?1` with a begin now; the others,
    /// passed over, have none).
    pub(super) held_begun: &'static str,
    pub(super) publish_event: &'static str,
    pub(super) record_reply: &'static str,
    /// A row when the run's lease is held by the epoch given: a transactional step's check,
    /// once its transaction holds the write lock, before its body runs.
    pub(super) lease_held: &'static str,
    /// A run's last write in one statement: fenced as `append` is (by `?2`), ends the run as
    /// `end_run` does (`?3`-`?6` its status, output, error and time); no row changed when the
    /// lease is lost. `numbered` then reads the base to number its events from, the parent
    /// and the chain's first run.
    pub(super) append_end: &'static str,
    /// After `append_end` of run `?1` in this transaction: the base to number its events from
    /// (its last event), the run's parent, its chain's first run, and its queue when it held
    /// a slot (had begun).
    pub(super) numbered: &'static str,
    /// A row when run `?1` holds an active hook: without one, giving up all its tokens
    /// writes nothing, and its two statements are skipped.
    pub(super) holds_hooks: &'static str,
}

pub(super) const SQL: Statements = Statements {
    run_exists: "SELECT 1 FROM runs WHERE id = ?1",
    // A delayed run (`?12` start) is due at its start, not at its admission.
    insert_run: "INSERT INTO runs (id, workflow, status, input, created_at, updated_at, wake_at,
                                   hook_token, deadline, parent_id, detached, queue,
                                   partition_key, priority, start_at, version, trace_context)
                 VALUES (?1, ?2, 'pending', ?3, ?4, ?4, MAX(?4, COALESCE(?12, ?4)), ?5, ?6, ?7,
                         ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                 ON CONFLICT (id) DO NOTHING",
    insert_leased_run: "INSERT INTO runs (id, workflow, status, input, created_at, updated_at,
                                          wake_at, hook_token, epoch, lease_until, deadline,
                                          parent_id, detached, start_at, version,
                                          trace_context)
                        VALUES (?1, ?2, 'running', ?3, ?4, ?4, ?4, ?5, 1, ?6, ?7, ?8, ?9, ?10,
                                ?11, ?12)
                        ON CONFLICT (id) DO NOTHING",
    claim: "INSERT INTO hooks (token, run_id, created_at, active, retain_until)
            VALUES (?1, ?2, ?3, 1, ?4)
            ON CONFLICT (token) DO UPDATE SET
                run_id = excluded.run_id, created_at = excluded.created_at, active = 1,
                retain_until = excluded.retain_until
            WHERE hooks.active = 0 AND COALESCE(hooks.retain_until, 0) <= excluded.created_at",
    hook_owner: "SELECT run_id, active FROM hooks WHERE token = ?1",
    get_run: "SELECT id, workflow, status, input, output, error, created_at, updated_at,
                     hook_token, deadline, parent_id, queue, partition_key, priority, start_at,
                     version, previous_run, next_run, trace_context, origin
              FROM runs WHERE id = ?1",
    events: "SELECT run_id, seq, at, data FROM events WHERE run_id = ?1 ORDER BY seq",
    // `?1`: the run ids as a JSON array.
    events_of: "SELECT run_id, seq, at, data FROM events
                WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq",
    // One statement picks and leases; the IMMEDIATE transaction around it keeps every other
    // connection, in any process, from leasing the same rows meanwhile.
    // Queued runs waiting for a slot are left to `begin_queued`, unless their deadline has
    // passed: handed out without a slot, they fail at once. `took_over` keeps, for RETURNING
    // (which reads the new row), whether a lease was still set: it expired under a worker
    // that stopped renewing it (a release or an end sets it NULL).
    acquire: "UPDATE runs SET epoch = epoch + 1, status = 'running', lease_until = ?1,
                  error = NULL, took_over = lease_until IS NOT NULL,
                  updated_at = CASE WHEN status = 'running' THEN updated_at ELSE ?2 END
              WHERE id IN (
                  SELECT id FROM runs
                  WHERE (status IN ('pending', 'running') OR status = 'blocked')
                    AND wake_at <= ?2
                    AND (lease_until IS NULL OR lease_until <= ?2)
                    AND workflow IN (SELECT value FROM json_each(?3))
                    AND (queue IS NULL OR began_at IS NOT NULL OR deadline <= ?2)
                  ORDER BY wake_at, id
                  LIMIT ?4)
              RETURNING id, workflow, status, input, output, error, created_at, updated_at,
                        hook_token, deadline, parent_id, queue, partition_key, priority,
                        start_at, version, previous_run, next_run, trace_context, origin,
                        epoch, wake_at, took_over,
                        EXISTS (SELECT 1 FROM events WHERE run_id = runs.id)",
    // Fences (with epoch `?2`, unless NULL) and reads the base to number the events from, the
    // run's last event, in one read: no row when the lease is lost. The writer holds the
    // file's write lock (`BEGIN IMMEDIATE`) from this read to the commit, so nothing writes
    // the run in between, and the run's row is not written for an append: each step's
    // commit writes the pages of its events, not also the run's.
    append: "SELECT (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1)
             FROM runs
             WHERE id = ?1
               AND (?2 IS NULL OR (epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL))",
    run_status: "SELECT status FROM runs WHERE id = ?1",
    // The parent, if any, is told next (`SqliteOnly::child_notice`).
    end_run: "UPDATE runs SET status = ?2, output = ?3, error = ?4, updated_at = ?5,
                  lease_until = NULL
              WHERE id = ?1
              RETURNING parent_id, COALESCE(origin, id), CASE WHEN began_at IS NOT NULL THEN queue END",
    children_to_cancel: "SELECT id FROM runs
                         WHERE parent_id = ?1 AND detached = 0
                           AND status NOT IN ('completed', 'failed', 'cancelled', 'continued_as_new')",
    // `?3`: the tokens as a JSON array, or NULL for all the run's.
    release_tokens: [
        "DELETE FROM hooks
         WHERE run_id = ?1 AND active = 1 AND COALESCE(retain_until, 0) <= ?2
           AND (?3 IS NULL OR token IN (SELECT value FROM json_each(?3)))",
        "UPDATE hooks SET active = 0
         WHERE run_id = ?1 AND active = 1
           AND (?2 IS NULL OR token IN (SELECT value FROM json_each(?2)))",
    ],
    // A payload committed after the worker last looked wakes the run at once; the check and
    // the release are one statement, so none slips in between.
    release: "UPDATE runs SET lease_until = NULL, failed_tries = 0,
                  wake_at = CASE
                      WHEN EXISTS (SELECT 1 FROM hook_inbox WHERE run_id = ?1 AND id > ?4)
                      THEN ?5 ELSE ?3 END
              WHERE id = ?1 AND epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL",
    count_failure: "UPDATE runs SET failed_tries = failed_tries + 1, lease_until = NULL
                    WHERE id = ?1 AND epoch = ?2 AND status = 'running'
                      AND lease_until IS NOT NULL
                    RETURNING failed_tries",
    retry_at: "UPDATE runs SET wake_at = ?2 WHERE id = ?1",
    block: "UPDATE runs SET status = 'blocked', error = ?3, updated_at = ?4, lease_until = NULL,
                blocked_tries = blocked_tries + 1
            WHERE id = ?1 AND epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL
            RETURNING blocked_tries",
    // A failed run re-opened waits for a slot of its queue again.
    retry: "UPDATE runs SET status = CASE status WHEN 'failed' THEN 'pending' ELSE status END,
                error = CASE status WHEN 'failed' THEN NULL ELSE error END,
                began_at = CASE status WHEN 'failed' THEN NULL ELSE began_at END,
                updated_at = ?2, wake_at = ?2, failed_tries = 0, blocked_tries = 0
            WHERE id = ?1 AND status IN ('failed', 'blocked')",
    wake_blocked: "UPDATE runs SET wake_at = MIN(wake_at, ?1) WHERE status = 'blocked'",
    // `?2`: the payload ids as a JSON array.
    forget_payloads: "DELETE FROM hook_inbox
                      WHERE run_id = ?1 AND id IN (SELECT value FROM json_each(?2))",
    // Finding the owner and queueing the payload is one statement: no row, no payload.
    resume: "INSERT INTO hook_inbox (run_id, token, payload, at)
             SELECT run_id, token, ?2, ?3 FROM hooks WHERE token = ?1 AND active = 1
             RETURNING id, run_id",
    payloads: "SELECT id, token, topic, payload FROM hook_inbox
               WHERE run_id = ?1 AND id > ?2 ORDER BY id",
    payloads_since: "SELECT id, run_id FROM hook_inbox WHERE id > ?1 ORDER BY id LIMIT ?2",
    last_payload_id: "SELECT COALESCE(MAX(id), 0) FROM hook_inbox",
    get_hook: "SELECT token, run_id, created_at FROM hooks WHERE token = ?1 AND active = 1",
    // `?1`: the leases as a JSON array of `[id, epoch]`.
    heartbeat: "UPDATE runs SET lease_until = ?2
                FROM (SELECT value ->> 0 AS held_id, value ->> 1 AS held_epoch
                      FROM json_each(?1)) AS l
                WHERE id = l.held_id AND epoch = l.held_epoch AND status = 'running'
                  AND lease_until IS NOT NULL
                RETURNING id, epoch",
    // A NULL filter matches everything.
    run_counts: "SELECT workflow, status, COUNT(*) FROM runs GROUP BY workflow, status
                 ORDER BY workflow, status",
    list_runs: "SELECT id, workflow, status, input, output, error, created_at, updated_at,
                       hook_token, deadline, parent_id, queue, partition_key, priority,
                       start_at, version, previous_run, next_run, trace_context, origin
                FROM runs
                WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR workflow = ?2)
                  AND (?9 IS NULL OR version = ?9)
                  AND (?4 IS NULL OR queue = ?4) AND (?5 IS NULL OR parent_id = ?5)
                  AND (?6 IS NULL OR created_at >= ?6) AND (?7 IS NULL OR created_at < ?7)
                  AND (?8 IS NULL OR (created_at, id) < (SELECT created_at, id FROM runs WHERE id = ?8))
                ORDER BY created_at DESC, id DESC LIMIT ?3",
    list_hooks: "SELECT token, run_id, created_at FROM hooks
                 WHERE active = 1 AND (?1 IS NULL OR token = ?1) AND (?2 IS NULL OR run_id = ?2)
                 ORDER BY created_at DESC, token LIMIT ?3",
    // `?1` ended before, `?2` now; then `?1`: the pruned ids as a JSON array.
    prune_runs: "DELETE FROM runs
                 WHERE status IN ('completed', 'failed', 'cancelled', 'continued_as_new') AND updated_at < ?1
                   AND NOT EXISTS (SELECT 1 FROM hooks WHERE run_id = runs.id AND retain_until > ?2)
                 RETURNING id",
    prune_records: [
        "DELETE FROM events WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM hook_inbox WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM hooks WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM streams WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM stream_chunks WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM message_keys WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM run_events WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM run_requests WHERE run_id IN (SELECT value FROM json_each(?1))",
    ],
    // After the fence (`append` of no events). The stream's row is the counter: a closed
    // stream's row is not updated, so no row.
    append_chunk: "INSERT INTO streams (run_id, name, len, closed) VALUES (?1, ?2, 1, 0)
                   ON CONFLICT (run_id, name) DO UPDATE SET len = len + 1 WHERE closed = 0
                   RETURNING len - 1",
    close_stream: "INSERT INTO streams (run_id, name, len, closed) VALUES (?1, ?2, 0, 1)
                   ON CONFLICT (run_id, name) DO UPDATE SET closed = 1",
    stream_state: "SELECT (SELECT status FROM runs WHERE id = ?1),
                          (SELECT len FROM streams WHERE run_id = ?1 AND name = ?2),
                          (SELECT closed FROM streams WHERE run_id = ?1 AND name = ?2)",
    stream_chunks: "SELECT idx, attempt, at, value FROM stream_chunks
                    WHERE run_id = ?1 AND name = ?2 AND idx >= ?3 ORDER BY idx LIMIT ?4",
    list_streams: "SELECT name, len, closed FROM streams WHERE run_id = ?1 ORDER BY name",
    // `?5` now.
    define_queue: "INSERT INTO queues (name, concurrency, rate_limit, rate_period, updated_at)
                   VALUES (?1, ?2, ?3, ?4, ?5)
                   ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency,
                       rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
                       updated_at = excluded.updated_at",
    // `?1` now.
    list_queues: "SELECT q.name, q.concurrency, q.rate_limit, q.rate_period,
                         (SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
                          WHERE queue = q.name AND began_at IS NOT NULL
                            AND (status IN ('pending', 'running') OR status = 'blocked')),
                         (SELECT COUNT(*) FROM runs
                          WHERE queue = q.name AND began_at IS NULL
                            AND (status IN ('pending', 'running') OR status = 'blocked')),
                         (SELECT COUNT(*) FROM runs
                          WHERE q.rate_period IS NOT NULL AND queue = q.name
                            AND began_at > ?1 - q.rate_period),
                         (SELECT MIN(created_at) FROM runs
                          WHERE queue = q.name AND began_at IS NULL
                            AND (status IN ('pending', 'running') OR status = 'blocked'))
                  FROM queues q ORDER BY q.name",
    // `?1` now. The window's oldest begin leaves it at `began_at + rate_period`.
    queue_opening: "SELECT MIN(opening) FROM (
                        SELECT (SELECT MIN(began_at) FROM runs r
                                WHERE r.queue = q.name AND r.began_at > ?1 - q.rate_period)
                               + q.rate_period AS opening
                        FROM queues q
                        WHERE q.rate_limit IS NOT NULL AND q.rate_period IS NOT NULL
                          AND EXISTS (SELECT 1 FROM runs w
                                      WHERE w.queue = q.name AND w.queue IS NOT NULL
                                        AND w.began_at IS NULL
                                        AND (w.status IN ('pending', 'running')
                                             OR w.status = 'blocked'))
                          AND (SELECT COUNT(*) FROM runs r
                               WHERE r.queue = q.name AND r.began_at > ?1 - q.rate_period)
                              >= q.rate_limit)",
    // One entry of the waiting runs' index, if any.
    has_waiting: "SELECT EXISTS (SELECT 1 FROM runs INDEXED BY runs_queue_waiting
                                 WHERE queue IS NOT NULL AND began_at IS NULL
                                   AND (status IN ('pending', 'running') OR status = 'blocked'))",
    // `?1` now, `?2` the workflows as a JSON array.
    waiting_queues: "SELECT DISTINCT queue FROM runs
                     WHERE queue IS NOT NULL AND began_at IS NULL
                       AND (status IN ('pending', 'running') OR status = 'blocked')
                       AND wake_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
                       AND workflow IN (SELECT value FROM json_each(?2))
                     ORDER BY queue",
    // The writer is serial (and `BEGIN IMMEDIATE` between processes): no lock needed.
    lock_queue: "SELECT concurrency, rate_limit, rate_period FROM queues WHERE name = ?1",
    // The slots held (`queues.held`, see `held_add`) and the begins within the rate window
    // (`?2` its start).
    queue_counts: "SELECT
                       (SELECT held FROM queues WHERE name = ?1),
                       (SELECT COUNT(*) FROM runs WHERE queue = ?1 AND began_at > ?2)",
    // `?1` queue, `?2` now, `?3` the workflows as a JSON array, `?4` limit. Walks the
    // waiting runs in the order they begin and stops at the limit. Of a key, only the
    // earliest started waiting run may begin, and only while none of the key holds a slot.
    queue_candidates: "SELECT id FROM runs w
                       WHERE queue = ?1 AND queue IS NOT NULL AND began_at IS NULL
                         AND (status IN ('pending', 'running') OR status = 'blocked')
                         AND wake_at <= ?2 AND (lease_until IS NULL OR lease_until <= ?2)
                         AND workflow IN (SELECT value FROM json_each(?3))
                         AND (partition_key IS NULL OR (
                             NOT EXISTS (
                                 SELECT 1 FROM runs e
                                 WHERE e.queue = ?1 AND e.partition_key = w.partition_key
                                   AND e.queue IS NOT NULL AND e.partition_key IS NOT NULL
                                   AND e.began_at IS NULL
                                   AND (e.status IN ('pending', 'running') OR e.status = 'blocked')
                                   AND (e.created_at, e.id) < (w.created_at, w.id))
                             AND NOT EXISTS (
                                 SELECT 1 FROM runs h INDEXED BY runs_queue_holding
                                 WHERE h.queue = ?1 AND h.partition_key = w.partition_key
                                   AND h.queue IS NOT NULL AND h.began_at IS NOT NULL
                                   AND (h.status IN ('pending', 'running')
                                        OR h.status = 'blocked'))))
                       ORDER BY priority DESC, created_at, id
                       LIMIT ?4",
    // `?1` lease until, `?2` now, `?3` the run ids as a JSON array.
    begin_queued: "UPDATE runs SET epoch = epoch + 1, status = 'running', lease_until = ?1,
                       error = NULL, began_at = ?2, took_over = lease_until IS NOT NULL,
                       updated_at = CASE WHEN status = 'running' THEN updated_at ELSE ?2 END
                   WHERE id IN (SELECT value FROM json_each(?3)) AND began_at IS NULL
                     AND (status IN ('pending', 'running') OR status = 'blocked')
                     AND (lease_until IS NULL OR lease_until <= ?2)
                   RETURNING id, workflow, status, input, output, error, created_at,
                             updated_at, hook_token, deadline, parent_id, queue, partition_key,
                             priority, start_at, version, previous_run, next_run,
                             trace_context, origin, epoch, wake_at, took_over,
                             EXISTS (SELECT 1 FROM events WHERE run_id = runs.id)",
    dialect: SqliteOnly {
        insert_event:
            "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        insert_chunk: "INSERT INTO stream_chunks (run_id, name, idx, attempt, at, value)
                       VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        // A blocked run waits for a build that fits, not for payloads; a delayed one for
        // its start.
        wake: "UPDATE runs SET wake_at = MAX(MIN(wake_at, ?2), COALESCE(start_at, 0))
               WHERE id = ?1 AND status <> 'blocked'",
        // A child's end, queued to its parent (`?1`) as a `ChildNotice` (`?3`) under the
        // notice token (`?2`).
        child_notice: "INSERT INTO hook_inbox (run_id, token, payload, at) VALUES (?1, ?2, ?3, ?4)",
        tables: "SELECT name FROM sqlite_schema
                 WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
                 ORDER BY name",
        migration_version: "SELECT COALESCE(MAX(version), 0) FROM workflow_migrations",
        record_migration: "INSERT INTO workflow_migrations (version, name, applied_at)
                           VALUES (?1, ?2, ?3)",
        legacy_meta: "SELECT value FROM workflow_meta WHERE key = ?1",
        // `?1`: run ids as a JSON array; those not live.
        ended_among: "SELECT value FROM json_each(?1)
                      WHERE NOT EXISTS (SELECT 1 FROM runs WHERE id = value
                                        AND (status IN ('pending', 'running')
                                             OR status = 'blocked'))",
        // Whether a queued run admitted at `?3` may take a slot at once: its queue (`?1`) is
        // declared, no run of it waits to begin (nobody is overtaken, whatever their priority
        // or key), a slot is free (`held`, kept with every begin and end (`held_add`) rather
        // than a count of the holding runs: up to `concurrency` index entries read per
        // admission), the rate window has room, and no run of its partition key
        // (`?2`) holds a slot. The writer is serial (and `BEGIN IMMEDIATE` between
        // processes): nothing changes between this check and `insert_begun`. (One statement
        // of both, an INSERT .. SELECT reading `runs`, had SQLite copy the row through a
        // temporary b-tree first.)
        may_begin: "SELECT 1 FROM queues q
                    WHERE q.name = ?1
                      AND NOT EXISTS (SELECT 1 FROM runs w INDEXED BY runs_queue_waiting
                                      WHERE w.queue = ?1 AND w.queue IS NOT NULL
                                        AND w.began_at IS NULL
                                        AND (w.status IN ('pending', 'running')
                                             OR w.status = 'blocked'))
                      AND (q.concurrency IS NULL OR q.held < q.concurrency)
                      AND (q.rate_limit IS NULL OR q.rate_period IS NULL OR
                           (SELECT COUNT(*) FROM runs
                            WHERE queue = ?1 AND began_at > ?3 - q.rate_period)
                           < q.rate_limit)
                      AND (?2 IS NULL OR NOT EXISTS (
                           SELECT 1 FROM runs h INDEXED BY runs_queue_holding
                           WHERE h.queue = ?1 AND h.partition_key = ?2
                             AND h.began_at IS NOT NULL
                             AND (h.status IN ('pending', 'running') OR h.status = 'blocked')))",
        held_add: "UPDATE queues SET held = held + ?2 WHERE name = ?1",
        held_recount: "UPDATE queues SET held = (
                           SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
                           WHERE queue = ?1 AND began_at IS NOT NULL
                             AND (status IN ('pending', 'running') OR status = 'blocked'))
                       WHERE name = ?1",
        held_begun: "UPDATE queues SET held = held + (
                         SELECT COUNT(*) FROM runs
                         WHERE id IN (SELECT value FROM json_each(?1))
                           AND queue = queues.name AND began_at IS NOT NULL)
                     WHERE name IN (SELECT queue FROM runs
                                    WHERE id IN (SELECT value FROM json_each(?1)))",
        // A queued run admitted holding its slot (`may_begin` said it may), begun now and
        // leased to the admitting worker (epoch 1) until `?6`.
        insert_begun: "INSERT INTO runs (id, workflow, status, input, created_at, updated_at,
                                         wake_at, hook_token, epoch, lease_until, deadline,
                                         parent_id, detached, queue, partition_key, priority,
                                         began_at, version, trace_context)
                       VALUES (?1, ?2, 'running', ?3, ?4, ?4, ?4, ?5, 1, ?6, ?7, ?8, ?9, ?10,
                               ?11, ?12, ?4, ?13, ?14)
                       ON CONFLICT (id) DO NOTHING",
        // Run `?1`'s latest value of key `?2` is `?3` (JSON), set at `?4`: readers in other
        // processes see it at their next poll.
        publish_event: "INSERT INTO run_events (run_id, key, value, at) VALUES (?1, ?2, ?3, ?4)
                        ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value,
                                                                at = excluded.at",
        // Run `?1`'s reply to its request `?2` is `?3` (JSON), recorded at `?4`; a recorded
        // reply stays. Callers in other processes see it at their next poll.
        record_reply: "UPDATE run_requests SET reply = ?3, replied_at = ?4
                       WHERE run_id = ?1 AND id = ?2 AND reply IS NULL",
        lease_held: "SELECT 1 FROM runs
                     WHERE id = ?1 AND epoch = ?2 AND status = 'running'
                       AND lease_until IS NOT NULL",
        append_end: "UPDATE runs SET status = ?3, output = ?4, error = ?5, updated_at = ?6,
                         lease_until = NULL
                     WHERE id = ?1
                       AND (?2 IS NULL OR (epoch = ?2 AND status = 'running'
                                           AND lease_until IS NOT NULL))",
        numbered: "SELECT (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1),
                          parent_id, COALESCE(origin, id),
                          CASE WHEN began_at IS NOT NULL THEN queue END
                   FROM runs WHERE id = ?1",
        holds_hooks: "SELECT 1 FROM hooks WHERE run_id = ?1 AND active = 1 LIMIT 1",
    },
};
