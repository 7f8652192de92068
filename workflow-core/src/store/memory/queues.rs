//! [`QueueStore`] in memory: declaring queues and reading their state. Each method takes the lock once
//! and calls the state's operations, so it is atomic; the rules themselves live in `state.rs`
//! and the shared store helpers, which this file must not repeat.

use std::time::SystemTime;

use super::MemoryStore;
use crate::error::StoreError;
use crate::history::after;
use crate::store::{QueueDef, QueueInfo, QueueStore};

#[async_trait::async_trait]
impl QueueStore for MemoryStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        let mut st = self.lock();
        for q in queues {
            st.queues.insert(q.name.clone(), q.clone());
        }
        Ok(())
    }

    async fn has_waiting_runs(&self) -> Result<bool, StoreError> {
        Ok(self.lock().books.values().any(|b| !b.waiting.is_empty()))
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let st = self.lock();
        let mut opening: Option<SystemTime> = None;
        for (name, book) in &st.books {
            let Some((n, period)) = st.queues.get(name).and_then(|d| d.rate_limit) else {
                continue;
            };
            if book.waiting.is_empty() {
                continue;
            }
            let since = now.checked_sub(period);
            let mut in_window = book.begins.iter().filter(|t| since.is_none_or(|s| **t > s));
            let count = in_window.clone().count();
            if count >= n as usize {
                if let Some(oldest) = in_window.next() {
                    let at = after(*oldest, period);
                    opening = Some(opening.map_or(at, |o| o.min(at)));
                }
            }
        }
        Ok(opening)
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let st = self.lock();
        let mut queues: Vec<QueueInfo> = st
            .queues
            .values()
            .map(|def| {
                let book = st.books.get(&def.name);
                let since = def.rate_limit.and_then(|(_, p)| now.checked_sub(p));
                QueueInfo {
                    def: def.clone(),
                    occupied: book.map_or(0, |b| b.holding.len() as u64),
                    waiting: book.map_or(0, |b| b.waiting.len() as u64),
                    oldest_waiting: book.and_then(|b| b.waiting.iter().map(|w| w.1).min()),
                    begun_in_window: match (book, def.rate_limit) {
                        (Some(b), Some(_)) => b
                            .begins
                            .iter()
                            .filter(|t| since.is_none_or(|s| **t > s))
                            .count() as u64,
                        _ => 0,
                    },
                }
            })
            .collect();
        queues.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(queues)
    }
}
