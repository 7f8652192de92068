//! A driver made for a leased run: its replay core from the recorded history, the context
//! the workflow body sees, the span its log lines are in, and what its first poll needs.

use std::collections::VecDeque;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Driver, Host, Pending, Signals};
use crate::context::RunCtx;
use crate::crypto::places;
use crate::history::Event;
use crate::registry::WorkflowRegistration;
use crate::replay::Replay;
use crate::store::{EndHint, LeasedRun};

/// What the first drive of a run needs beside its driver.
pub(super) struct FirstDrive {
    /// The run's stored arguments.
    pub(super) input: Value,
    pub(super) owner: places::Owner,
    /// Why a payload of the history cannot be opened here (a key is missing), if so.
    pub(super) unreadable: Option<places::Unreadable>,
    /// A fresh run without a start token owns no hook yet, so its inbox holds at most
    /// messages, read when the workflow first waits for one.
    pub(super) fresh: bool,
    /// The span the body runs in.
    pub(super) span: tracing::Span,
}

impl Driver {
    /// The driver of `leased`, its history read into its replay core.
    pub(super) fn begin(
        host: Arc<dyn Host>,
        leased: LeasedRun,
        reg: &'static WorkflowRegistration,
        signals: &Signals,
        pending: Option<Box<Pending>>,
    ) -> (Driver, FirstDrive) {
        let LeasedRun {
            run,
            lease,
            mut events,
            ..
        } = leased;
        let owner = places::Owner::of(&run);
        let unreadable = places::unreadable_run(
            host.config().payloads.keys(),
            owner,
            &run.input,
            events.iter_mut().map(|e| &mut e.event),
        );
        let last_seq = events.last().map_or(0, |e| e.seq);
        // The span the body's own log lines are in, at DEBUG under its own target
        // (`telemetry::RUN_SPAN_TARGET`): at INFO, the level services run at, a run's spans
        // are its step attempts' (each carrying the run's id and workflow) and, with the
        // feature `otel`, its start's. Each span costs every subscriber's layers (formatting its
        // fields, an OpenTelemetry span built and exported); this one is entered at every
        // poll of the body and was a third of the spans of a one-step run.
        let span = tracing::debug_span!(
            target: crate::telemetry::RUN_SPAN_TARGET,
            "workflow_run",
            workflow.run_id = %run.id,
            workflow.name = reg.name,
        );
        // In the run's trace (feature `otel`) rather than a trace of its own per drive.
        let trace = crate::traces::Parent::of(run.trace_context.as_ref());
        trace.adopt(&span);
        let replay_began = std::time::Instant::now();
        let payloads = host.config().payloads.clone();
        let measure = Box::new(move |e: &mut Event| payloads.event_bytes(owner, e));
        let replay = Replay::new(events, measure);
        // A queued run started here is counted by its admission, once it begins.
        if let (Some(q), false, None) = (&run.queue, replay.has_history(), &pending) {
            let waited = host
                .now()
                .duration_since(run.created_at)
                .unwrap_or_default();
            crate::telemetry::queue_waited(&q.name, waited);
        }
        let fresh = run.hook_token.is_none() && !replay.has_history() && run.previous_run.is_none();
        let ties = if run.parent.is_some() {
            EndHint::Child
        } else if run.queue.is_some() || run.hook_token.is_some() || run.previous_run.is_some() {
            EndHint::NoParent
        } else {
            EndHint::Alone
        };
        let begins = run.begins();
        let ctx = RunCtx::new(
            owner,
            reg.name,
            begins,
            run.hook_token,
            host.config().payloads.clone(),
            replay.patches(),
            host.config().history,
        );
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let replayed = replay.has_history();
        let d = Driver {
            host,
            lease,
            ctx,
            replay,
            attempts: HashMap::new(),
            done_tx,
            done_rx,
            last_seq,
            stop: signals.stop.clone(),
            deadline: run.deadline.map(|at| {
                let timeout = at.duration_since(begins).unwrap_or_default();
                (at, timeout)
            }),
            parent: run.parent,
            own_children: HashSet::new(),
            shared_children: HashMap::new(),
            ties,
            inbox_unread: true,
            unreadable: None,
            replay_began: replayed.then_some(replay_began),
            tx_attempt: None,
            tx_pending: None,
            tx_unwritten: None,
            held: VecDeque::new(),
            trace,
            span: span.clone(),
            pending,
            _active: crate::telemetry::ActiveRun::new(),
        };
        let first = FirstDrive {
            input: run.input,
            owner,
            unreadable,
            fresh,
            span,
        };
        (d, first)
    }
}
