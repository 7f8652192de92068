//! [`HookStore`] on SQLite: claiming and resuming hooks, and reading the hook inbox. Each
//! method sends its work to the writer (`write`) or a reader (`read`) and decodes the rows;
//! what a write decides is the shared policy's, which this file calls and must not repeat.

use std::time::{Duration, SystemTime};

use rusqlite::params;
use serde_json::Value;

use super::statements::SQL;
use super::tx::{all, now, one, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::policy::{self, NewRunRow, Tx};
use crate::store::sql::rows::{HookRow, InboxRow, PayloadRow};
use crate::store::sql::{sql_id, sql_time, to_json};
use crate::store::{
    AdmitOrResume, ClaimOutcome, HookFilter, HookRecord, HookStore, InboxEntry, Lease, NewRun,
};

#[async_trait::async_trait]
impl HookStore for SqliteStore {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let row = NewRunRow::new(run, lease)?;
        let payload = to_json(&payload, "the payload")?;
        self.write(move |tx| {
            // The transaction holds the database's write lock from its start, so no hook
            // takes the token between the resume and the claim: the policy always decides.
            now(policy::admit_or_resume(&mut Lite(tx), &row, &payload))?.ok_or_else(|| {
                StoreError::database("internal error: a token changed hands inside a transaction")
            })
        })
        .await
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let lease = lease.clone();
        let (key, token) = (hook_key.to_owned(), token.to_owned());
        self.write(move |tx| now(policy::claim_hook(&mut Lite(tx), &lease, &key, &token, at)))
            .await
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        let token = token.to_owned();
        let payload = to_json(&payload, "the payload")?;
        let at = sql_time(at);
        self.write(move |tx| {
            let queued = now(Lite(tx).resume(&token, &payload, at))?;
            queued
                .map(|q| q.decode().map(|(id, run)| (run, id)))
                .transpose()
        })
        .await
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError> {
        let run = run.to_string();
        let after = sql_id(after);
        self.read(move |conn| {
            let rows = all(
                conn,
                SQL.payloads,
                params![run, after],
                PayloadRow::from_sqlite,
            )?;
            rows.into_iter().map(|p| p.decode(&run)).collect()
        })
        .await
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        let (after, limit) = (sql_id(after), sql_id(limit));
        let rows = self
            .read(move |conn| {
                all(
                    conn,
                    SQL.payloads_since,
                    [after, limit],
                    InboxRow::from_sqlite,
                )
            })
            .await?;
        rows.into_iter().map(InboxRow::decode).collect()
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        let last = self
            .read(|conn| one(conn, SQL.last_payload_id, [], |r| r.get(0)))
            .await?;
        crate::store::sql::payload_id_of(last.unwrap_or(0))
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        let token = token.to_owned();
        let row = self
            .read(move |conn| one(conn, SQL.get_hook, [token], HookRow::from_sqlite))
            .await?;
        row.map(HookRow::decode).transpose()
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let args = policy::hook_filter(filter);
        let rows = self
            .read(move |conn| all(conn, SQL.list_hooks, args, HookRow::from_sqlite))
            .await?;
        rows.into_iter().map(HookRow::decode).collect()
    }
}
