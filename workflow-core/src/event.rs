//! Values a run publishes while it goes on: [`set_event`] in a workflow body records the
//! latest value of a key, which readers outside the run get with `run.event::<T>(key)`
//! (waiting until it is set) or `run.events()`.
//!
//! A `set_event` is recorded in the run's history (numbered per run, so a replay records it
//! once and a fork's copy records it again) and written to the store's table of latest
//! values in the same transaction; readers are woken like stream readers.

use serde::Serialize;

use crate::context::Publisher;
use crate::error::Error;
use crate::message::invalid_name;
use crate::payload::{PayloadError, PayloadKind};

/// Publishes `value` as the run's latest value of `key`: readers waiting in
/// `run.event::<T>(key)` get it, and `run.events()` lists it, also after the run ended.
///
/// In a workflow body it is recorded with the run's next write, once: on replay the call
/// records nothing again. In a step (or a plain fn a step calls) the value is recorded with
/// the attempt's outcome, its result or its failure, in the same write, and readers see it
/// then; a replayed step publishes nothing again, and a retried attempt publishes anew.
/// Outside a run it is an error.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[workflow]
/// async fn checkout(order: String) -> Result<String> {
///     set_event("payment_url", &format!("https://pay.example/{order}"))?;
///     let paid = recv::<bool>("paid").await?;
///     set_event("status", &if paid { "paid" } else { "declined" })?;
///     Ok(order)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(checkout, ("o-1".to_string(),)).await?;
/// let url: String = run.event::<String>("payment_url").await?;
/// assert_eq!(url, "https://pay.example/o-1");
/// run.send("paid", true).await?;
/// run.return_value().await?;
/// assert_eq!(run.event::<String>("status").latest().await?, Some("paid".to_owned()));
/// # Ok(())
/// # }
/// ```
pub fn set_event<T: Serialize + ?Sized>(key: impl Into<String>, value: &T) -> Result<(), Error> {
    let key = key.into();
    let Some(publisher) = Publisher::current() else {
        return Err(Error::fatal(
            "set_event() was called outside a run; call it in a `#[workflow]` fn or in a \
             `#[step]` fn the workflow calls",
        ));
    };
    if let Some(why) = invalid_name("event key", &key) {
        return Err(Error::fatal(why));
    }
    let value = publisher
        .payloads()
        .encode(
            value,
            PayloadKind::Event { key: &key }.of_run(publisher.owner()),
        )
        .map_err(PayloadError::fatal)?;
    publisher.publish(key, value);
    Ok(())
}
