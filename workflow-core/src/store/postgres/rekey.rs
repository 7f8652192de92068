//! [`RekeyStore`] for PostgreSQL: the statements of `store::sql::rekey` in this dialect, each
//! scan and each compare-and-set one statement on a pooled connection. Holds no decision of
//! its own.

use super::schema::quote_ident;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::rekey::{
    decode_chunks, decode_events, decode_inbox, decode_published, decode_replies, decode_runs,
    replacement, sql_limit, Cursor, RekeySql, Replace,
};
use crate::store::sql::rows::EventRow;
use crate::store::{PayloadTable, RekeyStore, SealedAt, SealedRow, SealedValue};

/// The statements of this file (`RekeySql`), `{s}` standing for the quoted schema;
/// `'%$wf_sealed%'` matches the envelope marker.
const SQL: RekeySql = RekeySql {
    runs: "SELECT id, input, output, error FROM {s}.runs
           WHERE id > $1 AND (input LIKE '%$wf_sealed%' OR output LIKE '%$wf_sealed%'
                              OR error LIKE '%$wf_sealed%')
           ORDER BY id LIMIT $2",
    inbox: "SELECT id, run_id, token, topic, payload FROM {s}.hook_inbox
            WHERE id > $1 AND payload LIKE '%$wf_sealed%' ORDER BY id LIMIT $2",
    events: "SELECT run_id, seq, at, data FROM {s}.events
             WHERE (run_id, seq) > ($1, $2) AND data LIKE '%$wf_sealed%'
             ORDER BY run_id, seq LIMIT $3",
    chunks: "SELECT run_id, name, idx, value FROM {s}.stream_chunks
             WHERE (run_id, name, idx) > ($1, $2, $3) AND value LIKE '%$wf_sealed%'
             ORDER BY run_id, name, idx LIMIT $4",
    published: "SELECT run_id, key, value FROM {s}.run_events
                WHERE (run_id, key) > ($1, $2) AND value LIKE '%$wf_sealed%'
                ORDER BY run_id, key LIMIT $3",
    replies: "SELECT run_id, id, reply FROM {s}.run_requests
              WHERE (run_id, id) > ($1, $2) AND reply LIKE '%$wf_sealed%'
              ORDER BY run_id, id LIMIT $3",
    set_input: "UPDATE {s}.runs SET input = $3 WHERE id = $1 AND input = $2",
    set_output: "UPDATE {s}.runs SET output = $3 WHERE id = $1 AND output = $2",
    set_error: "UPDATE {s}.runs SET error = $3 WHERE id = $1 AND error = $2",
    set_event: "UPDATE {s}.events SET data = $4 WHERE run_id = $1 AND seq = $2 AND data = $3",
    set_inbox: "UPDATE {s}.hook_inbox SET payload = $4
                WHERE id = $1 AND run_id = $2 AND payload = $3",
    set_chunk: "UPDATE {s}.stream_chunks SET value = $5
                WHERE run_id = $1 AND name = $2 AND idx = $3 AND value = $4",
    set_published: "UPDATE {s}.run_events SET value = $4
                    WHERE run_id = $1 AND key = $2 AND value = $3",
    set_reply: "UPDATE {s}.run_requests SET reply = $4
                WHERE run_id = $1 AND id = $2 AND reply = $3",
};

/// `sql` for the schema `schema`.
fn on(sql: &str, schema: &str) -> String {
    sql.replace("{s}", &quote_ident(schema))
}

#[async_trait::async_trait]
impl RekeyStore for PostgresStore {
    async fn sealed_rows(
        &self,
        table: PayloadTable,
        after: Option<&SealedAt>,
        limit: usize,
    ) -> Result<Vec<SealedRow>, StoreError> {
        let (c, limit) = (Cursor::after(after), sql_limit(limit));
        let schema = &self.inner.schema;
        let mut conn = self.conn().await?;
        match table {
            PayloadTable::Runs => {
                let rows = sqlx::query_as(&on(SQL.runs, schema))
                    .bind(&c.run)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_runs(conn.kept(rows)?)
            }
            PayloadTable::Inbox => {
                let rows = sqlx::query_as(&on(SQL.inbox, schema))
                    .bind(c.num)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_inbox(conn.kept(rows)?)
            }
            PayloadTable::Events => {
                let rows: Result<Vec<EventRow>, _> = sqlx::query_as(&on(SQL.events, schema))
                    .bind(&c.run)
                    .bind(c.num)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_events(conn.kept(rows)?)
            }
            PayloadTable::Chunks => {
                let rows = sqlx::query_as(&on(SQL.chunks, schema))
                    .bind(&c.run)
                    .bind(&c.name)
                    .bind(c.num)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_chunks(conn.kept(rows)?)
            }
            PayloadTable::Published => {
                let rows = sqlx::query_as(&on(SQL.published, schema))
                    .bind(&c.run)
                    .bind(&c.name)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_published(conn.kept(rows)?)
            }
            PayloadTable::Replies => {
                let rows = sqlx::query_as(&on(SQL.replies, schema))
                    .bind(&c.run)
                    .bind(c.num)
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await;
                decode_replies(conn.kept(rows)?)
            }
        }
    }

    async fn replace_sealed(
        &self,
        row: &SealedRow,
        value: &SealedValue,
    ) -> Result<bool, StoreError> {
        let (replace, new) = replacement(&SQL, row, value)?;
        let (old, schema) = (&row.stored, &self.inner.schema);
        let mut conn = self.conn().await?;
        let done = match replace {
            Replace::Run(sql, run) => {
                sqlx::query(&on(sql, schema))
                    .bind(run)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
            Replace::Event(run, seq) => {
                sqlx::query(&on(SQL.set_event, schema))
                    .bind(run)
                    .bind(seq)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
            Replace::Inbox(id, run) => {
                sqlx::query(&on(SQL.set_inbox, schema))
                    .bind(id)
                    .bind(run)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
            Replace::Chunk(run, name, idx) => {
                sqlx::query(&on(SQL.set_chunk, schema))
                    .bind(run)
                    .bind(name)
                    .bind(idx)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
            Replace::Published(run, key) => {
                sqlx::query(&on(SQL.set_published, schema))
                    .bind(run)
                    .bind(key)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
            Replace::Reply(run, id) => {
                sqlx::query(&on(SQL.set_reply, schema))
                    .bind(run)
                    .bind(id)
                    .bind(old)
                    .bind(&new)
                    .execute(&mut *conn)
                    .await
            }
        };
        Ok(conn.kept(done)?.rows_affected() == 1)
    }
}
