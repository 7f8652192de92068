//! What code inside a run sees: the run's journal context (a task-local set while the driver
//! polls the workflow), the step context (a task-local set while a step attempt runs), and the
//! deterministic primitives built on them: step calls, `sleep`, `now`, `random`, metadata.
//!
//! The workflow never performs effects itself. Calling a step or a sleep *issues a command*
//! into the journal and waits for its result under a key (the step id or timer id); the driver
//! (`driver.rs`) executes commands, records them and delivers results one at a time.

use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use rand::distr::{Distribution, StandardUniform};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::config::HistoryLimits;
use crate::crypto::places::{self, Owner};
use crate::error::{Error, HookConflictError};
use crate::history::{after, HistorySize};
use crate::ids::RunId;
use crate::model::{Inbound, InboxEntry};
use crate::payload::{Encoded, PayloadError, PayloadKind, Payloads};
use crate::registry::{BoxFuture, StepDef, WorkflowValue};
use crate::replay::{
    ChildKey, Delivered, Delivery, HookKey, Key, Mailbox, Patches, SetId, StepCall, StepId, TimerId,
};

tokio::task_local! {
    static WORKFLOW: Arc<RunCtx>;
    static STEP: StepMetadata;
    static STEP_SETS: Arc<StepSets>;
}

/// Runs one attempt of a step body on serialized arguments.
pub(crate) type StepExec =
    Arc<dyn Fn(&Value) -> BoxFuture<'static, Result<Value, Error>> + Send + Sync>;

/// A command the workflow issued during a poll; the driver runs a step's attempts with its
/// [`StepExec`].
pub(crate) type Command = crate::replay::Command<StepExec>;

/// A result delivered under a [`Key`], waiting for the future that asked for it.
pub(crate) enum Ready {
    Step(Result<Value, Error>),
    Fired,
    Registered(Option<RunId>),
    /// A child's admission: its id, and the owner of its token when none was admitted.
    ChildStarted {
        child_id: RunId,
        conflict: Option<RunId>,
        refused: Option<String>,
    },
    ChildEnded(Result<Value, Error>),
}

/// The per-run state shared by the workflow's futures and its driver.
pub(crate) struct RunCtx {
    pub(crate) run_id: RunId,
    /// The first run of the run's chain (`continue_as_new`), itself if it continues none:
    /// the values the chain shares are sealed for it.
    pub(crate) origin: RunId,
    pub(crate) workflow: &'static str,
    pub(crate) started_at: SystemTime,
    /// The token claimed at admission (`start(..).hook(token)`).
    start_token: Option<String>,
    /// How the runtime stores payloads, for what the run's body encodes and decodes.
    pub(crate) payloads: Payloads,
    /// The soft limit of the history (`continue_as_new_suggested`).
    limits: HistoryLimits,
    journal: Mutex<Journal>,
}

struct Journal {
    clock: SystemTime,
    /// The history up to the last event delivered: `history_events` and `history_bytes`,
    /// advanced by deliveries as the clock is.
    history: HistorySize,
    rng: ChaCha8Rng,
    step_counters: HashMap<&'static str, u32>,
    timers: u32,
    hooks: u32,
    /// `start_child` calls so far: the next start's key is `ch_<children>`.
    children: u32,
    /// `set_event` calls so far: the next call's id is `set_<event_sets>`.
    event_sets: u32,
    /// Whether a hook handle bound to the start token (or gave it up).
    start_token_used: bool,
    /// Tokens owned by live hook handles: payloads for them are delivered.
    open_tokens: HashSet<String>,
    /// Hook keys whose handle was dropped while its registration was in flight.
    abandoned: HashSet<HookKey>,
    /// Delivered, not yet received payloads per token, with their inbox ids.
    payloads: HashMap<String, VecDeque<(u64, Value)>>,
    /// Delivered, not yet received messages (and requests) per mailbox, with their inbox
    /// ids (`message.rs`, `request.rs`).
    messages: HashMap<Mailbox, VecDeque<(u64, Value)>>,
    /// The `recv` futures (and `requests` streams) waiting per mailbox, by their number, with
    /// their wakers: a message is delivered only while more of them wait than messages of its
    /// mailbox are buffered.
    receivers: HashMap<Mailbox, HashMap<u64, Waker>>,
    /// Requests the workflow replied to in this execution (`req.reply`): a second reply is
    /// an error.
    replied: HashSet<u64>,
    /// The number of the next `recv` future.
    next_receiver: u64,
    issued: Vec<Command>,
    /// Commands matched against the history or recorded (releases aside) taken by the
    /// driver so far: with those still in `issued`, the position of the next one.
    taken: usize,
    /// The history's patch markers, and the answers `patched` gave in this run.
    patches: Patches,
    patched: HashMap<String, bool>,
    ready: HashMap<Key, Ready>,
    waiters: HashMap<Key, Waker>,
}

/// Whether `cmd` takes a place among the recorded commands (a release does not).
fn is_recorded(cmd: &Command) -> bool {
    !matches!(
        cmd,
        Command::HookRelease { .. }
            | Command::AwaitChild { .. }
            | Command::SetEvent { .. }
            | Command::Reply { .. }
    )
}

impl RunCtx {
    /// The run and the first run of its chain.
    pub(crate) fn owner(&self) -> Owner {
        Owner::new(self.run_id, Some(self.origin))
    }

    pub(crate) fn new(
        run: Owner,
        workflow: &'static str,
        started_at: SystemTime,
        start_token: Option<String>,
        payloads: Payloads,
        patches: Patches,
        limits: HistoryLimits,
    ) -> Arc<Self> {
        let run_id = run.run;
        Arc::new(RunCtx {
            run_id,
            origin: run.origin,
            workflow,
            started_at,
            start_token,
            payloads,
            limits,
            journal: Mutex::new(Journal {
                clock: started_at,
                history: HistorySize::default(),
                rng: ChaCha8Rng::seed_from_u64(run_id.seed()),
                step_counters: HashMap::new(),
                timers: 0,
                hooks: 0,
                children: 0,
                event_sets: 0,
                start_token_used: false,
                open_tokens: HashSet::new(),
                abandoned: HashSet::new(),
                payloads: HashMap::new(),
                messages: HashMap::new(),
                receivers: HashMap::new(),
                replied: HashSet::new(),
                next_receiver: 0,
                issued: Vec::new(),
                taken: 0,
                patches,
                patched: HashMap::new(),
                ready: HashMap::new(),
                waiters: HashMap::new(),
            }),
        })
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        crate::sync::lock(&self.journal)
    }

    /// Runs `fut` with this context visible to the primitives.
    pub(crate) fn scope<F: Future>(self: &Arc<Self>, fut: F) -> impl Future<Output = F::Output> {
        WORKFLOW.scope(self.clone(), fut)
    }

    /// Takes the commands issued since the last call, in issue order.
    pub(crate) fn take_issued(&self) -> Vec<Command> {
        let mut j = self.journal();
        let issued = std::mem::take(&mut j.issued);
        j.taken += issued.iter().filter(|c| is_recorded(c)).count();
        issued
    }

    /// Hands `delivery` to the future waiting for it, advances the clock to its time, and
    /// wakes that future.
    pub(crate) fn deliver(&self, delivery: Delivery) {
        let waker = {
            let mut j = self.journal();
            if delivery.at > j.clock {
                j.clock = delivery.at;
            }
            j.history = j.history.max(delivery.history);
            match delivery.what {
                Delivered::Step { step_id, result } => {
                    let key = Key::Step(step_id);
                    j.ready.insert(key.clone(), Ready::Step(result));
                    j.waiters.remove(&key)
                }
                Delivered::Timer { timer_id } => {
                    let key = Key::Timer(timer_id);
                    j.ready.insert(key.clone(), Ready::Fired);
                    j.waiters.remove(&key)
                }
                Delivered::Registration {
                    hook_key,
                    token,
                    conflict,
                } => {
                    if conflict.is_none() {
                        if j.abandoned.remove(&hook_key) {
                            // Claimed for a handle that is gone: give the token back.
                            j.issued.push(Command::HookRelease { hook_key, token });
                        } else {
                            j.open_tokens.insert(token);
                        }
                    }
                    let key = Key::Hook(hook_key);
                    j.ready.insert(key.clone(), Ready::Registered(conflict));
                    j.waiters.remove(&key)
                }
                Delivered::ChildStarted {
                    child_key,
                    child_id,
                    conflict,
                    refused,
                } => {
                    let key = Key::Child(child_key);
                    j.ready.insert(
                        key.clone(),
                        Ready::ChildStarted {
                            child_id,
                            conflict,
                            refused,
                        },
                    );
                    j.waiters.remove(&key)
                }
                Delivered::ChildEnded { child_id, result } => {
                    let key = Key::ChildEnd(child_id);
                    j.ready.insert(key.clone(), Ready::ChildEnded(result));
                    j.waiters.remove(&key)
                }
                Delivered::Payload { token, id, payload } => {
                    j.payloads
                        .entry(token.clone())
                        .or_default()
                        .push_back((id, payload));
                    j.waiters.remove(&Key::Payload(token))
                }
                Delivered::Message {
                    mailbox,
                    id,
                    payload,
                } => {
                    // Every receiver of the mailbox polls again; the first polled takes it.
                    let wakers: Vec<Waker> = j
                        .receivers
                        .get(&mailbox)
                        .map(|r| r.values().cloned().collect())
                        .unwrap_or_default();
                    j.messages
                        .entry(mailbox)
                        .or_default()
                        .push_back((id, payload));
                    drop(j);
                    for w in wakers {
                        w.wake();
                    }
                    return;
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Issues the run's next `set_event` call.
    pub(crate) fn set_event(&self, key: String, value: Value) {
        let mut j = self.journal();
        let set_id = SetId(j.event_sets);
        j.event_sets += 1;
        j.issued.push(Command::SetEvent { set_id, key, value });
    }

    /// Issues the reply to request `request_id`, unless the workflow replied to it before
    /// in this execution: then `false`, and nothing is issued.
    pub(crate) fn reply(&self, request_id: u64, name: String, reply: Result<Value, Error>) -> bool {
        let mut j = self.journal();
        if !j.replied.insert(request_id) {
            return false;
        }
        j.issued.push(Command::Reply {
            request_id,
            name,
            reply,
        });
        true
    }

    /// Whether a receiver of `mailbox` waits for a message not delivered yet: more receivers
    /// wait than messages of the mailbox are buffered.
    pub(crate) fn wants_message(&self, mailbox: &Mailbox) -> bool {
        let j = self.journal();
        let waiting = j.receivers.get(mailbox).map_or(0, HashMap::len);
        waiting > j.messages.get(mailbox).map_or(0, VecDeque::len)
    }

    /// Whether any `recv` waits.
    pub(crate) fn receiving(&self) -> bool {
        self.journal().receivers.values().any(|r| !r.is_empty())
    }

    /// The number of a new `recv` future.
    pub(crate) fn new_receiver(&self) -> u64 {
        let mut j = self.journal();
        j.next_receiver += 1;
        j.next_receiver
    }

    /// Receiver `receiver` of `mailbox` takes the next delivered message (its inbox id and
    /// payload), or else waits with `waker`.
    pub(crate) fn take_message(
        &self,
        mailbox: &Mailbox,
        receiver: u64,
        waker: &Waker,
    ) -> Option<(u64, Value)> {
        let mut j = self.journal();
        match j.messages.get_mut(mailbox).and_then(VecDeque::pop_front) {
            Some(v) => {
                if let Some(r) = j.receivers.get_mut(mailbox) {
                    r.remove(&receiver);
                }
                Some(v)
            }
            None => {
                j.receivers
                    .entry(mailbox.clone())
                    .or_default()
                    .insert(receiver, waker.clone());
                None
            }
        }
    }

    /// Receiver `receiver` of `mailbox` no longer waits (it resolved or was dropped).
    pub(crate) fn stop_receiving(&self, mailbox: &Mailbox, receiver: u64) {
        let mut j = self.journal();
        if let Some(r) = j.receivers.get_mut(mailbox) {
            r.remove(&receiver);
            if r.is_empty() {
                j.receivers.remove(mailbox);
            }
        }
    }

    /// Whether a live hook handle owns `token`.
    /// Whether a payload for `token` is to be delivered now: a live hook handle owns the
    /// token and a `recv` of it waits with no payload delivered to it yet. Payloads are not
    /// delivered ahead of a `recv`: one the workflow never takes stays in the store's inbox,
    /// where a continuation finds it.
    pub(crate) fn wants_payload(&self, token: &str) -> bool {
        let j = self.journal();
        j.open_tokens.contains(token)
            && j.payloads.get(token).is_none_or(VecDeque::is_empty)
            && j.waiters.contains_key(&Key::Payload(token.to_owned()))
    }

    /// What was delivered to the workflow (and recorded as received) but not taken by it:
    /// hook payloads and messages and requests of any mailbox, in inbox order. A
    /// continuation gives them back to the inbox for the next run (a hook payload only when
    /// the next run inherits its token: the store knows which tokens the run still owns,
    /// while the body's returning dropped every handle).
    pub(crate) fn unconsumed(&self) -> Vec<InboxEntry> {
        let j = self.journal();
        let mut out: Vec<InboxEntry> = Vec::new();
        for (token, queued) in &j.payloads {
            out.extend(queued.iter().map(|(id, payload)| InboxEntry {
                id: *id,
                what: Inbound::Hook {
                    token: token.clone(),
                    payload: payload.clone(),
                },
            }));
        }
        for (mailbox, queued) in &j.messages {
            out.extend(queued.iter().map(|(id, payload)| InboxEntry {
                id: *id,
                what: match mailbox {
                    Mailbox::Topic(topic) => Inbound::Message {
                        topic: topic.clone(),
                        payload: payload.clone(),
                    },
                    Mailbox::Requests(name) => Inbound::Request {
                        name: name.clone(),
                        payload: payload.clone(),
                    },
                },
            }));
        }
        out.sort_by_key(|e| e.id);
        out
    }

    pub(crate) fn issue(&self, cmd: Command) {
        self.journal().issued.push(cmd);
    }

    /// The key of the next `start_child` call.
    pub(crate) fn next_child_key(&self) -> ChildKey {
        let mut j = self.journal();
        let key = ChildKey(j.children);
        j.children += 1;
        key
    }

    pub(crate) fn wait(self: &Arc<Self>, key: Key) -> WaitFor {
        WaitFor {
            ctx: self.clone(),
            key,
        }
    }
}

/// Resolves with the result delivered under `key`. Dropping it consumes nothing.
pub(crate) struct WaitFor {
    ctx: Arc<RunCtx>,
    key: Key,
}

impl Future for WaitFor {
    type Output = Ready;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut j = self.ctx.journal();
        match j.ready.remove(&self.key) {
            Some(r) => {
                j.waiters.remove(&self.key);
                Poll::Ready(r)
            }
            None => {
                j.waiters.insert(self.key.clone(), cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

pub(crate) fn current() -> Option<Arc<RunCtx>> {
    WORKFLOW.try_with(|c| c.clone()).ok()
}

/// Sets the step context for one attempt: its metadata, and where its `set_event` calls
/// collect their values.
pub(crate) fn step_scope<F: Future>(
    meta: StepMetadata,
    sets: Arc<StepSets>,
    fut: F,
) -> impl Future<Output = F::Output> {
    STEP.scope(meta, STEP_SETS.scope(sets, fut))
}

/// The values one step attempt published with `set_event`, in call order: recorded with the
/// attempt's outcome (its result, or its failure), so a replayed step publishes nothing again.
pub(crate) struct StepSets {
    run: Owner,
    payloads: Payloads,
    sets: Mutex<Vec<(String, Value)>>,
}

impl StepSets {
    pub(crate) fn new(run: Owner, payloads: Payloads) -> Arc<Self> {
        Arc::new(Self {
            run,
            payloads,
            sets: Mutex::new(Vec::new()),
        })
    }

    /// The values published so far, leaving none.
    pub(crate) fn take(&self) -> Vec<(String, Value)> {
        std::mem::take(&mut *self.sets.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Where a `set_event` call publishes: the step attempt running now, or the workflow body.
pub(crate) enum Publisher {
    Step(Arc<StepSets>),
    Body(Arc<RunCtx>),
}

impl Publisher {
    /// The publisher of the current task, or `None` outside any run.
    pub(crate) fn current() -> Option<Self> {
        match STEP_SETS.try_with(|s| s.clone()) {
            Ok(sets) => Some(Self::Step(sets)),
            Err(_) => current().map(Self::Body),
        }
    }

    /// The run whose value this is, and its chain's first run.
    pub(crate) fn owner(&self) -> Owner {
        match self {
            Self::Step(s) => s.run,
            Self::Body(c) => c.owner(),
        }
    }

    pub(crate) fn payloads(&self) -> &Payloads {
        match self {
            Self::Step(s) => &s.payloads,
            Self::Body(c) => &c.payloads,
        }
    }

    /// Publishes the encoded `value` of `key`: issued by the body, or kept for the step
    /// attempt's outcome.
    pub(crate) fn publish(&self, key: String, value: Value) {
        match self {
            Self::Step(s) => s
                .sets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((key, value)),
            Self::Body(c) => c.set_event(key, value),
        }
    }
}

/// Where a step runs: as a recorded step of the current run, or (outside any workflow, or
/// inside another step) as a plain async fn.
#[doc(hidden)]
pub async fn call_step<A, T, F, Fut>(def: &'static StepDef, args: A, body: F) -> Result<T, Error>
where
    A: WorkflowValue,
    T: WorkflowValue,
    F: Fn(A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Error>> + Send + 'static,
{
    run_step(def, args, body, false).await
}

/// [`call_step`] for a `#[step(transactional)]`: each attempt runs in a transaction of the
/// store that also records its result (`driver/transactional.rs`); `body` reaches it through
/// [`crate::transactional::transactional`].
#[doc(hidden)]
pub async fn call_tx_step<A, T, F, Fut>(def: &'static StepDef, args: A, body: F) -> Result<T, Error>
where
    A: WorkflowValue,
    T: WorkflowValue,
    F: Fn(A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Error>> + Send + 'static,
{
    run_step(def, args, body, true).await
}

async fn run_step<A, T, F, Fut>(
    def: &'static StepDef,
    args: A,
    body: F,
    transactional: bool,
) -> Result<T, Error>
where
    A: WorkflowValue,
    T: WorkflowValue,
    F: Fn(A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Error>> + Send + 'static,
{
    if let Some(e) = crate::transactional::forbidden(&format!("step `{}` was called", def.name)) {
        return Err(e);
    }
    let Some(ctx) = current() else {
        return body(args).await;
    };
    // The id first (without counting the call yet): it is where the arguments are sealed.
    let id = {
        let j = ctx.journal();
        let n = j.step_counters.get(def.name).copied().unwrap_or(0);
        StepId::new(&ctx.run_id, def.name, n)
    };
    let place: Arc<str> = id.to_string().into();
    let input = ctx
        .payloads
        .encode_keeping(
            &args,
            PayloadKind::StepInput { step: def.name }
                .of(ctx.run_id)
                .at(&place),
        )
        .map_err(PayloadError::fatal)?;
    *ctx.journal().step_counters.entry(def.name).or_insert(0) += 1;
    let name = def.name;
    let (run, payloads) = (ctx.run_id, ctx.payloads.clone());
    // With encryption on, what this call sealed is read back in the clear rather than opened
    // again: the arguments by each attempt given them, the result by this call once an
    // attempt of this process recorded it (`Payloads::decode_known`).
    let (stored_input, sealed_args) = match input.plain {
        Some(_) => (input.stored.clone(), Some(input)),
        None => (input.stored, None),
    };
    let result: Option<Arc<Mutex<Option<Encoded>>>> = ctx
        .payloads
        .transforms()
        .then(|| Arc::new(Mutex::new(None)));
    // Each attempt decodes the recorded input (not a copy of it). A result too large to
    // record fails the attempt for good: retrying would produce it again.
    let at = place.clone();
    let kept = result.clone();
    let exec: StepExec = Arc::new(move |input: &Value| {
        let cx = PayloadKind::StepInput { step: name }.of(run).at(&at);
        let args = payloads.decode_known::<A>(input, sealed_args.as_ref(), cx);
        let fut = args.map(&body).map_err(PayloadError::fatal);
        let (payloads, at, kept) = (payloads.clone(), at.clone(), kept.clone());
        Box::pin(async move {
            let out = fut?.await?;
            let cx = PayloadKind::StepResult { step: name }.of(run).at(&at);
            let Some(kept) = kept else {
                return payloads.encode(&out, cx).map_err(PayloadError::fatal);
            };
            let encoded = payloads
                .encode_keeping(&out, cx)
                .map_err(PayloadError::fatal)?;
            let stored = encoded.stored.clone();
            *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(encoded);
            Ok(stored)
        })
    });
    ctx.issue(Command::Step(StepCall {
        step_id: id.clone(),
        name: def.name,
        input: stored_input,
        max_retries: def.max_retries,
        timeout: def.timeout,
        transactional,
        body: exec,
    }));
    let value = match ctx.wait(Key::Step(id)).await {
        Ready::Step(result) => {
            let binding = places::of_run(ctx.owner(), places::STEP_ERROR, &place);
            result.map_err(|e| ctx.payloads.open_error(e, &binding))?
        }
        _ => return Err(mismatched_delivery(name)),
    };
    let cx = PayloadKind::StepResult { step: name }
        .of(ctx.run_id)
        .at(&place);
    match result.and_then(|r| r.lock().unwrap_or_else(|p| p.into_inner()).take()) {
        Some(known) => ctx.payloads.decode_known(&value, Some(&known), cx),
        None => ctx.payloads.decode(value, cx),
    }
    .map_err(PayloadError::fatal)
}

/// Sleeps durably: inside a workflow the wake-up time is recorded and survives restarts (a
/// long sleep lets the worker evict the run from memory); outside, it is `tokio::time::sleep`.
///
/// Cancellation-safe: a sleep dropped before it fires (e.g. the losing branch of a `select`)
/// consumes nothing.
pub async fn sleep(duration: Duration) {
    match current() {
        Some(ctx) => {
            // As long as representable: a sleep past the end of time waits for a cancel.
            let clock = ctx.journal().clock;
            let at = after(clock, duration);
            timer(ctx, at).await;
        }
        None => tokio::time::sleep(duration).await,
    }
}

/// Sleeps durably until `deadline` (see [`sleep`]).
pub async fn sleep_until(deadline: SystemTime) {
    match current() {
        Some(ctx) => timer(ctx, deadline).await,
        None => {
            let d = deadline
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::time::sleep(d).await;
        }
    }
}

async fn timer(ctx: Arc<RunCtx>, fire_at: SystemTime) {
    let id = {
        let mut j = ctx.journal();
        let id = TimerId(j.timers);
        j.timers += 1;
        j.issued.push(Command::Timer {
            timer_id: id,
            fire_at,
        });
        id
    };
    // A timer's delivery carries no value and cannot fail.
    let _ = ctx.wait(Key::Timer(id)).await;
}

/// Whether this run takes the path added by patch `id`: lets a new build change a
/// workflow while runs of the old code are in flight.
///
/// `true` when the run reaches this call live (a marker is recorded in its history) or
/// replays a history holding the marker here; `false` when it replays a history recorded
/// before the patch existed (nothing is recorded). Later calls with the same id in the same
/// run give the same answer. Outside a workflow: `true`.
///
/// The recipe: put the new code under `if patched("id")` and keep the old path in the `else`,
/// deploy, wait until no open run started before the deploy (`workflow runs --status
/// running`), then remove the old path and the call (the marker stays in old histories and is
/// ignored only if the call is gone from every code path that reaches it, so remove both
/// together, in one deploy, after the last old run ended).
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn charge(order: u64) -> Result<u64> { Ok(order) }
/// #[step]
/// async fn charge_with_tax(order: u64) -> Result<u64> { Ok(order * 2) }
///
/// #[workflow]
/// async fn checkout(order: u64) -> Result<u64> {
///     if patched("tax-2026") {
///         charge_with_tax(order).await
///     } else {
///         charge(order).await
///     }
/// }
/// # assert!(workflow_core::patched("outside a workflow"));
/// ```
pub fn patched(id: &str) -> bool {
    let Some(ctx) = current() else {
        return true;
    };
    let mut j = ctx.journal();
    if let Some(answer) = j.patched.get(id) {
        return *answer;
    }
    let at = j.taken + j.issued.iter().filter(|c| is_recorded(c)).count();
    let answer = if at < j.patches.recorded {
        // Replaying: the marker is here, or the history predates the patch.
        j.patches.markers.get(&at).is_some_and(|m| m == id)
    } else {
        true
    };
    if answer {
        j.issued.push(Command::Patch {
            patch_id: id.to_owned(),
        });
    }
    j.patched.insert(id.to_owned(), answer);
    answer
}

/// The current time. Inside a workflow: the time of the last event delivered to it (the run's
/// start before any), the same on every replay. Elsewhere: the wall clock.
pub fn now() -> SystemTime {
    match current() {
        Some(ctx) => ctx.journal().clock,
        None => SystemTime::now(),
    }
}

/// A random value. Inside a workflow: from a generator seeded by the run id, so replay draws
/// the same sequence. Elsewhere: from the thread's generator.
///
/// ```
/// let roll: u8 = workflow_core::random();
/// let coin: bool = workflow_core::random();
/// # let _ = (roll, coin);
/// ```
pub fn random<T>() -> T
where
    StandardUniform: Distribution<T>,
{
    match current() {
        Some(ctx) => ctx.journal().rng.random(),
        None => rand::random(),
    }
}

/// Facts about the running step attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMetadata {
    /// Stable across retries and replays; use it as an idempotency key.
    pub step_id: String,
    /// The step's registered name.
    pub step_name: String,
    /// The run the step belongs to.
    pub run_id: RunId,
    /// From 1.
    pub attempt: u32,
    /// When this attempt started.
    pub started_at: SystemTime,
}

/// Facts about the running workflow.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn fetch(i: u32) -> Result<String> { Ok(format!("page {i}")) }
///
/// #[workflow]
/// async fn crawl() -> Result<Vec<(u64, u64)>> {
///     let mut seen = vec![];
///     for i in 0..3 {
///         fetch(i).await?;
///         let m = workflow_metadata();
///         seen.push((m.history_events, m.history_bytes));
///     }
///     Ok(seen)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let seen = rt.start(crawl, ()).await?.return_value().await?;
/// // Each call adds its scheduling (the arguments `[0]`: 3 bytes) and its result
/// // (`"page 0"`: 8 bytes).
/// assert_eq!(seen, [(2, 11), (4, 22), (6, 33)]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowMetadata {
    /// The run.
    pub run_id: RunId,
    /// The workflow's registered name.
    pub workflow_name: String,
    /// When the run was admitted, or its start when that was later (`start(..).delay(d)`);
    /// `now()` in the workflow begins here.
    pub started_at: SystemTime,
    /// How many events the run's history holds up to the point the body has reached: up to
    /// the last result delivered to it (a step's result, a timer's firing, a payload, ...),
    /// that one included, whatever this execution appended on the way (steps' schedulings,
    /// retries). The same at the same point on every replay; it grows as the run goes on.
    /// 0 before the first delivery.
    pub history_events: u64,
    /// The bytes of payloads those events hold, as the workflow wrote them: each value's JSON
    /// text (step arguments and results, hook payloads, messages, requests and replies,
    /// events, children's results) and each error's message, counted before any `Codec` or
    /// encryption, so the figure is the same on every store, with or without keys, and after
    /// `workflow rekey`. Names, ids and times are not counted.
    pub history_bytes: u64,
}

/// The metadata of the step attempt running now, or `None` outside a recorded step.
pub fn try_step_metadata() -> Option<StepMetadata> {
    STEP.try_with(|m| m.clone()).ok()
}

/// The metadata of the step attempt running now.
///
/// # Panics
/// Outside a step executed by a runtime (in a workflow body, or a step called as a plain fn);
/// use [`try_step_metadata`] where that can happen.
pub fn step_metadata() -> StepMetadata {
    try_step_metadata().expect(
        "step_metadata() was called outside a step executed by a workflow runtime; \
         call it inside a #[step] fn invoked from a #[workflow], or use try_step_metadata()",
    )
}

/// The metadata of the running workflow, or `None` outside one.
pub fn try_workflow_metadata() -> Option<WorkflowMetadata> {
    current().map(|c| {
        let history = c.journal().history;
        WorkflowMetadata {
            run_id: c.run_id,
            workflow_name: c.workflow.to_owned(),
            started_at: c.started_at,
            history_events: history.events,
            history_bytes: history.bytes,
        }
    })
}

/// Whether the run's history is past the soft limit
/// ([`RuntimeBuilder::history_limits`](crate::RuntimeBuilder::history_limits), default 10,000
/// events or 10 MiB of payloads) at the point the body has reached: time to end the run with
/// `continue_as_new`, carrying its state as the next run's arguments, before the hard limit
/// (5 times as large) fails it. The same answer at the same point on every replay (see
/// [`WorkflowMetadata::history_events`]). Outside a workflow: `false`.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn check(i: u64) -> Result<u64> { Ok(i + 1) }
///
/// #[workflow]
/// async fn watch(from: u64) -> Result<u64> {
///     let mut i = from;
///     while !continue_as_new_suggested() {
///         i = check(i).await?;
///     }
///     // Here a run that watches for ever would `return continue_as_new(watch, (i,)).await;`
///     Ok(i)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().history_limits(100, 1 << 20).build().await?;
/// let reached = rt.start(watch, (0,)).await?.return_value().await?;
/// assert_eq!(reached, 51); // 51 calls: 102 events, past 100
/// assert!(!continue_as_new_suggested());
/// # Ok(())
/// # }
/// ```
pub fn continue_as_new_suggested() -> bool {
    current().is_some_and(|c| {
        let history = c.journal().history;
        c.limits.past(history).is_some()
    })
}

/// The metadata of the running workflow.
///
/// # Panics
/// Outside a workflow body run by a runtime; use [`try_workflow_metadata`] where that can happen.
pub fn workflow_metadata() -> WorkflowMetadata {
    try_workflow_metadata().expect(
        "workflow_metadata() was called outside a workflow run by a runtime; \
         use try_workflow_metadata() where that can happen",
    )
}

mod hooks;
pub use hooks::*;
