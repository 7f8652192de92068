//! [`HookStore`] in memory: claiming and resuming hooks, and reading the hook inbox. Each method takes the lock once
//! and calls the state's operations, so it is atomic; the rules themselves live in `state.rs`
//! and the shared store helpers, which this file must not repeat.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::state::HookRow;
use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{
    Admission, AdmitOrResume, ClaimOutcome, Event, HookFilter, HookRecord, HookStore, InboxEntry,
    Lease, NewRun,
};

#[async_trait::async_trait]
impl HookStore for MemoryStore {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let Some(token) = run.hook.as_ref().map(|h| h.token.clone()) else {
            return Err(crate::store::no_token());
        };
        let at = run.created_at;
        let mut st = self.lock();
        match st.admit(run, lease)? {
            (Admission::Admitted, lease) => Ok(AdmitOrResume::Admitted(lease)),
            (Admission::Conflict(owner), _) => Ok(match st.resume(&token, payload, at) {
                Some((run, payload_id)) => AdmitOrResume::Resumed { run, payload_id },
                None => AdmitOrResume::Conflict(owner),
            }),
        }
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut st = self.lock();
        st.held(lease)?;
        let outcome = match st.hooks.get_mut(token).filter(|h| h.taken(at)) {
            // A token the run inherited from the run it continues binds, once.
            Some(owner) if owner.active && owner.run_id == lease.run_id && owner.inherited => {
                owner.inherited = false;
                ClaimOutcome::Claimed
            }
            Some(owner) => ClaimOutcome::Conflict(owner.run_id),
            None => {
                st.hooks.insert(
                    token.to_owned(),
                    HookRow {
                        run_id: lease.run_id,
                        inherited: false,
                        created_at: at,
                        active: true,
                        retain_until: None,
                    },
                );
                ClaimOutcome::Claimed
            }
        };
        let conflict = match outcome {
            ClaimOutcome::Claimed => None,
            ClaimOutcome::Conflict(owner) => Some(owner),
        };
        st.held(lease)?.push(
            at,
            Event::HookRegistered {
                hook_key: hook_key.to_owned(),
                token: token.to_owned(),
                conflict,
            },
        );
        Ok(outcome)
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        Ok(self.lock().resume(token, payload, at))
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError> {
        Ok(self
            .lock()
            .inbox
            .range(after.saturating_add(1)..)
            .filter(|(_, (r, _))| r == run)
            .map(|(_, (_, p))| p.clone())
            .collect())
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        Ok(self
            .lock()
            .inbox
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(id, (run, _))| (*id, *run))
            .collect())
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        Ok(self.lock().inbox.last_key_value().map_or(0, |(k, _)| *k))
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        Ok(self
            .lock()
            .hooks
            .get(token)
            .filter(|h| h.active)
            .map(|h| HookRecord {
                token: token.to_owned(),
                run_id: h.run_id,
                created_at: h.created_at,
            }))
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let st = self.lock();
        let mut hooks: Vec<HookRecord> = st
            .hooks
            .iter()
            .filter(|(t, h)| {
                h.active
                    && filter.token.as_ref().is_none_or(|want| want == *t)
                    && filter.run_id.is_none_or(|run| run == h.run_id)
            })
            .map(|(t, h)| HookRecord {
                token: t.clone(),
                run_id: h.run_id,
                created_at: h.created_at,
            })
            .collect();
        hooks.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.token.cmp(&b.token))
        });
        hooks.truncate(filter.limit);
        Ok(hooks)
    }
}
