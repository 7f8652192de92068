//! The envelope a sealed payload is stored in: a JSON object, because every store keeps
//! payloads as JSON values, that readers recognise by its reserved marker. Written since
//! version 2, the nonce and the ciphertext in one base64 string under the marker:
//!
//! ```json
//! {"$wf_sealed": "<24 bytes of nonce, then ciphertext and tag, base64>", "key": "2026-12"}
//! ```
//!
//! Version 1 envelopes, written before, are read as well (a nonce of 24 bytes is exactly 32
//! base64 characters, so both versions split into the same nonce and data texts):
//!
//! ```json
//! {"$wf_sealed": 1, "key": "2026-12", "nonce": "<24 bytes, base64>", "data": "<ciphertext and tag, base64>"}
//! ```
//!
//! Either carries `"coded": 1` when its bytes are a [`Codec`](super::Codec)'s.
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

/// The marker field of an envelope, and the version 1 number it holds (a version 2
/// envelope holds its nonce and ciphertext there instead).
pub(crate) const MARKER: &str = "$wf_sealed";
const VERSION: u64 = 1;
const NONCE_BYTES: usize = 24;
/// The length of a nonce in base64: 24 bytes, a multiple of 3, so without padding and the
/// prefix of the base64 of anything that starts with it.
const NONCE_B64: usize = NONCE_BYTES / 3 * 4;

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
        const TAG: &[u8] = b"workflow-rs/sealed/v1";
        let mut ad = Vec::with_capacity(
            TAG.len() + 1 + 32 + subject.len() + self.kind.len() + self.place.len() + key_id.len(),
        );
        ad.extend_from_slice(TAG);
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
    // One string: the nonce's 32 characters, then the ciphertext's.
    let mut sealed = String::with_capacity(NONCE_B64 + data.len().div_ceil(3) * 4);
    B64.encode_string(nonce, &mut sealed);
    B64.encode_string(&data, &mut sealed);
    let (nonce, data) = sealed.split_at(NONCE_B64);
    ring.recent().remember(nonce, key_id, &ad, data, plaintext);
    let mut m = Map::new();
    m.insert(MARKER.to_owned(), Value::String(sealed));
    if coded {
        m.insert("coded".to_owned(), Value::from(1));
    }
    m.insert("key".to_owned(), Value::from(key_id));
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

/// What an envelope holds, of either version (see the module docs).
enum Envelope<'a> {
    /// Encrypted under key `key`: the nonce and the ciphertext, each in base64.
    Sealed {
        key: &'a str,
        coded: bool,
        nonce: &'a str,
        data: &'a str,
    },
    /// A codec's bytes, not encrypted, in base64.
    Coded { data: &'a str },
}

impl<'a> Envelope<'a> {
    /// The envelope `value` is, or why it is not one.
    fn parse(value: &'a Value) -> Result<Envelope<'a>, OpenError> {
        let m = value
            .as_object()
            .ok_or_else(|| OpenError::Malformed("not an object".to_owned()))?;
        let field = |name: &str| {
            m.get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| OpenError::Malformed(format!("no `{name}`")))
        };
        let coded = m.contains_key("coded");
        match m.get(MARKER) {
            // Version 2: the nonce's base64, then the ciphertext's, in one string.
            Some(Value::String(sealed)) => {
                let key = field("key")?;
                if sealed.len() < NONCE_B64 || !sealed.is_char_boundary(NONCE_B64) {
                    return Err(OpenError::Malformed(format!(
                        "a sealed text of {} characters",
                        sealed.len()
                    )));
                }
                let (nonce, data) = sealed.split_at(NONCE_B64);
                Ok(Envelope::Sealed {
                    key,
                    coded,
                    nonce,
                    data,
                })
            }
            Some(v) if v.as_u64() == Some(VERSION) => match m.get("key") {
                None => Ok(Envelope::Coded {
                    data: field("data")?,
                }),
                Some(_) => Ok(Envelope::Sealed {
                    key: field("key")?,
                    coded,
                    nonce: field("nonce")?,
                    data: field("data")?,
                }),
            },
            other => Err(OpenError::Malformed(format!(
                "unknown version {}",
                other.unwrap_or(&Value::Null)
            ))),
        }
    }
}

/// The length of the plaintext sealed in envelope `value`, read from the ciphertext's length
/// without opening it (XChaCha20-Poly1305 adds exactly its tag): `None` for an envelope whose
/// bytes are a codec's (their plaintext is known only once the codec decodes them) or that is
/// not well-formed.
pub(crate) fn sealed_plain_len(value: &Value) -> Option<usize> {
    let Ok(Envelope::Sealed {
        coded: false, data, ..
    }) = Envelope::parse(value)
    else {
        return None;
    };
    let data = data.as_bytes();
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
    let (key_id, coded, nonce, data) = match Envelope::parse(value)? {
        Envelope::Coded { data } => {
            let data = B64
                .decode(data)
                .map_err(|e| OpenError::Malformed(format!("data: {e}")))?;
            return Ok((data, true));
        }
        Envelope::Sealed {
            key,
            coded,
            nonce,
            data,
        } => (key, coded, nonce, data),
    };
    let Some(ring) = ring.filter(|r| r.has(key_id)) else {
        return Err(OpenError::MissingKey(key_id.to_owned()));
    };
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
        let mut bytes = B64.decode(bad[MARKER].as_str().unwrap()).unwrap();
        bytes[NONCE_BYTES] ^= 1;
        bad[MARKER] = Value::from(B64.encode(bytes));
        assert!(matches!(
            open(Some(&r), &bad, &b),
            Err(OpenError::Unauthentic { .. })
        ));
        // A sealed text too short to hold a nonce is not an envelope.
        bad[MARKER] = Value::from("AAAA");
        assert!(matches!(
            open(Some(&r), &bad, &b),
            Err(OpenError::Malformed(_))
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

    /// The envelope of version 1 (`"$wf_sealed": 1` with `nonce` and `data` fields), which
    /// stores hold from before version 2: the same nonce and ciphertext split in two fields.
    fn as_version_1(v: &Value) -> Value {
        let sealed = v[MARKER].as_str().unwrap();
        let mut m = Map::new();
        m.insert(MARKER.to_owned(), Value::from(1));
        if v.get("coded").is_some() {
            m.insert("coded".to_owned(), Value::from(1));
        }
        m.insert("key".to_owned(), v["key"].clone());
        m.insert("nonce".to_owned(), Value::from(&sealed[..NONCE_B64]));
        m.insert("data".to_owned(), Value::from(&sealed[NONCE_B64..]));
        Value::Object(m)
    }

    #[test]
    fn a_version_1_envelope_still_opens_and_is_measured() {
        let run = RunId::new();
        let b = Binding {
            subject: Subject::Run(run),
            kind: "step_result",
            place: "s-1",
        };
        for coded in [false, true] {
            let v2 = seal(&ring("k1", 1), b"\"old secret\"", &b, coded);
            assert_eq!(
                v2.as_object().unwrap().len(),
                if coded { 3 } else { 2 },
                "{v2}"
            );
            let v1 = as_version_1(&v2);
            assert_eq!(sealed_key(&v1), Some("k1"));
            assert!(is_sealed(&v1));
            // A fresh ring: nothing sealed lately, so the cipher opens it.
            let fresh = ring("k1", 1);
            assert_eq!(
                open(Some(&fresh), &v1, &b).unwrap(),
                (b"\"old secret\"".to_vec(), coded)
            );
            assert_eq!(
                sealed_plain_len(&v1),
                (!coded).then_some(b"\"old secret\"".len())
            );
            // Still bound to its place and key.
            let elsewhere = Binding { place: "s-2", ..b };
            assert!(matches!(
                open(Some(&fresh), &v1, &elsewhere),
                Err(OpenError::Unauthentic { .. })
            ));
            assert_eq!(
                open(Some(&ring("k2", 1)), &v1, &b),
                Err(OpenError::MissingKey("k1".into()))
            );
        }
        // A version 1 envelope as the previous release wrote it, field for field.
        let text = seal(&ring("k1", 1), b"1", &b, false);
        let v1 = as_version_1(&text);
        let written: Value = serde_json::from_str(&v1.to_string()).unwrap();
        assert_eq!(
            written.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["$wf_sealed", "data", "key", "nonce"]
        );
        assert_eq!(open(Some(&ring("k1", 1)), &written, &b).unwrap().0, b"1");
        // An unknown version is named.
        let mut v9 = written.clone();
        v9[MARKER] = Value::from(9);
        assert!(
            matches!(open(Some(&ring("k1", 1)), &v9, &b), Err(OpenError::Malformed(m)) if m.contains("unknown version 9"))
        );
    }

    /// A version 1 envelope as stores hold it from before version 2, made outside this crate
    /// (Python's `cryptography`: HKDF-SHA256, HChaCha20 and ChaCha20-Poly1305, the same
    /// construction): key "2025-06" = 32 bytes of 7, run `01JF8Z3V5K6M7N8P9QRSTVWXYZ`, a step
    /// result at `stp_1`.
    #[test]
    fn a_stored_version_1_envelope_opens() {
        let stored: Value = serde_json::from_str(
            r#"{"$wf_sealed":1,"key":"2025-06","nonce":"ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7","data":"qU8z+e19AmJAjuAYrXA7O17qcONvMCz32hTZiu5/EiL/oxc3i6/8jKFs"}"#,
        )
        .unwrap();
        let run: RunId = "01JF8Z3V5K6M7N8P9QRSTVWXYZ".parse().unwrap();
        let b = Binding {
            subject: Subject::Run(run),
            kind: "step_result",
            place: "stp_1",
        };
        let keys = Keys::new()
            .current("2026-12", [1; 32])
            .old("2025-06", [7; 32])
            .ring()
            .unwrap();
        let plain = b"\"written before version 2\"";
        assert_eq!(
            open(Some(&keys), &stored, &b).unwrap(),
            (plain.to_vec(), false)
        );
        assert_eq!(sealed_key(&stored), Some("2025-06"));
        assert_eq!(sealed_plain_len(&stored), Some(plain.len()));
        // Sealed again (as `workflow rekey` does): version 2 under the current key.
        let again = seal(&keys, plain, &b, false);
        assert!(
            again[MARKER].is_string() && again["key"] == "2026-12",
            "{again}"
        );
        assert_eq!(open(Some(&keys), &again, &b).unwrap().0, plain);
    }
}
