//! The shared helpers of the bottom floor: small synchronisation tools every layer may use,
//! which know nothing of runs, stores or the runtime.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, also after a panic elsewhere poisoned it: every critical section in this crate
/// validates before it mutates, so the data behind a poisoned lock is still consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
