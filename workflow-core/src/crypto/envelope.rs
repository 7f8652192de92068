//! The envelope a sealed payload is stored in: a JSON object, because every store keeps
//! payloads as JSON values, that readers recognise by its reserved marker:
//!
//! ```json
//! {"$wf_sealed": 1, "key": "2026-12", "nonce": "<24 bytes, base64>", "data": "<ciphertext and tag, base64>"}
//! ```
//!
//! The cipher is XChaCha20-Poly1305 (its 192-bit nonces are drawn at random without any risk
//! of reuse), under the data key of the payload's subject (see [`Keyring::data_key`]); the
//! associated data binds the ciphertext to its subject, its kind, its place and its key id, so
//! a ciphertext moved anywhere else fails to open.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::{Map, Value};

use super::keys::Keyring;
use crate::ids::RunId;

/// The marker field of an envelope, and its version.
pub(crate) const MARKER: &str = "$wf_sealed";
const VERSION: u64 = 1;
const NONCE_BYTES: usize = 24;

/// Whom a payload belongs to: the data key is derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject<'a> {
    /// A run's own payload.
    Run(RunId),
    /// A payload sent to a hook token before any run is known to own it.
    Token(&'a str),
    /// A payload of run `run` that the other runs of its chain read too (a message waiting
    /// in the inbox at a `continue_as_new`, a published value, the chain's end): sealed for
    /// the chain's first run, `origin`, so it opens in every run of the chain without being
    /// sealed again. It also opens sealed for `run` alone, as such payloads were before
    /// chains shared them.
    Chain {
        /// The chain's first run (`run` itself for a run that continues nothing).
        origin: RunId,
        /// The run it is read or written by.
        run: RunId,
    },
}

/// Where a payload belongs: what the associated data of its ciphertext says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding<'a> {
    /// The run (or token) it belongs to.
    pub(crate) subject: Subject<'a>,
    /// What it is (`input`, `step_result`, ...).
    pub(crate) kind: &'static str,
    /// Its place within the subject (a step id, a stream name); empty when the kind has one.
    pub(crate) place: &'a str,
}

impl Binding<'_> {
    /// The subject a payload is sealed for. A chain's payload is sealed for its first run:
    /// the same bytes as that run's own payloads, so an unchained run's are unchanged.
    fn subject_bytes(&self) -> Vec<u8> {
        match self.subject {
            Subject::Run(run) | Subject::Chain { origin: run, .. } => {
                format!("run:{run}").into_bytes()
            }
            Subject::Token(token) => format!("hook:{token}").into_bytes(),
        }
    }

    /// The subjects a payload of this binding opens for, in the order they are tried: the
    /// one it is sealed for, then (for a chain's payload read by a later run) the run alone,
    /// as payloads written before chains shared them were sealed.
    fn open_subjects(&self) -> impl Iterator<Item = Vec<u8>> {
        let fallback = match self.subject {
            Subject::Chain { origin, run } if origin != run => {
                Some(format!("run:{run}").into_bytes())
            }
            Subject::Run(_) | Subject::Token(_) | Subject::Chain { .. } => None,
        };
        std::iter::once(self.subject_bytes()).chain(fallback)
    }

    fn associated_data(&self, subject: &[u8], key_id: &str, coded: bool) -> Vec<u8> {
        let mut ad = b"workflow-rs/sealed/v1".to_vec();
        ad.push(u8::from(coded));
        for part in [
            subject,
            self.kind.as_bytes(),
            self.place.as_bytes(),
            key_id.as_bytes(),
        ] {
            // Length-prefixed: no two bindings share a byte string.
            ad.extend_from_slice(&(part.len() as u64).to_be_bytes());
            ad.extend_from_slice(part);
        }
        ad
    }
}

/// Why an envelope did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// It was sealed with key `id`, which this process was not given.
    MissingKey(String),
    /// The key is there but the ciphertext does not open: it belongs to another run or
    /// place, or it was altered.
    Unauthentic {
        /// The key it names.
        key: String,
    },
    /// It carries the marker but is not a well-formed envelope.
    Malformed(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::MissingKey(id) => write!(
                f,
                "it is encrypted with key {id:?}, which this process was not given (add it to \
                 `Keys` with `.old({id:?}, key)`)"
            ),
            OpenError::Unauthentic { key } => write!(
                f,
                "it does not decrypt with key {key:?}: it was not written for this run and \
                 place, or it was altered"
            ),
            OpenError::Malformed(why) => write!(f, "it is not a well-formed sealed payload: {why}"),
        }
    }
}

/// `plaintext` sealed under the current key for `binding`; `coded`: its bytes are a
/// [`Codec`](super::Codec)'s (said in the envelope and bound by the associated data).
pub(crate) fn seal(ring: &Keyring, plaintext: &[u8], binding: &Binding<'_>, coded: bool) -> Value {
    let key_id = ring.current();
    let subject = binding.subject_bytes();
    // The current key is in the ring by construction.
    let key = ring.data_key(key_id, &subject).unwrap_or_default();
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let cipher = XChaCha20Poly1305::new(&key.into());
    let ad = binding.associated_data(&subject, key_id, coded);
    // Encryption with a valid key fails only for inputs over 256 GiB, far over any payload
    // limit; an empty ciphertext would then fail to open rather than leak.
    let data = cipher
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: &ad,
            },
        )
        .unwrap_or_default();
    let (nonce, data) = (B64.encode(nonce), B64.encode(data));
    ring.recent()
        .remember(&nonce, key_id, &ad, &data, plaintext);
    let mut m = Map::with_capacity(5);
    m.insert(MARKER.to_owned(), Value::from(VERSION));
    if coded {
        m.insert("coded".to_owned(), Value::from(1));
    }
    m.insert("key".to_owned(), Value::from(key_id));
    m.insert("nonce".to_owned(), Value::from(nonce));
    m.insert("data".to_owned(), Value::from(data));
    Value::Object(m)
}

/// `bytes` of a [`Codec`](super::Codec), without encryption: an envelope with no key.
pub(crate) fn wrap(bytes: &[u8]) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert(MARKER.to_owned(), Value::from(VERSION));
    m.insert("coded".to_owned(), Value::from(1));
    m.insert("data".to_owned(), Value::from(B64.encode(bytes)));
    Value::Object(m)
}

/// Whether `value` is an envelope (sealed, or a codec's bytes).
pub(crate) fn is_sealed(value: &Value) -> bool {
    value.as_object().is_some_and(|m| m.contains_key(MARKER))
}

/// The key id of `value` when it is an encrypted envelope.
pub(crate) fn sealed_key(value: &Value) -> Option<&str> {
    let m = value.as_object()?;
    m.get(MARKER)?;
    m.get("key").and_then(Value::as_str)
}

/// The Poly1305 tag every ciphertext carries after the plaintext's bytes.
const TAG_BYTES: usize = 16;

/// The length of the plaintext sealed in envelope `value`, read from the ciphertext's length
/// without opening it (XChaCha20-Poly1305 adds exactly its tag): `None` for an envelope whose
/// bytes are a codec's (their plaintext is known only once the codec decodes them) or that is
/// not well-formed.
pub(crate) fn sealed_plain_len(value: &Value) -> Option<usize> {
    let m = value.as_object()?;
    if m.contains_key("coded") || !m.contains_key("key") {
        return None;
    }
    let data = m.get("data")?.as_str()?.as_bytes();
    if data.len() % 4 != 0 {
        return None;
    }
    let padding = data.iter().rev().take(2).filter(|b| **b == b'=').count();
    (data.len() / 4 * 3)
        .checked_sub(padding)?
        .checked_sub(TAG_BYTES)
}

/// The plaintext of envelope `value` sealed for `binding`, opened with `ring` (`None`: no
/// keys were given, so every encrypted envelope names a missing key), and whether its bytes
/// are a codec's.
pub(crate) fn open(
    ring: Option<&Keyring>,
    value: &Value,
    binding: &Binding<'_>,
) -> Result<(Vec<u8>, bool), OpenError> {
    let m = value
        .as_object()
        .ok_or_else(|| OpenError::Malformed("not an object".to_owned()))?;
    if m.get(MARKER).and_then(Value::as_u64) != Some(VERSION) {
        return Err(OpenError::Malformed(format!(
            "unknown version {}",
            m.get(MARKER).unwrap_or(&Value::Null)
        )));
    }
    let field = |name: &str| {
        m.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| OpenError::Malformed(format!("no `{name}`")))
    };
    let coded = m.contains_key("coded");
    if !m.contains_key("key") {
        // A codec's bytes, not encrypted.
        let data = B64
            .decode(field("data")?)
            .map_err(|e| OpenError::Malformed(format!("data: {e}")))?;
        return Ok((data, coded));
    }
    let key_id = field("key")?;
    let Some(ring) = ring.filter(|r| r.has(key_id)) else {
        return Err(OpenError::MissingKey(key_id.to_owned()));
    };
    let (nonce, data) = (field("nonce")?, field("data")?);
    let mut failed = None;
    for subject in binding.open_subjects() {
        match open_for(ring, &subject, binding, key_id, coded, nonce, data) {
            Err(e @ OpenError::Unauthentic { .. }) => failed = Some(e),
            done => return done,
        }
    }
    Err(failed.unwrap_or(OpenError::Unauthentic {
        key: key_id.to_owned(),
    }))
}

/// [`open`] for one of the binding's subjects.
fn open_for(
    ring: &Keyring,
    subject: &[u8],
    binding: &Binding<'_>,
    key_id: &str,
    coded: bool,
    nonce: &str,
    data: &str,
) -> Result<(Vec<u8>, bool), OpenError> {
    let ad = binding.associated_data(subject, key_id, coded);
    // Sealed here lately: the very envelope gives back the plaintext it was sealed from.
    if let Some(plain) = ring.recent().recall(nonce, key_id, &ad, data) {
        return Ok((plain, coded));
    }
    let Some(key) = ring.data_key(key_id, subject) else {
        return Err(OpenError::MissingKey(key_id.to_owned()));
    };
    let nonce = B64
        .decode(nonce)
        .map_err(|e| OpenError::Malformed(format!("nonce: {e}")))?;
    if nonce.len() != NONCE_BYTES {
        return Err(OpenError::Malformed(format!(
            "a nonce of {} bytes",
            nonce.len()
        )));
    }
    let data = B64
        .decode(data)
        .map_err(|e| OpenError::Malformed(format!("data: {e}")))?;
    let cipher = XChaCha20Poly1305::new(&key.into());
    cipher
        .decrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: &data,
                aad: &ad,
            },
        )
        .map(|plain| (plain, coded))
        .map_err(|_| OpenError::Unauthentic {
            key: key_id.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Keys;

    fn ring(id: &str, byte: u8) -> Keyring {
        Keys::new().current(id, [byte; 32]).ring().unwrap()
    }

    #[test]
    fn a_sealed_payload_opens_only_where_it_was_sealed() {
        let (run, other) = (RunId::new(), RunId::new());
        let r = ring("k1", 1);
        let at = |subject, kind, place| Binding {
            subject,
            kind,
            place,
        };
        let b = at(Subject::Run(run), "step_result", "s-1");
        let v = seal(&r, b"secret marker", &b, false);
        assert_eq!(sealed_key(&v), Some("k1"));
        assert!(!v.to_string().contains("secret"), "{v}");
        assert_eq!(open(Some(&r), &v, &b).unwrap().0, b"secret marker");
        for n in 0..40 {
            let plain = vec![b'x'; n];
            assert_eq!(sealed_plain_len(&seal(&r, &plain, &b, false)), Some(n));
        }
        assert_eq!(sealed_plain_len(&seal(&r, b"x", &b, true)), None);
        assert_eq!(sealed_plain_len(&wrap(b"x")), None);
        // Two seals of one value differ (fresh nonces).
        assert_ne!(seal(&r, b"secret marker", &b, false), v);
        for wrong in [
            at(Subject::Run(other), "step_result", "s-1"),
            at(Subject::Run(run), "step_input", "s-1"),
            at(Subject::Run(run), "step_result", "s-2"),
            at(Subject::Token("s-1"), "step_result", "s-1"),
        ] {
            assert_eq!(
                open(Some(&r), &v, &wrong),
                Err(OpenError::Unauthentic { key: "k1".into() }),
                "{wrong:?}"
            );
        }
        // The same id with another key: does not open either.
        assert!(matches!(
            open(Some(&ring("k1", 2)), &v, &b),
            Err(OpenError::Unauthentic { .. })
        ));
        // A missing key is named.
        let err = open(Some(&ring("k2", 1)), &v, &b).unwrap_err();
        assert_eq!(err, OpenError::MissingKey("k1".into()));
        assert!(err.to_string().contains("key \"k1\""), "{err}");
        assert_eq!(open(None, &v, &b), Err(OpenError::MissingKey("k1".into())));
        // A flipped ciphertext byte is caught.
        let mut bad = v.clone();
        let data = B64.decode(bad["data"].as_str().unwrap()).unwrap();
        let mut data = data;
        data[0] ^= 1;
        bad["data"] = Value::from(B64.encode(data));
        assert!(matches!(
            open(Some(&r), &bad, &b),
            Err(OpenError::Unauthentic { .. })
        ));
        assert_eq!(sealed_key(&Value::from("plain")), None);
    }

    #[test]
    fn an_old_key_still_opens_what_it_sealed() {
        let run = RunId::new();
        let b = Binding {
            subject: Subject::Run(run),
            kind: "input",
            place: "",
        };
        let v = seal(&ring("a", 1), b"x", &b, false);
        let rotated = Keys::new()
            .current("b", [2; 32])
            .old("a", [1; 32])
            .ring()
            .unwrap();
        assert_eq!(open(Some(&rotated), &v, &b).unwrap().0, b"x");
        assert_eq!(sealed_key(&seal(&rotated, b"x", &b, false)), Some("b"));
        // The codec flag is bound: an envelope stripped of it does not open.
        let mut coded = seal(&rotated, b"x", &b, true);
        assert_eq!(
            open(Some(&rotated), &coded, &b).unwrap(),
            (b"x".to_vec(), true)
        );
        coded.as_object_mut().unwrap().remove("coded");
        assert!(matches!(
            open(Some(&rotated), &coded, &b),
            Err(OpenError::Unauthentic { .. })
        ));
        let plain = wrap(b"y");
        assert!(is_sealed(&plain) && sealed_key(&plain).is_none());
        assert_eq!(open(None, &plain, &b).unwrap(), (b"y".to_vec(), true));
    }

    #[test]
    fn a_chains_payload_opens_in_every_run_of_the_chain_and_nowhere_else() {
        let (origin, later, other) = (RunId::new(), RunId::new(), RunId::new());
        let r = ring("k1", 1);
        let chain = |origin, run| Binding {
            subject: Subject::Chain { origin, run },
            kind: "message",
            place: "t",
        };
        // Sealed by the first run (or a sender to it): opened by a later run of the chain.
        let v = seal(&r, b"m", &chain(origin, origin), false);
        assert_eq!(open(Some(&r), &v, &chain(origin, later)).unwrap().0, b"m");
        // Sealed by a later run: opened by the first.
        let v = seal(&r, b"m", &chain(origin, later), false);
        assert_eq!(open(Some(&r), &v, &chain(origin, origin)).unwrap().0, b"m");
        // An unchained run's are what they always were: `Run` and `Chain` of itself agree.
        let alone = Binding {
            subject: Subject::Run(origin),
            kind: "message",
            place: "t",
        };
        assert_eq!(open(Some(&r), &v, &alone).unwrap().0, b"m");
        // Sealed for the later run alone (before chains shared payloads): still opens there.
        let own = Binding {
            subject: Subject::Run(later),
            ..alone
        };
        let old = seal(&r, b"old", &own, false);
        assert_eq!(
            open(Some(&r), &old, &chain(origin, later)).unwrap().0,
            b"old"
        );
        // Another chain, or a run of none, opens neither.
        for wrong in [
            chain(other, other),
            chain(other, later),
            chain(later, other),
        ] {
            assert!(
                matches!(
                    open(
                        Some(&r),
                        &seal(&r, b"m", &chain(origin, later), false),
                        &wrong
                    ),
                    Err(OpenError::Unauthentic { .. })
                ),
                "{wrong:?}"
            );
        }
        assert!(matches!(
            open(Some(&r), &old, &chain(origin, origin)),
            Err(OpenError::Unauthentic { .. })
        ));
    }
}
