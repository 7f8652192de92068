//! [`MessageStore`] in memory: a message goes into the run's inbox through the state's
//! `queue`, as hook payloads do, under the one lock, so the checks (the run, its end, the
//! idempotency key) and the write are one act.

use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{Inbound, MessageStore, NewMessage, RunEvents, SendOutcome};

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
}
