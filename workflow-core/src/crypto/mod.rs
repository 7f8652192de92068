//! Payload encryption: the keys a runtime is given and the sealed envelope a
//! payload is stored in. Nothing here knows what a payload is: [`crate::payload`] decides
//! which values are sealed and where each belongs (its [`Binding`]); this module only seals
//! bytes for a binding and opens them again.

mod codec;
mod envelope;
mod keys;
pub(crate) mod places;
mod recent;

pub(crate) use codec::SharedCodec;
pub use codec::{Codec, PayloadContext};
pub(crate) use envelope::{
    is_sealed, open, seal, sealed_key, sealed_plain_len, unknown_form, wrap, Binding, OpenError,
    MARKER,
};
pub(crate) use keys::Keyring;
pub use keys::{KeyError, Keys};
