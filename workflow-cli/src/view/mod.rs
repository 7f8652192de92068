//! What a run looks like to a person: its steps with their attempts, its sleeps and its hooks,
//! derived from the recorded history. The command line's tables and `--json`, and the
//! dashboard's pages, are all drawn from these views, so they never disagree.

use std::time::SystemTime;

use serde::{Serialize, Serializer};
use workflow_core::store::to_millis;

use crate::text;

mod detail;
mod events;
mod list;
#[cfg(test)]
mod tests;

pub use detail::*;
pub use events::*;
pub use list::*;

/// A point in time; serialized as RFC 3339 in UTC with milliseconds, shown to people in the
/// zone `--tz` chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub SystemTime);

impl Time {
    /// Milliseconds since the Unix epoch.
    pub fn ms(self) -> u64 {
        to_millis(self.0)
    }

    /// Milliseconds from `self` to `later` (0 if `later` is earlier).
    pub fn until(self, later: Time) -> u64 {
        later.ms().saturating_sub(self.ms())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text::rfc3339(self.0))
    }
}

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&text::time(self.0))
    }
}

/// `charge_card` for `shop::orders::charge_card`: registered names carry the module path.
pub fn short_name(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}
