//! The driver of one leased run: replays its recorded history, then runs it live.
//!
//! The workflow future stays in memory for as long as the run is active, so a run of n steps
//! costs O(n); replay happens only when a run is picked up (after a restart, a takeover, or an
//! eviction during a long sleep).
//!
//! Results reach the workflow one at a time, in history order, and the workflow is polled until
//! it is quiescent before the next one: live runs record results in the order they were
//! delivered, and replay delivers them in that same order, so a `select` picks the same branch
//! on every replay. Commands the workflow issues are checked against the recorded ones in
//! order; a mismatch stops the run with a divergence error and writes no event.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::SystemTime;

use futures::task::AtomicWaker;
use futures::FutureExt;
use serde_json::Value;
use tokio::sync::{mpsc, Notify};
use tracing::Instrument;

use crate::context::{step_scope, Command, RunCtx, StepExec, StepMetadata};
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::registry::{StepDef, WorkflowRegistration};
use crate::runtime::Inner;
use crate::store::{
    from_millis, never, to_millis, Append, ClaimOutcome, Event, Lease, LeasedRun, NewEvent,
    Payload, RunOutcome,
};

/// A recorded command, for the divergence check.
#[derive(Debug)]
enum Recorded {
    Step {
        step_id: String,
        name: String,
    },
    Timer {
        timer_id: String,
        fire_at: SystemTime,
    },
    Hook {
        hook_key: String,
        token: String,
    },
}

impl Recorded {
    fn key(&self) -> &str {
        match self {
            Recorded::Step { step_id, .. } => step_id,
            Recorded::Timer { timer_id, .. } => timer_id,
            Recorded::Hook { hook_key, .. } => hook_key,
        }
    }

    fn describe(&self) -> String {
        match self {
            Recorded::Step { step_id, name } => format!("step `{name}` ({step_id})"),
            Recorded::Timer { timer_id, .. } => format!("sleep ({timer_id})"),
            Recorded::Hook { hook_key, token } => format!("hook {token:?} ({hook_key})"),
        }
    }
}

fn describe(cmd: &Command) -> String {
    match cmd {
        Command::Step { step_id, def, .. } => format!("step `{}` ({step_id})", def.name),
        Command::Timer { timer_id, .. } => format!("sleep ({timer_id})"),
        Command::HookRegister { hook_key, token } => format!("hook {token:?} ({hook_key})"),
        Command::HookRelease { hook_key, token } => {
            format!("release of hook {token:?} ({hook_key})")
        }
    }
}

/// A recorded result, delivered to the workflow in history order.
#[derive(Debug)]
enum Delivery {
    /// A step's result or a timer's firing, under the command's key.
    Keyed {
        key: String,
        at: SystemTime,
        result: Result<Value, Error>,
    },
    /// The decision on a hook's registration.
    Registered {
        hook_key: String,
        token: String,
        at: SystemTime,
        conflict: Option<RunId>,
    },
    /// A payload for a hook.
    Payload {
        token: String,
        at: SystemTime,
        payload: Value,
    },
}

/// Where an interrupted step resumes.
#[derive(Default, Clone, Copy)]
struct Attempts {
    /// The last attempt that started.
    started: u32,
    /// When the last attempt failed with a retry scheduled: the earliest next start.
    retry_at: Option<SystemTime>,
}

/// The history, split for replay.
struct History {
    commands: Vec<Recorded>,
    deliveries: VecDeque<Delivery>,
    /// The keys of keyed `deliveries`, for O(1) look-ups while replaying.
    delivered: HashSet<String>,
    attempts: HashMap<String, Attempts>,
    /// Inbox ids of the payloads already delivered.
    payloads: HashSet<u64>,
    /// Hook keys whose release is recorded.
    released: HashSet<String>,
}

impl History {
    fn parse(events: Vec<crate::store::EventRecord>) -> History {
        let mut h = History {
            commands: Vec::new(),
            deliveries: VecDeque::new(),
            delivered: HashSet::new(),
            attempts: HashMap::new(),
            payloads: HashSet::new(),
            released: HashSet::new(),
        };
        for rec in events {
            match rec.event {
                Event::StepScheduled { step_id, name, .. } => {
                    h.attempts.insert(
                        step_id.clone(),
                        Attempts {
                            started: 1,
                            retry_at: None,
                        },
                    );
                    h.commands.push(Recorded::Step { step_id, name });
                }
                Event::StepAttemptStarted { step_id, attempt } => {
                    let a = h.attempts.entry(step_id).or_default();
                    a.started = a.started.max(attempt);
                    a.retry_at = None;
                }
                Event::StepAttemptFailed {
                    step_id,
                    attempt,
                    retry_at_ms,
                    ..
                } => {
                    let a = h.attempts.entry(step_id).or_default();
                    if attempt >= a.started {
                        a.retry_at = Some(from_millis(retry_at_ms));
                    }
                }
                Event::StepCompleted { step_id, result } => {
                    h.delivered.insert(step_id.clone());
                    h.deliveries.push_back(Delivery::Keyed {
                        key: step_id,
                        at: rec.at,
                        result,
                    });
                }
                Event::TimerScheduled {
                    timer_id,
                    fire_at_ms,
                } => h.commands.push(Recorded::Timer {
                    timer_id,
                    fire_at: from_millis(fire_at_ms),
                }),
                Event::TimerFired { timer_id } => {
                    h.delivered.insert(timer_id.clone());
                    h.deliveries.push_back(Delivery::Keyed {
                        key: timer_id,
                        at: rec.at,
                        result: Ok(Value::Null),
                    });
                }
                Event::HookRegistered {
                    hook_key,
                    token,
                    conflict,
                } => {
                    h.delivered.insert(hook_key.clone());
                    h.commands.push(Recorded::Hook {
                        hook_key: hook_key.clone(),
                        token: token.clone(),
                    });
                    h.deliveries.push_back(Delivery::Registered {
                        hook_key,
                        token,
                        at: rec.at,
                        conflict,
                    });
                }
                Event::HookReceived {
                    token,
                    payload_id,
                    payload,
                } => {
                    h.payloads.insert(payload_id);
                    h.deliveries.push_back(Delivery::Payload {
                        token,
                        at: rec.at,
                        payload,
                    });
                }
                Event::HookReleased { hook_key, .. } => {
                    h.released.insert(hook_key);
                }
                Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled => {}
            }
        }
        h
    }
}

/// Wakes the driver when anything inside the workflow future is woken.
struct FlagWaker {
    /// Set by a wake, cleared before each poll of the workflow future.
    woken: AtomicBool,
    /// The driver's task while it waits in its `select!`.
    driver: AtomicWaker,
}

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.driver.wake();
    }
}

impl FlagWaker {
    /// Ready once the workflow future was woken after its last poll. (A wake during a poll is
    /// already handled by polling again, so unlike a stored `Notify` permit it costs no extra
    /// round of the driver's loop.)
    fn woken(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            self.driver.register(cx.waker());
            if self.woken.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

type WorkflowFuture = Pin<Box<dyn Future<Output = Result<Value, Error>> + Send>>;

/// Why the driver stopped without recording an end.
enum Stop {
    /// Cancelled, lease lost, or runtime shut down: another party owns what happens next.
    Abandoned,
    /// Evicted: given back to the store until its wake time or next payload.
    Evicted,
}

pub(crate) struct Driver {
    rt: Arc<Inner>,
    lease: Lease,
    ctx: Arc<RunCtx>,
    history: History,
    /// Index of the next recorded command to match.
    matched: usize,
    /// Keys issued and not yet delivered.
    waiting: HashSet<String>,
    /// Events and token releases to make durable before the next effect.
    outbox: Vec<NewEvent>,
    releases: Vec<String>,
    /// Live steps to start once the outbox is durable: (step_id, def, exec, input, attempts).
    to_start: Vec<(String, &'static StepDef, StepExec, Value, Attempts)>,
    /// Live hook registrations to decide: (hook_key, token).
    to_claim: VecDeque<(String, String)>,
    timers: BTreeSet<(SystemTime, String)>,
    steps_running: HashMap<String, tokio::task::AbortHandle>,
    done_tx: mpsc::UnboundedSender<(String, Result<Value, Error>)>,
    done_rx: mpsc::UnboundedReceiver<(String, Result<Value, Error>)>,
    /// Payloads fetched from the inbox and not yet delivered, in id order.
    inbox: VecDeque<Payload>,
    /// The highest inbox id fetched.
    inbox_seen: u64,
}

/// What the driver is told from outside while it runs.
pub(crate) struct Signals {
    /// Stop driving (cancelled, lease lost, shutdown).
    pub(crate) stop: Arc<Notify>,
    /// The run's inbox may hold new payloads.
    pub(crate) inbox: Arc<Notify>,
}

impl Driver {
    /// Drives `leased` until it ends, is evicted, or is abandoned.
    pub(crate) async fn run(
        rt: Arc<Inner>,
        leased: LeasedRun,
        reg: &'static WorkflowRegistration,
        signals: Signals,
    ) {
        let run_id = leased.run.id;
        let span = tracing::info_span!("workflow_run", %run_id, workflow = reg.name);
        let ctx = RunCtx::new(
            run_id,
            reg.name,
            leased.run.created_at,
            leased.run.hook_token.clone(),
        );
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let mut d = Driver {
            rt,
            lease: leased.lease,
            ctx,
            history: History::parse(leased.events),
            matched: 0,
            waiting: HashSet::new(),
            outbox: Vec::new(),
            releases: Vec::new(),
            to_start: Vec::new(),
            to_claim: VecDeque::new(),
            timers: BTreeSet::new(),
            steps_running: HashMap::new(),
            done_tx,
            done_rx,
            inbox: VecDeque::new(),
            inbox_seen: 0,
        };
        // A fresh run without a start token owns no hook yet, so its inbox is empty.
        let fresh = leased.run.hook_token.is_none() && d.history.commands.is_empty();
        let result = async {
            if !fresh {
                d.fetch_payloads().await?;
            }
            let fut: Result<WorkflowFuture, Error> = (reg.run)(leased.run.input.clone())
                .map(|f| Box::pin(d.ctx.scope(f)) as WorkflowFuture);
            match fut {
                Ok(fut) => d.drive(fut, &signals).await,
                Err(e) => d.finish(Err(e)).await.map(|_| None),
            }
        }
        .instrument(span)
        .await;
        for (_, h) in d.steps_running.drain() {
            h.abort();
        }
        let evicted = matches!(result, Ok(Some(Stop::Evicted)));
        match result {
            Ok(_) => {}
            Err(StoreError::LeaseLost(_)) => {
                tracing::debug!(%run_id, "lease lost; the run is no longer driven here");
            }
            Err(e) => tracing::warn!(%run_id, error = %e, "run driver stopped on a store error"),
        }
        d.rt.run_left(&run_id);
        if evicted {
            // A payload that arrived since the release made the run due, and found it still
            // listed here: now that it has left, any worker may take it.
            d.rt.work.notify_one();
        }
    }

    /// Reads new payloads from the run's inbox (those not delivered by the history).
    async fn fetch_payloads(&mut self) -> Result<(), StoreError> {
        let fresh = self
            .rt
            .store
            .payloads(&self.ctx.run_id, self.inbox_seen)
            .await?;
        for p in fresh {
            self.inbox_seen = self.inbox_seen.max(p.id);
            if !self.history.payloads.contains(&p.id) {
                self.inbox.push_back(p);
            }
        }
        Ok(())
    }

    async fn drive(
        &mut self,
        mut fut: WorkflowFuture,
        signals: &Signals,
    ) -> Result<Option<Stop>, StoreError> {
        let flag = Arc::new(FlagWaker {
            woken: AtomicBool::new(false),
            driver: AtomicWaker::new(),
        });
        let waker = Waker::from(flag.clone());
        loop {
            // Poll to quiescence.
            let polled = loop {
                flag.woken.store(false, Ordering::Release);
                let mut cx = Context::from_waker(&waker);
                let p = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)));
                match p {
                    Ok(Poll::Pending) if flag.woken.load(Ordering::Acquire) => continue,
                    Ok(Poll::Pending) => break None,
                    Ok(Poll::Ready(r)) => break Some(r),
                    Err(panic) => {
                        break Some(Err(Error::panicked(format!(
                            "workflow `{}` panicked: {}",
                            self.ctx.workflow,
                            panic_message(&panic)
                        ))))
                    }
                }
            };
            if let Err(e) = self.take_commands() {
                return self.diverge(e).await.map(|_| None);
            }
            if let Some(result) = polled {
                if let Some(next) = self.history.commands.get(self.matched) {
                    let e = format!(
                        "the workflow returned where its history expects {}",
                        next.describe()
                    );
                    return self.diverge(e).await.map(|_| None);
                }
                if !self.history.deliveries.is_empty() {
                    let e = "the workflow returned before its whole history was replayed";
                    return self.diverge(e.to_owned()).await.map(|_| None);
                }
                self.finish(result).await?;
                return Ok(None);
            }
            // Replay: deliver the next recorded result.
            if let Some(delivery) = self.history.deliveries.pop_front() {
                if let Err(e) = self.deliver_recorded(delivery) {
                    return self.diverge(e).await.map(|_| None);
                }
                continue;
            }
            // Live: make the commands durable, then act on them.
            self.flush().await?;
            self.start_pending();
            if let Some((hook_key, token)) = self.to_claim.pop_front() {
                let at = SystemTime::now();
                let outcome = self
                    .rt
                    .store
                    .claim_hook(&self.lease, &hook_key, &token, at)
                    .await?;
                self.waiting.remove(&hook_key);
                let conflict = match outcome {
                    ClaimOutcome::Claimed => None,
                    ClaimOutcome::Conflict(owner) => Some(owner),
                };
                self.ctx
                    .deliver_registration(&hook_key, &token, at, conflict);
                continue;
            }
            if let Some(i) = self.inbox.iter().position(|p| self.ctx.is_open(&p.token)) {
                if let Some(p) = self.inbox.remove(i) {
                    let at = SystemTime::now();
                    self.outbox.push(NewEvent {
                        at,
                        event: Event::HookReceived {
                            token: p.token.clone(),
                            payload_id: p.id,
                            payload: p.payload.clone(),
                        },
                    });
                    self.ctx.deliver_payload(&p.token, at, p.payload);
                    continue;
                }
            }
            let idle = self.steps_running.is_empty();
            if idle {
                if let Some((first, _)) = self.timers.first() {
                    if *first > SystemTime::now() + self.rt.config.evict_after {
                        let first = *first;
                        return self.evict(first).await;
                    }
                }
            }
            let next_timer = self.timers.first().map(|t| t.0);
            let timer_sleep = async {
                match next_timer {
                    Some(at) => {
                        let d = at.duration_since(SystemTime::now()).unwrap_or_default();
                        tokio::time::sleep(d).await
                    }
                    None => std::future::pending().await,
                }
            };
            // A run with nothing in flight and nothing due soon waits in memory for a while,
            // then is evicted (a payload wakes it up again).
            let idle_evict = async {
                if idle {
                    tokio::time::sleep(self.rt.config.evict_after).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                biased;
                _ = signals.stop.notified() => return Ok(Some(Stop::Abandoned)),
                Some((key, result)) = self.done_rx.recv() => {
                    self.steps_running.remove(&key);
                    self.waiting.remove(&key);
                    let at = SystemTime::now();
                    self.outbox.push(NewEvent { at, event: Event::StepCompleted { step_id: key.clone(), result: result.clone() } });
                    self.ctx.deliver(&key, at, result);
                }
                _ = timer_sleep => {
                    // The first timer: nothing else touches `timers` while the driver waits.
                    if let Some((due, timer_id)) = self.timers.pop_first() {
                        self.waiting.remove(&timer_id);
                        let at = SystemTime::now().max(due);
                        self.ctx.deliver(&timer_id, at, Ok(Value::Null));
                        self.outbox.push(NewEvent { at, event: Event::TimerFired { timer_id } });
                    }
                }
                _ = signals.inbox.notified() => self.fetch_payloads().await?,
                _ = flag.woken() => {}
                _ = idle_evict => {
                    let wake = self.timers.first().map_or_else(never, |t| t.0);
                    return self.evict(wake).await;
                }
            }
        }
    }

    /// Writes what is pending and gives the run back until `wake_at` (or its next payload).
    async fn evict(&mut self, wake_at: SystemTime) -> Result<Option<Stop>, StoreError> {
        self.flush().await?;
        self.rt
            .store
            .release(&self.lease, wake_at, self.inbox_seen)
            .await?;
        Ok(Some(Stop::Evicted))
    }

    /// Hands one recorded result to the workflow; `Err` names a divergence.
    fn deliver_recorded(&mut self, delivery: Delivery) -> Result<(), String> {
        let key = match &delivery {
            Delivery::Keyed { key, .. } => Some(key),
            Delivery::Registered { hook_key, .. } => Some(hook_key),
            Delivery::Payload { .. } => None,
        };
        if let Some(key) = key {
            if !self.waiting.remove(key) {
                let expected = self
                    .history
                    .commands
                    .iter()
                    .find(|c| c.key() == key)
                    .map(Recorded::describe)
                    .unwrap_or_else(|| format!("`{key}`"));
                let mut found: Vec<&str> = self.waiting.iter().map(String::as_str).collect();
                found.sort_unstable();
                return Err(format!(
                    "its history delivers the result of {expected} next, but the workflow is waiting on {}",
                    if found.is_empty() { "nothing".to_owned() } else { found.join(", ") }
                ));
            }
        }
        match delivery {
            Delivery::Keyed { key, at, result } => self.ctx.deliver(&key, at, result),
            Delivery::Registered {
                hook_key,
                token,
                at,
                conflict,
            } => self
                .ctx
                .deliver_registration(&hook_key, &token, at, conflict),
            Delivery::Payload { token, at, payload } => {
                self.ctx.deliver_payload(&token, at, payload)
            }
        }
        Ok(())
    }

    /// Matches newly issued commands against the history; queues live ones.
    fn take_commands(&mut self) -> Result<(), String> {
        for cmd in self.ctx.take_issued() {
            let key = match &cmd {
                Command::Step { step_id, .. } => step_id.clone(),
                Command::Timer { timer_id, .. } => timer_id.clone(),
                Command::HookRegister { hook_key, .. } => hook_key.clone(),
                Command::HookRelease { hook_key, token } => {
                    // Releases are not results: record each once, skip recorded ones.
                    if !self.history.released.contains(hook_key) {
                        self.outbox.push(NewEvent {
                            at: SystemTime::now(),
                            event: Event::HookReleased {
                                hook_key: hook_key.clone(),
                                token: token.clone(),
                            },
                        });
                        self.releases.push(token.clone());
                    }
                    continue;
                }
            };
            let recorded = self.history.commands.get(self.matched);
            let replayed = match recorded {
                Some(rec) => {
                    let same = match (rec, &cmd) {
                        (
                            Recorded::Step { step_id, name },
                            Command::Step {
                                step_id: s, def, ..
                            },
                        ) => step_id == s && name == def.name,
                        (Recorded::Timer { timer_id, .. }, Command::Timer { timer_id: t, .. }) => {
                            timer_id == t
                        }
                        (
                            Recorded::Hook { hook_key, token },
                            Command::HookRegister {
                                hook_key: k,
                                token: t,
                            },
                        ) => hook_key == k && token == t,
                        _ => false,
                    };
                    if !same {
                        return Err(format!(
                            "its history expects {} next, but the workflow called {}",
                            rec.describe(),
                            describe(&cmd)
                        ));
                    }
                    self.matched += 1;
                    true
                }
                None => false,
            };
            self.waiting.insert(key.clone());
            let delivered_from_history = replayed && self.history.delivered.contains(&key);
            if delivered_from_history {
                continue;
            }
            match cmd {
                Command::Step {
                    step_id,
                    def,
                    input,
                    exec,
                } => {
                    let attempts = if replayed {
                        self.history
                            .attempts
                            .get(&step_id)
                            .copied()
                            .unwrap_or_default()
                    } else {
                        self.outbox.push(NewEvent {
                            at: SystemTime::now(),
                            event: Event::StepScheduled {
                                step_id: step_id.clone(),
                                name: def.name.to_owned(),
                                input: input.clone(),
                            },
                        });
                        Attempts {
                            started: 0,
                            retry_at: None,
                        }
                    };
                    self.to_start.push((step_id, def, exec, input, attempts));
                }
                Command::Timer { timer_id, fire_at } => {
                    let fire_at = if replayed {
                        match &self.history.commands[self.matched - 1] {
                            Recorded::Timer { fire_at, .. } => *fire_at,
                            _ => fire_at,
                        }
                    } else {
                        self.outbox.push(NewEvent {
                            at: SystemTime::now(),
                            event: Event::TimerScheduled {
                                timer_id: timer_id.clone(),
                                fire_at_ms: to_millis(fire_at),
                            },
                        });
                        fire_at
                    };
                    self.timers.insert((fire_at, timer_id));
                }
                Command::HookRegister { hook_key, token } => {
                    self.to_claim.push_back((hook_key, token));
                }
                Command::HookRelease { .. } => {}
            }
        }
        Ok(())
    }

    /// Makes the outbox durable.
    async fn flush(&mut self) -> Result<(), StoreError> {
        if self.outbox.is_empty() && self.releases.is_empty() {
            return Ok(());
        }
        let write = Append {
            events: std::mem::take(&mut self.outbox),
            release_tokens: std::mem::take(&mut self.releases),
            outcome: None,
        };
        self.rt.store.append(&self.lease, write).await
    }

    /// Starts the steps whose scheduling is durable.
    fn start_pending(&mut self) {
        for (step_id, def, exec, input, attempts) in self.to_start.drain(..) {
            let task = StepTask {
                rt: self.rt.clone(),
                lease: self.lease.clone(),
                run_id: self.ctx.run_id,
                step_id: step_id.clone(),
                def,
                exec,
                input,
                attempts,
                done: self.done_tx.clone(),
            };
            // In the run's span, so step spans are its children (one trace per run).
            let h = tokio::spawn(task.run().in_current_span());
            self.steps_running.insert(step_id, h.abort_handle());
        }
    }

    async fn finish(&mut self, result: Result<Value, Error>) -> Result<(), StoreError> {
        let at = SystemTime::now();
        let (event, outcome) = match result {
            Ok(v) => (
                Event::RunCompleted { output: v.clone() },
                RunOutcome::Completed(v),
            ),
            Err(e) => (Event::RunFailed { error: e.clone() }, RunOutcome::Failed(e)),
        };
        self.outbox.push(NewEvent { at, event });
        let write = Append {
            events: std::mem::take(&mut self.outbox),
            release_tokens: std::mem::take(&mut self.releases),
            outcome: Some(outcome),
        };
        self.rt.store.append(&self.lease, write).await?;
        self.rt.run_ended(self.ctx.run_id);
        Ok(())
    }

    /// Stops the run as failed without touching its history.
    async fn diverge(&mut self, what: String) -> Result<(), StoreError> {
        let msg = format!(
            "replay of run {} (workflow `{}`) diverged from its recorded history: {what}; \
             the code changed under a running workflow. The history was left as recorded.",
            self.ctx.run_id, self.ctx.workflow
        );
        tracing::error!(run_id = %self.ctx.run_id, "{msg}");
        self.rt
            .store
            .append(
                &self.lease,
                Append {
                    outcome: Some(RunOutcome::Failed(Error::diverged(msg))),
                    ..Append::default()
                },
            )
            .await?;
        self.rt.run_ended(self.ctx.run_id);
        Ok(())
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// Executes one step invocation: its attempts, retries and their records.
struct StepTask {
    rt: Arc<Inner>,
    lease: Lease,
    run_id: RunId,
    step_id: String,
    def: &'static StepDef,
    exec: StepExec,
    input: Value,
    attempts: Attempts,
    done: mpsc::UnboundedSender<(String, Result<Value, Error>)>,
}

impl StepTask {
    /// Appends one event about this step's attempts.
    async fn record(&self, event: Event) -> Result<(), StoreError> {
        let write = Append {
            events: vec![NewEvent {
                at: SystemTime::now(),
                event,
            }],
            ..Append::default()
        };
        self.rt.store.append(&self.lease, write).await
    }

    async fn run(self) {
        let result = self.attempts_loop().await;
        if let Ok(r) = result {
            let _ = self.done.send((self.step_id.clone(), r));
        }
    }

    /// The final result, or `Err` when the lease was lost (nothing more may be recorded).
    async fn attempts_loop(&self) -> Result<Result<Value, Error>, StoreError> {
        let max_attempts = self.def.max_retries.saturating_add(1);
        let mut attempt = self.attempts.started;
        let mut wait_until = self.attempts.retry_at;
        let mut last_error: Option<Error> = None;
        loop {
            if attempt == 0 {
                // Attempt 1 started with the durable `StepScheduled`.
                attempt = 1;
            } else {
                attempt += 1;
                if attempt > max_attempts {
                    return Ok(Err(last_error.unwrap_or_else(|| {
                        Error::retryable(format!(
                            "step `{}` ({}) was interrupted in each of its {max_attempts} attempts \
                             (its worker stopped while running it)",
                            self.def.name, self.step_id
                        ))
                    })));
                }
                if let Some(t) = wait_until.take() {
                    if let Ok(d) = t.duration_since(SystemTime::now()) {
                        tokio::time::sleep(d).await;
                    }
                }
                self.record(Event::StepAttemptStarted {
                    step_id: self.step_id.clone(),
                    attempt,
                })
                .await?;
            }
            let meta = StepMetadata {
                step_id: self.step_id.clone(),
                step_name: self.def.name.to_owned(),
                run_id: self.run_id,
                attempt,
                started_at: SystemTime::now(),
            };
            // One span per attempt, so exporters see each try with its own duration.
            let span = tracing::info_span!(
                "step",
                run_id = %self.run_id,
                step = self.def.name,
                step_id = %self.step_id,
                attempt,
            );
            let fut = (self.exec)(&self.input);
            let outcome = AssertUnwindSafe(crate::runtime::with_runtime(
                self.rt.clone(),
                step_scope(meta, fut),
            ))
            .catch_unwind()
            .instrument(span.clone())
            .await;
            let err = match outcome {
                Ok(Ok(v)) => return Ok(Ok(v)),
                Ok(Err(e)) => e,
                Err(panic) => Error::panicked(format!(
                    "step `{}` panicked: {}",
                    self.def.name,
                    panic_message(&panic)
                )),
            };
            span.in_scope(|| tracing::warn!(error = %err, "step attempt failed"));
            if !err.is_retryable() || attempt >= max_attempts {
                return Ok(Err(err));
            }
            let delay = err
                .retry_after_hint()
                .unwrap_or_else(|| self.rt.config.backoff(attempt));
            let retry_at = SystemTime::now() + delay;
            self.record(Event::StepAttemptFailed {
                step_id: self.step_id.clone(),
                attempt,
                error: err.clone(),
                retry_at_ms: to_millis(retry_at),
            })
            .await?;
            last_error = Some(err);
            wait_until = Some(retry_at);
        }
    }
}
