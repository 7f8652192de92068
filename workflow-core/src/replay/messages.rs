//! Messages sent to the run (`run.send(topic, msg)`) on their way to the workflow's
//! `recv(topic)`: read from the inbox in commit order, each delivered (and its delivery
//! recorded) only when a `recv` of its topic waits for it, so a message nobody asks for stays
//! in the store's inbox, and one a `recv` that lost a race did not take waits for the next.

use std::time::SystemTime;

use super::{Delivered, Delivery, Replay};
use crate::history::{Event, NewEvent};

impl<S> Replay<S> {
    /// Delivers the first message read from the inbox whose topic `wanted` (a `recv` of it
    /// waits with nothing buffered), recording its delivery. Messages of one topic go in
    /// inbox order. Returns whether one was delivered.
    pub(crate) fn deliver_message(
        &mut self,
        wanted: impl Fn(&str) -> bool,
        now: SystemTime,
    ) -> bool {
        let Some(i) = self.messages.iter().position(|m| wanted(&m.token)) else {
            return false;
        };
        let Some(m) = self.messages.remove(i) else {
            return false;
        };
        self.received.insert(m.id);
        self.writes.push(NewEvent {
            at: now,
            event: Event::MessageReceived {
                topic: m.token.clone(),
                payload_id: m.id,
                payload: m.payload.clone(),
            },
        });
        self.ready.push_back(Delivery {
            at: now,
            what: Delivered::Message {
                topic: m.token,
                payload: m.payload,
            },
        });
        true
    }

    /// Messages read from the inbox and not delivered, in order: (inbox id, topic).
    #[cfg(test)]
    pub(crate) fn waiting_messages(&self) -> Vec<(u64, &str)> {
        self.messages
            .iter()
            .map(|m| (m.id, m.token.as_str()))
            .collect()
    }
}
