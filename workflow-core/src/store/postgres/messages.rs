//! [`MessageStore`] for PostgreSQL: the messages' statements and the send, in one
//! transaction that takes the inbox lock first (message ids, like every inbox id, grow in
//! commit order; see `PostgresStore::resume_hook`), then the run's row (its end and the send
//! take turns). What a send decides is the shared policy's
//! (`store::sql::messages::send_message`); the payload's notice goes out after the commit.

use super::listen::{NOTE_PAYLOAD, NOTE_READY};
use super::schema::quote_ident;
use super::stash::settle;
use super::tx::Pg;
use super::PostgresStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::messages::{
    decode_events, decode_reply, decode_requests, request_id, send_message, send_request,
    EncodedMessage, MessageSql, MessageTx, RequestRow,
};
use crate::store::{
    MessageStore, NewMessage, NewRequest, ReplyState, RequestRecord, RunEvents, SendOutcome,
};

/// The statements of this file (`MessageSql`), `{s}` standing for the quoted schema and
/// `{now}` for the server's clock in ms.
const SQL: MessageSql = MessageSql {
    key: "SELECT payload_id FROM {s}.message_keys WHERE run_id = $1 AND key = $2",
    queue: "WITH queued AS (
             INSERT INTO {s}.hook_inbox (run_id, token, topic, payload, at)
             VALUES ($1, $2, $3, $4, $5) RETURNING id, run_id),
         woken AS (
             UPDATE {s}.runs r SET wake_at = CASE r.status
                 WHEN 'blocked' THEN r.wake_at ELSE LEAST(r.wake_at, $5) END
             FROM queued q WHERE r.id = q.run_id
             RETURNING r.status IN ('pending', 'running')
                 AND (r.lease_until IS NULL OR r.lease_until <= {now}) AS idle)
         SELECT q.id, COALESCE((SELECT idle FROM woken LIMIT 1), FALSE) FROM queued q",
    keep_key: "INSERT INTO {s}.message_keys (run_id, key, payload_id) VALUES ($1, $2, $3)",
    status: "SELECT status FROM {s}.runs WHERE id = $1",
    events: "SELECT key, value FROM {s}.run_events WHERE run_id = $1 ORDER BY key",
    request_key: "SELECT id FROM {s}.run_requests WHERE run_id = $1 AND key = $2",
    keep_request: "INSERT INTO {s}.run_requests (run_id, id, name, key, at)
                   VALUES ($1, $2, $3, $4, $5)",
    reply: "SELECT reply FROM {s}.run_requests WHERE run_id = $1 AND id = $2",
    requests: "SELECT id, name, key, at, reply IS NOT NULL FROM {s}.run_requests
               WHERE run_id = $1 ORDER BY id",
};

/// `sql` for the schema `schema`.
fn on(sql: &str, schema: &str) -> String {
    sql.replace("{s}", &quote_ident(schema))
        .replace("{now}", super::statements::NOW_MS)
}

impl MessageTx for Pg<'_> {
    async fn message_key(&mut self, run: &str, key: &str) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar(&on(SQL.key, self.channel))
            .bind(run)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn queue_message(&mut self, run: &str, m: &EncodedMessage) -> Result<i64, StoreError> {
        let (id, idle): (i64, bool) = sqlx::query_as(&on(SQL.queue, self.channel))
            .bind(run)
            .bind(m.token)
            .bind(&m.topic)
            .bind(&m.payload)
            .bind(m.at)
            .fetch_one(&mut *self.conn)
            .await?;
        let mut notes = vec![format!("{NOTE_PAYLOAD}{run}")];
        if idle {
            notes.push(NOTE_READY.to_owned());
        }
        self.announce(notes).await?;
        Ok(id)
    }

    async fn keep_message_key(&mut self, run: &str, key: &str, id: i64) -> Result<(), StoreError> {
        sqlx::query(&on(SQL.keep_key, self.channel))
            .bind(run)
            .bind(key)
            .bind(id)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn request_key(&mut self, run: &str, key: &str) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar(&on(SQL.request_key, self.channel))
            .bind(run)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn keep_request(
        &mut self,
        run: &str,
        id: i64,
        r: &EncodedMessage,
    ) -> Result<(), StoreError> {
        sqlx::query(&on(SQL.keep_request, self.channel))
            .bind(run)
            .bind(id)
            .bind(&r.topic)
            .bind(&r.key)
            .bind(r.at)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl MessageStore for PostgresStore {
    async fn send_message(
        &self,
        run: &RunId,
        message: NewMessage,
    ) -> Result<SendOutcome, StoreError> {
        let message = EncodedMessage::new(&message)?;
        let mut notes = Vec::new();
        let mut tx = self.begin().await?;
        let sent = send_message(&mut self.noting(&mut tx, &mut notes), run, &message).await;
        let sent = settle(tx, sent).await?;
        self.inner.writer.announce(notes);
        Ok(sent)
    }

    async fn run_events(&self, run: &RunId) -> Result<Option<RunEvents>, StoreError> {
        let key = run.to_string();
        let schema = &self.inner.schema;
        let mut conn = self.conn().await?;
        let read = async {
            let status: Option<String> = sqlx::query_scalar(&on(SQL.status, schema))
                .bind(&key)
                .fetch_optional(&mut *conn)
                .await?;
            let values: Vec<(String, String)> = sqlx::query_as(&on(SQL.events, schema))
                .bind(&key)
                .fetch_all(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>((status, values))
        }
        .await;
        let (status, values) = conn.kept(read)?;
        decode_events(&key, status, values)
    }

    async fn send_request(
        &self,
        run: &RunId,
        request: NewRequest,
    ) -> Result<SendOutcome, StoreError> {
        let request = EncodedMessage::request(&request)?;
        let mut notes = Vec::new();
        let mut tx = self.begin().await?;
        let sent = send_request(&mut self.noting(&mut tx, &mut notes), run, &request).await;
        let sent = settle(tx, sent).await?;
        self.inner.writer.announce(notes);
        Ok(sent)
    }

    async fn request_reply(&self, run: &RunId, id: u64) -> Result<Option<ReplyState>, StoreError> {
        let key = run.to_string();
        let schema = &self.inner.schema;
        let mut conn = self.conn().await?;
        // The status first: a run seen ended shows the reply it recorded before its end.
        let read = async {
            let status: Option<String> = sqlx::query_scalar(&on(SQL.status, schema))
                .bind(&key)
                .fetch_optional(&mut *conn)
                .await?;
            let reply: Option<Option<String>> = sqlx::query_scalar(&on(SQL.reply, schema))
                .bind(&key)
                .bind(request_id(id))
                .fetch_optional(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>((status, reply))
        }
        .await;
        let (status, reply) = conn.kept(read)?;
        decode_reply(&key, status, reply)
    }

    async fn run_requests(&self, run: &RunId) -> Result<Vec<RequestRecord>, StoreError> {
        let key = run.to_string();
        let schema = &self.inner.schema;
        let mut conn = self.conn().await?;
        let read = sqlx::query_as::<_, RequestRow>(&on(SQL.requests, schema))
            .bind(&key)
            .fetch_all(&mut *conn)
            .await;
        let rows = conn.kept(read)?;
        decode_requests(&key, rows)
    }
}
