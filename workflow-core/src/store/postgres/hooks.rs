//! [`HookStore`] for PostgreSQL: starting or resuming by token, claiming tokens, resuming hooks
//! and reading the inbox and the hooks. Binds requests to the shared policy and the statements;
//! holds no SQL and no decision of its own.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::stash::settle;
use super::PostgresStore;
use crate::error::{DatabaseError, StoreError};
use crate::ids::RunId;
use crate::store::sql::policy::{self, NewRunRow};
use crate::store::sql::rows::{HookRow, InboxRow, PayloadRow};
use crate::store::sql::{owner_of, payload_id_of, sql_id, sql_time, to_json};
use crate::store::{
    AdmitOrResume, ClaimOutcome, HookFilter, HookRecord, HookStore, InboxEntry, Lease, NewRun,
};

#[async_trait::async_trait]
impl HookStore for PostgresStore {
    /// One transaction decides. It holds the inbox lock from its first statement (the resume)
    /// to its commit, so concurrent `admit_or_resume` calls in the schema, and resumes, take
    /// turns; only a plain `.hook(..)` start or a workflow's `create_hook` can take the token
    /// between its resume and its claim, and then the transaction is rolled back (it wrote
    /// nothing) and the next one resumes to that hook.
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        const ATTEMPTS: usize = 8;
        let row = NewRunRow::new(run, lease)?;
        let payload = to_json(&payload, "the payload")?;
        for _ in 0..ATTEMPTS {
            let mut tx = self.begin().await?;
            let decided = policy::admit_or_resume(&mut self.tx(&mut tx), &row, &payload).await;
            if let Some(outcome) = settle(tx, decided).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Database(
            DatabaseError::new(format!(
                "hook token {:?} changed hands {ATTEMPTS} times while starting or resuming",
                row.hook.as_ref().map_or("", |h| h.0.as_str())
            ))
            .transient(true),
        ))
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut tx = self.begin().await?;
        let claimed = policy::claim_hook(&mut self.tx(&mut tx), lease, hook_key, token, at).await;
        settle(tx, claimed).await
    }

    /// Payload ids must grow in commit order: `payloads_since` readers advance a cursor past
    /// every id they have seen, so an id drawn earlier but committed later would be skipped
    /// for good. Identity values are drawn at insert time, not at commit, so each insert takes
    /// a transaction-level advisory lock (one key per schema) before drawing its id and holds
    /// it until its commit; PostgreSQL makes a commit visible before it releases the
    /// transaction's locks, so when the next insert draws an id, every smaller id is already
    /// visible. Locking the token's hook row instead would only order payloads per token,
    /// not across tokens, which is what the global cursor needs. The cost is one resume
    /// committing at a time per schema; the whole resume is one statement (one round trip,
    /// its own transaction), so the lock is held for little more than the commit.
    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        let payload = to_json(&payload, "the payload")?;
        let mut conn = self.conn().await?;
        let queued = sqlx::query_as(&self.inner.sql.resume)
            .bind(token)
            .bind(&payload)
            .bind(sql_time(at))
            .bind(self.inner.inbox_lock)
            .bind(&self.inner.schema)
            .fetch_optional(&mut *conn)
            .await;
        let queued: Option<(i64, String, i64)> = conn.kept(queued)?;
        let Some((payload_id, owner, _notes)) = queued else {
            return Ok(None);
        };
        Ok(Some((owner_of(&owner, token)?, payload_id_of(payload_id)?)))
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError> {
        let key = run.to_string();
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.payloads)
            .bind(&key)
            .bind(sql_id(after))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<PayloadRow> = conn.kept(rows)?;
        rows.into_iter().map(|p| p.decode(&key)).collect()
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.payloads_since)
            .bind(sql_id(after))
            .bind(sql_id(limit))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<InboxRow> = conn.kept(rows)?;
        rows.into_iter().map(InboxRow::decode).collect()
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let last = sqlx::query_scalar(&self.inner.sql.last_payload_id)
            .fetch_one(&mut *conn)
            .await;
        let last: i64 = conn.kept(last)?;
        payload_id_of(last)
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query_as(&self.inner.sql.get_hook)
            .bind(token)
            .fetch_optional(&mut *conn)
            .await;
        let row: Option<HookRow> = conn.kept(row)?;
        row.map(HookRow::decode).transpose()
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let (token, run, limit) = policy::hook_filter(filter);
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_hooks)
            .bind(token)
            .bind(run)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<HookRow> = conn.kept(rows)?;
        rows.into_iter().map(HookRow::decode).collect()
    }
}
