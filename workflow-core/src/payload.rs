//! The one door every recorded value passes through on its way to the store and back:
//! workflow arguments and outputs, step arguments and results, children's arguments and
//! results, hook payloads and stream chunks. Encoding serializes a value to JSON and checks it
//! against the runtime's `max_payload_bytes`; decoding reads it back into the caller's type.
//! Each call names what the value is ([`PayloadKind`]) and, where it is known, the run it
//! belongs to ([`PayloadContext`]): the errors are worded from that, and a transform applied to
//! stored payloads (encryption binds a ciphertext to its run and its place) belongs in
//! [`Payloads`] and needs nothing more. No other module calls `serde_json::to_value` or
//! `from_value` on a payload.
//!
//! What the store itself serializes (events, errors, rows) and the replay core's copies of
//! recorded values are not payloads in this sense: they hold values that already came through
//! here.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, PayloadTooLarge};
use crate::ids::RunId;

/// What a payload is, with the names its errors quote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadKind<'a> {
    /// A run's arguments, of workflow `workflow`.
    WorkflowInput { workflow: &'a str },
    /// A run's output; the workflow is known where it is written, not where it is read.
    WorkflowOutput { workflow: Option<&'a str> },
    /// The arguments of a child run of workflow `workflow`, as its parent records them.
    ChildInput { workflow: &'a str },
    /// A child run's result, as its parent records it (the context's run is the child).
    ChildResult,
    /// The arguments of step `step`.
    StepInput { step: &'a str },
    /// The result of step `step`.
    StepResult { step: &'a str },
    /// A payload sent to the hook owning `token`.
    HookPayload { token: &'a str },
    /// A chunk of stream `stream`; its index is known once the store numbered it.
    StreamChunk { stream: &'a str, index: Option<u64> },
    /// A message sent to a run on topic `topic` (`run.send`).
    Message { topic: &'a str },
    /// A value a run published under `key` (`set_event`).
    Event { key: &'a str },
}

impl<'a> PayloadKind<'a> {
    /// This kind of value, of run `run`.
    pub(crate) fn of(self, run: RunId) -> PayloadContext<'a> {
        PayloadContext {
            kind: self,
            run: Some(run),
        }
    }

    /// This kind of value, whose run is not known here: a hook payload goes to whichever run
    /// owns its token when the store takes it; a start's run has no id before it is admitted.
    pub(crate) fn unbound(self) -> PayloadContext<'a> {
        PayloadContext {
            kind: self,
            run: None,
        }
    }

    /// Whether `max_payload_bytes` bounds this kind: arguments, step results, hook payloads
    /// and chunks. A workflow's output and a child's result are bounded by nothing here (the
    /// output was produced by a run that already ran; refusing it would lose it).
    fn bounded(self) -> bool {
        !matches!(
            self,
            PayloadKind::WorkflowOutput { .. } | PayloadKind::ChildResult
        )
    }

    /// The value as the size error names it: "the arguments of workflow `x`".
    fn what(self) -> String {
        match self {
            PayloadKind::WorkflowInput { workflow } => {
                format!("the arguments of workflow `{workflow}`")
            }
            PayloadKind::WorkflowOutput { workflow } => match workflow {
                Some(w) => format!("the return value of workflow `{w}`"),
                None => "the return value of a workflow".to_owned(),
            },
            PayloadKind::ChildInput { workflow } => {
                format!("the arguments of child workflow `{workflow}`")
            }
            PayloadKind::ChildResult => "the result of a child run".to_owned(),
            PayloadKind::StepInput { step } => format!("the arguments of step `{step}`"),
            PayloadKind::StepResult { step } => format!("the result of step `{step}`"),
            PayloadKind::HookPayload { token } => format!("the payload for hook {token:?}"),
            PayloadKind::StreamChunk { stream, .. } => format!("a chunk for stream {stream:?}"),
            PayloadKind::Message { topic } => format!("the message on topic {topic:?}"),
            PayloadKind::Event { key } => format!("the value of event {key:?}"),
        }
    }
}

/// A payload's place: what it is and, where known, the run it belongs to. All an encoding
/// step needs to know about a value besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PayloadContext<'a> {
    pub(crate) kind: PayloadKind<'a>,
    pub(crate) run: Option<RunId>,
}

impl PayloadContext<'_> {
    /// Why a stored value does not decode into `type_name`, in the words each kind has used
    /// since it was recorded.
    fn mismatch(&self, type_name: &str, e: &serde_json::Error) -> String {
        let run = || self.run.map_or_else(|| "?".to_owned(), |r| r.to_string());
        match self.kind {
            PayloadKind::WorkflowInput { workflow } => format!(
                "the recorded arguments do not match workflow `{workflow}` in this binary \
                 (was the run started by another version?): {e}"
            ),
            PayloadKind::WorkflowOutput { .. } => format!(
                "the result of run {} does not deserialize into the requested type: {e}",
                run()
            ),
            PayloadKind::ChildInput { workflow } => format!(
                "the recorded arguments of child workflow `{workflow}` do not match this \
                 binary: {e}"
            ),
            PayloadKind::ChildResult => format!(
                "the result of child run {} does not fit `{type_name}`: {e}",
                run()
            ),
            PayloadKind::StepInput { step } => {
                format!("the recorded arguments of step `{step}` do not match this binary: {e}")
            }
            PayloadKind::StepResult { step } => format!(
                "the recorded result of step `{step}` does not match its type in this binary: {e}"
            ),
            PayloadKind::HookPayload { token } => format!(
                "a payload sent to hook {token:?} does not fit `{type_name}`: {e} \
                 (the raw payload is kept in the run's history)"
            ),
            PayloadKind::StreamChunk { stream, index } => format!(
                "chunk {} of stream {stream:?} of run {} does not deserialize into the \
                 requested type: {e}",
                index.map_or_else(|| "?".to_owned(), |i| i.to_string()),
                run()
            ),
            PayloadKind::Message { topic } => format!(
                "a message sent on topic {topic:?} does not fit `{type_name}`: {e} \
                 (the raw message is kept in the run's history)"
            ),
            PayloadKind::Event { key } => format!(
                "the value of event {key:?} of run {} does not deserialize into `{type_name}`: {e}",
                run()
            ),
        }
    }
}

/// Why a payload could not be encoded or decoded. Its message names the value; a size error
/// also names the size and the limit.
///
/// Deliberately not a `std::error::Error`: `?` would turn it into a retryable [`Error`],
/// while inside a run every payload error is fatal (the same value would fail again), which
/// [`PayloadError::fatal`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PayloadError {
    /// serde refused the value.
    Serialize {
        /// The value, as [`PayloadTooLarge::what`] names it.
        what: String,
        /// What serde reported.
        cause: String,
    },
    /// Over `max_payload_bytes` as serialized; nothing was written.
    TooLarge(PayloadTooLarge),
    /// The stored value does not fit the requested type; the whole message.
    Mismatch(String),
}

impl std::fmt::Display for PayloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayloadError::Serialize { what, cause } => {
                write!(f, "{what} could not be serialized: {cause}")
            }
            PayloadError::TooLarge(e) => e.fmt(f),
            PayloadError::Mismatch(m) => f.write_str(m),
        }
    }
}

impl PayloadError {
    /// What serde reported, for the errors that quote it in their own words.
    pub(crate) fn cause(self) -> String {
        match self {
            PayloadError::Serialize { cause, .. } => cause,
            other => other.to_string(),
        }
    }

    /// The error a run sees: fatal, with this message.
    pub(crate) fn fatal(self) -> Error {
        Error::fatal(self.to_string())
    }
}

/// How one runtime stores payloads: the size limit every bounded payload is checked against.
/// Cheap to clone; the driver of each run holds a copy.
#[derive(Debug, Clone)]
pub(crate) struct Payloads {
    /// `max_payload_bytes`.
    max_bytes: usize,
}

impl Default for Payloads {
    fn default() -> Self {
        Payloads { max_bytes: 8 << 20 }
    }
}

impl Payloads {
    /// The same, with the limit `max_bytes`.
    pub(crate) fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// `value` serialized for the store as `cx`, checked against the limit.
    pub(crate) fn encode<T: Serialize + ?Sized>(
        &self,
        value: &T,
        cx: PayloadContext<'_>,
    ) -> Result<Value, PayloadError> {
        self.seal(to_json(value), cx)
    }

    /// A value serialized by generated code (a workflow's arguments or output, whose types
    /// only the macro can name), made ready for the store as [`Payloads::encode`] does.
    pub(crate) fn seal(
        &self,
        serialized: Result<Value, serde_json::Error>,
        cx: PayloadContext<'_>,
    ) -> Result<Value, PayloadError> {
        let value = serialized.map_err(|e| PayloadError::Serialize {
            what: cx.kind.what(),
            cause: e.to_string(),
        })?;
        if cx.kind.bounded() {
            let size = serialized_len(&value);
            if size > self.max_bytes {
                return Err(PayloadError::TooLarge(PayloadTooLarge {
                    what: cx.kind.what(),
                    size,
                    limit: self.max_bytes,
                }));
            }
        }
        Ok(value)
    }

    /// The stored `value` of `cx` read as a `T`.
    pub(crate) fn decode<T: DeserializeOwned>(
        &self,
        value: Value,
        cx: PayloadContext<'_>,
    ) -> Result<T, PayloadError> {
        self.open(value, cx, from_json)
    }

    /// The stored `value` of `cx` read as a `T`, leaving it in place (a step's arguments are
    /// decoded again by each attempt).
    pub(crate) fn decode_ref<T: DeserializeOwned>(
        &self,
        value: &Value,
        cx: PayloadContext<'_>,
    ) -> Result<T, PayloadError> {
        T::deserialize(value).map_err(|e| mismatch::<T>(cx, &e))
    }

    /// The stored `value` of `cx` read by generated code (a workflow's arguments).
    pub(crate) fn open<T>(
        &self,
        value: Value,
        cx: PayloadContext<'_>,
        deserialize: impl FnOnce(Value) -> Result<T, serde_json::Error>,
    ) -> Result<T, PayloadError> {
        deserialize(value).map_err(|e| mismatch::<T>(cx, &e))
    }
}

fn mismatch<T>(cx: PayloadContext<'_>, e: &serde_json::Error) -> PayloadError {
    PayloadError::Mismatch(cx.mismatch(std::any::type_name::<T>(), e))
}

/// The serialization every payload goes through: JSON.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(value)
}

/// The reverse of [`to_json`].
pub(crate) fn from_json<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(value)
}

/// The length of `value` as serialized text, counted without building the text.
fn serialized_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut size = Count(0);
    // Writing to a counter cannot fail, and a `Value` always serializes.
    let _ = serde_json::to_writer(&mut size, value);
    size.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Payloads {
        Payloads::default().with_max_bytes(10)
    }

    #[test]
    fn a_bounded_payload_over_the_limit_names_it_the_size_and_the_limit() {
        let run = RunId::new();
        let cases = [
            (
                PayloadKind::WorkflowInput { workflow: "orders" }.unbound(),
                "the arguments of workflow `orders` is 14 bytes serialized",
            ),
            (
                PayloadKind::ChildInput { workflow: "ship" }.of(run),
                "the arguments of child workflow `ship` is 14 bytes serialized",
            ),
            (
                PayloadKind::StepInput { step: "charge" }.of(run),
                "the arguments of step `charge` is 14 bytes serialized",
            ),
            (
                PayloadKind::StepResult { step: "charge" }.of(run),
                "the result of step `charge` is 14 bytes serialized",
            ),
            (
                PayloadKind::HookPayload { token: "t" }.unbound(),
                "the payload for hook \"t\" is 14 bytes serialized",
            ),
            (
                PayloadKind::StreamChunk {
                    stream: "s",
                    index: None,
                }
                .of(run),
                "a chunk for stream \"s\" is 14 bytes serialized",
            ),
        ];
        for (cx, starts) in cases {
            let err = small().encode("0123456789ab", cx).unwrap_err();
            let PayloadError::TooLarge(t) = &err else {
                panic!("{cx:?}: {err:?}");
            };
            assert_eq!((t.size, t.limit), (14, 10), "{cx:?}");
            let msg = err.to_string();
            assert!(msg.starts_with(starts), "{msg}");
            assert!(
                msg.ends_with("over the limit of 10 bytes (`max_payload_bytes`)"),
                "{msg}"
            );
            // At the limit: accepted as it is.
            assert_eq!(small().encode("01234567", cx).unwrap(), "01234567");
        }
    }

    #[test]
    fn outputs_are_not_bounded() {
        let long = "x".repeat(100);
        let run = RunId::new();
        for cx in [
            PayloadKind::WorkflowOutput {
                workflow: Some("w"),
            }
            .of(run),
            PayloadKind::ChildResult.of(run),
        ] {
            assert_eq!(
                small().encode(&long, cx).unwrap(),
                Value::from(long.clone())
            );
        }
    }

    #[test]
    fn a_value_serde_refuses_is_named() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), 3);
        let err = small()
            .encode(&map, PayloadKind::StepResult { step: "s" }.unbound())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the result of step `s` could not be serialized: key must be a string"
        );
    }

    #[test]
    fn a_mismatch_names_the_value_and_the_type() {
        let run = RunId::new();
        let err = small()
            .decode::<u32>(
                Value::from("x"),
                PayloadKind::HookPayload { token: "t" }.of(run),
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("a payload sent to hook \"t\" does not fit `u32`: invalid type"),
            "{err}"
        );
        let err = small()
            .decode_ref::<u32>(
                &Value::from("x"),
                PayloadKind::StreamChunk {
                    stream: "s",
                    index: Some(4),
                }
                .of(run),
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("chunk 4 of stream \"s\" of run {run} does not")),
            "{err}"
        );
    }
}
