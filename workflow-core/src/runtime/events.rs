//! Reading what a run publishes with `set_event`: [`Run::event`] (its builder [`EventRead`],
//! and [`LatestEvent`] for `.latest()`) and [`Run::events`]. A waiting reader reads the
//! store, then waits for the run's change signal (the one stream readers use: a value set or
//! the run's end, here at once, from other processes by the store's notice) or the poll
//! interval, and reads again.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Run, StreamWatch};
use crate::crypto::places::Owner;
use crate::error::RunError;
use crate::ids::RunId;
use crate::payload::PayloadKind;
use crate::registry::BoxFuture;

impl<T> Run<T> {
    /// The value the run published last under `key` with
    /// [`set_event`](crate::set_event), read as a `U`. Await the returned builder: it waits
    /// until the key is set (woken at once in this process, by the store's notice or poll
    /// elsewhere), and fails with [`RunError::EventNotSet`] if the run ends without setting
    /// it. [`.latest()`](EventRead::latest) answers at once; [`.timeout(d)`](EventRead::timeout)
    /// bounds the wait ([`RunError::TimedOut`]).
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn progress() -> Result<()> {
    ///     for pct in [10, 60, 100] {
    ///         set_event("progress", &pct)?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(progress, ()).await?;
    /// run.return_value().await?;
    /// assert_eq!(run.event::<u32>("progress").await?, 100);
    /// assert_eq!(run.event::<u32>("other").latest().await?, None);
    /// let all = run.events().await?;
    /// assert_eq!(all["progress"], 100);
    /// # Ok(())
    /// # }
    /// ```
    pub fn event<U: DeserializeOwned>(&self, key: impl Into<String>) -> EventRead<U> {
        EventRead {
            run: self.untyped(),
            key: key.into(),
            timeout: None,
            _t: PhantomData,
        }
    }

    /// The latest value of every key the run published, by key.
    /// Of a run that continued as new, its chain's current run's.
    pub async fn events(&self) -> Result<BTreeMap<String, Value>, RunError> {
        let mut id = self.id;
        loop {
            let found = self.rt.inner.store.run_events(&id).await?;
            let found = found.ok_or(RunError::NotFound(id))?;
            if found.status == crate::RunStatus::ContinuedAsNew {
                if let Some(next) = super::messages::next_of(&self.rt.inner, id).await? {
                    id = next;
                    continue;
                }
            }
            return Ok(found.values);
        }
    }
}

/// A pending [`Run::event`]; await it for the value, waiting until it is set.
#[must_use = "an event is read only when awaited"]
pub struct EventRead<T> {
    run: Run<Value>,
    key: String,
    timeout: Option<Duration>,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for EventRead<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRead")
            .field("run", &self.run.id)
            .field("key", &self.key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> EventRead<T> {
    /// Waits at most `d` for the key to be set; then [`RunError::TimedOut`].
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// The value set last, or `None` when the key is not set: no wait.
    pub fn latest(self) -> LatestEvent<T> {
        LatestEvent { read: self }
    }

    /// One read: the value if set, the run's status, and the run read: the chain's current
    /// run when this one continued as new (its values go on with the chain).
    async fn read(&self) -> Result<(Option<T>, crate::RunStatus, RunId), RunError> {
        let mut id = self.run.id;
        let inner = &self.run.rt.inner;
        let found = loop {
            let Some(found) = inner.store.run_events(&id).await? else {
                return Err(RunError::NotFound(id));
            };
            if found.status == crate::RunStatus::ContinuedAsNew {
                if let Some(next) = super::messages::next_of(inner, id).await? {
                    id = next;
                    continue;
                }
            }
            break found;
        };
        let value = match found.values.get(&self.key) {
            None => None,
            Some(v) => {
                // Published values are the chain's, sealed for its first run.
                let owner = self.run.owner().await?;
                let owner = Owner::new(id, Some(owner.origin));
                let cx = PayloadKind::Event { key: &self.key }.of_run(owner);
                let decoded = inner.config.payloads.decode(v.clone(), cx);
                Some(decoded.map_err(|e| RunError::Payload(e.to_string()))?)
            }
        };
        Ok((value, found.status, id))
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for EventRead<T> {
    type Output = Result<T, RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let id = self.run.id;
            let deadline = self.timeout.map(|d| Instant::now().checked_add(d));
            let mut watch = StreamWatch::new(&self.run.rt.inner, id);
            let poll = self.run.rt.inner.config.poll_interval;
            let mut watched = id;
            loop {
                watch.seen();
                let (value, status, current) = self.read().await?;
                if current != watched {
                    watched = current;
                    watch = StreamWatch::new(&self.run.rt.inner, current);
                }
                if let Some(v) = value {
                    return Ok(v);
                }
                if status.is_terminal() {
                    return Err(RunError::EventNotSet {
                        id,
                        key: self.key,
                        status,
                    });
                }
                let wait = match deadline {
                    None | Some(None) => poll,
                    Some(Some(at)) => match at.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => left.min(poll),
                        _ => {
                            return Err(RunError::TimedOut {
                                id,
                                waited: self.timeout.unwrap_or_default(),
                            })
                        }
                    },
                };
                watch.changed(wait).await;
            }
        })
    }
}

/// A pending [`EventRead::latest`]; await it for the value set last, if any.
#[must_use = "an event is read only when awaited"]
#[derive(Debug)]
pub struct LatestEvent<T> {
    read: EventRead<T>,
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for LatestEvent<T> {
    type Output = Result<Option<T>, RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { Ok(self.read.read().await?.0) })
    }
}
