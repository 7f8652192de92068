//! Where replay stopped matching a run's history, as data: the event, what the history holds
//! there and what the code did instead. The replay core finds it, the runtime records it on the
//! blocked run's [`Error`](crate::Error) (serialized with it) and `testing::replay` returns it;
//! tools read its fields rather than its sentence.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How the code and the history disagree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DivergenceKind {
    /// The workflow issued a different command than the one recorded next.
    #[default]
    Command,
    /// The history delivers a result the workflow is not waiting for.
    Result,
    /// The workflow returned while the history records further commands.
    Returned,
    /// The workflow returned while recorded results were still to be delivered.
    Unreplayed,
}

/// Where replay of a run stopped matching its recorded history. Nothing is written to the
/// history when it is found: the run is blocked until a build whose code fits picks it up.
///
/// Its `Display` is the sentence a blocked run shows; its fields are that sentence's parts.
///
/// ```
/// use workflow_core::{Divergence, Error};
///
/// fn explain(error: &Error) -> Option<String> {
///     let Divergence { event, expected, found, .. } = error.divergence()?;
///     Some(format!("event {event}: expected {expected}, found {found}"))
/// }
/// assert_eq!(explain(&Error::fatal("not a divergence")), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Divergence {
    /// The recorded event involved: its `seq` in `run.export()`.
    pub event: u64,
    /// What the history holds there.
    pub expected: String,
    /// What the workflow did instead.
    pub found: String,
    /// Which disagreement, which decides how the sentence reads.
    #[serde(default)]
    pub kind: DivergenceKind,
}

impl Divergence {
    pub(crate) fn new(
        kind: DivergenceKind,
        event: u64,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        Divergence {
            event,
            expected: expected.into(),
            found: found.into(),
            kind,
        }
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Divergence {
            event,
            expected,
            found,
            ..
        } = self;
        match self.kind {
            DivergenceKind::Command => write!(
                f,
                "at event {event} its history expects {expected} next, but the workflow called \
                 {found}"
            ),
            DivergenceKind::Result => write!(
                f,
                "at event {event} its history delivers the result of {expected}, but the \
                 workflow is waiting on {found}"
            ),
            DivergenceKind::Returned => write!(
                f,
                "the workflow returned ({found}) where its history expects {expected} next \
                 (event {event})"
            ),
            DivergenceKind::Unreplayed => write!(
                f,
                "the workflow returned ({found}) before its history delivered {expected} \
                 (event {event})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_as_a_sentence_naming_its_parts() {
        let d = |kind| Divergence::new(kind, 3, "step `a` (s1)", "step `b` (s2)");
        assert_eq!(
            d(DivergenceKind::Command).to_string(),
            "at event 3 its history expects step `a` (s1) next, but the workflow called step \
             `b` (s2)"
        );
        assert_eq!(
            d(DivergenceKind::Result).to_string(),
            "at event 3 its history delivers the result of step `a` (s1), but the workflow is \
             waiting on step `b` (s2)"
        );
        assert_eq!(
            d(DivergenceKind::Returned).to_string(),
            "the workflow returned (step `b` (s2)) where its history expects step `a` (s1) next \
             (event 3)"
        );
        assert_eq!(
            d(DivergenceKind::Unreplayed).to_string(),
            "the workflow returned (step `b` (s2)) before its history delivered step `a` (s1) \
             (event 3)"
        );
    }

    #[test]
    fn an_error_carries_its_divergence_through_serde() {
        let d = Divergence::new(DivergenceKind::Returned, 4, "step `a` (s1)", "Ok");
        let e = crate::Error::diverged_at(format!("blocked: {d}"), d.clone());
        assert_eq!(e.divergence(), Some(&d));
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["divergence"]["event"], 4);
        let back: crate::Error = serde_json::from_value(json).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.divergence(), Some(&d));
        assert_eq!(
            back.divergence().unwrap().to_string(),
            "the workflow returned (Ok) where its history expects step `a` (s1) next (event 4)"
        );
    }

    #[test]
    fn errors_recorded_without_a_divergence_still_decode() {
        // As builds before the field recorded a blocked run's error, and any other error.
        let old =
            serde_json::json!({"kind": "diverged", "message": "at event 1 its history expects A"});
        let e: crate::Error = serde_json::from_value(old).unwrap();
        assert!(e.is_diverged());
        assert_eq!(e.divergence(), None);
        let plain = serde_json::to_value(crate::Error::fatal("no")).unwrap();
        assert!(plain.get("divergence").is_none(), "{plain}");
        // A divergence recorded without its kind reads as a command mismatch.
        let d: Divergence =
            serde_json::from_value(serde_json::json!({"event": 2, "expected": "a", "found": "b"}))
                .unwrap();
        assert_eq!(d.kind, DivergenceKind::Command);
    }
}
