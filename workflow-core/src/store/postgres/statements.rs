//! The PostgreSQL statements, one table (`Statements`) built once per store with the schema
//! spelled in, to read side by side with SQLite's. Only SQL text lives here: nothing is
//! executed, bound or decided in this file; the policies decide, `tx` and `commit` run it.

use super::listen::{NOTE_CHUNK, NOTE_ENDED, NOTE_PAYLOAD, NOTE_READY};

/// The server's clock, in microseconds since the Unix epoch: what [`Store::now`] reports and
/// every process times its writes by.
pub(super) const CLOCK: &str =
    "SELECT floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint";
/// The server's clock as a time column (ms), for what a statement decides without a caller's
/// time: one value for the whole statement.
pub(super) const NOW_MS: &str = "floor(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::bigint";

/// Every statement with the schema spelled in, built once per store: sqlx prepares each one
/// once per connection and reuses it (its cache is keyed by the SQL text). Read it side by
/// side with SQLite's.
pub(super) type Statements = crate::store::sql::Statements<String, PgOnly>;

/// The statements SQLite does without: its writer holds the database's one write lock.
pub(super) struct PgOnly {
    /// Continue-as-new (`chain_sql.rs`, run by `chain.rs`).
    pub(super) chain: super::chain_sql::ChainSql,
    /// `insert_leased_run` (no token: `$1`-`$4`, then `$5` lease until, `$6` deadline, `$7`
    /// parent, `$8` detached, `$9` start, `$10` version, `$11` trace context) with the run's
    /// first events (`$12` times, `$13` kinds, `$14` data), numbered from 1: one statement,
    /// one commit (`RunStore::create_run_leased_with`). The id, or no row when it exists.
    pub(super) insert_leased_with: String,
    /// `append`, taking the inbox lock first when the run has a parent (`$6` lock key): the
    /// first statement of a run's end, which may queue a notice to the parent. The lock is
    /// an InitPlan of the row's UPDATE, so it is held before the row is locked.
    pub(super) append_ending: String,
    /// Takes the inbox lock (see `resume_hook`). `$1` lock key.
    pub(super) lock_inbox: String,
    /// See [`policy::Tx::append_and_end`].
    pub(super) append_and_end: String,
    /// Takes the inbox lock (`$1`) if any of the runs `$2` has a parent: what a group
    /// transaction ending those runs does first.
    pub(super) lock_inbox_for_children: String,
    /// `append_and_end` for a run with no parent, no queue and no live token (most runs, as
    /// the writer's `EndHint::Alone` says): none of its other parts has anything to do, and
    /// PostgreSQL sets them all up on every call. No row when the run is not such a run, or
    /// its lease is lost; then `append_and_end` decides. `$1` run, `$2` times, `$3` kinds, `$4` data, `$5` epoch or
    /// NULL, `$6` status, `$7` output, `$8` error, `$9` now.
    pub(super) append_and_end_plain: String,
    /// The events of several runs in one statement (see `Tx::append_many`): `$1` runs, `$2`
    /// their epochs, `$3` their counts of events; `$4` .. `$8` the events (run, index within the
    /// run from 1, time, kind, data). The rows are locked in id order, each fenced as `append`
    /// fences it; the answer: the runs written (a run missing was fenced out).
    pub(super) append_many: String,
    /// The usual ends of several runs without ties in one statement (see
    /// `Tx::end_many_alone`): `$1` runs, `$2` their epochs, `$3` their counts of events,
    /// `$4` statuses, `$5` outputs, `$6` errors, `$7` times; `$8` .. `$12` the events as in
    /// `append_many`. The rows are locked in id order, each fenced as `append_and_end_plain`
    /// fences it and taken only on its terms (no parent, queue, start token or active hook);
    /// the answer: the runs ended (a run missing was not written: the caller writes it alone).
    pub(super) end_many_alone: String,
    /// Admissions without a token, several in one statement (see `Tx::insert_many`), leased
    /// to the admitting worker where `$5` has a lease's end: `$1` ids, `$2` workflows, `$3`
    /// inputs, `$4` times, `$5` lease ends, `$6` deadlines, `$7` parents, `$8` detached, `$9`
    /// queues, `$10` partition keys, `$11` priorities, `$12` starts, `$13` versions, `$14` trace contexts, `$15` counts of first events;
    /// `$16` .. `$20` the first events of runs leased at admission (run, seq from 1, time,
    /// kind, data), written for the runs inserted. The answer: the ids admitted (an id
    /// missing existed already).
    pub(super) admit_many: String,
    /// An admission claiming its token, in one statement: see `Tx::admit_claiming`.
    /// `[0]` waits for a worker, `[1]` is leased to the admitting one.
    pub(super) admit_claiming: [String; 2],
    /// A queued run admitted holding its slot (see `Tx::admit_begun`), run after its queue's
    /// row was locked: `$1` id, `$2` workflow, `$3` input, `$4` created at, `$5` lease end,
    /// `$6` deadline, `$7` parent, `$8` detached, `$9` queue, `$10` partition key, `$11`
    /// priority, `$12` version, `$13` trace context. A row when it was inserted.
    pub(super) insert_begun: String,
    /// Locks queue `$1`'s row unless another transaction holds it or a run of the queue waits
    /// to begin (then no admission may begin: nobody is overtaken): a row when locked, none
    /// otherwise (or when the queue was not declared). `Tx::admit_begun` takes it.
    pub(super) try_lock_queue: String,
    /// Run `$1`'s latest value of key `$2` is `$3` (JSON), set at `$4` (`Tx::publish_event`).
    pub(super) publish_event: String,
    /// Run `$1`'s reply to its request `$2` is `$3` (JSON), recorded at `$4`, unless one is
    /// (`Tx::record_reply`).
    pub(super) record_reply: String,
}

/// The statement admitting a run with its token (see `Tx::admit_claiming`): `$1` id,
/// `$2` workflow, `$3` input, `$4` created at, `$5` token, `$6` retained until, `$7` deadline,
/// `$8` parent, `$9` detached, then with `leased` `$10` the lease's end, `$11` start, `$12`
/// version, `$13` trace context, else `$10` queue, `$11` partition key, `$12` priority, `$13`
/// start (the run is due at the later of it and `$4`), `$14` version, `$15` trace context. One row: whether the id was new, whether the run was
/// admitted, and the token's owner as the statement's snapshot saw it (and whether it holds
/// the token).
pub(super) fn admit_claiming_sql(s: &str, leased: bool) -> String {
    let insert = if leased {
        format!(
            "INSERT INTO {s}.runs
                 (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                  epoch, lease_until, deadline, parent_id, detached, start_at, version,
                  trace_context)
             SELECT $1, $2, 'running', $3, $4, $4, $4, $5, 1, $10, $7, $8, $9, $11, $12, $13
             FROM claimed"
        )
    } else {
        format!(
            "INSERT INTO {s}.runs
                 (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                  deadline, parent_id, detached, queue, partition_key, priority, start_at,
                  version, trace_context)
             SELECT $1, $2, 'pending', $3, $4, $4, GREATEST($4, $13), $5, $7, $8, $9, $10, $11,
                    $12, $13, $14, $15
             FROM claimed"
        )
    };
    format!(
        "WITH fresh AS (SELECT NOT EXISTS (SELECT 1 FROM {s}.runs WHERE id = $1) AS new),
         seen AS (
             SELECT run_id FROM {s}.hooks
             WHERE token = $5 AND (active OR COALESCE(retain_until, 0) > $4)),
         claimed AS (
             INSERT INTO {s}.hooks AS h (token, run_id, created_at, active, retain_until)
             SELECT $5, $1, $4, TRUE, $6 FROM fresh
             WHERE fresh.new AND NOT EXISTS (SELECT 1 FROM seen)
             ON CONFLICT (token) DO UPDATE SET
                 run_id = EXCLUDED.run_id, created_at = EXCLUDED.created_at, active = TRUE,
                 retain_until = EXCLUDED.retain_until
             WHERE NOT h.active AND COALESCE(h.retain_until, 0) <= EXCLUDED.created_at
             RETURNING run_id),
         inserted AS ({insert} RETURNING id)
         SELECT (SELECT new FROM fresh), EXISTS (SELECT 1 FROM inserted), o.run_id,
                COALESCE(o.active OR COALESCE(o.retain_until, 0) > $4, FALSE)
         FROM (SELECT 1) AS one
         LEFT JOIN {s}.hooks AS o ON o.token = $5"
    )
}

pub(super) const RUN_COLUMNS: &str =
    "id, workflow, status, input, output, error, created_at, updated_at, \
                           hook_token, deadline, parent_id, queue, partition_key, priority, \
                           start_at, version, previous_run, next_run, trace_context, origin";

/// The statements for the tables in schema `s` (quoted).
pub(super) fn statements(s: &str) -> Statements {
    // What every append of one run's events (`$1` run, `$2` times, `$3` kinds, `$4` data)
    // inserts, numbered after the `base` its fenced update of the run's row returned (from
    // CTE `numbered` or `ended`).
    let insert_events = |from: &str| {
        format!(
            "INSERT INTO {s}.events (run_id, seq, at, kind, data)
             SELECT $1, {from}.base + e.n, e.at, e.kind, e.data
             FROM {from},
                  UNNEST($2::bigint[], $3::text[], $4::text[])
                      WITH ORDINALITY AS e(at, kind, data, n)"
        )
    };
    let (insert_numbered, insert_ended) = (insert_events("numbered"), insert_events("ended"));
    // What the statements for many runs insert: the events of `FlatEvents` (run, number
    // within the run from 1, time, kind, data) from parameter `$p` on, numbered after the
    // `base` that CTE `from` returned for each run it wrote (a run it did not write gets
    // none).
    let insert_flat = |p: u32, from: &str| {
        format!(
            "INSERT INTO {s}.events (run_id, seq, at, kind, data)
             SELECT e.run, nb.base + e.k, e.at, e.kind, e.data
             FROM UNNEST(${p}::text[], ${}::bigint[], ${}::bigint[], ${}::text[], ${}::text[])
                 AS e(run, k, at, kind, data)
             JOIN {from} nb ON nb.id = e.run",
            p + 1,
            p + 2,
            p + 3,
            p + 4
        )
    };
    let insert_flat_numbered = insert_flat(4, "numbered");
    let insert_flat_ended = insert_flat(8, "ended");
    let insert_flat_inserted = insert_flat(16, "inserted");
    // After a run's end (CTE `ended`: its id, parent and queue) and its notice queued to the
    // parent (CTE `queued`): the parent woken at `now`, and the notices to send.
    let woken_notes = |now: &str| {
        format!(
            "woken AS (
                 UPDATE {s}.runs r SET wake_at = CASE r.status
                     WHEN 'blocked' THEN r.wake_at ELSE LEAST(r.wake_at, {now}) END
                 FROM queued q WHERE r.id = q.run_id
                 RETURNING r.id, r.status IN ('pending', 'running')
                     AND (r.lease_until IS NULL OR r.lease_until <= {NOW_MS}) AS idle),
             notes AS (
                 SELECT ARRAY['{NOTE_ENDED}' || e.id]
                     || ARRAY(SELECT '{NOTE_PAYLOAD}' || w.id FROM woken w)
                     || CASE WHEN e.queue IS NOT NULL
                                  OR EXISTS (SELECT 1 FROM woken w WHERE w.idle)
                             THEN ARRAY['{NOTE_READY}'] ELSE ARRAY[]::text[] END AS n
                 FROM ended e)"
        )
    };
    let (end_woken_notes, ending_woken_notes) = (woken_notes("$5"), woken_notes("$9"));
    // A run's end with its last events, fenced by epoch `$5` unless NULL: status `$6`, output
    // `$7`, error `$8` at `$9`.
    // A child's end notice (`ChildNotice::encode`, which opens with the child's id) names the
    // chain's first run instead when the ended run continues a chain (`e`/`l.origin`).
    let chain_notice = |notice: &str, e: &str| {
        format!(
            "CASE WHEN {e}.origin IS NULL THEN {notice} ELSE replace({notice}, \
             '{{\"child\":\"' || $1 || '\"', '{{\"child\":\"' || {e}.origin || '\"') END"
        )
    };
    let chain_notice9 = chain_notice("$9", "l");
    let chain_notice12 = chain_notice("$12", "e");
    let end_fenced = format!(
        "UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[]),
             status = $6, output = $7, error = $8, updated_at = $9, lease_until = NULL
         WHERE id = $1
           AND ($5::bigint IS NULL
                OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))"
    );
    {
        Statements {
            run_exists: format!("SELECT 1 FROM {s}.runs WHERE id = $1"),
            // Inserted and announced, or nothing (the id exists): one row or none. A delayed
            // run (`$12` start) is due at its start.
            insert_run: format!(
                "WITH inserted AS (
                     INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                          deadline, parent_id, detached, queue, partition_key, priority,
                          start_at, version, trace_context)
                     VALUES ($1, $2, 'pending', $3, $4, $4, GREATEST($4, $12), $5, $6, $7, $8,
                             $9, $10, $11, $12, $13, $14)
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id)
                 SELECT id FROM inserted"
            ),
            // Admitted and leased to the admitting worker (epoch 1, lease until `$6`): nobody
            // else may take it, so nobody is told it is ready.
            insert_leased_run: format!(
                "INSERT INTO {s}.runs
                     (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                      epoch, lease_until, deadline, parent_id, detached, start_at, version,
                      trace_context)
                 VALUES ($1, $2, 'running', $3, $4, $4, $4, $5, 1, $6, $7, $8, $9, $10, $11,
                         $12)
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id"
            ),
            // The decision is the upsert's own WHERE on the token's primary key: of any number
            // of claims, in any process, exactly one takes a free token. A taken token's row
            // is locked all the same, so the owner read next is the owner.
            claim: format!(
                "INSERT INTO {s}.hooks AS h (token, run_id, created_at, active, retain_until)
                 VALUES ($1, $2, $3, TRUE, $4)
                 ON CONFLICT (token) DO UPDATE SET
                     run_id = EXCLUDED.run_id, created_at = EXCLUDED.created_at, active = TRUE,
                     retain_until = EXCLUDED.retain_until
                 WHERE NOT h.active AND COALESCE(h.retain_until, 0) <= EXCLUDED.created_at"
            ),
            hook_owner: format!("SELECT run_id, active FROM {s}.hooks WHERE token = $1"),
            get_run: format!("SELECT {RUN_COLUMNS} FROM {s}.runs WHERE id = $1"),
            events: format!(
                "SELECT run_id, seq, at, data FROM {s}.events WHERE run_id = $1 ORDER BY seq"
            ),
            events_of: format!(
                "SELECT run_id, seq, at, data FROM {s}.events
                 WHERE run_id = ANY($1) ORDER BY run_id, seq"
            ),
            // MATERIALIZED: the locked pick is computed exactly once. `took_over`: the lease
            // replaced was still set, so it expired under a worker that stopped renewing it.
            acquire: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT id, lease_until IS NOT NULL AS took_over FROM {s}.runs
                     WHERE status IN ('pending', 'running', 'blocked')
                       AND wake_at <= $2
                       AND (lease_until IS NULL OR lease_until <= $2)
                       AND workflow = ANY($3)
                       -- Waiting queued runs are left to `begin_queued`, unless their
                       -- deadline has passed: handed out without a slot, they fail at once.
                       AND (queue IS NULL OR began_at IS NOT NULL OR deadline <= $2)
                     ORDER BY wake_at, id
                     LIMIT $4
                     FOR UPDATE SKIP LOCKED)
                 UPDATE {s}.runs AS r
                 SET epoch = r.epoch + 1, status = 'running', lease_until = $1, error = NULL,
                     updated_at = CASE WHEN r.status = 'running' THEN r.updated_at ELSE $2 END
                 FROM picked WHERE r.id = picked.id
                 RETURNING r.id, r.workflow, r.status, r.input, r.output, r.error,
                           r.created_at, r.updated_at, r.hook_token, r.deadline, r.parent_id,
                           r.queue, r.partition_key, r.priority, r.start_at, r.version,
                           r.previous_run, r.next_run, r.trace_context, r.origin, r.epoch,
                           r.wake_at,
                           picked.took_over, r.last_seq"
            ),
            // Fenced (with epoch `$5`, unless NULL), numbered after the run's last event
            // (`runs.last_seq`, bumped in the same statement) and inserted: one statement. The
            // run's row stays locked until commit, so no takeover, cancel or other write to
            // the run interleaves with the caller's. No row when the lease is lost. `$2`
            // times, `$3` kinds, `$4` data.
            append: format!(
                "WITH numbered AS (
                     UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[])
                     WHERE id = $1
                       AND ($5::bigint IS NULL
                            OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))
                     RETURNING last_seq - cardinality($2::bigint[]) AS base),
                 inserted AS (
                     {insert_numbered})
                 SELECT base FROM numbered"
            ),
            run_status: format!("SELECT status FROM {s}.runs WHERE id = $1 FOR UPDATE"),
            // Ended; a child's end (`$9`, its `ChildNotice` as `EncodedEnd::notice` encodes it)
            // is queued to its parent under the notice token (`$6`), with the inbox lock (`$7`,
            // see `resume`) taken only then, and the parent woken; the end of a queued run
            // frees a slot, so its queue's waiting runs may be ready. The answer: the notices
            // to send. With `$8`, the run's tokens are given up too (as `release_tokens` does
            // for all of them): a retained row stays, inactive, the others go.
            end_run: format!(
                "WITH ended AS (
                     UPDATE {s}.runs SET status = $2, output = $3, error = $4, updated_at = $5,
                         lease_until = NULL
                     WHERE id = $1
                     RETURNING id, parent_id, queue, origin),
                 freed AS (
                     DELETE FROM {s}.hooks
                     WHERE $8 AND run_id = $1 AND active AND COALESCE(retain_until, 0) <= $5),
                 kept AS (
                     UPDATE {s}.hooks SET active = FALSE
                     WHERE $8 AND run_id = $1 AND active AND COALESCE(retain_until, 0) > $5),
                 locked AS (
                     SELECT pg_advisory_xact_lock($7), e.parent_id, e.origin
                     FROM ended e WHERE e.parent_id IS NOT NULL),
                 -- A chain's end names its first run (`origin`), which the parent awaits.
                 queued AS (
                     INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                     SELECT l.parent_id, $6, {chain_notice9}, $5 FROM locked l
                     RETURNING run_id),
                 {end_woken_notes}
                 SELECT COALESCE((SELECT n FROM notes), ARRAY[]::text[])"
            ),
            children_to_cancel: format!(
                "SELECT id FROM {s}.runs
                 WHERE parent_id = $1 AND NOT detached
                   AND status NOT IN ('completed', 'failed', 'cancelled', 'continued_as_new')"
            ),
            // Giving up tokens (`$3`, or NULL for all the run's): the row goes, freeing the
            // token, unless retained past now; then it stays, inactive, until a claim after
            // its retention replaces it.
            release_tokens: [
                format!(
                    "DELETE FROM {s}.hooks
                     WHERE run_id = $1 AND active AND COALESCE(retain_until, 0) <= $2
                       AND ($3::text[] IS NULL OR token = ANY($3))"
                ),
                format!(
                    "UPDATE {s}.hooks SET active = FALSE
                     WHERE run_id = $1 AND active AND ($2::text[] IS NULL OR token = ANY($2))"
                ),
            ],
            // Announced only when acquirable now: telling every worker about a run due later
            // would only make them look in vain. A payload it has not seen makes it due now,
            // on the server's clock. `$4` channel.
            release: format!(
                "WITH released AS (
                     UPDATE {s}.runs SET lease_until = NULL, failed_tries = 0,
                         wake_at = CASE
                             WHEN EXISTS (SELECT 1 FROM {s}.hook_inbox WHERE run_id = $1 AND id > $3)
                             THEN {NOW_MS} ELSE $2 END
                     WHERE id = $1
                     RETURNING wake_at)
                 SELECT pg_notify($4, '{NOTE_READY}') FROM released WHERE wake_at <= {NOW_MS}"
            ),
            count_failure: format!(
                "UPDATE {s}.runs SET failed_tries = failed_tries + 1, lease_until = NULL
                 WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until IS NOT NULL
                 RETURNING failed_tries::bigint"
            ),
            retry_at: format!("UPDATE {s}.runs SET wake_at = $2 WHERE id = $1"),
            block: format!(
                "UPDATE {s}.runs SET status = 'blocked', error = $3, updated_at = $4,
                     lease_until = NULL, blocked_tries = blocked_tries + 1
                 WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until IS NOT NULL
                 RETURNING blocked_tries::bigint"
            ),
            // Announced: the run is acquirable now. `$3` channel.
            retry: format!(
                "WITH retried AS (
                     UPDATE {s}.runs SET
                         status = CASE status WHEN 'failed' THEN 'pending' ELSE status END,
                         error = CASE status WHEN 'failed' THEN NULL ELSE error END,
                         -- Re-opened, it waits for a slot of its queue again.
                         began_at = CASE status WHEN 'failed' THEN NULL ELSE began_at END,
                         updated_at = $2, wake_at = $2, failed_tries = 0, blocked_tries = 0
                     WHERE id = $1 AND status IN ('failed', 'blocked')
                     RETURNING id)
                 SELECT pg_notify($3, '{NOTE_READY}') FROM retried"
            ),
            // `$2` channel.
            wake_blocked: format!(
                "WITH woken AS (
                     UPDATE {s}.runs SET wake_at = LEAST(wake_at, $1) WHERE status = 'blocked'
                     RETURNING id),
                 notes AS (SELECT pg_notify($2, '{NOTE_READY}') FROM (SELECT 1 FROM woken LIMIT 1) w)
                 SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM notes)"
            ),
            forget_payloads: format!("DELETE FROM {s}.hook_inbox WHERE run_id = $1 AND id = ANY($2)"),
            // One statement, so one round trip and an implicit transaction: take the inbox
            // lock (see `PostgresStore::resume_hook`), queue the payload if the token has an
            // owner, lower the owner's wake time, and announce the payload (and, when nobody
            // drives the run, that it is ready). The insert's rows come from the join with
            // `locked`, so its identity value is drawn only after the lock is held. `notes` is
            // read only so that it runs: PostgreSQL skips a `WITH` query that does not modify
            // data unless something reads it. Whether a lease still holds the run is judged
            // on the server's clock. `$1` token, `$2` payload, `$3` at, `$4` lock key, `$5`
            // channel.
            resume: format!(
                "WITH locked AS (SELECT pg_advisory_xact_lock($4)),
                 queued AS (
                     INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                     SELECT h.run_id, h.token, $2, $3 FROM {s}.hooks h, locked
                     WHERE h.token = $1 AND h.active
                     -- Read again once locked: an owner that changed (continue-as-new) or
                     -- released it while this waited for the inbox lock is seen.
                     FOR SHARE OF h
                     RETURNING id, run_id),
                 -- A delayed run waits for its start, payloads or not.
                 woken AS (
                     UPDATE {s}.runs r SET wake_at = CASE r.status
                         WHEN 'blocked' THEN r.wake_at
                         ELSE GREATEST(LEAST(r.wake_at, $3), r.start_at) END
                     FROM queued q WHERE r.id = q.run_id
                     RETURNING r.status IN ('pending', 'running')
                         AND (r.lease_until IS NULL OR r.lease_until <= {NOW_MS}) AS idle),
                 notes AS (
                     SELECT pg_notify($5, n)
                     FROM queued q LEFT JOIN woken w ON true,
                     UNNEST(CASE WHEN w.idle
                         THEN ARRAY['{NOTE_PAYLOAD}' || q.run_id, '{NOTE_READY}']
                         ELSE ARRAY['{NOTE_PAYLOAD}' || q.run_id] END) AS n)
                 SELECT q.id, q.run_id, (SELECT count(*) FROM notes) FROM queued q"
            ),
            payloads: format!(
                "SELECT id, token, topic, payload FROM {s}.hook_inbox
                 WHERE run_id = $1 AND id > $2 ORDER BY id"
            ),
            payloads_since: format!(
                "SELECT id, run_id FROM {s}.hook_inbox WHERE id > $1 ORDER BY id LIMIT $2"
            ),
            last_payload_id: format!("SELECT COALESCE(MAX(id), 0) FROM {s}.hook_inbox"),
            get_hook: format!(
                "SELECT token, run_id, created_at FROM {s}.hooks WHERE token = $1 AND active"
            ),
            // The rows are locked in id order, the order a group transaction of the
            // committers locks them in: a renewal and a batch of the same runs never wait for
            // each other both ways.
            heartbeat: format!(
                "WITH held AS MATERIALIZED (
                     SELECT r.id FROM {s}.runs r
                     JOIN UNNEST($1::text[], $2::bigint[]) AS l(id, epoch)
                         ON r.id = l.id AND r.epoch = l.epoch
                     WHERE r.status = 'running' AND r.lease_until IS NOT NULL
                     ORDER BY r.id
                     FOR UPDATE OF r)
                 UPDATE {s}.runs AS r SET lease_until = $3
                 FROM held WHERE r.id = held.id
                 RETURNING r.id, r.epoch"
            ),
            // A NULL filter matches everything.
            run_counts: format!(
                "SELECT workflow, status, count(*) FROM {s}.runs GROUP BY workflow, status
                 ORDER BY workflow, status"
            ),
            list_runs: format!(
                "SELECT {RUN_COLUMNS} FROM {s}.runs
                 WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR workflow = $2)
                   AND ($4::text IS NULL OR queue = $4) AND ($5::text IS NULL OR parent_id = $5)
                   AND ($9::text IS NULL OR version = $9)
                   AND ($6::bigint IS NULL OR created_at >= $6)
                   AND ($7::bigint IS NULL OR created_at < $7)
                   AND ($8::text IS NULL OR (created_at, id) <
                        (SELECT c.created_at, c.id FROM {s}.runs c WHERE c.id = $8))
                 ORDER BY created_at DESC, id DESC
                 LIMIT $3"
            ),
            // Ties broken byte-wise, like the other stores.
            list_hooks: format!(
                "SELECT token, run_id, created_at FROM {s}.hooks
                 WHERE active AND ($1::text IS NULL OR token = $1)
                   AND ($2::text IS NULL OR run_id = $2)
                 ORDER BY created_at DESC, token COLLATE \"C\"
                 LIMIT $3"
            ),
            // `$1` ended before, `$2` now; then `$1`: the pruned ids.
            prune_runs: format!(
                "DELETE FROM {s}.runs r
                 WHERE status IN ('completed', 'failed', 'cancelled', 'continued_as_new') AND updated_at < $1
                   AND NOT EXISTS (SELECT 1 FROM {s}.hooks h
                                   WHERE h.run_id = r.id AND h.retain_until > $2)
                 RETURNING id"
            ),
            prune_records: [
                "events",
                "hook_inbox",
                "hooks",
                "streams",
                "stream_chunks",
                "message_keys",
                "run_events",
                "run_requests",
            ]
                .map(|t| format!("DELETE FROM {s}.{t} WHERE run_id = ANY($1)")),
            // One statement, so one round trip and its own transaction: fence (the run's row
            // stays locked to the end, so no end or cancel of the run interleaves), draw the
            // index from the stream's row (the counter, locked too: concurrent writers to one
            // stream take turns and get indexes in commit order; a closed stream's row is not
            // updated, so no index) and insert the chunk. `$1` run, `$2` epoch, `$3` stream,
            // `$4` attempt, `$5` at, `$6` value; the answer: (fenced, index or NULL when
            // closed).
            append_chunk: format!(
                "WITH fenced AS (
                     UPDATE {s}.runs SET last_seq = last_seq
                     WHERE id = $1 AND epoch = $2 AND status = 'running'
                       AND lease_until IS NOT NULL
                     RETURNING id),
                 counted AS (
                     INSERT INTO {s}.streams AS st (run_id, name, len, closed)
                     SELECT id, $3, 1, FALSE FROM fenced
                     ON CONFLICT (run_id, name) DO UPDATE SET len = st.len + 1
                     WHERE NOT st.closed
                     RETURNING st.len - 1 AS idx),
                 inserted AS (
                     INSERT INTO {s}.stream_chunks (run_id, name, idx, attempt, at, value)
                     SELECT $1, $3, idx, $4, $5, $6 FROM counted
                     RETURNING run_id)
                 SELECT (SELECT count(*) FROM fenced), (SELECT idx FROM counted)"
            ),
            // Closed and announced. `$3` channel.
            close_stream: format!(
                "WITH closed AS (
                     INSERT INTO {s}.streams AS st (run_id, name, len, closed)
                     VALUES ($1, $2, 0, TRUE)
                     ON CONFLICT (run_id, name) DO UPDATE SET closed = TRUE
                     RETURNING run_id)
                 SELECT pg_notify($3, '{NOTE_CHUNK}' || run_id) FROM closed"
            ),
            stream_state: format!(
                "SELECT (SELECT status FROM {s}.runs WHERE id = $1) AS status,
                        (SELECT len FROM {s}.streams WHERE run_id = $1 AND name = $2) AS len,
                        (SELECT closed FROM {s}.streams WHERE run_id = $1 AND name = $2)
                            AS closed"
            ),
            stream_chunks: format!(
                "SELECT idx, attempt, at, value FROM {s}.stream_chunks
                 WHERE run_id = $1 AND name = $2 AND idx >= $3 ORDER BY idx LIMIT $4"
            ),
            list_streams: format!(
                "SELECT name, len, closed FROM {s}.streams WHERE run_id = $1 ORDER BY name"
            ),
            // Rows as arrays: `$1` names, `$2` concurrency, `$3` rate limits, `$4` periods,
            // `$5` now.
            define_queue: format!(
                "INSERT INTO {s}.queues (name, concurrency, rate_limit, rate_period, updated_at)
                 SELECT q.name, q.concurrency, q.rate_limit, q.rate_period, $5
                 FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
                     AS q(name, concurrency, rate_limit, rate_period)
                 ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency,
                     rate_limit = EXCLUDED.rate_limit, rate_period = EXCLUDED.rate_period,
                     updated_at = EXCLUDED.updated_at"
            ),
            // `$1` now.
            list_queues: format!(
                "SELECT q.name, q.concurrency, q.rate_limit, q.rate_period,
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = q.name AND began_at IS NOT NULL
                        AND status IN ('pending', 'running', 'blocked')) AS occupied,
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = q.name AND began_at IS NULL
                        AND status IN ('pending', 'running', 'blocked')) AS waiting,
                     (SELECT count(*) FROM {s}.runs
                      WHERE q.rate_period IS NOT NULL AND queue = q.name
                        AND began_at > $1 - q.rate_period) AS begun_in_window,
                     (SELECT min(created_at) FROM {s}.runs
                      WHERE queue = q.name AND began_at IS NULL
                        AND status IN ('pending', 'running', 'blocked')) AS oldest_waiting
                 FROM {s}.queues q ORDER BY q.name"
            ),
            // `$1` now. The window's oldest begin leaves it at `began_at + rate_period`.
            has_waiting: format!(
                "SELECT EXISTS (SELECT 1 FROM {s}.runs
                                WHERE queue IS NOT NULL AND began_at IS NULL
                                  AND status IN ('pending', 'running', 'blocked'))"
            ),
            queue_opening: format!(
                "SELECT MIN(opening) FROM (
                     SELECT (SELECT MIN(began_at) FROM {s}.runs r
                             WHERE r.queue = q.name AND r.began_at > $1 - q.rate_period)
                            + q.rate_period AS opening
                     FROM {s}.queues q
                     WHERE q.rate_limit IS NOT NULL AND q.rate_period IS NOT NULL
                       AND EXISTS (SELECT 1 FROM {s}.runs w
                                   WHERE w.queue = q.name AND w.began_at IS NULL
                                     AND w.status IN ('pending', 'running', 'blocked'))
                       AND (SELECT count(*) FROM {s}.runs r
                            WHERE r.queue = q.name AND r.began_at > $1 - q.rate_period)
                           >= q.rate_limit) AS o"
            ),
            // In byte order, the order declarations lock queues in too.
            waiting_queues: format!(
                "SELECT DISTINCT queue COLLATE \"C\" AS q FROM {s}.runs
                 WHERE queue IS NOT NULL AND began_at IS NULL
                   AND status IN ('pending', 'running', 'blocked')
                   AND wake_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)
                   AND workflow = ANY($2)
                 ORDER BY q"
            ),
            // Held until the acquire's transaction ends: one acquirer at a time begins runs
            // of the queue, and the next one's counts, read after the lock is granted, see
            // what it began.
            lock_queue: format!(
                "SELECT concurrency, rate_limit, rate_period FROM {s}.queues
                 WHERE name = $1 FOR UPDATE"
            ),
            queue_counts: format!(
                "SELECT
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = $1 AND began_at IS NOT NULL
                        AND status IN ('pending', 'running', 'blocked')),
                     (SELECT count(*) FROM {s}.runs WHERE queue = $1 AND began_at > $2)"
            ),
            // `$1` queue, `$2` now, `$3` workflows, `$4` limit. Walks the waiting runs in the
            // order they begin and stops at the limit. Of a key, only the earliest started
            // waiting run may begin, and only while none of the key holds a slot.
            queue_candidates: format!(
                "SELECT id FROM {s}.runs w
                 WHERE queue = $1 AND began_at IS NULL
                   AND status IN ('pending', 'running', 'blocked')
                   AND wake_at <= $2 AND (lease_until IS NULL OR lease_until <= $2)
                   AND workflow = ANY($3)
                   AND (partition_key IS NULL OR (
                       NOT EXISTS (
                           SELECT 1 FROM {s}.runs e
                           WHERE e.queue = $1 AND e.partition_key = w.partition_key
                             AND e.partition_key IS NOT NULL AND e.began_at IS NULL
                             AND e.status IN ('pending', 'running', 'blocked')
                             AND (e.created_at, e.id) < (w.created_at, w.id))
                       AND NOT EXISTS (
                           SELECT 1 FROM {s}.runs h
                           WHERE h.queue = $1 AND h.partition_key = w.partition_key
                             AND h.began_at IS NOT NULL
                             AND h.status IN ('pending', 'running', 'blocked'))))
                 ORDER BY priority DESC, created_at, id
                 LIMIT $4"
            ),
            // `$1` lease until, `$2` now, `$3` the run ids. A run locked meanwhile (being
            // cancelled) is passed over.
            begin_queued: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT id, lease_until IS NOT NULL AS took_over FROM {s}.runs
                     WHERE id = ANY($3) AND began_at IS NULL
                       AND status IN ('pending', 'running', 'blocked')
                       AND (lease_until IS NULL OR lease_until <= $2)
                     FOR UPDATE SKIP LOCKED)
                 UPDATE {s}.runs AS r
                 SET epoch = r.epoch + 1, status = 'running', lease_until = $1, error = NULL,
                     began_at = $2,
                     updated_at = CASE WHEN r.status = 'running' THEN r.updated_at ELSE $2 END
                 FROM picked WHERE r.id = picked.id
                 RETURNING r.id, r.workflow, r.status, r.input, r.output, r.error,
                           r.created_at, r.updated_at, r.hook_token, r.deadline, r.parent_id,
                           r.queue, r.partition_key, r.priority, r.start_at, r.version,
                           r.previous_run, r.next_run, r.trace_context, r.origin, r.epoch,
                           r.wake_at,
                           picked.took_over, r.last_seq"
            ),
            dialect: PgOnly {
                chain: super::chain_sql::ChainSql::new(s),
                insert_leased_with: format!(
                    "WITH inserted AS (
                         INSERT INTO {s}.runs
                             (id, workflow, status, input, created_at, updated_at, wake_at,
                              epoch, lease_until, deadline, parent_id, detached, start_at,
                              version, trace_context, last_seq)
                         VALUES ($1, $2, 'running', $3, $4, $4, $4, 1, $5, $6, $7, $8, $9,
                                 $10, $11, cardinality($12::bigint[]))
                         ON CONFLICT (id) DO NOTHING
                         RETURNING id),
                     first AS (
                         INSERT INTO {s}.events (run_id, seq, at, kind, data)
                         SELECT i.id, e.n, e.at, e.kind, e.data
                         FROM inserted i,
                              UNNEST($12::bigint[], $13::text[], $14::text[])
                                  WITH ORDINALITY AS e(at, kind, data, n))
                     SELECT id FROM inserted"
                ),
                record_reply: format!(
                    "UPDATE {s}.run_requests SET reply = $3, replied_at = $4
                     WHERE run_id = $1 AND id = $2 AND reply IS NULL"
                ),
                publish_event: format!(
                    "INSERT INTO {s}.run_events (run_id, key, value, at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value,
                                                             at = excluded.at"
                ),
                try_lock_queue: format!(
                    "SELECT 1 FROM {s}.queues q
                     WHERE q.name = $1
                       AND NOT EXISTS (SELECT 1 FROM {s}.runs w
                                       WHERE w.queue = $1 AND w.began_at IS NULL
                                         AND w.status IN ('pending', 'running', 'blocked'))
                     FOR UPDATE OF q SKIP LOCKED"
                ),
                // The queue's row is locked by the statement before (`try_lock_queue`), so the
                // counts are read after every other admission or acquire of the queue
                // committed. Nobody is overtaken: no run of the queue may wait to begin.
                insert_begun: format!(
                    "INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at,
                          epoch, lease_until, deadline, parent_id, detached, queue,
                          partition_key, priority, began_at, version, trace_context)
                     SELECT $1, $2, 'running', $3, $4, $4, $4, 1, $5, $6, $7, $8, $9, $10,
                            $11, $4, $12, $13
                     FROM {s}.queues q
                     WHERE q.name = $9
                       AND NOT EXISTS (SELECT 1 FROM {s}.runs w
                                       WHERE w.queue = $9 AND w.began_at IS NULL
                                         AND w.status IN ('pending', 'running', 'blocked'))
                       AND (q.concurrency IS NULL OR
                            (SELECT count(*) FROM {s}.runs
                             WHERE queue = $9 AND began_at IS NOT NULL
                               AND status IN ('pending', 'running', 'blocked'))
                            < q.concurrency)
                       AND (q.rate_limit IS NULL OR q.rate_period IS NULL OR
                            (SELECT count(*) FROM {s}.runs
                             WHERE queue = $9 AND began_at > $4 - q.rate_period)
                            < q.rate_limit)
                       AND ($10::text IS NULL OR NOT EXISTS (
                            SELECT 1 FROM {s}.runs h
                            WHERE h.queue = $9 AND h.partition_key = $10
                              AND h.began_at IS NOT NULL
                              AND h.status IN ('pending', 'running', 'blocked')))
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id"
                ),
                append_ending: format!(
                    "WITH numbered AS (
                         UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[])
                         WHERE id = $1
                           AND ($5::bigint IS NULL
                                OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))
                           AND (SELECT count(*) FROM (
                                    SELECT pg_advisory_xact_lock($6) FROM {s}.runs p
                                    WHERE p.id = $1 AND p.parent_id IS NOT NULL) l) >= 0
                         RETURNING last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_numbered})
                     SELECT base FROM numbered"
                ),
                // `append_ending` and `end_run` (releasing the tokens) in one statement: the
                // run's row is updated once, numbering the events and ending it. `$1` run,
                // `$2` times, `$3` kinds, `$4` data, `$5` epoch or NULL, `$6` status, `$7`
                // output, `$8` error, `$9` now, `$10` the notice token, `$12` the child's notice
                // (`EncodedEnd::notice`, queued only for a child; NULL when the writer knows the
                // run has no parent, and then a run with one is refused), `$11` the inbox lock
                // (taken before the row lock, and only for a child). One row, with the notices
                // to send; none when the lease is lost or the notice is missing.
                append_and_end: format!(
                    "WITH ended AS (
                         {end_fenced}
                           AND ($12::text IS NOT NULL OR parent_id IS NULL)
                           AND (SELECT count(*) FROM (
                                    SELECT pg_advisory_xact_lock($11) FROM {s}.runs p
                                    WHERE p.id = $1 AND p.parent_id IS NOT NULL) l) >= 0
                         RETURNING id, parent_id, queue, origin,
                                   last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_ended}),
                     freed AS (
                         DELETE FROM {s}.hooks
                         WHERE run_id = $1 AND EXISTS (SELECT 1 FROM ended)
                           AND active AND COALESCE(retain_until, 0) <= $9),
                     kept AS (
                         UPDATE {s}.hooks SET active = FALSE
                         WHERE run_id = $1 AND EXISTS (SELECT 1 FROM ended)
                           AND active AND COALESCE(retain_until, 0) > $9),
                     queued AS (
                         INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                         SELECT e.parent_id, $10, {chain_notice12}, $9 FROM ended e
                         WHERE e.parent_id IS NOT NULL
                         RETURNING run_id),
                     {ending_woken_notes}
                     SELECT base, (SELECT n FROM notes) FROM ended"
                ),
                append_and_end_plain: format!(
                    "WITH ended AS (
                         {end_fenced}
                           AND parent_id IS NULL AND queue IS NULL AND hook_token IS NULL
                           AND NOT EXISTS (SELECT 1 FROM {s}.hooks h
                                           WHERE h.run_id = $1 AND h.active)
                         RETURNING last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_ended})
                     SELECT base FROM ended"
                ),
                append_many: format!(
                    "WITH locked AS MATERIALIZED (
                         SELECT r.id, i.n
                         FROM {s}.runs r
                         JOIN UNNEST($1::text[], $2::bigint[], $3::bigint[]) AS i(run, epoch, n)
                             ON r.id = i.run
                         WHERE r.epoch = i.epoch AND r.status = 'running'
                           AND r.lease_until IS NOT NULL
                         ORDER BY r.id
                         FOR UPDATE OF r),
                     numbered AS (
                         UPDATE {s}.runs r SET last_seq = r.last_seq + l.n
                         FROM locked l WHERE r.id = l.id
                         RETURNING r.id, r.last_seq - l.n AS base),
                     inserted AS ({insert_flat_numbered})
                     SELECT id FROM numbered"
                ),
                end_many_alone: format!(
                    "WITH locked AS MATERIALIZED (
                         SELECT r.id, i.n, i.status, i.output, i.error, i.at
                         FROM {s}.runs r
                         JOIN UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::text[],
                                     $5::text[], $6::text[], $7::bigint[])
                             AS i(run, epoch, n, status, output, error, at)
                             ON r.id = i.run
                         WHERE r.epoch = i.epoch AND r.status = 'running'
                           AND r.lease_until IS NOT NULL
                           AND r.parent_id IS NULL AND r.queue IS NULL AND r.hook_token IS NULL
                           AND NOT EXISTS (SELECT 1 FROM {s}.hooks h
                                           WHERE h.run_id = r.id AND h.active)
                         ORDER BY r.id
                         FOR UPDATE OF r),
                     ended AS (
                         UPDATE {s}.runs r SET last_seq = r.last_seq + l.n, status = l.status,
                             output = l.output, error = l.error, updated_at = l.at,
                             lease_until = NULL
                         FROM locked l WHERE r.id = l.id
                         RETURNING r.id, r.last_seq - l.n AS base),
                     inserted AS ({insert_flat_ended})
                     SELECT id FROM ended"
                ),
                admit_many: format!(
                    "WITH inserted AS (
                         INSERT INTO {s}.runs
                             (id, workflow, status, input, created_at, updated_at, wake_at,
                              epoch, lease_until, deadline, parent_id, detached, queue,
                              partition_key, priority, start_at, version, trace_context,
                              last_seq)
                         SELECT a.id, a.workflow,
                                CASE WHEN a.lease_until IS NULL THEN 'pending' ELSE 'running' END,
                                a.input, a.at, a.at, GREATEST(a.at, a.start_at),
                                CASE WHEN a.lease_until IS NULL THEN 0 ELSE 1 END,
                                a.lease_until, a.deadline, a.parent_id, a.detached, a.queue,
                                a.partition_key, a.priority, a.start_at, a.version,
                                a.trace_context, a.last_seq
                         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[],
                                     $5::bigint[], $6::bigint[], $7::text[], $8::bool[],
                                     $9::text[], $10::text[], $11::int[], $12::bigint[],
                                     $13::text[], $14::text[], $15::bigint[])
                              AS a(id, workflow, input, at, lease_until, deadline, parent_id,
                                   detached, queue, partition_key, priority, start_at, version,
                                   trace_context, last_seq)
                         ON CONFLICT (id) DO NOTHING
                         RETURNING id, 0::bigint AS base),
                     first AS ({insert_flat_inserted})
                     SELECT id FROM inserted"
                ),
                lock_inbox: "SELECT pg_advisory_xact_lock($1)".to_owned(),
                admit_claiming: [false, true].map(|leased| admit_claiming_sql(s, leased)),
                // Parent ids never change, so reading them unlocked is enough.
                lock_inbox_for_children: format!(
                    "SELECT count(pg_advisory_xact_lock($1)) FROM (
                         SELECT 1 FROM {s}.runs
                         WHERE id = ANY($2) AND parent_id IS NOT NULL LIMIT 1) AS c"
                ),
            },
        }
    }
}
