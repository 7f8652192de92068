//! Messages sent to the run (`run.send(topic, msg)`) on their way to the workflow's
//! `recv(topic)`, and requests (`run.request(name, req)`) on their way to its
//! `requests(name)`: read from the inbox in commit order, each delivered (and its delivery
//! recorded) only when a receiver of its mailbox waits for it, so a message nobody asks for
//! stays in the store's inbox, and one a receiver that lost a race did not take waits for the
//! next.

use std::time::SystemTime;

use serde_json::Value;

use super::{Delivered, Delivery, Replay};
use crate::history::{Event, NewEvent};

/// Where a message waits for its receiver: a topic of `recv`, or the name of `requests`.
/// The two never meet, whatever their names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Mailbox {
    /// `recv(topic)`.
    Topic(String),
    /// `requests(name)`.
    Requests(String),
}

impl std::fmt::Display for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mailbox::Topic(topic) => write!(f, "a message on topic {topic:?}"),
            Mailbox::Requests(name) => write!(f, "a request {name:?}"),
        }
    }
}

/// A message or request read from the run's inbox, waiting for a receiver of its mailbox.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct QueuedMessage {
    /// Its inbox id (global commit order); a request's id.
    pub(super) id: u64,
    pub(super) mailbox: Mailbox,
    /// As sent.
    pub(super) payload: Value,
}

impl<S> Replay<S> {
    /// Delivers the first message (or request) read from the inbox whose mailbox is `wanted`
    /// (a receiver of it waits with nothing buffered), recording its delivery. Messages of
    /// one mailbox go in inbox order. Returns whether one was delivered.
    pub(crate) fn deliver_message(
        &mut self,
        wanted: impl Fn(&Mailbox) -> bool,
        now: SystemTime,
    ) -> bool {
        let Some(i) = self.messages.iter().position(|m| wanted(&m.mailbox)) else {
            return false;
        };
        let Some(m) = self.messages.remove(i) else {
            return false;
        };
        self.received.insert(m.id);
        let event = match &m.mailbox {
            Mailbox::Topic(topic) => Event::MessageReceived {
                topic: topic.clone(),
                payload_id: m.id,
                payload: m.payload.clone(),
            },
            Mailbox::Requests(name) => Event::RequestReceived {
                name: name.clone(),
                payload_id: m.id,
                payload: m.payload.clone(),
            },
        };
        let history = self.record(NewEvent { at: now, event });
        self.ready.push_back(Delivery {
            history,
            at: now,
            what: Delivered::Message {
                mailbox: m.mailbox,
                id: m.id,
                payload: m.payload,
            },
        });
        true
    }

    /// Messages read from the inbox and not delivered, in order: (inbox id, mailbox).
    #[cfg(test)]
    pub(crate) fn waiting_messages(&self) -> Vec<(u64, &Mailbox)> {
        self.messages.iter().map(|m| (m.id, &m.mailbox)).collect()
    }
}
