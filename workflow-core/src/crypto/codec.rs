//! [`Codec`]: a transform of every payload's bytes of the user's own (compression, a KMS
//! client), applied after serialization and before encryption, and undone in reverse order.

use std::fmt;
use std::sync::Arc;

use super::envelope::{Binding, Subject};
use crate::ids::RunId;

/// A transform of every stored payload's bytes: compression, a call to a KMS, ... Given to
/// [`RuntimeBuilder::codec`](crate::RuntimeBuilder::codec), it is applied to each payload's
/// serialized JSON before it is stored (and before encryption, when keys are set too), and
/// `decode` undoes it when the payload is read. A payload stored with a codec is an envelope
/// that says so, so a runtime without the codec reports it instead of misreading it.
///
/// ```
/// use workflow_core::prelude::*;
/// use workflow_core::{Codec, PayloadContext};
///
/// /// Not compression, but as easy to check: every byte flipped.
/// struct Flip;
/// impl Codec for Flip {
///     fn encode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> Vec<u8> {
///         bytes.iter().map(|b| !b).collect()
///     }
///     fn decode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> Result<Vec<u8>, String> {
///         Ok(bytes.iter().map(|b| !b).collect())
///     }
/// }
///
/// #[workflow]
/// async fn hello(name: String) -> Result<String> { Ok(format!("hello {name}")) }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().codec(Flip).build().await?;
/// let run = rt.start(hello, ("ada".to_owned(),)).await?;
/// assert_eq!(run.return_value().await?, "hello ada");
/// let stored = rt.store().get_run(&run.id()).await?.unwrap().input;
/// assert!(!stored.to_string().contains("ada"));
/// # Ok(())
/// # }
/// ```
pub trait Codec: Send + Sync + 'static {
    /// `bytes` (a payload's serialized JSON) as they are to be stored.
    fn encode(&self, bytes: &[u8], cx: &PayloadContext<'_>) -> Vec<u8>;

    /// The reverse of [`Codec::encode`]; an error is the payload's read error.
    fn decode(&self, bytes: &[u8], cx: &PayloadContext<'_>) -> Result<Vec<u8>, String>;
}

/// What a [`Codec`] is told of a payload: whose it is, what it is and where.
#[derive(Debug, Clone, Copy)]
pub struct PayloadContext<'a> {
    binding: &'a Binding<'a>,
}

impl<'a> PayloadContext<'a> {
    pub(crate) fn new(binding: &'a Binding<'a>) -> Self {
        PayloadContext { binding }
    }

    /// The run the payload belongs to; `None` for a payload sent to a hook token before a run
    /// is known to own it (see [`PayloadContext::hook_token`]). A payload the runs of a
    /// `continue_as_new` chain share (messages, requests and replies, published values, the
    /// chain's end) belongs to the chain's first run, whichever run of it writes or reads it.
    pub fn run(&self) -> Option<RunId> {
        match self.binding.subject {
            Subject::Run(run) | Subject::Chain { origin: run, .. } => Some(run),
            Subject::Token(_) => None,
        }
    }

    /// The token a hook payload was sent to.
    pub fn hook_token(&self) -> Option<&str> {
        match self.binding.subject {
            Subject::Token(token) => Some(token),
            Subject::Run(_) | Subject::Chain { .. } => None,
        }
    }

    /// What the payload is: `input`, `output`, `error`, `step_input`, `step_result`,
    /// `step_error`, `hook_payload` or `stream_chunk`.
    pub fn kind(&self) -> &str {
        self.binding.kind
    }

    /// Where in the run: the step id of a step's payload, the stream's name of a chunk.
    pub fn place(&self) -> &str {
        self.binding.place
    }
}

/// A runtime's codec, cheap to clone.
#[derive(Clone)]
pub(crate) struct SharedCodec(pub(crate) Arc<dyn Codec>);

impl fmt::Debug for SharedCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Codec")
    }
}
