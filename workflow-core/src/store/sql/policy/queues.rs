//! Queues: which waiting runs may begin within their queues' limits, and declared queues as
//! rows.

use super::Tx;
use crate::error::StoreError;
use crate::store::QueueDef;

/// The waiting queued runs that may begin at `now` within their queues' limits, at most
/// `room`, for `acquire` to lease (see [`Store::acquire`]). Each queue's row is locked while
/// it is decided, and the counts are read after the lock is granted, so concurrent acquirers
/// in any process take turns per queue and each sees the runs the previous one began.
/// Queues are visited in name order, so two acquirers never wait on each other's locks in a
/// cycle.
pub(in crate::store) async fn queued_to_begin(
    tx: &mut impl Tx,
    now: i64,
    workflows: &[String],
    mut room: i64,
) -> Result<Vec<String>, StoreError> {
    let mut begin = Vec::new();
    if room <= 0 {
        return Ok(begin);
    }
    for queue in tx.waiting_queues(now, workflows).await? {
        if room <= 0 {
            break;
        }
        let Some(limits) = tx.lock_queue(&queue).await? else {
            continue;
        };
        let since = limits
            .rate_period
            .map_or(i64::MAX, |p| now.saturating_sub(p));
        // A queue that only orders its runs (partition keys, priority) counts nothing.
        let limited = limits.concurrency.is_some() || limits.rate_limit.is_some();
        let (holding, begun) = if limited {
            tx.queue_counts(&queue, since).await?
        } else {
            (0, 0)
        };
        let mut allowance = room;
        if let Some(c) = limits.concurrency {
            allowance = allowance.min(c - holding);
        }
        if let (Some(n), Some(_)) = (limits.rate_limit, limits.rate_period) {
            allowance = allowance.min(n - begun);
        }
        if allowance <= 0 {
            continue;
        }
        let picked = tx
            .queue_candidates(&queue, now, workflows, allowance)
            .await?;
        room -= picked.len() as i64;
        begin.extend(picked);
    }
    Ok(begin)
}

/// A queue's columns: name, concurrency, rate limit, rate period (ms).
pub(in crate::store) type QueueColumns = (String, Option<i64>, Option<i64>, Option<i64>);

/// [`QueueDef`]s as rows: name, concurrency, rate limit, rate period (ms); in name order
/// (byte-wise), the order `acquire` locks queues in, so a declaration and an acquire never
/// wait on each other's locks in a cycle.
pub(in crate::store) fn queue_rows(queues: &[QueueDef]) -> Vec<QueueColumns> {
    let mut queues: Vec<&QueueDef> = queues.iter().collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    queues
        .into_iter()
        .map(|q| {
            (
                q.name.clone(),
                q.concurrency.map(i64::from),
                q.rate_limit.map(|(n, _)| i64::from(n)),
                q.rate_limit
                    .map(|(_, p)| i64::try_from(p.as_millis()).unwrap_or(i64::MAX)),
            )
        })
        .collect()
}
