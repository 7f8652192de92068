//! The in-process start flight: concurrent `.hook(token)` starts of one token in this process
//! follow the first one instead of contending for the token in the store.

use std::sync::Arc;

use tokio::sync::watch;

use super::Inner;
use crate::ids::RunId;

impl Inner {
    /// Joins the start of `token` in flight in this process, or becomes it.
    pub(super) fn join_start(self: &Arc<Self>, token: &str) -> Joined {
        let mut starting = crate::sync::lock(&self.starting);
        if let Some(flight) = starting.get(token) {
            return Joined::Follow(flight.clone());
        }
        let (tx, rx) = watch::channel(None);
        starting.insert(token.to_owned(), rx);
        Joined::Lead(StartFlight {
            inner: self.clone(),
            token: token.to_owned(),
            owner: tx,
        })
    }
}

/// A `.hook(token)` start while no other start of `token` is in flight in this process. Starts
/// of the same token that arrive meanwhile (a storm of duplicate requests) follow it instead of
/// contending for the token in the store: when it learns the token's owner (its own new run,
/// or the run that already held the token) they fail with the same
/// [`HookConflictError`](crate::HookConflictError) it would have met, and when it fails or is
/// dropped they go to the store themselves. Each follower was waiting while the leader's
/// admission was in flight, so the owner it is told of held the token within the follower's
/// own call, as if it had contended in the store.
pub(super) struct StartFlight {
    inner: Arc<Inner>,
    token: String,
    owner: watch::Sender<Option<RunId>>,
}

impl StartFlight {
    /// Ends the flight: the token's owner is `owner`.
    pub(super) fn land(self, owner: RunId) {
        // Out of the map first, so a start arriving from now on asks the store.
        self.leave();
        self.owner.send_replace(Some(owner));
    }

    /// Removes this flight from the map, unless a later one has replaced it.
    fn leave(&self) {
        let mut starting = crate::sync::lock(&self.inner.starting);
        if starting
            .get(&self.token)
            .is_some_and(|rx| rx.same_channel(&self.owner.subscribe()))
        {
            starting.remove(&self.token);
        }
    }
}

impl Drop for StartFlight {
    fn drop(&mut self) {
        // Failed or dropped without an answer: the followers, woken when the sender goes
        // right after, ask the store themselves.
        self.leave();
    }
}

/// What a `.hook(token)` start does about the flight of its token.
pub(super) enum Joined {
    /// No start of the token is in flight here: this one leads.
    Lead(StartFlight),
    /// Another start leads: wait for the owner it learns.
    Follow(watch::Receiver<Option<RunId>>),
}
