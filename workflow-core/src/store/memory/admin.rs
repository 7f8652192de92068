//! [`AdminStore`] in memory: listing runs and pruning ended ones. Each method takes the lock once
//! and calls the state's operations, so it is atomic; the rules themselves live in `state.rs`
//! and the shared store helpers, which this file must not repeat.

use std::collections::HashSet;
use std::time::SystemTime;

use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::model::RunStatus;
use crate::store::{AdminStore, PruneStats, RunCount, RunFilter, RunRecord};

#[async_trait::async_trait]
impl AdminStore for MemoryStore {
    async fn run_counts(&self) -> Result<Vec<RunCount>, StoreError> {
        let st = self.lock();
        let mut counts = std::collections::BTreeMap::<(&str, &str), (RunStatus, u64)>::new();
        for r in st.runs.values() {
            let status = r.record.status;
            counts
                .entry((r.record.workflow.as_str(), status.as_str()))
                .or_insert((status, 0))
                .1 += 1;
        }
        Ok(counts
            .into_iter()
            .map(|((workflow, _), (status, runs))| RunCount {
                workflow: workflow.to_owned(),
                status,
                runs,
            })
            .collect())
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let st = self.lock();
        let cursor = match filter.after {
            Some(id) => {
                let run = st.runs.get(&id).ok_or(StoreError::RunNotFound(id))?;
                Some((run.record.created_at, id))
            }
            None => None,
        };
        let mut runs: Vec<&RunRecord> = st
            .runs
            .values()
            .map(|r| &r.record)
            .filter(|r| filter.created_after.is_none_or(|t| r.created_at >= t))
            .filter(|r| filter.created_before.is_none_or(|t| r.created_at < t))
            .filter(|r| cursor.is_none_or(|c| (r.created_at, r.id) < c))
            .filter(|r| filter.status.is_none_or(|s| r.status == s))
            .filter(|r| filter.workflow.as_ref().is_none_or(|w| &r.workflow == w))
            .filter(|r| filter.parent.is_none_or(|p| r.parent == Some(p)))
            .filter(|r| {
                filter
                    .version
                    .as_ref()
                    .is_none_or(|v| r.version.as_ref() == Some(v))
            })
            .filter(|r| {
                filter
                    .queue
                    .as_ref()
                    .is_none_or(|q| r.queue.as_ref().is_some_and(|e| &e.name == q))
            })
            .collect();
        runs.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id)));
        Ok(runs.into_iter().take(filter.limit).cloned().collect())
    }

    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<PruneStats, StoreError> {
        let mut st = self.lock();
        let retaining: HashSet<RunId> = st
            .hooks
            .values()
            .filter(|h| h.retain_until.is_some_and(|t| t > now))
            .map(|h| h.run_id)
            .collect();
        let doomed: HashSet<RunId> = st
            .runs
            .iter()
            .filter(|(id, row)| {
                row.record.status.is_terminal()
                    && row.record.updated_at < ended_before
                    && !retaining.contains(*id)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut stats = PruneStats::default();
        for id in &doomed {
            if let Some(row) = st.runs.remove(id) {
                stats.runs += 1;
                stats.events += row.events.len() as u64;
            }
        }
        st.hooks.retain(|_, h| !doomed.contains(&h.run_id));
        st.inbox.retain(|_, (run, _)| !doomed.contains(run));
        Ok(stats)
    }
}
