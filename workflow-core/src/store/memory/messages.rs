//! [`MessageStore`] in memory: a message goes into the run's inbox through the state's
//! `queue`, as hook payloads do, under the one lock, so the checks (the run, its end, the
//! idempotency key) and the write are one act.

use super::state::RequestRow;
use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{
    Inbound, MessageStore, NewMessage, NewRequest, ReplyState, RequestRecord, RunEvents,
    SendOutcome,
};

#[async_trait::async_trait]
impl MessageStore for MemoryStore {
    async fn send_message(
        &self,
        run: &RunId,
        message: NewMessage,
    ) -> Result<SendOutcome, StoreError> {
        let mut st = self.lock();
        let Some(row) = st.runs.get(run) else {
            return Ok(SendOutcome::NotFound);
        };
        if row.record.status.is_terminal() {
            return Ok(SendOutcome::Ended(row.record.status));
        }
        if let Some(first) = message
            .idempotency_key
            .as_ref()
            .and_then(|k| row.message_keys.get(k))
        {
            return Ok(SendOutcome::Duplicate(*first));
        }
        let NewMessage {
            topic,
            payload,
            idempotency_key,
            at,
        } = message;
        let id = st.queue(*run, Inbound::Message { topic, payload }, at);
        if let (Some(key), Some(row)) = (idempotency_key, st.runs.get_mut(run)) {
            row.message_keys.insert(key, id);
        }
        Ok(SendOutcome::Queued(id))
    }

    async fn run_events(&self, run: &RunId) -> Result<Option<RunEvents>, StoreError> {
        Ok(self.lock().runs.get(run).map(|row| RunEvents {
            status: row.record.status,
            values: row.published.clone(),
        }))
    }

    async fn send_request(
        &self,
        run: &RunId,
        request: NewRequest,
    ) -> Result<SendOutcome, StoreError> {
        let mut st = self.lock();
        let Some(row) = st.runs.get(run) else {
            return Ok(SendOutcome::NotFound);
        };
        if let Some(first) = request
            .idempotency_key
            .as_ref()
            .and_then(|k| row.request_keys.get(k))
        {
            return Ok(SendOutcome::Duplicate(*first));
        }
        if row.record.status.is_terminal() {
            return Ok(SendOutcome::Ended(row.record.status));
        }
        let NewRequest {
            name,
            payload,
            idempotency_key,
            at,
        } = request;
        let what = Inbound::Request {
            name: name.clone(),
            payload,
        };
        let id = st.queue(*run, what, at);
        if let Some(row) = st.runs.get_mut(run) {
            if let Some(key) = &idempotency_key {
                row.request_keys.insert(key.clone(), id);
            }
            let kept = RequestRow {
                name,
                key: idempotency_key,
                at,
                reply: None,
            };
            row.requests.insert(id, kept);
        }
        Ok(SendOutcome::Queued(id))
    }

    async fn request_reply(&self, run: &RunId, id: u64) -> Result<Option<ReplyState>, StoreError> {
        Ok(self.lock().runs.get(run).map(|row| ReplyState {
            status: row.record.status,
            reply: row.requests.get(&id).and_then(|r| r.reply.clone()),
        }))
    }

    async fn run_requests(&self, run: &RunId) -> Result<Vec<RequestRecord>, StoreError> {
        let st = self.lock();
        let Some(row) = st.runs.get(run) else {
            return Ok(Vec::new());
        };
        Ok(row
            .requests
            .iter()
            .map(|(id, r)| RequestRecord {
                id: *id,
                name: r.name.clone(),
                idempotency_key: r.key.clone(),
                at: r.at,
                replied: r.reply.is_some(),
            })
            .collect())
    }
}
