//! The run model: what a run is, as the store keeps it and the replay core and the runtime
//! read it (its status, its admission, its record, its end, and its inbox: payloads sent to
//! its hooks and its children's ends). Nothing here knows about storage or replay; both
//! import it.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::ids::RunId;

/// The state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Admitted, not yet picked up by a worker.
    Pending,
    /// Picked up at least once and not ended (it may be waiting on a timer).
    Running,
    /// Returned `Ok`.
    Completed,
    /// Returned `Err`, panicked, or could not be replayed.
    Failed,
    /// Cancelled with `cancel()`.
    Cancelled,
    /// Its replay does not match its history (the code changed under it): nothing more is
    /// recorded until a build that fits picks it up. The divergence is the run's
    /// `error`; workers try it again when they start, with backoff, and on `retry()`.
    Blocked,
    /// Ended by `continue_as_new(..)`: in the same transaction another run (its
    /// [`RunRecord::next_run`]) was admitted, which carries on with its hook tokens, inbox,
    /// queue slot, parent and deadline. Terminal for this run's own row; the chain's result is
    /// the last run's, which `return_value()` on any run of the chain waits for.
    ContinuedAsNew,
}

impl RunStatus {
    /// True for `Completed`, `Failed`, `Cancelled` and `ContinuedAsNew` (the run's own row
    /// ended; its chain may go on in [`RunRecord::next_run`]).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Cancelled | Self::ContinuedAsNew
        )
    }

    /// The lower-case name used in databases and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Blocked => "blocked",
            Self::ContinuedAsNew => "continued_as_new",
        }
    }

    /// The inverse of [`RunStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "blocked" => Self::Blocked,
            "continued_as_new" => Self::ContinuedAsNew,
            _ => return None,
        })
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run to admit.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Its id, chosen by the caller.
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// The serialized argument tuple.
    pub input: Value,
    /// Admission time; also the first time a worker may pick it up, unless `start_at` is
    /// later.
    pub created_at: SystemTime,
    /// The run begins no earlier than this (`start(..).delay(d)`, `start(..).start_at(t)`):
    /// it waits as [`RunStatus::Pending`] until then, and is never leased at admission while
    /// it lies ahead. `None`: at admission.
    pub start_at: Option<SystemTime>,
    /// The version of the build that started it ([`RuntimeBuilder::version`]).
    ///
    /// [`RuntimeBuilder::version`]: crate::RuntimeBuilder::version
    pub version: Option<String>,
    /// A hook token to claim atomically with the admission (`start(..).hook(token)`).
    pub hook: Option<StartHook>,
    /// The run fails if it has not ended by then (`start(..).timeout(d)`).
    pub deadline: Option<SystemTime>,
    /// The run that started this one with `start_child`, if any.
    pub parent: Option<ParentLink>,
    /// The queue the run waits in for a slot: `start(..).queue(name)` or the
    /// workflow's `#[workflow(queue = "..")]`. A queued run is never leased at admission.
    pub queue: Option<QueueEntry>,
    /// The trace its step attempts' spans belong to (feature `otel`; `None` without it).
    pub trace_context: Option<TraceContext>,
}

impl NewRun {
    /// A run of `workflow` with `input` (its serialized argument tuple), admitted at
    /// `created_at`, with nothing else: no delay, version, token, deadline, parent, queue or
    /// trace context. The options are set with the methods named after the fields:
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use workflow_core::store::NewRun;
    /// use workflow_core::RunId;
    ///
    /// let now = SystemTime::now();
    /// let run = NewRun::new(RunId::new(), "orders.process", serde_json::json!(["o-1"]), now)
    ///     .start_at(Some(now + Duration::from_secs(60)));
    /// assert!(run.delayed());
    /// assert!(run.queue.is_none());
    /// ```
    pub fn new(
        id: RunId,
        workflow: impl Into<String>,
        input: Value,
        created_at: SystemTime,
    ) -> NewRun {
        NewRun {
            id,
            workflow: workflow.into(),
            input,
            created_at,
            start_at: None,
            version: None,
            hook: None,
            deadline: None,
            parent: None,
            queue: None,
            trace_context: None,
        }
    }

    /// With [`NewRun::start_at`](field@NewRun::start_at) set.
    pub fn start_at(mut self, start_at: Option<SystemTime>) -> Self {
        self.start_at = start_at;
        self
    }

    /// With [`NewRun::version`](field@NewRun::version) set.
    pub fn version(mut self, version: Option<String>) -> Self {
        self.version = version;
        self
    }

    /// With [`NewRun::hook`](field@NewRun::hook) set.
    pub fn hook(mut self, hook: Option<StartHook>) -> Self {
        self.hook = hook;
        self
    }

    /// With [`NewRun::deadline`](field@NewRun::deadline) set.
    pub fn deadline(mut self, deadline: Option<SystemTime>) -> Self {
        self.deadline = deadline;
        self
    }

    /// With [`NewRun::parent`](field@NewRun::parent) set.
    pub fn parent(mut self, parent: Option<ParentLink>) -> Self {
        self.parent = parent;
        self
    }

    /// With [`NewRun::queue`](field@NewRun::queue) set.
    pub fn queue(mut self, queue: Option<QueueEntry>) -> Self {
        self.queue = queue;
        self
    }

    /// With [`NewRun::trace_context`](field@NewRun::trace_context) set.
    pub fn trace_context(mut self, trace_context: Option<TraceContext>) -> Self {
        self.trace_context = trace_context;
        self
    }

    /// When a worker may first pick the run up: its admission, or its start if later.
    pub fn first_wake(&self) -> SystemTime {
        self.start_at
            .map_or(self.created_at, |t| t.max(self.created_at))
    }

    /// Whether its start lies ahead of its admission, so it must not be leased at admission.
    pub fn delayed(&self) -> bool {
        self.start_at.is_some_and(|t| t > self.created_at)
    }
}

/// How a child run is tied to the run that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentLink {
    /// The parent run.
    pub run: RunId,
    /// Started with `.detached()`: cancelling the parent leaves this child running.
    pub detached: bool,
}

/// Where a run stands in a queue: the queue, the run's partition key and priority.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The queue's name (declared with [`crate::Queue`] on the runtime builder).
    pub name: String,
    /// Runs of the queue with the same key run one at a time, in start order.
    pub partition_key: Option<String>,
    /// Among the queue's waiting runs, higher begins first; equal priority in start order.
    pub priority: i32,
}

impl QueueEntry {
    /// An entry in queue `name`, no partition key, priority 0.
    pub fn new(name: impl Into<String>) -> Self {
        QueueEntry {
            name: name.into(),
            partition_key: None,
            priority: 0,
        }
    }
}

/// The token a run claims when it is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartHook {
    /// The token.
    pub token: String,
    /// The token stays claimed at least until then, even after the run ended
    /// (`min_retention`).
    pub retain_until: Option<SystemTime>,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Its id.
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// Current state.
    pub status: RunStatus,
    /// The serialized argument tuple.
    pub input: Value,
    /// The return value of a completed run.
    pub output: Option<Value>,
    /// The error of a failed or cancelled run.
    pub error: Option<Error>,
    /// Admission time.
    pub created_at: SystemTime,
    /// Time of the last change of state.
    pub updated_at: SystemTime,
    /// The token claimed at admission, if any.
    pub hook_token: Option<String>,
    /// When the run fails if it has not ended (`start(..).timeout(d)`).
    pub deadline: Option<SystemTime>,
    /// The run that started this one with `start_child`, if any.
    pub parent: Option<RunId>,
    /// The queue it was started in, if any.
    pub queue: Option<QueueEntry>,
    /// Not begun before this time (`start(..).delay(d)`, `start(..).start_at(t)`); `None`:
    /// from admission on.
    pub start_at: Option<SystemTime>,
    /// The version of the build that started it ([`RuntimeBuilder::version`]), if it
    /// named one.
    ///
    /// [`RuntimeBuilder::version`]: crate::RuntimeBuilder::version
    pub version: Option<String>,
    /// The run this one continues (it ended with `continue_as_new(..)` and admitted this one
    /// in the same transaction), if any.
    pub previous_run: Option<RunId>,
    /// The run that continues this one, once it ended as [`RunStatus::ContinuedAsNew`].
    pub next_run: Option<RunId>,
    /// The first run of the chain this run continues (`continue_as_new`), `None` for a run
    /// that continues none. Set at admission and never changed: the payloads the runs of a
    /// chain share (messages, requests and replies, published values, the chain's end) are
    /// sealed for it when encryption is on.
    pub origin: Option<RunId>,
    /// The W3C trace context the run was started in (feature `otel`): every span of its step
    /// attempts is a child of it. `None` for a run started without the feature or outside
    /// any trace.
    pub trace_context: Option<TraceContext>,
}

impl RunRecord {
    /// When the run may begin: its admission, or its start if later. Its workflow clock
    /// and its `.timeout(..)` count from here.
    pub(crate) fn begins(&self) -> SystemTime {
        self.start_at
            .map_or(self.created_at, |t| t.max(self.created_at))
    }

    /// When a pending run begins, if that lies after `now`: it was started with a delay and
    /// waits for its time (not for a worker).
    pub fn starts_later(&self, now: SystemTime) -> Option<SystemTime> {
        self.start_at
            .filter(|t| self.status == RunStatus::Pending && *t > now)
    }
}

/// A W3C trace context (<https://www.w3.org/TR/trace-context/>) kept with a run: the
/// `traceparent` of the span that started it and the caller's `tracestate`, if any. It holds
/// ids and vendor flags, never user data, so it is stored as plain text (not sealed with the
/// payloads). A store keeps it in one column as [`TraceContext::to_text`] writes it.
///
/// ```
/// use workflow_core::store::TraceContext;
///
/// let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01,congo=t61rcWkgMzE";
/// let cx = TraceContext::parse(text).unwrap();
/// assert_eq!(cx.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(cx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
/// assert_eq!(cx.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
/// assert_eq!(cx.to_text(), text);
/// assert!(TraceContext::parse("not a traceparent").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`, lower-case hex, as the `traceparent` header.
    pub traceparent: String,
    /// The `tracestate` header's list, when the caller's context had one.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// One line: the `traceparent`, then `,` and the `tracestate` list when there is one (a
    /// `traceparent` holds no comma, so the first one separates them).
    pub fn to_text(&self) -> String {
        match &self.tracestate {
            Some(state) => format!("{},{state}", self.traceparent),
            None => self.traceparent.clone(),
        }
    }

    /// The inverse of [`TraceContext::to_text`]; `None` unless the `traceparent` is well
    /// formed (four fields of 2, 32, 16 and 2 hex digits, the trace and parent ids not all
    /// zeros).
    pub fn parse(text: &str) -> Option<Self> {
        let (parent, state) = match text.split_once(',') {
            Some((p, s)) => (p.trim(), Some(s.trim()).filter(|s| !s.is_empty())),
            None => (text.trim(), None),
        };
        traceparent_fields(parent)?;
        Some(TraceContext {
            traceparent: parent.to_ascii_lowercase(),
            tracestate: state.map(str::to_owned),
        })
    }

    /// The trace id (32 hex digits), when the `traceparent` is well formed.
    pub fn trace_id(&self) -> Option<&str> {
        self.traceparent
            .split('-')
            .nth(1)
            .filter(|id| id.len() == 32)
    }
}

/// The version, trace id, parent id and flags of a well-formed `traceparent` (four fields of
/// 2, 32, 16 and 2 hex digits, the ids not all zeros, a version other than `ff`; a later
/// version may add fields), as [`TraceContext::parse`] and the `otel` decoding both check it.
pub(crate) fn traceparent_fields(parent: &str) -> Option<[&str; 4]> {
    // The fields have fixed widths, so their `-`s have fixed places (2, 35, 52), and a fifth
    // field, if any, begins with the `-` at 55. Those places hold ASCII, so the slices below
    // fall on character boundaries.
    let b = parent.as_bytes();
    let dashes = b.len() >= 55
        && b[2] == b'-'
        && b[35] == b'-'
        && b[52] == b'-'
        && (b.len() == 55 || b[55] == b'-');
    if !dashes {
        return None;
    }
    let fields = [
        &parent[..2],
        &parent[3..35],
        &parent[36..52],
        &parent[53..55],
    ];
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    let ok =
        fields.iter().all(|f| hex(f)) && fields[0] != "ff" && !zero(fields[1]) && !zero(fields[2]);
    ok.then_some(fields)
}

/// How a run ended, written by [`RunStore::append`] together with its last events.
///
/// [`RunStore::append`]: crate::store::RunStore::append
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Returned `Ok` with this value.
    Completed(Value),
    /// Failed with this error.
    Failed(Error),
}

/// An entry of a run's inbox, as [`HookStore::payloads`] reads it: a payload sent to one of
/// the run's hooks, the end of one of its children, or a message or request sent to the run.
///
/// [`HookStore::payloads`]: crate::store::HookStore::payloads
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    /// Global, increasing in commit order; the `payload_id` of the event that records its
    /// delivery.
    pub id: u64,
    /// What arrived.
    pub what: Inbound,
}

/// What an [`InboxEntry`] holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A payload sent with `resume_hook` (or `start(..).hook(token).or_resume(..)`) to a
    /// token a hook of the run owns.
    Hook {
        /// The token it was sent to.
        token: String,
        /// As sent.
        payload: Value,
    },
    /// A child of the run ended.
    ChildEnded(ChildNotice),
    /// A message sent to the run with `run.send(topic, msg)`, for the workflow's
    /// `recv(topic)`.
    Message {
        /// The topic it was sent on.
        topic: String,
        /// As sent.
        payload: Value,
    },
    /// A request sent with `run.request(name, req)`, for the workflow's `requests(name)`;
    /// its id is the request's id (the caller waits for the reply recorded under it).
    Request {
        /// The name the workflow's `requests(name)` takes it under.
        name: String,
        /// As sent.
        payload: Value,
    },
}

/// A child run's end, as its parent's inbox holds it (see [`RunStore::start_child`]).
///
/// [`RunStore::start_child`]: crate::store::RunStore::start_child
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildNotice {
    /// The child run.
    pub child: RunId,
    /// How it ended (completed, failed or cancelled).
    pub status: RunStatus,
    /// Its return value, when it completed.
    pub output: Option<Value>,
    /// Its error, when it failed or was cancelled.
    pub error: Option<Error>,
}

impl ChildNotice {
    /// The notice as the child's result: its value, or its error.
    pub fn result(self) -> Result<Value, Error> {
        match (self.status, self.output, self.error) {
            (RunStatus::Completed, output, _) => Ok(output.unwrap_or(Value::Null)),
            (_, _, Some(error)) => Err(error),
            (status, _, None) => Err(Error::fatal(format!(
                "child run {} ended {status} without an error",
                self.child
            ))),
        }
    }

    /// The notice's JSON from the columns a SQL store writes (`output` and `error` are
    /// already JSON), without decoding them again.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn encode(
        child: &str,
        status: RunStatus,
        output: Option<&str>,
        error: Option<&str>,
    ) -> String {
        format!(
            r#"{{"child":"{child}","status":"{}","output":{},"error":{}}}"#,
            status.as_str(),
            output.unwrap_or("null"),
            error.unwrap_or("null")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::traceparent_fields;

    /// The rule as first written: split at every `-`, the first four fields checked.
    fn by_splitting(parent: &str) -> Option<[&str; 4]> {
        let mut fields = parent.split('-');
        let fields = [
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        ];
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        let ok = hex(fields[0], 2)
            && fields[0] != "ff"
            && hex(fields[1], 32)
            && !zero(fields[1])
            && hex(fields[2], 16)
            && !zero(fields[2])
            && hex(fields[3], 2);
        ok.then_some(fields)
    }

    /// The fixed-place check accepts exactly what splitting accepted, with the same fields,
    /// on a well-formed `traceparent` with each character replaced, removed or followed by
    /// another, cut short and extended; and it never slices inside a character.
    #[test]
    fn traceparent_fields_are_checked_as_before() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut texts = vec![
            good.to_owned(),
            good.to_uppercase(),
            format!("{good}-later-fields"),
            format!("{good}x"),
            format!("{good}-"),
            String::new(),
            "-".repeat(60),
        ];
        for len in 0..good.len() {
            texts.push(good[..len].to_owned());
        }
        for (at, _) in good.char_indices() {
            for c in ['-', 'g', 'F', '0', 'é', ' '] {
                let mut t = good.to_owned();
                t.replace_range(at..at + 1, &c.to_string());
                texts.push(t.clone());
                t.insert(at, c);
                texts.push(t);
            }
            let mut t = good.to_owned();
            t.remove(at);
            texts.push(t);
        }
        for t in &texts {
            assert_eq!(traceparent_fields(t), by_splitting(t), "{t:?}");
        }
        assert!(traceparent_fields(good).is_some());
        assert!(traceparent_fields(&format!("{good}-later-fields")).is_some());
    }
}
