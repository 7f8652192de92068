//! Results on their way to the workflow: recorded ones in history order, then live ones
//! (hook registrations, child admissions and ends, payloads from the run's inbox), one at a
//! time, and the divergence when the history delivers a result nobody waits for.

use std::time::SystemTime;

use serde_json::Value;

use super::{ChildCall, ChildKey, HookKey, Key, Replay, StepId, TimerId};
use crate::divergence::{Divergence, DivergenceKind};
use crate::error::Error;
use crate::history::{Event, HistorySize, NewEvent};
use crate::ids::RunId;
use crate::model::{Inbound, InboxEntry};

/// A result handed to the workflow, stamped with the time that becomes its clock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Delivery {
    /// The workflow's clock from this delivery on.
    pub(crate) at: SystemTime,
    /// The history up to the delivered event (its own included): what the workflow's
    /// `history_events` and `history_bytes` read from this delivery on.
    pub(crate) history: HistorySize,
    /// What is delivered.
    pub(crate) what: Delivered,
}

/// What a [`Delivery`] carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delivered {
    /// A step's final result.
    Step {
        step_id: StepId,
        result: Result<Value, Error>,
    },
    /// A timer fired.
    Timer { timer_id: TimerId },
    /// The decision on a hook's registration: `None` when this run owns the token.
    Registration {
        hook_key: HookKey,
        token: String,
        conflict: Option<RunId>,
    },
    /// A payload sent to a token this run owns, with its inbox id.
    Payload {
        token: String,
        id: u64,
        payload: Value,
    },
    /// The decision on a child's admission: `conflict` names the owner of its token when no
    /// child was admitted.
    ChildStarted {
        child_key: ChildKey,
        child_id: RunId,
        conflict: Option<RunId>,
        refused: Option<String>,
    },
    /// A child run's end.
    ChildEnded {
        child_id: RunId,
        result: Result<Value, Error>,
    },
    /// A message sent to the run for a `recv(topic)`, or a request for a `requests(name)`:
    /// its inbox id (a request's id) and the payload.
    Message {
        mailbox: super::Mailbox,
        id: u64,
        payload: Value,
    },
}

impl Delivered {
    /// The key the workflow waits on for this result (payloads are queued per token instead).
    pub(super) fn key(&self) -> Option<Key> {
        match self {
            Delivered::Step { step_id, .. } => Some(Key::Step(step_id.clone())),
            Delivered::Timer { timer_id } => Some(Key::Timer(*timer_id)),
            Delivered::Registration { hook_key, .. } => Some(Key::Hook(*hook_key)),
            Delivered::Payload { .. } | Delivered::Message { .. } => None,
            Delivered::ChildStarted { child_key, .. } => Some(Key::Child(*child_key)),
            Delivered::ChildEnded { child_id, .. } => Some(Key::ChildEnd(*child_id)),
        }
    }
}

/// A hook payload read from the run's inbox, waiting for a hook that owns its token.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct QueuedPayload {
    /// Its inbox id (global commit order).
    pub(super) id: u64,
    /// The token it was sent to.
    pub(super) token: String,
    /// As sent.
    pub(super) payload: Value,
}

impl<S> Replay<S> {
    /// The store decided the registration of hook `hook_key` (and recorded it).
    pub(crate) fn claimed(
        &mut self,
        hook_key: HookKey,
        token: String,
        conflict: Option<RunId>,
        at: SystemTime,
    ) {
        if conflict.is_none() {
            self.claimed.insert(hook_key);
        }
        let history = self.recorded_by_store(Event::HookRegistered {
            hook_key: hook_key.to_string(),
            token: token.clone(),
            conflict,
        });
        self.ready.push_back(Delivery {
            at,
            history,
            what: Delivered::Registration {
                hook_key,
                token,
                conflict,
            },
        });
    }

    /// The child start behind an [`Effect::StartChild`].
    pub(crate) fn child(&self, child_key: ChildKey) -> Option<&ChildCall> {
        self.children.get(&child_key)
    }

    /// The store decided the admission of child start `child_key` (and recorded it).
    pub(crate) fn child_started(
        &mut self,
        child_key: ChildKey,
        child_id: RunId,
        conflict: Option<RunId>,
        at: SystemTime,
    ) {
        let call = self.children.remove(&child_key);
        let history = self.recorded_by_store(Event::ChildStarted {
            child_key: child_key.to_string(),
            child_id,
            workflow: call.map(|c| c.workflow.to_owned()).unwrap_or_default(),
            conflict,
            refused: None,
        });
        self.ready.push_back(Delivery {
            at,
            history,
            what: Delivered::ChildStarted {
                child_key,
                child_id,
                conflict,
                refused: None,
            },
        });
    }

    /// Child start `child_key` is refused before the store admits anything (its queue is
    /// declared nowhere): recorded as such, and delivered.
    pub(crate) fn child_refused(
        &mut self,
        child_key: ChildKey,
        child_id: RunId,
        why: String,
        at: SystemTime,
    ) {
        let Some(call) = self.children.remove(&child_key) else {
            return;
        };
        let history = self.record(NewEvent {
            at,
            event: Event::ChildStarted {
                child_key: child_key.to_string(),
                child_id,
                workflow: call.workflow.to_owned(),
                conflict: None,
                refused: Some(why.clone()),
            },
        });
        self.ready.push_back(Delivery {
            history,
            at,
            what: Delivered::ChildStarted {
                child_key,
                child_id,
                conflict: None,
                refused: Some(why),
            },
        });
    }

    /// Records and delivers the end of one child the workflow waits for, if its notice was
    /// read. Returns whether one was delivered.
    pub(crate) fn deliver_child_end(&mut self, now: SystemTime) -> bool {
        // Of the awaited ends read, the first committed (inbox order, as payloads go).
        let Some(child_id) = self
            .child_ends
            .iter()
            .filter(|(id, _)| {
                let key = Key::ChildEnd(**id);
                self.waiting.contains(&key) && !self.recorded_results.contains(&key)
            })
            .min_by_key(|(_, (payload_id, _))| *payload_id)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        let Some((payload_id, result)) = self.child_ends.remove(&child_id) else {
            return false;
        };
        self.received.insert(payload_id);
        self.recorded_results.insert(Key::ChildEnd(child_id));
        let history = self.record(NewEvent {
            at: now,
            event: Event::ChildEnded {
                child_id,
                payload_id,
                result: result.clone(),
            },
        });
        self.ready.push_back(Delivery {
            history,
            at: now,
            what: Delivered::ChildEnded { child_id, result },
        });
        true
    }

    /// Adds entries read from the run's inbox; those the history already delivered are
    /// skipped. Hook payloads queue for their hooks; a child's end is kept until the
    /// workflow awaits it.
    pub(crate) fn add_inbox(&mut self, entries: impl IntoIterator<Item = InboxEntry>) {
        for InboxEntry { id, what } in entries {
            self.inbox_seen = self.inbox_seen.max(id);
            if self.received.contains(&id) {
                continue;
            }
            match what {
                Inbound::Hook { token, payload } => {
                    self.inbox.push_back(QueuedPayload { id, token, payload })
                }
                Inbound::ChildEnded(notice) => {
                    self.child_ends.insert(notice.child, (id, notice.result()));
                }
                Inbound::Message { topic, payload } => {
                    self.messages.push_back(super::QueuedMessage {
                        id,
                        mailbox: super::Mailbox::Topic(topic),
                        payload,
                    })
                }
                Inbound::Request { name, payload } => {
                    self.messages.push_back(super::QueuedMessage {
                        id,
                        mailbox: super::Mailbox::Requests(name),
                        payload,
                    })
                }
            }
        }
    }

    /// The highest inbox id read so far.
    pub(crate) fn inbox_seen(&self) -> u64 {
        self.inbox_seen
    }

    /// Delivers the first inbox payload whose token `wanted` (a live hook owns it and a
    /// `recv` waits for it), recording its delivery. Payloads for other tokens stay queued,
    /// and in the store's inbox, so what a run never takes moves with its chain. Returns
    /// whether one was delivered.
    pub(crate) fn deliver_payload(
        &mut self,
        wanted: impl Fn(&str) -> bool,
        now: SystemTime,
    ) -> bool {
        let Some(i) = self.inbox.iter().position(|p| wanted(&p.token)) else {
            return false;
        };
        let Some(p) = self.inbox.remove(i) else {
            return false;
        };
        self.received.insert(p.id);
        let history = self.record(NewEvent {
            at: now,
            event: Event::HookReceived {
                token: p.token.clone(),
                payload_id: p.id,
                payload: p.payload.clone(),
            },
        });
        self.ready.push_back(Delivery {
            history,
            at: now,
            what: Delivered::Payload {
                token: p.token,
                id: p.id,
                payload: p.payload,
            },
        });
        true
    }

    /// The next result for the workflow: recorded ones in history order, then live ones.
    /// A recorded result the workflow is not waiting for is a divergence.
    pub(crate) fn next_delivery(&mut self) -> Option<Result<Delivery, Divergence>> {
        if let Some((seq, delivery)) = self.history.pop_front() {
            if let Some(key) = delivery.what.key() {
                if !self.waiting.remove(&key) {
                    return Some(Err(self.unexpected(seq, &key)));
                }
            }
            return Some(Ok(delivery));
        }
        let delivery = self.ready.pop_front()?;
        if let Some(key) = delivery.what.key() {
            self.waiting.remove(&key);
        }
        Some(Ok(delivery))
    }

    fn unexpected(&self, seq: u64, key: &Key) -> Divergence {
        let expected = self
            .recorded
            .iter()
            .find(|c| c.what.key().as_ref() == Some(key))
            .map(|c| c.what.describe())
            .unwrap_or_else(|| format!("`{key}`"));
        let mut waiting: Vec<String> = self.waiting.iter().map(Key::to_string).collect();
        waiting.sort_unstable();
        let found = if waiting.is_empty() {
            "nothing".to_owned()
        } else {
            waiting.join(", ")
        };
        Divergence::new(DivergenceKind::Result, seq, expected, found)
    }
}
