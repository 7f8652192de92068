//! Where each sealed value of a run belongs: the kind and place its [`Binding`] names, for the
//! payloads sealed through [`crate::payload`] and for every value a history holds. One table,
//! so that what the runtime seals and what a reader (the CLI, a fork, `workflow rekey`) opens
//! can never disagree.
//!
//! The runs of a `continue_as_new` chain share what crosses the seam: messages, requests and
//! replies, published values, and the chain's end (its output or error, which its parent and
//! every handle of the chain read). Those are sealed for the chain's first run (its origin,
//! [`Owner::origin`]), so the run that inherits them opens them as they are: the store moves
//! them in its transaction without ever holding a key. Everything else (arguments, steps,
//! streams) stays the run's own.

use serde_json::Value;

use super::envelope::{Binding, Subject};
use crate::error::Error;
use crate::history::Event;
use crate::ids::RunId;
use crate::model::RunRecord;

/// A run's arguments (also as its parent started it).
pub(crate) const INPUT: &str = "input";
/// A run's return value (also as its parent reads it).
pub(crate) const OUTPUT: &str = "output";
/// The message of a run's error (also as its parent reads it).
pub(crate) const ERROR: &str = "error";
/// A step's arguments; the place is the step id.
pub(crate) const STEP_INPUT: &str = "step_input";
/// A step's result; the place is the step id.
pub(crate) const STEP_RESULT: &str = "step_result";
/// The message of a step's error (of any attempt); the place is the step id.
pub(crate) const STEP_ERROR: &str = "step_error";
/// A payload sent to a hook token.
pub(crate) const HOOK_PAYLOAD: &str = "hook_payload";
/// A chunk of a run's stream; the place is the stream's name.
pub(crate) const STREAM_CHUNK: &str = "stream_chunk";
/// A message sent to a run (`run.send`); the place is its topic.
pub(crate) const MESSAGE: &str = "message";
/// A value a run published (`set_event`); the place is its key.
pub(crate) const EVENT: &str = "event";
/// A request sent to a run (`run.request`); the place is its name.
pub(crate) const REQUEST: &str = "request";
/// A run's reply to a request (`req.reply`); the place is the request's id, so a reply
/// copied to another request does not open.
pub(crate) const REPLY: &str = "reply";

/// A run, and the first run of the chain it belongs to: whom its values are sealed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The run.
    pub(crate) run: RunId,
    /// The first run of its chain: the run itself unless it continues another
    /// (`continue_as_new`).
    pub(crate) origin: RunId,
}

impl Owner {
    /// Run `run` of the chain that begins with `origin` (`None`: it begins one).
    pub(crate) fn new(run: RunId, origin: Option<RunId>) -> Self {
        Owner {
            run,
            origin: origin.unwrap_or(run),
        }
    }

    /// A run known to begin its chain: a run just started, a child as its parent knows it.
    pub(crate) fn first(run: RunId) -> Self {
        Owner { run, origin: run }
    }

    /// The run of `record`.
    pub(crate) fn of(record: &RunRecord) -> Self {
        Owner::new(record.id, record.origin)
    }
}

/// The kinds of values the runs of a chain share (see the module's doc); the others
/// ([`INPUT`], the steps', [`HOOK_PAYLOAD`] bound to its token, [`STREAM_CHUNK`]) are a
/// run's own.
const SHARED_BY_CHAIN: [&str; 6] = [OUTPUT, ERROR, MESSAGE, EVENT, REQUEST, REPLY];

fn shared_by_chain(kind: &str) -> bool {
    SHARED_BY_CHAIN.contains(&kind)
}

/// A payload sent to `token`: bound to the token, since it is sealed before any run is known
/// to own it (the store finds the owner in the same transaction that keeps the payload).
pub(crate) fn hook_payload(token: &str) -> Binding<'_> {
    Binding {
        subject: Subject::Token(token),
        kind: HOOK_PAYLOAD,
        place: token,
    }
}

/// Value `kind` of run `run` at `place`: sealed for its chain's first run when the chain
/// shares such values, for the run alone otherwise.
pub(crate) fn of_run<'a>(run: Owner, kind: &'static str, place: &'a str) -> Binding<'a> {
    let subject = if shared_by_chain(kind) {
        Subject::Chain {
            origin: run.origin,
            run: run.run,
        }
    } else {
        Subject::Run(run.run)
    };
    Binding {
        subject,
        kind,
        place,
    }
}

/// A sealed or sealable value inside a history, as [`visit_event`] hands it out.
pub(crate) enum Slot<'e> {
    /// A payload.
    Value(&'e mut Value),
    /// An error, whose message may be sealed.
    Error(&'e mut Error),
}

/// Calls `f` with every payload and error of `event` of run `run`, and where each belongs.
pub(crate) fn visit_event(run: Owner, event: &mut Event, mut f: impl FnMut(Binding<'_>, Slot<'_>)) {
    match event {
        Event::StepScheduled { step_id, input, .. } => {
            f(of_run(run, STEP_INPUT, step_id), Slot::Value(input))
        }
        Event::StepAttemptFailed { step_id, error, .. } => {
            f(of_run(run, STEP_ERROR, step_id), Slot::Error(error))
        }
        Event::StepCompleted { step_id, result } => match result {
            Ok(v) => f(of_run(run, STEP_RESULT, step_id), Slot::Value(v)),
            Err(e) => f(of_run(run, STEP_ERROR, step_id), Slot::Error(e)),
        },
        Event::RunCompleted { output } => f(of_run(run, OUTPUT, ""), Slot::Value(output)),
        Event::RunFailed { error } => f(of_run(run, ERROR, ""), Slot::Error(error)),
        Event::HookReceived { token, payload, .. } => f(hook_payload(token), Slot::Value(payload)),
        Event::MessageReceived { topic, payload, .. } => {
            f(of_run(run, MESSAGE, topic), Slot::Value(payload))
        }
        Event::EventSet { key, value, .. } => f(of_run(run, EVENT, key), Slot::Value(value)),
        Event::RequestReceived { name, payload, .. } => {
            f(of_run(run, REQUEST, name), Slot::Value(payload))
        }
        Event::RequestReplied {
            request_id, reply, ..
        } => {
            let place = request_id.to_string();
            match reply {
                Ok(v) => f(of_run(run, REPLY, &place), Slot::Value(v)),
                Err(e) => f(of_run(run, REPLY, &place), Slot::Error(e)),
            }
        }
        Event::ChildEnded {
            child_id, result, ..
        } => match result {
            // The child as its parent started it: the first run of its chain, whose end
            // (from whichever run of the chain ended it) is sealed for it.
            Ok(v) => f(of_run(Owner::first(*child_id), OUTPUT, ""), Slot::Value(v)),
            Err(e) => f(of_run(Owner::first(*child_id), ERROR, ""), Slot::Error(e)),
        },
        Event::StepAttemptStarted { .. }
        | Event::TimerScheduled { .. }
        | Event::TimerFired { .. }
        | Event::RunCancelled
        | Event::RunContinuedAsNew { .. }
        | Event::HookRegistered { .. }
        | Event::HookReleased { .. }
        | Event::PatchMarked { .. }
        | Event::RunRetried
        | Event::ChildStarted { .. } => {}
    }
}

/// Calls `f` with every payload and error of inbox entry `what` of run `run` (not yet
/// delivered: a hook payload is bound to its token, a message to the run and its topic, a
/// child's end to the child), and where each belongs.
pub(crate) fn visit_inbound(
    run: Owner,
    what: &mut crate::model::Inbound,
    mut f: impl FnMut(Binding<'_>, Slot<'_>),
) {
    use crate::model::Inbound;
    match what {
        Inbound::Hook { token, payload } => f(hook_payload(token), Slot::Value(payload)),
        Inbound::Message { topic, payload } => f(of_run(run, MESSAGE, topic), Slot::Value(payload)),
        Inbound::Request { name, payload } => f(of_run(run, REQUEST, name), Slot::Value(payload)),
        Inbound::ChildEnded(notice) => {
            // The notice names the child's first run (see `Event::ChildEnded`).
            let child = Owner::first(notice.child);
            if let Some(v) = notice.output.as_mut() {
                f(of_run(child, OUTPUT, ""), Slot::Value(v));
            }
            if let Some(e) = notice.error.as_mut() {
                f(of_run(child, ERROR, ""), Slot::Error(e));
            }
        }
    }
}

/// Why a run's payloads cannot be opened by this worker, found before anything of the run is
/// replayed or delivered: the run is blocked, unchanged, until a worker that can takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// Sealed with this key id, which this worker was not given.
    Key(String),
    /// Sealed in a form this build does not read, as a newer build writes it: what its
    /// envelope says of the form.
    Form(String),
}

/// Why `value` (a payload, or an error's sealed message) cannot be opened with `keys`.
fn unreadable(keys: Option<&super::Keyring>, value: &Value) -> Option<Unreadable> {
    if let Some(form) = super::unknown_form(value) {
        return Some(Unreadable::Form(form));
    }
    super::sealed_key(value)
        .filter(|id| !keys.is_some_and(|k| k.has(id)))
        .map(|id| Unreadable::Key(id.to_owned()))
}

/// [`unreadable`] of a slot.
fn slot_unreadable(keys: Option<&super::Keyring>, slot: &Slot<'_>) -> Option<Unreadable> {
    match slot {
        Slot::Value(v) => unreadable(keys, v),
        Slot::Error(e) => e.sealed_message().and_then(|m| unreadable(keys, m)),
    }
}

/// Why the first payload of run `run`'s arguments or history that this worker cannot open
/// (its key is not among `keys`, or its form is newer than this build) does not open: a run
/// that holds one cannot be replayed here.
pub(crate) fn unreadable_run<'e>(
    keys: Option<&super::Keyring>,
    run: Owner,
    input: &Value,
    events: impl IntoIterator<Item = &'e mut Event>,
) -> Option<Unreadable> {
    if let Some(why) = unreadable(keys, input) {
        return Some(why);
    }
    let mut found = None;
    for event in events {
        visit_event(run, event, |_, slot| {
            if found.is_none() {
                found = slot_unreadable(keys, &slot);
            }
        });
        if found.is_some() {
            break;
        }
    }
    found
}

/// The same for entries of a run's inbox (payloads sent to its hooks, its children's ends).
pub(crate) fn unreadable_inbox<'e>(
    keys: Option<&super::Keyring>,
    entries: impl IntoIterator<Item = &'e crate::model::InboxEntry>,
) -> Option<Unreadable> {
    use crate::model::Inbound;
    entries.into_iter().find_map(|entry| match &entry.what {
        Inbound::Hook { payload, .. }
        | Inbound::Message { payload, .. }
        | Inbound::Request { payload, .. } => unreadable(keys, payload),
        Inbound::ChildEnded(notice) => notice
            .output
            .as_ref()
            .and_then(|v| unreadable(keys, v))
            .or_else(|| {
                notice
                    .error
                    .as_ref()
                    .and_then(|e| e.sealed_message().and_then(|m| unreadable(keys, m)))
            }),
    })
}
