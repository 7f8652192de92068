//! `Lite`: the shared policy's `Tx` on the writer's transaction, one method per statement of
//! the table, and the small helpers that run a statement on a connection. Statements only:
//! what to do with their rows is decided by the policy, and when they commit by the writer.

use std::future::Future;

use futures::FutureExt;
use rusqlite::{params, Connection, OptionalExtension, Params, Row};

use super::statements::SQL;
use crate::error::StoreError;
use crate::store::sql::policy::{ChunkAppend, EncodedChunk, NewRunRow, Tx};
use crate::store::sql::rows::{InboxRow, LeasedRow, QueueLimits, RunRow};
use crate::store::sql::{to_json, EncodedEnd, EncodedEvents};
use crate::store::CHILD_NOTICE_TOKEN;

/// The policies' statements on the writer's transaction. They run synchronously, so every
/// future they return is ready at once; [`now`] takes its value.
pub(super) struct Lite<'a>(pub(super) &'a Connection);

impl Tx for Lite<'_> {
    async fn run_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        Ok(self.0.prepare_cached(SQL.run_exists)?.exists([id])?)
    }

    async fn insert_run(&mut self, run: &NewRunRow) -> Result<bool, StoreError> {
        let token = run.hook.as_ref().map(|h| &h.0);
        let (id, wf, input, at) = (&run.key, &run.workflow, &run.input, run.created_at);
        let deadline = run.deadline;
        let (parent, detached) = run.parent_cols();
        let inserted = match run.lease_until {
            None => exec(
                self.0,
                SQL.insert_run,
                params![
                    id,
                    wf,
                    input,
                    at,
                    token,
                    deadline,
                    parent,
                    detached,
                    run.queue,
                    run.partition_key,
                    run.priority,
                    run.start_at,
                    run.version,
                    run.trace_context
                ],
            )?,
            Some(until) => exec(
                self.0,
                SQL.insert_leased_run,
                params![
                    id,
                    wf,
                    input,
                    at,
                    token,
                    until,
                    deadline,
                    parent,
                    detached,
                    run.start_at,
                    run.version,
                    run.trace_context
                ],
            )?,
        };
        Ok(inserted > 0)
    }

    async fn admit_begun(&mut self, run: &NewRunRow, until: i64) -> Result<bool, StoreError> {
        let Some(queue) = &run.queue else {
            return Ok(false);
        };
        let token = run.hook.as_ref().map(|h| &h.0);
        let (parent, detached) = run.parent_cols();
        let may = params![queue, run.partition_key, run.created_at];
        if one(self.0, SQL.dialect.may_begin, may, |_| Ok(()))?.is_none() {
            return Ok(false);
        }
        let inserted = exec(
            self.0,
            SQL.dialect.insert_begun,
            params![
                run.key,
                run.workflow,
                run.input,
                run.created_at,
                token,
                until,
                run.deadline,
                parent,
                detached,
                queue,
                run.partition_key,
                run.priority,
                run.version,
                run.trace_context
            ],
        )?;
        if inserted > 0 {
            exec(self.0, SQL.dialect.held_add, params![queue, 1])?;
        }
        Ok(inserted > 0)
    }

    async fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> Result<bool, StoreError> {
        Ok(exec(self.0, SQL.claim, params![token, run, at, retain_until])? > 0)
    }

    async fn bind_inherited(&mut self, token: &str, run: &str) -> Result<bool, StoreError> {
        let bound = exec(
            self.0,
            "UPDATE hooks SET inherited = 0
             WHERE token = ?1 AND run_id = ?2 AND active = 1 AND inherited = 1",
            params![token, run],
        )?;
        Ok(bound > 0)
    }

    async fn hook_owner(&mut self, token: &str) -> Result<(String, bool), StoreError> {
        Ok(self
            .0
            .prepare_cached(SQL.hook_owner)?
            .query_row([token], |r| Ok((r.get(0)?, r.get(1)?)))?)
    }

    async fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> Result<Option<InboxRow>, StoreError> {
        // Finding the owner and queueing are one statement; the wake follows in the same
        // transaction.
        let queued = one(
            self.0,
            SQL.resume,
            params![token, payload, at],
            InboxRow::from_sqlite,
        )?;
        if let Some(q) = &queued {
            exec(self.0, SQL.dialect.wake, params![q.run_id, at])?;
        }
        Ok(queued)
    }

    async fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> Result<bool, StoreError> {
        let Some(base) = one(self.0, SQL.append, params![run, fence], |r| r.get(0))? else {
            return Ok(false);
        };
        if !events.is_empty() {
            insert_events(self.0, run, base, events)?;
        }
        Ok(true)
    }

    /// One statement numbers the events and ends the run (the run's row is read and
    /// written once, not twice), then the events, the parent's notice and the tokens.
    async fn append_and_end(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
        end: &EncodedEnd,
        now: i64,
        _hint: crate::store::EndHint,
    ) -> Result<bool, StoreError> {
        let (status, output, error) = (end.status.as_str(), &end.output, &end.error);
        let args = params![run, fence, status, output, error, now];
        if exec(self.0, SQL.dialect.append_end, args)? == 0 {
            return Ok(false);
        }
        let Numbered {
            base,
            parent,
            origin,
            held,
        } = numbered(self.0, run)?;
        if let Some(queue) = held {
            // Fenced, the run was running: it gives its slot back. Unfenced, it may have
            // ended before: counted again.
            match fence {
                Some(_) => exec(self.0, SQL.dialect.held_add, params![queue, -1])?,
                None => exec(self.0, SQL.dialect.held_recount, params![queue])?,
            };
        }
        insert_events(self.0, run, base, events)?;
        if let Some(parent) = parent {
            notify_parent(self.0, &parent, &origin, end, now)?;
        }
        self.release_tokens(run, None, now).await?;
        Ok(true)
    }

    async fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> Result<(), StoreError> {
        // Every run ends giving up all its tokens; most hold none. A read of the index is
        // cheaper than the two writes that would find nothing.
        if tokens.is_none() && one(self.0, SQL.dialect.holds_hooks, [run], |_| Ok(()))?.is_none() {
            return Ok(());
        }
        let tokens = tokens.map(|t| to_json(&t, "tokens")).transpose()?;
        exec(self.0, SQL.release_tokens[0], params![run, now, tokens])?;
        exec(self.0, SQL.release_tokens[1], params![run, tokens])?;
        Ok(())
    }

    async fn prune_runs(&mut self, before: i64, now: i64) -> Result<Vec<String>, StoreError> {
        all(self.0, SQL.prune_runs, [before, now], |r| r.get(0))
    }

    async fn prune_records(&mut self, runs: &[String]) -> Result<Vec<u64>, StoreError> {
        let runs = to_json(&runs, "run ids")?;
        let deleted = SQL.prune_records.map(|sql| exec(self.0, sql, [&runs]));
        deleted.into_iter().map(|n| Ok(n? as u64)).collect()
    }

    async fn publish_event(
        &mut self,
        run: &str,
        key: &str,
        value: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        exec(
            self.0,
            SQL.dialect.publish_event,
            params![run, key, value, at],
        )?;
        Ok(())
    }

    async fn record_reply(
        &mut self,
        run: &str,
        id: i64,
        reply: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        exec(
            self.0,
            SQL.dialect.record_reply,
            params![run, id, reply, at],
        )?;
        Ok(())
    }

    async fn forget_payloads(&mut self, run: &str, ids: &[i64]) -> Result<(), StoreError> {
        let ids = to_json(&ids, "payload ids")?;
        exec(self.0, SQL.forget_payloads, params![run, ids])?;
        Ok(())
    }

    async fn count_failure(&mut self, run: &str, epoch: i64) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.count_failure, params![run, epoch], |r| r.get(0))
    }

    async fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.block, params![run, epoch, error, now], |r| {
            r.get(0)
        })
    }

    async fn retry(&mut self, run: &str, now: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.retry, params![run, now])?;
        Ok(())
    }

    async fn retry_at(&mut self, run: &str, at: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.retry_at, params![run, at])?;
        Ok(())
    }

    async fn run_status(&mut self, run: &str) -> Result<Option<String>, StoreError> {
        one(self.0, SQL.run_status, [run], |r| r.get(0))
    }

    async fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> Result<ChunkAppend, StoreError> {
        if !self
            .append_events(run, Some(fence), &EncodedEvents::default())
            .await?
        {
            return Ok(ChunkAppend::LeaseLost);
        }
        let c = chunk;
        let Some(idx) = one(self.0, SQL.append_chunk, [run, &c.stream], |r| r.get(0))? else {
            return Ok(ChunkAppend::Closed);
        };
        let args = params![run, c.stream, idx, c.attempt, c.at, c.value];
        exec(self.0, SQL.dialect.insert_chunk, args)?;
        Ok(ChunkAppend::Appended(idx))
    }

    async fn close_stream(&mut self, run: &str, stream: &str) -> Result<(), StoreError> {
        exec(self.0, SQL.close_stream, [run, stream])?;
        Ok(())
    }

    async fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let workflows = to_json(&workflows, "workflow names")?;
        all(self.0, SQL.waiting_queues, params![now, workflows], |r| {
            r.get(0)
        })
    }

    async fn lock_queue(&mut self, name: &str) -> Result<Option<QueueLimits>, StoreError> {
        one(self.0, SQL.lock_queue, [name], QueueLimits::from_sqlite)
    }

    async fn queue_counts(&mut self, name: &str, since: i64) -> Result<(i64, i64), StoreError> {
        let counts = one(self.0, SQL.queue_counts, params![name, since], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        Ok(counts.unwrap_or((0, 0)))
    }

    async fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let workflows = to_json(&workflows, "workflow names")?;
        let args = params![name, now, workflows, limit];
        all(self.0, SQL.queue_candidates, args, |r| r.get(0))
    }

    async fn end_run(&mut self, run: &str, end: &EncodedEnd, now: i64) -> Result<(), StoreError> {
        let (status, output, error) = (end.status.as_str(), &end.output, &end.error);
        let ended = one(
            self.0,
            SQL.end_run,
            params![run, status, output, error, now],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            },
        )?;
        let Some((parent, origin, held)) = ended else {
            return Ok(());
        };
        if let Some(queue) = held {
            // Cancellations and failures: its queue's slots are counted again.
            exec(self.0, SQL.dialect.held_recount, params![queue])?;
        }
        if let Some(parent) = parent {
            notify_parent(self.0, &parent, &origin, end, now)?;
        }
        Ok(())
    }

    async fn lock_inbox_for_end(&mut self, _run: Option<&str>) -> Result<(), StoreError> {
        // The writer's transaction holds the database's one write lock already.
        Ok(())
    }

    async fn children_to_cancel(&mut self, run: &str) -> Result<Vec<String>, StoreError> {
        all(self.0, SQL.children_to_cancel, params![run], |r| r.get(0))
    }
}

/// What `SqliteOnly::numbered` reads of a run before its last events are inserted.
struct Numbered {
    /// The base to number them from: its last event's number.
    base: i64,
    parent: Option<String>,
    /// Its chain's first run.
    origin: String,
    /// Its queue, when it had begun in one (it held a slot).
    held: Option<String>,
}

fn numbered(conn: &Connection, run: &str) -> Result<Numbered, StoreError> {
    one(conn, SQL.dialect.numbered, [run], |r| {
        Ok(Numbered {
            base: r.get(0)?,
            parent: r.get(1)?,
            origin: r.get(2)?,
            held: r.get(3)?,
        })
    })?
    .ok_or_else(|| StoreError::database(format!("run {run} vanished while it was written")))
}

/// Inserts `events` as run `run`'s, numbered from `base + 1`.
fn insert_events(
    conn: &Connection,
    run: &str,
    base: i64,
    events: &EncodedEvents,
) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(SQL.dialect.insert_event)?;
    for (i, seq) in (base + 1..).take(events.len()).enumerate() {
        insert.execute(params![
            run,
            seq,
            events.at[i],
            events.kind[i],
            events.data[i]
        ])?;
    }
    Ok(())
}

/// Tells `parent` that its child ended with `end`. A chain's end names its first run
/// (`origin`), which the parent awaits.
fn notify_parent(
    conn: &Connection,
    parent: &str,
    origin: &str,
    end: &EncodedEnd,
    now: i64,
) -> Result<(), StoreError> {
    let notice = end.notice(origin);
    exec(
        conn,
        SQL.dialect.child_notice,
        params![parent, CHILD_NOTICE_TOKEN, notice, now],
    )?;
    exec(conn, SQL.dialect.wake, params![parent, now])?;
    Ok(())
}

/// The value of a policy run on the writer thread, whose statements never wait.
pub(super) fn now<T>(policy: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    policy.now_or_never().unwrap_or_else(|| {
        Err(StoreError::database(
            "internal error: a SQLite statement did not complete at once",
        ))
    })
}

pub(super) fn exec(conn: &Connection, sql: &str, args: impl Params) -> Result<usize, StoreError> {
    Ok(conn.prepare_cached(sql)?.execute(args)?)
}

/// The first row `sql` returns, if any.
pub(super) fn one<T>(
    conn: &Connection,
    sql: &str,
    args: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Option<T>, StoreError> {
    Ok(conn.prepare_cached(sql)?.query_row(args, f).optional()?)
}

/// Every row `sql` returns.
pub(super) fn all<T>(
    conn: &Connection,
    sql: &str,
    args: impl Params,
    f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(args, f)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A row `acquire` leased, or why it cannot even be read, with the run id for the log: such
/// a row is skipped like one that cannot be decoded.
pub(super) fn leased_row(r: &Row<'_>) -> rusqlite::Result<Result<LeasedRow, (String, StoreError)>> {
    let row = RunRow::from_sqlite(r).and_then(|run| {
        let (epoch, wake_at, took_over) = (r.get(20)?, r.get(21)?, r.get(22)?);
        Ok(LeasedRow {
            run,
            epoch,
            wake_at,
            took_over,
            last_seq: r.get(23)?,
        })
    });
    let id = || r.get(0).unwrap_or_else(|_| "<unreadable id>".to_owned());
    Ok(row.map_err(|e| (id(), e.into())))
}
