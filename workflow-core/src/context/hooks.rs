//! Hooks as code inside a run sees them: `create_hook`, the typed [`Hook`] handle (its
//! payloads as a `Stream`, its release on drop) and the checks of tokens.

use super::*;

/// Tokens are non-empty UTF-8 of at most this many bytes.
pub(crate) const MAX_TOKEN_BYTES: usize = 1024;

/// Why `token` cannot be a hook token, if it cannot: tokens are non-empty UTF-8 of at most
/// [`MAX_TOKEN_BYTES`] without control characters (NUL, escapes, line breaks), which some
/// databases refuse and terminals act on.
pub(crate) fn invalid_token(token: &str) -> Option<String> {
    if token.is_empty() {
        Some("a hook token must not be empty".to_owned())
    } else if token.len() > MAX_TOKEN_BYTES {
        Some(format!(
            "a hook token must be at most {MAX_TOKEN_BYTES} bytes; this one has {} (it starts with {:?})",
            token.len(),
            token.chars().take(32).collect::<String>()
        ))
    } else if let Some((at, c)) = token.char_indices().find(|(_, c)| c.is_control()) {
        Some(format!(
            "a hook token must not contain control characters; this one has {c:?} at byte {at}"
        ))
    } else {
        None
    }
}

/// A delivery of the wrong kind under a key: the keys are typed, so only a bug gets here, and
/// it fails the call instead of panicking in the workflow.
pub(crate) fn mismatched_delivery(what: &str) -> Error {
    Error::fatal(format!(
        "internal error: `{what}` received a result of another kind; please report this"
    ))
}

/// The run that owns a token another hook asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HookConflict {
    /// The owner.
    pub run_id: RunId,
}

enum HookState {
    Unregistered,
    Registering(WaitFor),
    Owned,
    Conflict(RunId),
    Released,
    Invalid(String),
    Outside,
}

/// A hook: the way data from the outside world (`resume_hook(token, payload)`) reaches a
/// running workflow. Created with [`create_hook`]; see its docs.
///
/// Receive payloads with [`Hook::recv`] or as a `futures::Stream`. Dropping the hook (or
/// [`Hook::dispose`]) releases its token; so does the end of the run.
#[must_use = "a hook registers nothing until awaited, and releases its token when dropped"]
pub struct Hook<T> {
    ctx: Option<Arc<RunCtx>>,
    /// `None` outside a workflow.
    key: Option<HookKey>,
    token: String,
    state: HookState,
    /// The stream ended (after yielding a registration error once).
    ended: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Hook<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("token", &self.token)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Creates a hook receiving payloads of type `T` sent to `token`.
///
/// Creating registers nothing. Awaiting [`Hook::get_conflict`], or first waiting for a payload,
/// commits the registration: at most one active hook in the whole store owns a token. If
/// another run owns it, `get_conflict()` names that run and `recv()` fails with a
/// [`HookConflictError`]. If the run was started with `start(..).hook(token)`, a hook with that
/// token binds to the claimed token: no conflict is possible and nothing is recorded.
///
/// A token is any non-empty UTF-8 string of at most 1 KiB; choose it from your domain
/// (`format!("order:{order_id}")`) so that duplicate requests meet on it.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// pub struct Approval { approved: bool }
///
/// #[workflow]
/// async fn expense(id: String) -> Result<bool> {
///     let mut approval = create_hook::<Approval>(format!("expense:{id}"));
///     if let Some(conflict) = approval.get_conflict().await {
///         return Err(Error::fatal(format!("expense {id} is handled by run {}", conflict.run_id)));
///     }
///     let Approval { approved } = approval.recv().await?;
///     Ok(approved)
/// }
/// ```
pub fn create_hook<T>(token: impl Into<String>) -> Hook<T> {
    let token = token.into();
    let ctx = current();
    let key = match &ctx {
        Some(c) => {
            let mut j = c.journal();
            let key = HookKey(j.hooks);
            j.hooks += 1;
            Some(key)
        }
        None => None,
    };
    let state = match (&ctx, invalid_token(&token)) {
        (None, _) => HookState::Outside,
        (_, Some(why)) => HookState::Invalid(why),
        (Some(c), None) => {
            let mut j = c.journal();
            if !j.start_token_used && c.start_token.as_deref() == Some(token.as_str()) {
                j.start_token_used = true;
                j.open_tokens.insert(token.clone());
                HookState::Owned
            } else {
                HookState::Unregistered
            }
        }
    };
    Hook {
        ctx,
        key,
        token,
        state,
        ended: false,
        _t: PhantomData,
    }
}

/// Creates a hook with a generated token, unique to this run and the same on every replay
/// (`<run id>:hk_<n>`); read it with [`Hook::token`] and hand it to whoever will resume it.
pub fn create_generated_hook<T>() -> Hook<T> {
    match current() {
        Some(c) => {
            let n = c.journal().hooks;
            create_hook(format!("{}:{}", c.run_id, HookKey(n)))
        }
        None => create_hook("outside-a-workflow"),
    }
}

impl<T> Hook<T> {
    /// The hook's token.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn registration_error(&self) -> Option<Error> {
        match &self.state {
            HookState::Conflict(owner) => Some(Error::hook_conflict(HookConflictError {
                token: self.token.clone(),
                conflicting_run_id: *owner,
            })),
            HookState::Invalid(why) => Some(Error::fatal(why.clone())),
            HookState::Outside => Some(Error::fatal(
                "create_hook() was called outside a workflow; hooks exist only inside `#[workflow]` fns",
            )),
            HookState::Released => Some(Error::fatal(format!(
                "hook {:?} was disposed",
                self.token
            ))),
            _ => None,
        }
    }

    /// Drives the registration; `Ok` once this run owns the token.
    fn poll_registration(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            match &mut self.state {
                HookState::Owned => return Poll::Ready(Ok(())),
                HookState::Unregistered => {
                    let (Some(ctx), Some(key)) = (&self.ctx, self.key) else {
                        self.state = HookState::Outside;
                        continue;
                    };
                    ctx.issue(Command::HookRegister {
                        hook_key: key,
                        token: self.token.clone(),
                    });
                    self.state = HookState::Registering(ctx.wait(Key::Hook(key)));
                }
                HookState::Registering(wait) => {
                    let delivered = match Pin::new(wait).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(v) => v,
                    };
                    self.state = match delivered {
                        Ready::Registered(None) => HookState::Owned,
                        Ready::Registered(Some(owner)) => HookState::Conflict(owner),
                        _ => HookState::Invalid(mismatched_delivery("create_hook").to_string()),
                    };
                }
                _ => {
                    let e = self
                        .registration_error()
                        .unwrap_or_else(|| Error::fatal("hook in an unexpected state"));
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// Commits the registration (if not yet done) and tells whether another run owns the
    /// token: `None` when this run owns it.
    ///
    /// # Panics
    /// When the token is empty or longer than 1 KiB, or the hook was created outside a
    /// workflow: inside a workflow this fails the run with that message.
    pub async fn get_conflict(&mut self) -> Option<HookConflict> {
        let r = std::future::poll_fn(|cx| self.poll_registration(cx)).await;
        match (r, &self.state) {
            (Ok(()), _) => None,
            (Err(_), HookState::Conflict(owner)) => Some(HookConflict { run_id: *owner }),
            (Err(e), _) => panic!("{e}"),
        }
    }

    /// Gives up the token now (dropping the hook does the same).
    pub fn dispose(self) {}
}

impl<T: serde::de::DeserializeOwned> Hook<T> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        if let Err(e) = std::task::ready!(self.poll_registration(cx)) {
            return Poll::Ready(Err(e));
        }
        let Some(ctx) = &self.ctx else {
            return Poll::Ready(Err(Error::fatal("hook used outside a workflow")));
        };
        let mut j = ctx.journal();
        match j
            .payloads
            .get_mut(&self.token)
            .and_then(VecDeque::pop_front)
        {
            Some((_, v)) => {
                drop(j);
                let cx = PayloadKind::HookPayload { token: &self.token }.of(ctx.run_id);
                Poll::Ready(ctx.payloads.decode(v, cx).map_err(PayloadError::fatal))
            }
            None => {
                j.waiters
                    .insert(Key::Payload(self.token.clone()), cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The next payload, in the order the `resume_hook` calls committed. Registers the hook
    /// first if needed.
    ///
    /// Cancellation-safe: a `recv()` dropped before it resolves (e.g. the losing branch of a
    /// `select` against a `sleep`) consumes nothing; the payload goes to the next `recv()`.
    ///
    /// Errors: the token is owned by another run ([`Error::as_hook_conflict`] is `Some`), the
    /// payload does not deserialize into `T` (the run decides what to do; the raw payload stays
    /// in the history), or the token is invalid.
    pub async fn recv(&mut self) -> Result<T, Error> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T: serde::de::DeserializeOwned> futures::Stream for Hook<T> {
    type Item = Result<T, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match this.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(v)) => Poll::Ready(Some(Ok(v))),
            Poll::Ready(Err(e)) => {
                // A hook that cannot register yields its error once and ends; a payload that
                // does not fit is reported and the stream goes on.
                if this.registration_error().is_some() {
                    this.ended = true;
                }
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

/// Ends only after yielding the error of a registration that failed; polled again after
/// that it yields `None`.
impl<T: serde::de::DeserializeOwned> futures::stream::FusedStream for Hook<T> {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl<T> Unpin for Hook<T> {}

impl<T> Drop for Hook<T> {
    fn drop(&mut self) {
        let (Some(ctx), Some(key)) = (&self.ctx, self.key) else {
            return;
        };
        match std::mem::replace(&mut self.state, HookState::Released) {
            HookState::Owned => {
                let mut j = ctx.journal();
                j.open_tokens.remove(&self.token);
                j.issued.push(Command::HookRelease {
                    hook_key: key,
                    token: self.token.clone(),
                });
            }
            HookState::Registering(_) => {
                ctx.journal().abandoned.insert(key);
            }
            _ => {}
        }
    }
}
