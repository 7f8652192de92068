//! [`MessageStore`] on SQLite: the messages' statements and the send, on the writer (one
//! transaction, which holds the database's write lock: the run's status, the key and the
//! insert are read and written with nobody in between). What a send decides is the shared
//! policy's (`store::sql::messages::send_message`).

use rusqlite::params;

use super::statements::SQL as STORE;
use super::tx::{all, exec, now, one, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::messages::{
    decode_events, decode_reply, decode_requests, request_id, send_message, send_request,
    EncodedMessage, MessageSql, MessageTx,
};
use crate::store::{
    MessageStore, NewMessage, NewRequest, ReplyState, RequestRecord, RunEvents, SendOutcome,
};

/// The statements of this file (`MessageSql`).
const SQL: MessageSql = MessageSql {
    key: "SELECT payload_id FROM message_keys WHERE run_id = ?1 AND key = ?2",
    queue: "INSERT INTO hook_inbox (run_id, token, topic, payload, at)
            VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
    keep_key: "INSERT INTO message_keys (run_id, key, payload_id) VALUES (?1, ?2, ?3)",
    status: "SELECT status FROM runs WHERE id = ?1",
    events: "SELECT key, value FROM run_events WHERE run_id = ?1 ORDER BY key",
    request_key: "SELECT id FROM run_requests WHERE run_id = ?1 AND key = ?2",
    keep_request:
        "INSERT INTO run_requests (run_id, id, name, key, at) VALUES (?1, ?2, ?3, ?4, ?5)",
    reply: "SELECT reply FROM run_requests WHERE run_id = ?1 AND id = ?2",
    requests: "SELECT id, name, key, at, reply IS NOT NULL FROM run_requests WHERE run_id = ?1
               ORDER BY id",
};

impl MessageTx for Lite<'_> {
    async fn message_key(&mut self, run: &str, key: &str) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.key, params![run, key], |r| r.get(0))
    }

    async fn queue_message(&mut self, run: &str, m: &EncodedMessage) -> Result<i64, StoreError> {
        let args = params![run, m.token, m.topic, m.payload, m.at];
        let id = one(self.0, SQL.queue, args, |r| r.get(0))?
            .ok_or_else(|| StoreError::database("the message's insert returned no id"))?;
        exec(self.0, STORE.dialect.wake, params![run, m.at])?;
        Ok(id)
    }

    async fn keep_message_key(&mut self, run: &str, key: &str, id: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.keep_key, params![run, key, id])?;
        Ok(())
    }

    async fn request_key(&mut self, run: &str, key: &str) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.request_key, params![run, key], |r| r.get(0))
    }

    async fn keep_request(
        &mut self,
        run: &str,
        id: i64,
        r: &EncodedMessage,
    ) -> Result<(), StoreError> {
        exec(
            self.0,
            SQL.keep_request,
            params![run, id, r.topic, r.key, r.at],
        )?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl MessageStore for SqliteStore {
    async fn send_message(
        &self,
        run: &RunId,
        message: NewMessage,
    ) -> Result<SendOutcome, StoreError> {
        let (run, message) = (*run, EncodedMessage::new(&message)?);
        self.write(move |tx| now(send_message(&mut Lite(tx), &run, &message)))
            .await
    }

    async fn run_events(&self, run: &RunId) -> Result<Option<RunEvents>, StoreError> {
        let run = run.to_string();
        self.read(move |conn| {
            let status = one(conn, SQL.status, [&run], |r| r.get(0))?;
            let values = all(conn, SQL.events, [&run], |r| Ok((r.get(0)?, r.get(1)?)))?;
            decode_events(&run, status, values)
        })
        .await
    }

    async fn send_request(
        &self,
        run: &RunId,
        request: NewRequest,
    ) -> Result<SendOutcome, StoreError> {
        let (run, request) = (*run, EncodedMessage::request(&request)?);
        self.write(move |tx| now(send_request(&mut Lite(tx), &run, &request)))
            .await
    }

    async fn request_reply(&self, run: &RunId, id: u64) -> Result<Option<ReplyState>, StoreError> {
        let run = run.to_string();
        self.read(move |conn| {
            // The status first: a run seen ended shows the reply it recorded before its end.
            let status = one(conn, SQL.status, [&run], |r| r.get(0))?;
            let reply = one(conn, SQL.reply, params![run, request_id(id)], |r| r.get(0))?;
            decode_reply(&run, status, reply)
        })
        .await
    }

    async fn run_requests(&self, run: &RunId) -> Result<Vec<RequestRecord>, StoreError> {
        let run = run.to_string();
        self.read(move |conn| {
            let rows = all(conn, SQL.requests, [&run], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?;
            decode_requests(&run, rows)
        })
        .await
    }
}
