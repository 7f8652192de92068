//! Identifiers: [`RunId`] and the derivation of stable step ids.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The globally unique id of a run (a ULID: sortable by creation time, 26 ASCII characters).
///
/// ```
/// use workflow_core::RunId;
/// let id = RunId::new();
/// let parsed: RunId = id.to_string().parse().unwrap();
/// assert_eq!(id, parsed);
/// assert!("not-a-run-id".parse::<RunId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(ulid::Ulid);

impl RunId {
    /// A new, unique id. Ids made in one process grow in the order they are made (within a
    /// millisecond too), so runs started one after another sort in start order.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        static GENERATOR: std::sync::Mutex<ulid::Generator> =
            std::sync::Mutex::new(ulid::Generator::new());
        // The generator fails only when a millisecond's 2^80 random increments run out.
        let next = crate::sync::lock(&GENERATOR).generate();
        RunId(next.unwrap_or_else(|_| ulid::Ulid::new()))
    }

    /// The 64 low bits, used to seed the run's deterministic random numbers.
    pub(crate) fn seed(&self) -> u64 {
        let v: u128 = self.0.into();
        (v as u64) ^ ((v >> 64) as u64)
    }
}

impl RunId {
    /// The ULID this id is.
    pub(crate) fn ulid(self) -> ulid::Ulid {
        self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.0)
    }
}

/// A string that is not a run id.
#[derive(Debug, Clone, thiserror::Error)]
#[error("`{input}` is not a run id (expected 26 characters of Crockford base32)")]
pub struct ParseRunIdError {
    input: String,
}

impl FromStr for RunId {
    type Err = ParseRunIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ulid::Ulid::from_string(s)
            .map(RunId)
            .map_err(|_| ParseRunIdError {
                input: s.chars().take(64).collect(),
            })
    }
}

impl Serialize for RunId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// FNV-1a, 64 bits: a hash whose value never changes between compiler or crate versions, so ids
/// derived from it stay valid for runs recorded by older binaries.
pub(crate) const fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// The id of the `invocation`-th call (from 0) of step `name` in run `run`.
///
/// `stp_<run id>_<16 hex digits of the name's hash>_<invocation>`: ASCII and at most 64 bytes,
/// well inside the 255-byte limit of payment providers' idempotency keys.
pub(crate) fn step_id(run: &RunId, name: &str, invocation: u32) -> String {
    format!(
        "stp_{run}_{:016x}_{invocation}",
        stable_hash(name.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ids_are_short_ascii_and_distinct() {
        let run = RunId::new();
        let a = step_id(&run, "orders::charge", 0);
        let b = step_id(&run, "orders::charge", 1);
        let c = step_id(&run, "orders::ship", 0);
        assert!(a.is_ascii() && a.len() <= 255, "{a}");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, step_id(&run, "orders::charge", 0));
        assert_ne!(a, step_id(&RunId::new(), "orders::charge", 0));
    }

    #[test]
    fn stable_hash_is_fixed() {
        // Pinned: changing this value would orphan every recorded run.
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
