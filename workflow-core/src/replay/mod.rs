//! The replay core: every decision about one run, as a state machine with no I/O.
//!
//! It reads the run's recorded history, matches the commands the workflow issues against it,
//! hands recorded results back in history order, decides what to record next (a step's
//! scheduling and attempts, retries, timer firings, hook payload deliveries) and detects
//! divergence between the code and the history. It knows no store and no async runtime: the
//! driver (`crate::driver`) feeds it commands, attempt outcomes, claim decisions, payloads and
//! the current time, persists the events it returns and carries out its effects. Its tests
//! (`tests.rs`) build histories by hand and check the decisions, with no store and no executor.
//!
//! Ordering is the core's main promise. Results reach the workflow one at a time, in the order
//! they were recorded, and the driver polls the workflow to quiescence between two deliveries:
//! a live run records results in the order it delivered them, so a replay delivers them in the
//! same order and a `select` in the workflow picks the same branch on every replay. Live
//! results wait until the whole history has been delivered.

mod command;
mod deliveries;
mod issue;
mod keys;
mod messages;
mod recorded;
mod shared;
mod steps;
mod writes;

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, VecDeque};
use std::time::SystemTime;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde_json::Value;

use crate::error::Error;
use crate::history::{Event, EventRecord, HistorySize, NewEvent};
use crate::ids::RunId;

pub(crate) use crate::divergence::Divergence;
pub(crate) use command::{ChildCall, Command, StepCall};
use command::{Recorded, RecordedCommand};
use deliveries::QueuedPayload;
pub(crate) use deliveries::{Delivered, Delivery};
pub(crate) use keys::{ChildKey, HookKey, Key, SetId, StepId, TimerId};
pub(crate) use messages::Mailbox;
use messages::QueuedMessage;
pub(crate) use steps::published_events;
use steps::{Attempts, Due, LiveStep};
pub(crate) use writes::{Effect, End, Writes};

/// The plaintext size in bytes of the payloads an event holds (`Payloads::event_bytes` of the
/// run; the core knows no payloads). It may open a value to measure it, hence `&mut`: the
/// visitor of a history's payloads lends them mutably.
pub(crate) type Measure = Box<dyn Fn(&mut Event) -> u64 + Send + Sync>;

/// Where the patch markers of a history stand: what `patched` needs to answer at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Patches {
    /// How many commands the history records.
    pub(crate) recorded: usize,
    /// The recorded commands that are patch markers, by position, with their ids.
    pub(crate) markers: HashMap<usize, String>,
}

/// The state machine of one run. See the module docs.
pub(crate) struct Replay<S> {
    /// Recorded commands, in order, and how many the workflow has matched.
    recorded: Vec<Recorded>,
    matched: usize,
    /// Recorded results not yet delivered, in order, with their event sequence number.
    history: VecDeque<(u64, Delivery)>,
    /// The keys of recorded results (delivered or not).
    recorded_results: HashSet<Key>,
    /// Attempts of recorded steps.
    attempts: HashMap<StepId, Attempts>,
    /// Inbox ids of recorded payload deliveries.
    received: HashSet<u64>,
    /// Hook keys whose release is recorded.
    released: HashSet<HookKey>,
    /// `set_event` calls recorded.
    published: HashSet<SetId>,
    /// Requests whose reply is recorded, by id.
    replied: HashSet<u64>,
    /// Hook keys whose token this run claimed (released or not).
    claimed: HashSet<HookKey>,

    /// Keys the workflow waits on.
    waiting: HashSet<Key>,
    /// Events and releases to make durable.
    writes: Vec<NewEvent>,
    /// How big the durable history is (read, written, or recorded by the store itself), and
    /// `writes` on top of it: what a delivery's [`Delivery::history`] is counted from.
    durable: HistorySize,
    pending: HistorySize,
    measure: Measure,
    releases: Vec<String>,
    /// Effects to carry out once `writes` are durable.
    effects: VecDeque<Effect>,
    /// Live results, delivered after the whole history.
    ready: VecDeque<Delivery>,
    steps: HashMap<StepId, LiveStep<S>>,
    /// Attempts running now.
    running: usize,
    due: BTreeSet<(SystemTime, Due)>,
    /// Hook payloads read from the inbox and not yet delivered, in id order.
    inbox: VecDeque<QueuedPayload>,
    /// Messages and requests read from the inbox and not yet delivered, in id order
    /// (`messages.rs`).
    messages: VecDeque<QueuedMessage>,
    /// The highest inbox id read.
    inbox_seen: u64,
    /// Child starts waiting for their admission, by key.
    children: HashMap<ChildKey, ChildCall>,
    /// Ends of children read from the inbox and not yet delivered: inbox id and result.
    child_ends: HashMap<RunId, (u64, Result<Value, Error>)>,
}

impl<S> Replay<S> {
    /// Prepares the replay of `history` (the run's events in order); `measure` sizes the
    /// payloads of each event, read or written.
    pub(crate) fn new(history: impl IntoIterator<Item = EventRecord>, measure: Measure) -> Self {
        let mut r = Replay {
            recorded: Vec::new(),
            matched: 0,
            history: VecDeque::new(),
            recorded_results: HashSet::new(),
            attempts: HashMap::new(),
            received: HashSet::new(),
            released: HashSet::new(),
            published: HashSet::new(),
            replied: HashSet::new(),
            claimed: HashSet::new(),
            waiting: HashSet::new(),
            writes: Vec::new(),
            durable: HistorySize::default(),
            pending: HistorySize::default(),
            measure,
            releases: Vec::new(),
            effects: VecDeque::new(),
            ready: VecDeque::new(),
            steps: HashMap::new(),
            running: 0,
            due: BTreeSet::new(),
            inbox: VecDeque::new(),
            messages: VecDeque::new(),
            inbox_seen: 0,
            children: HashMap::new(),
            child_ends: HashMap::new(),
        };
        for rec in history {
            r.read(rec);
        }
        r
    }

    /// Whether the history records any command (a run that did nothing yet has none).
    pub(crate) fn has_history(&self) -> bool {
        !self.recorded.is_empty()
    }

    /// Whether the run holds a hook's token it claimed and has not released (the run's start
    /// token aside).
    pub(crate) fn holds_hooks(&self) -> bool {
        self.claimed.iter().any(|k| !self.released.contains(k))
    }

    /// The size of the run's whole history, with the events still to be written: what the
    /// hard limit is checked against.
    pub(crate) fn size(&self) -> HistorySize {
        self.durable + self.pending
    }

    /// Appends `event` to the writes; its place in the history, as a delivery of it carries.
    fn record(&mut self, mut event: NewEvent) -> HistorySize {
        let bytes = (self.measure)(&mut event.event);
        self.pending.add(bytes);
        self.writes.push(event);
        self.durable + self.pending
    }

    /// The store recorded `event` itself (a hook's claim, a child's admission, a transactional
    /// step's result), after the durable history and before the writes not yet made: its
    /// place in the history.
    fn recorded_by_store(&mut self, mut event: Event) -> HistorySize {
        let bytes = (self.measure)(&mut event);
        self.durable.add(bytes);
        self.durable
    }

    /// Drops the writes not yet taken (a divergence keeps nothing of its poll).
    fn clear_writes(&mut self) {
        self.writes.clear();
        self.releases.clear();
        self.pending = HistorySize::default();
    }

    /// Whether recorded results are still to be delivered.
    #[cfg(test)]
    pub(crate) fn replaying(&self) -> bool {
        !self.history.is_empty()
    }
}
