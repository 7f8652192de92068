//! The journal's keys: the typed ids of a run's steps, timers, hooks and children, and the
//! [`Key`] a result is delivered under. The history spells each id as text (`tmr_0`, `hk_0`,
//! `ch_0`, the step id); that text is made and read only here, at the history's boundary.

use std::fmt;

use crate::ids::{step_id, RunId};

/// One invocation of a step: its stable id (`stp_<run id>_<name hash>_<call>`), which its body
/// sees as its idempotency key and the history records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StepId(String);

impl StepId {
    /// The id of the `call`-th call (from 0) of step `name` in run `run`.
    pub(crate) fn new(run: &RunId, name: &str, call: u32) -> Self {
        StepId(step_id(run, name, call))
    }

    /// The id as a history records it.
    pub(crate) fn recorded(id: String) -> Self {
        StepId(id)
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
impl From<&str> for StepId {
    fn from(id: &str) -> Self {
        StepId(id.to_owned())
    }
}

#[cfg(test)]
impl PartialEq<str> for StepId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

#[cfg(test)]
impl PartialEq<&str> for StepId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Ids numbered by the order of their calls in a run, spelled `<prefix><n>` in its history.
macro_rules! numbered_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) struct $name(pub(crate) u32);

        impl $name {
            /// The id a history spells `text`; `None` for text this build never records.
            pub(crate) fn recorded(text: &str) -> Option<Self> {
                let n = text.strip_prefix($prefix)?;
                // One spelling per number: no sign, no leading zeros.
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0')) {
                    return None;
                }
                n.parse().ok().map($name)
            }
        }

        #[cfg(test)]
        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self::recorded(text).expect("an id as the history spells it")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

numbered_id!(
    /// The run's `n`-th durable sleep (`tmr_<n>`).
    TimerId,
    "tmr_"
);
numbered_id!(
    /// The run's `n`-th hook (`hk_<n>`).
    HookKey,
    "hk_"
);
numbered_id!(
    /// The run's `n`-th `start_child` call (`ch_<n>`).
    ChildKey,
    "ch_"
);
numbered_id!(
    /// The run's `n`-th `set_event` call (`set_<n>`).
    SetId,
    "set_"
);

/// What the workflow waits on: the key a result is delivered under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Key {
    /// A step invocation's final result.
    Step(StepId),
    /// A durable sleep's firing.
    Timer(TimerId),
    /// The decision on a hook's registration.
    Hook(HookKey),
    /// The next payload for a token. Only the workflow's `recv` waits on it; payloads are
    /// recorded by their inbox id, not under this key.
    Payload(String),
    /// The admission of a child run.
    Child(ChildKey),
    /// A child run's end, by the child's id.
    ChildEnd(RunId),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Step(id) => id.fmt(f),
            Key::Timer(id) => id.fmt(f),
            Key::Hook(key) => key.fmt(f),
            Key::Child(key) => key.fmt(f),
            Key::Payload(token) => write!(f, "the next payload for {token:?}"),
            Key::ChildEnd(id) => write!(f, "the end of child run {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_ids_read_back_only_as_written() {
        assert_eq!(TimerId(7).to_string(), "tmr_7");
        assert_eq!(HookKey::recorded("hk_12"), Some(HookKey(12)));
        assert_eq!(
            ChildKey::recorded(&ChildKey(0).to_string()),
            Some(ChildKey(0))
        );
        for text in ["hk_", "hk_01", "hk_+1", "hk_x", "tmr_1", "hk_99999999999"] {
            assert_eq!(HookKey::recorded(text), None, "{text}");
        }
    }
}
