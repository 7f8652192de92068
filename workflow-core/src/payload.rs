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

use crate::crypto::places::{Owner, Slot};
use crate::crypto::{self, Binding, Keyring, OpenError, SharedCodec};
use crate::error::{Error, PayloadTooLarge};
use crate::history::Event;
use crate::ids::RunId;
use crate::model::RunRecord;

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
    /// A request sent to a run under `name` (`run.request`).
    Request { name: &'a str },
    /// A run's reply to a request sent under `name`; the place is the request's id.
    Reply { name: &'a str },
}

impl<'a> PayloadKind<'a> {
    /// This kind of value, of run `run`, a run that begins its chain (or a value the chain
    /// does not share: see [`crypto::places`]).
    pub(crate) fn of(self, run: RunId) -> PayloadContext<'a> {
        self.of_run(Owner::first(run))
    }

    /// This kind of value, of run `run` of its chain.
    pub(crate) fn of_run(self, run: Owner) -> PayloadContext<'a> {
        PayloadContext {
            kind: self,
            run: Some(run),
            place: "",
        }
    }

    /// This kind of value, whose run is not known here: a hook payload goes to whichever run
    /// owns its token when the store takes it; a start's run has no id before it is admitted.
    pub(crate) fn unbound(self) -> PayloadContext<'a> {
        PayloadContext {
            kind: self,
            run: None,
            place: "",
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
            PayloadKind::Request { name } => format!("the request {name:?}"),
            PayloadKind::Reply { name } => format!("the reply to request {name:?}"),
        }
    }
}

/// A payload's place: what it is and, where known, the run it belongs to. All an encoding
/// step needs to know about a value besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PayloadContext<'a> {
    pub(crate) kind: PayloadKind<'a>,
    pub(crate) run: Option<Owner>,
    /// Where in the run, when the kind alone does not say: a step's id.
    pub(crate) place: &'a str,
}

impl<'a> PayloadContext<'a> {
    /// The same, at `place` within the run (a step's arguments and result: the step's id).
    pub(crate) fn at(mut self, place: &'a str) -> Self {
        self.place = place;
        self
    }

    /// Where a sealed payload of this context belongs (see [`crate::crypto::places`]): its
    /// run and place; a hook payload belongs to its token, since it is sent before any run is
    /// known to own it. A run's arguments and output are the same payload to the parent that
    /// starts a child and awaits its end as to the child itself, so they share a binding.
    fn binding(&self) -> Result<Binding<'a>, String> {
        use crypto::places as k;
        let (kind, place) = match self.kind {
            PayloadKind::WorkflowInput { .. } | PayloadKind::ChildInput { .. } => (k::INPUT, ""),
            PayloadKind::WorkflowOutput { .. } | PayloadKind::ChildResult => (k::OUTPUT, ""),
            PayloadKind::StepInput { .. } => (k::STEP_INPUT, self.place),
            PayloadKind::StepResult { .. } => (k::STEP_RESULT, self.place),
            PayloadKind::HookPayload { token } => return Ok(k::hook_payload(token)),
            PayloadKind::StreamChunk { stream, .. } => (k::STREAM_CHUNK, stream),
            PayloadKind::Message { topic } => (k::MESSAGE, topic),
            PayloadKind::Event { key } => (k::EVENT, key),
            PayloadKind::Request { name } => (k::REQUEST, name),
            PayloadKind::Reply { .. } => (k::REPLY, self.place),
        };
        let run = self
            .run
            .ok_or_else(|| format!("{} has no run to be sealed for", self.kind.what()))?;
        Ok(k::of_run(run, kind, place))
    }

    /// Why a stored value does not decode into `type_name`, in the words each kind has used
    /// since it was recorded.
    fn mismatch(&self, type_name: &str, e: &serde_json::Error) -> String {
        let run = || {
            self.run
                .map_or_else(|| "?".to_owned(), |r| r.run.to_string())
        };
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
            PayloadKind::Request { name } => format!(
                "a request sent as {name:?} does not fit `{type_name}`: {e} (the raw request is \
                 kept in the run's history)"
            ),
            PayloadKind::Reply { name } => format!(
                "the reply of run {} to request {name:?} does not deserialize into \
                 `{type_name}`: {e}",
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
    /// The value is sealed (encrypted) and did not open: its key is missing, or it was not
    /// sealed for this place.
    Sealed {
        /// The value, as [`PayloadTooLarge::what`] names it.
        what: String,
        /// Why it did not open.
        cause: OpenError,
    },
}

impl std::fmt::Display for PayloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayloadError::Serialize { what, cause } => {
                write!(f, "{what} could not be serialized: {cause}")
            }
            PayloadError::TooLarge(e) => e.fmt(f),
            PayloadError::Mismatch(m) => f.write_str(m),
            PayloadError::Sealed { what, cause } => write!(f, "{what} could not be read: {cause}"),
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

/// A payload as stored and, when they differ (encryption or a codec is on), the plain value
/// it was made from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Encoded {
    /// What the store keeps.
    pub(crate) stored: Value,
    /// The value before it was sealed; `None` when `stored` is that value.
    pub(crate) plain: Option<Value>,
}

/// What [`Payloads::rekey_slot`] did with one payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rekeyed {
    /// Sealed under another key; now under the current one.
    Rewritten,
    /// Already under the current key.
    Current,
    /// Not encrypted (stored before encryption was on, or a codec's bytes alone): left.
    Plain,
}

/// How one runtime stores payloads: the size limit every bounded payload is checked against,
/// and the keys that seal every payload when encryption is on.
/// Cheap to clone; the driver of each run holds a copy.
#[derive(Debug, Clone)]
pub(crate) struct Payloads {
    /// `max_payload_bytes`.
    max_bytes: usize,
    /// `RuntimeBuilder::encryption`: with keys, every payload is stored sealed.
    keys: Option<Keyring>,
    /// `RuntimeBuilder::codec`: applied to every payload's bytes, before encryption.
    codec: Option<SharedCodec>,
}

impl Default for Payloads {
    fn default() -> Self {
        Payloads {
            max_bytes: 8 << 20,
            keys: None,
            codec: None,
        }
    }
}

impl Payloads {
    /// The same, with the limit `max_bytes`.
    pub(crate) fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The same, sealing every payload with `keys`' current key and opening with any of them.
    pub(crate) fn with_keys(mut self, keys: Keyring) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The same, with `codec` applied to every payload's bytes (before encryption).
    pub(crate) fn with_codec(mut self, codec: SharedCodec) -> Self {
        self.codec = Some(codec);
        self
    }

    /// Whether stored payloads are transformed (encrypted, or a codec's), so wrapped in an
    /// envelope.
    pub(crate) fn transforms(&self) -> bool {
        self.keys.is_some() || self.codec.is_some()
    }

    /// `bytes` as stored for `binding`: the codec's, then sealed when keys are set;
    /// `remember`: kept for a reader of this process that opens it soon without the plaintext
    /// at hand (see [`crypto::seal`]).
    fn wrap_bytes(&self, bytes: Vec<u8>, binding: &Binding<'_>, remember: bool) -> Value {
        let (bytes, coded) = match &self.codec {
            Some(c) => (
                c.0.encode(&bytes, &crypto::PayloadContext::new(binding)),
                true,
            ),
            None => (bytes, false),
        };
        match &self.keys {
            Some(ring) => crypto::seal(ring, &bytes, binding, coded, remember),
            None => crypto::wrap(&bytes),
        }
    }

    /// The reverse of [`Payloads::wrap_bytes`].
    fn unwrap_bytes(&self, value: &Value, binding: &Binding<'_>) -> Result<Vec<u8>, OpenError> {
        let (bytes, coded) = crypto::open(self.keys.as_ref(), value, binding)?;
        if !coded {
            return Ok(bytes);
        }
        let Some(codec) = &self.codec else {
            return Err(OpenError::Malformed(
                "it was stored through a `Codec` this runtime was not given".to_owned(),
            ));
        };
        codec
            .0
            .decode(&bytes, &crypto::PayloadContext::new(binding))
            .map_err(|e| OpenError::Malformed(format!("the codec could not decode it: {e}")))
    }

    /// The keys, when encryption is on.
    pub(crate) fn keys(&self) -> Option<&Keyring> {
        self.keys.as_ref()
    }

    /// `value` sealed for `binding` when encryption is on; as it is otherwise.
    pub(crate) fn seal_at(&self, value: Value, binding: &Binding<'_>) -> Value {
        if !self.transforms() {
            return value;
        }
        // A `Value` always serializes.
        let bytes = serde_json::to_vec(&value).unwrap_or_default();
        self.wrap_bytes(bytes, binding, true)
    }

    /// The plaintext of `value` stored for `binding`: a sealed value opened, a plain one as it
    /// is (stored before encryption was turned on; `workflow rekey` leaves those as they are).
    pub(crate) fn open_at(&self, value: Value, binding: &Binding<'_>) -> Result<Value, OpenError> {
        if !crypto::is_sealed(&value) {
            return Ok(value);
        }
        self.open_sealed(&value, binding)
    }

    /// [`Payloads::open_at`] of a value known to be sealed, left in place.
    fn open_sealed(&self, value: &Value, binding: &Binding<'_>) -> Result<Value, OpenError> {
        let bytes = self.unwrap_bytes(value, binding)?;
        serde_json::from_slice(&bytes).map_err(|e| OpenError::Malformed(e.to_string()))
    }

    /// `error` with its message opened, or why it does not open.
    pub(crate) fn try_open_error(
        &self,
        error: Error,
        binding: &Binding<'_>,
    ) -> Result<Error, OpenError> {
        let Some(sealed) = error.sealed_message() else {
            return Ok(error);
        };
        let bytes = self.unwrap_bytes(sealed, binding)?;
        Ok(error.with_opened_message(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Opens every payload and error message of `event` of run `from` (see
    /// [`crypto::places::visit_event`]), or says why one does not open.
    pub(crate) fn open_event(&self, from: Owner, event: &mut Event) -> Result<(), OpenError> {
        let mut result = Ok(());
        crypto::places::visit_event(from, event, |b, slot| {
            let opened = match slot {
                Slot::Value(v) => self.open_at(v.clone(), &b).map(|p| *v = p),
                Slot::Error(e) => self.try_open_error(e.clone(), &b).map(|p| *e = p),
            };
            if let Err(e) = opened {
                result = Err(e);
            }
        });
        result
    }

    /// The size in bytes of the payloads `event` of run `run` holds, as the workflow wrote
    /// them: each value's JSON text and each error's message, before any codec or encryption,
    /// so neither the store, nor a key, nor `workflow rekey` changes it. A sealed value is
    /// measured from its ciphertext's length; a codec's bytes are decoded to be measured (and
    /// counted as stored if they do not open: such a run blocks before it replays).
    pub(crate) fn event_bytes(&self, run: Owner, event: &mut Event) -> u64 {
        let mut bytes = 0usize;
        crypto::places::visit_event(run, event, |b, slot| {
            let n = match slot {
                Slot::Value(v) => self.plain_len(v, &b),
                Slot::Error(e) => match e.sealed_message() {
                    Some(sealed) => self.plain_len(sealed, &b),
                    None => e.message().len(),
                },
            };
            bytes = bytes.saturating_add(n);
        });
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// The length of `value`'s plaintext as serialized (see [`Payloads::event_bytes`]).
    fn plain_len(&self, value: &Value, binding: &Binding<'_>) -> usize {
        if !crypto::is_sealed(value) {
            return serialized_len(value);
        }
        if let Some(n) = crypto::sealed_plain_len(value) {
            return n;
        }
        self.unwrap_bytes(value, binding)
            .map_or_else(|_| serialized_len(value), |plain| plain.len())
    }

    /// Seals every payload and error message of `event`, as run `to`'s, under the current key
    /// (a no-op without keys).
    pub(crate) fn seal_event(&self, to: Owner, event: &mut Event) {
        if self.keys.is_none() {
            return;
        }
        crypto::places::visit_event(to, event, |b, slot| match slot {
            Slot::Value(v) => *v = self.seal_at(std::mem::take(v), &b),
            Slot::Error(e) => *e = self.seal_error(e.clone(), &b),
        });
    }

    /// `value` stored for `from`, sealed again for `to` under the current key.
    pub(crate) fn reseal_at(
        &self,
        value: Value,
        from: &Binding<'_>,
        to: &Binding<'_>,
    ) -> Result<Value, OpenError> {
        let plain = self.open_at(value, from)?;
        Ok(self.seal_at(plain, to))
    }

    /// `slot`, stored for `binding`, sealed again under the current key when it is sealed
    /// under another (`workflow rekey`): what it did, or why it does not open. The bytes are
    /// moved as they are, a codec's included, so no codec is needed here.
    pub(crate) fn rekey_slot(
        &self,
        binding: &Binding<'_>,
        slot: Slot<'_>,
    ) -> Result<Rekeyed, OpenError> {
        let Some(ring) = &self.keys else {
            return Ok(Rekeyed::Plain);
        };
        let envelope = match &slot {
            Slot::Value(v) => &**v,
            Slot::Error(e) => match e.sealed_message() {
                Some(m) => m,
                None => return Ok(Rekeyed::Plain),
            },
        };
        match crypto::sealed_key(envelope) {
            None => return Ok(Rekeyed::Plain),
            Some(id) if id == ring.current() => return Ok(Rekeyed::Current),
            Some(_) => {}
        }
        let (bytes, coded) = crypto::open(Some(ring), envelope, binding)?;
        let sealed = crypto::seal(ring, &bytes, binding, coded, false);
        match slot {
            Slot::Value(v) => *v = sealed,
            Slot::Error(e) => *e = e.clone().with_sealed_message(sealed, ring.current()),
        }
        Ok(Rekeyed::Rewritten)
    }

    /// For tools that show stored data: `value`, stored for `binding`, opened; one that does
    /// not open becomes the text "encrypted (key <id>)" (its key is missing) or
    /// "unreadable (key <id>)" (it was not sealed for this place).
    pub(crate) fn reveal_at(&self, value: &mut Value, binding: &Binding<'_>) {
        match self.open_at(value.clone(), binding) {
            Ok(v) => *value = v,
            Err(OpenError::MissingKey(id)) => *value = Value::from(format!("encrypted (key {id})")),
            Err(OpenError::Unauthentic { key }) => {
                *value = Value::from(format!("unreadable (key {key})"))
            }
            Err(OpenError::Malformed(_)) => {}
        }
    }

    /// [`Payloads::reveal_at`] of every payload and error message of `event` of run `run`.
    pub(crate) fn reveal_event(&self, run: Owner, event: &mut Event) {
        crypto::places::visit_event(run, event, |b, slot| match slot {
            Slot::Value(v) => self.reveal_at(v, &b),
            Slot::Error(e) => *e = self.open_error(e.clone(), &b),
        });
    }

    /// `run`'s record with its arguments, output and error opened where they open (a value
    /// under a missing key stays sealed; its error message says which key).
    pub(crate) fn open_record(&self, mut run: RunRecord) -> RunRecord {
        use crypto::places::{of_run, ERROR, INPUT, OUTPUT};
        let id = Owner::of(&run);
        if crypto::is_sealed(&run.input) {
            if let Ok(v) = self.open_sealed(&run.input, &of_run(id, INPUT, "")) {
                run.input = v;
            }
        }
        if let Some(out) = run.output.as_mut().filter(|v| crypto::is_sealed(v)) {
            if let Ok(v) = self.open_sealed(out, &of_run(id, OUTPUT, "")) {
                *out = v;
            }
        }
        run.error = run
            .error
            .map(|e| self.open_error(e, &of_run(id, ERROR, "")));
        run
    }

    /// `error`'s message sealed for `binding` when encryption is on: its message then reads
    /// "encrypted (key <id>)" to anyone without the keys; its kind and retry hint stay
    /// readable (the runtime decides retries on them).
    pub(crate) fn seal_error(&self, error: Error, binding: &Binding<'_>) -> Error {
        // A codec alone (compression) leaves error messages as they are.
        match &self.keys {
            Some(ring) if error.sealed_message().is_none() => {
                let sealed = self.wrap_bytes(error.message().as_bytes().to_vec(), binding, true);
                error.with_sealed_message(sealed, ring.current())
            }
            _ => error,
        }
    }

    /// `error` with its message opened (see [`Payloads::seal_error`]). A message under a
    /// missing key stays sealed (it reads "encrypted (key <id>)"); one that does not open
    /// otherwise is replaced by why.
    pub(crate) fn open_error(&self, error: Error, binding: &Binding<'_>) -> Error {
        let Some(sealed) = error.sealed_message() else {
            return error;
        };
        let message = match self.unwrap_bytes(sealed, binding) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            // It says "encrypted (key <id>)", and opens where the key is given.
            Err(OpenError::MissingKey(_)) => return error,
            Err(e) => format!("the error message could not be read: {e}"),
        };
        error.with_opened_message(message)
    }

    /// `value` serialized for the store as `cx`, checked against the limit.
    pub(crate) fn encode<T: Serialize + ?Sized>(
        &self,
        value: &T,
        cx: PayloadContext<'_>,
    ) -> Result<Value, PayloadError> {
        self.seal(to_json(value), cx)
    }

    /// [`Payloads::encode`], keeping the plain value beside the stored one when they differ
    /// (encryption or a codec is on): what the encoding process reads back without opening
    /// it (see [`Payloads::decode_known`]).
    pub(crate) fn encode_keeping<T: Serialize + ?Sized>(
        &self,
        value: &T,
        cx: PayloadContext<'_>,
    ) -> Result<Encoded, PayloadError> {
        self.seal_kept(to_json(value), cx, false)
    }

    /// A value serialized by generated code (a workflow's arguments or output, whose types
    /// only the macro can name), made ready for the store as [`Payloads::encode`] does.
    pub(crate) fn seal(
        &self,
        serialized: Result<Value, serde_json::Error>,
        cx: PayloadContext<'_>,
    ) -> Result<Value, PayloadError> {
        self.seal_kept(serialized, cx, true).map(|e| e.stored)
    }

    /// [`Payloads::seal`], keeping the plain value beside the stored one when they differ, as
    /// [`Payloads::encode_keeping`] does: a run's arguments, handed with the run to its driver
    /// here, and a run's output, told to its waiters here (see [`Payloads::open_known`]).
    /// `remember` as [`Payloads::wrap_bytes`]: kept for other readers of this process too,
    /// when some may open it from the store (needless where the plain value is read).
    pub(crate) fn seal_kept(
        &self,
        serialized: Result<Value, serde_json::Error>,
        cx: PayloadContext<'_>,
        remember: bool,
    ) -> Result<Encoded, PayloadError> {
        let value = serialized.map_err(|e| PayloadError::Serialize {
            what: cx.kind.what(),
            cause: e.to_string(),
        })?;
        let too_large = |size| {
            PayloadError::TooLarge(PayloadTooLarge {
                what: cx.kind.what(),
                size,
                limit: self.max_bytes,
            })
        };
        if !self.transforms() {
            if cx.kind.bounded() {
                let size = serialized_len(&value);
                if size > self.max_bytes {
                    return Err(too_large(size));
                }
            }
            return Ok(Encoded {
                stored: value,
                plain: None,
            });
        }
        // The text that is sealed is the one measured: the value is serialized once.
        // A `Value` always serializes.
        let bytes = serde_json::to_vec(&value).unwrap_or_default();
        if cx.kind.bounded() && bytes.len() > self.max_bytes {
            return Err(too_large(bytes.len()));
        }
        let binding = cx.binding().map_err(|cause| PayloadError::Serialize {
            what: cx.kind.what(),
            cause,
        })?;
        Ok(Encoded {
            stored: self.wrap_bytes(bytes, &binding, remember),
            plain: Some(value),
        })
    }

    /// The stored `value` of `cx` read as a `T`, leaving it in place, as
    /// [`Payloads::decode_ref`]; when it is the very value `known` stored (this process
    /// encoded it), `known`'s plain value is read instead of opening it. A sealed value equal
    /// to one sealed here holds the same ciphertext under the same fresh nonce, so the same
    /// plaintext; any other value (one sealed by another process, or again on a replay) is
    /// opened.
    pub(crate) fn decode_known<T: DeserializeOwned>(
        &self,
        value: &Value,
        known: Option<&Encoded>,
        cx: PayloadContext<'_>,
    ) -> Result<T, PayloadError> {
        match known {
            Some(Encoded {
                stored,
                plain: Some(plain),
            }) if stored == value => T::deserialize(plain).map_err(|e| mismatch::<T>(cx, &e)),
            _ => self.decode_ref(value, cx),
        }
    }

    /// `plain`, the value a stored payload of `cx` was sealed from here, read as a `T`.
    pub(crate) fn decode_plain<T: DeserializeOwned>(
        &self,
        plain: &Value,
        cx: PayloadContext<'_>,
    ) -> Result<T, PayloadError> {
        T::deserialize(plain).map_err(|e| mismatch::<T>(cx, &e))
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
        if crypto::is_sealed(value) {
            let sealed = |cause| PayloadError::Sealed {
                what: cx.kind.what(),
                cause,
            };
            let binding = cx.binding().map_err(|e| sealed(OpenError::Malformed(e)))?;
            let plain = self.open_sealed(value, &binding).map_err(sealed)?;
            return from_json(plain).map_err(|e| mismatch::<T>(cx, &e));
        }
        T::deserialize(value).map_err(|e| mismatch::<T>(cx, &e))
    }

    /// [`Payloads::open`] of a stored value whose plain value `known` this process sealed
    /// it from and kept (see [`Payloads::seal_kept`]): `known` is read, nothing is opened.
    /// Without it, `value` is opened.
    pub(crate) fn open_known<T>(
        &self,
        value: Value,
        known: Option<Value>,
        cx: PayloadContext<'_>,
        deserialize: impl FnOnce(Value) -> Result<T, serde_json::Error>,
    ) -> Result<T, PayloadError> {
        match known {
            Some(plain) => deserialize(plain).map_err(|e| mismatch::<T>(cx, &e)),
            None => self.open(value, cx, deserialize),
        }
    }

    /// The stored `value` of `cx` read by generated code (a workflow's arguments).
    pub(crate) fn open<T>(
        &self,
        value: Value,
        cx: PayloadContext<'_>,
        deserialize: impl FnOnce(Value) -> Result<T, serde_json::Error>,
    ) -> Result<T, PayloadError> {
        let value = if crypto::is_sealed(&value) {
            let sealed = |cause| PayloadError::Sealed {
                what: cx.kind.what(),
                cause,
            };
            let binding = cx.binding().map_err(|e| sealed(OpenError::Malformed(e)))?;
            self.open_at(value, &binding).map_err(sealed)?
        } else {
            value
        };
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
    fn a_value_sealed_here_is_read_in_the_clear_and_any_other_is_opened() {
        let keys = crate::crypto::Keys::new()
            .current("k1", [3u8; 32])
            .ring()
            .unwrap();
        let payloads = Payloads::default().with_keys(keys);
        let run = RunId::new();
        let at = |place| PayloadKind::StepResult { step: "s" }.of(run).at(place);
        let kept = payloads.encode_keeping("mine", at("s-1")).unwrap();
        assert_eq!(kept.plain, Some(Value::from("mine")));
        assert!(crypto::is_sealed(&kept.stored), "{}", kept.stored);
        let read = |value: &Value, cx| payloads.decode_known::<String>(value, Some(&kept), cx);
        assert_eq!(read(&kept.stored, at("s-1")).unwrap(), "mine");
        // The same place sealed again (a replay, another process): opened, its own value.
        let again = payloads.encode("theirs", at("s-1")).unwrap();
        assert_eq!(read(&again, at("s-1")).unwrap(), "theirs");
        // Sealed for another place: it does not open here, kept value or not.
        let elsewhere = payloads.encode("theirs", at("s-2")).unwrap();
        let err = read(&elsewhere, at("s-1")).unwrap_err();
        assert!(matches!(err, PayloadError::Sealed { .. }), "{err:?}");
        // Without keys nothing is kept: the stored value is the plain one.
        let plain = Payloads::default().encode_keeping("p", at("s-1")).unwrap();
        assert_eq!((plain.stored, plain.plain), (Value::from("p"), None));
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
