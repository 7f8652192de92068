//! [`Queue`]: flow control. A queue bounds how many runs entering it are begun and
//! not ended at once and how many begin per time window, across every process on the store;
//! its runs may carry a partition key (one run at a time per key) and a priority. The store
//! enforces the limits when it leases runs ([`crate::store::Store::acquire`]).

use std::time::Duration;

use crate::error::BuildError;
use crate::store::QueueDef;

/// A queue declared on the runtime builder and shared by every worker on the store.
///
/// Runs enter it with `rt.start(..).queue(name)` or by default through
/// `#[workflow(queue = "..")]`. Its limits are stored when the runtime is built, replacing
/// those declared earlier under the same name (by this or another process): every process
/// enforces the last declaration.
///
/// ```
/// use workflow_core::prelude::*;
/// use workflow_core::Queue;
///
/// #[workflow]
/// async fn send_email(to: String) -> Result<String> {
///     Ok(format!("sent to {to}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder()
///     .in_memory()
///     .queue(Queue::new("emails").concurrency(10).rate_limit(100, Duration::from_secs(60)))
///     .build()
///     .await?;
/// let run = rt
///     .start(send_email, ("ada@example.com".to_string(),))
///     .queue("emails")
///     .partition_key("ada")
///     .priority(5)
///     .await?;
/// assert_eq!(run.return_value().await?, "sent to ada@example.com");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Queue {
    def: QueueDef,
}

impl Queue {
    /// A queue named `name`, without limits until [`Queue::concurrency`] or
    /// [`Queue::rate_limit`] sets them (partition keys and priorities still apply).
    pub fn new(name: impl Into<String>) -> Self {
        Queue {
            def: QueueDef {
                name: name.into(),
                concurrency: None,
                rate_limit: None,
            },
        }
    }

    /// At most `n` runs of the queue begun and not yet ended, across all worker processes. A
    /// run holds its slot from its first step until it ends, sleeping included.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.def.concurrency = Some(n);
        self
    }

    /// At most `n` runs of the queue begin in any window of length `period`.
    pub fn rate_limit(mut self, n: u32, period: Duration) -> Self {
        self.def.rate_limit = Some((n, period));
        self
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The limits as the store keeps them, checked.
    pub(crate) fn into_def(self) -> Result<QueueDef, BuildError> {
        let invalid = |why: &str| BuildError::InvalidQueue {
            name: self.def.name.clone(),
            why: why.to_owned(),
        };
        if self.def.name.is_empty() {
            return Err(invalid("a queue needs a name"));
        }
        if self.def.concurrency == Some(0) {
            return Err(invalid("a concurrency of 0 would never begin a run"));
        }
        match self.def.rate_limit {
            Some((0, _)) => return Err(invalid("a rate limit of 0 runs would never begin one")),
            Some((_, p)) if p.as_millis() == 0 => {
                return Err(invalid("a rate limit's period must be at least 1 ms"))
            }
            _ => {}
        }
        Ok(self.def)
    }
}

/// The queue entry a start's builder methods (`start`, `start_child`) write into: created
/// empty when a partition key or priority comes before any queue (an entry with an empty name
/// stands for "no queue yet"; `.queue(..)` or the workflow's default names it).
pub(crate) fn entry(queue: &mut Option<crate::store::QueueEntry>) -> &mut crate::store::QueueEntry {
    queue.get_or_insert_with(|| crate::store::QueueEntry::new(""))
}
