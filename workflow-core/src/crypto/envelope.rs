//! The envelope a sealed payload is stored in: a JSON object, because every store keeps
//! payloads as JSON values, that readers recognise by its reserved marker. Written since
//! version 4, one field: the form's name, the key id, then the nonce and the ciphertext in
//! one base64 string:
//!
//! ```json
//! {"$wf_sealed": "v4:2026-12:<12 bytes of nonce, then ciphertext and tag, base64>"}
//! ```
//!
//! The form is `v4` for a payload's bytes, `v4c` for a [`Codec`](super::Codec)'s. A key id is
//! printable ASCII and may hold a `:`; base64 holds none, so the text after the last `:` is
//! the sealed bytes. The cipher is AES-256-GCM under the data key of the payload's subject
//! (see [`Keyring::gcm`]): a data key seals the payloads of one run (or one chain, or one hook
//! token), far fewer than the 2^32 messages below which random 96-bit nonces are safe.
//!
//! Written with [`Keys::compact_envelopes`](super::Keys::compact_envelopes), and read always:
//! version 5, the same text as a JSON string after the marker and a `:`,
//! `"$wf_sealed:v4:2026-12:<base64>"`. A payload is cloned, dropped and serialized several
//! times on its way to the store and back, and a string costs one allocation where the
//! object's map costs three and a tree node (about 10,000 instructions of the 49,000 that
//! encryption adds to a one-step run). A build that reads only objects would take such a
//! string for a plain value and misread it, hence the option, for once no such build runs.
//!
//! Envelopes written before are read as well: version 3 (the same cipher and
//! associated data, the key id in a field of its own), and, sealed with XChaCha20-Poly1305,
//! version 2 (no form's name, a nonce of 24 bytes) and version 1 (the nonce and the
//! ciphertext in fields of their own; a nonce of 24 bytes is exactly 32 base64 characters, so
//! both split into the same nonce and data texts):
//!
//! ```json
//! {"$wf_sealed": "gcm:<12 bytes of nonce, then ciphertext and tag, base64>", "key": "2026-12"}
//! {"$wf_sealed": "<24 bytes of nonce, then ciphertext and tag, base64>", "key": "2026-12"}
//! {"$wf_sealed": 1, "key": "2026-12", "nonce": "<24 bytes, base64>", "data": "<ciphertext and tag, base64>"}
//! ```
//!
//! Versions 1 to 3 carry `"coded": 1` when their bytes are a codec's. Version 4 is version 3
//! in one string: one map entry to build, clone, store and drop instead of two or three, and
//! nine bytes fewer (eighteen for a codec's). A codec's bytes without encryption are written
//! as version 1 (`{"$wf_sealed": 1, "coded": 1, "data": ...}`). The associated data
//! binds the ciphertext to its cipher, its subject, its kind, its place, its key id and
//! whether its bytes are a codec's, so a ciphertext moved anywhere else fails to open.

use aes_gcm::aead::{Aead, AeadInPlace, KeyInit, Payload};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::{Map, Value};

use super::keys::Keyring;
use crate::ids::RunId;

/// The marker field of an envelope, and the version 1 number it holds (a version 2
/// envelope holds its nonce and ciphertext there instead).
pub(crate) const MARKER: &str = "$wf_sealed";
const VERSION: u64 = 1;
/// What begins the sealed text of a version 3 envelope: the cipher's name and a `:` (never
/// base64, which has no `:`).
const GCM_PREFIX: &str = "gcm:";
/// The names version 4 begins its sealed text with (then a `:`, the key id, a `:`): for a
/// payload's bytes, for a codec's.
const V4: &str = "v4";
const V4_CODED: &str = "v4c";
/// What begins an envelope of version 5 (written with `Keys::compact_envelopes`): the marker
/// and a `:`, then a sealed text of version 4.
const STRING_PREFIX: &str = "$wf_sealed:";
/// How far into a sealed text a form's name and its `:` may reach.
const NAME_MAX: usize = 16;

/// The cipher of a sealed envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cipher {
    /// AES-256-GCM: versions 3 and 4 (what is sealed now), with the same associated data.
    Gcm,
    /// XChaCha20-Poly1305: versions 1 and 2.
    XChaCha,
}

/// Whether this build reads the sealed texts that begin with form name `name` and a `:`.
fn known_form(name: &str) -> bool {
    GCM_PREFIX.strip_suffix(':') == Some(name) || name == V4 || name == V4_CODED
}

impl Cipher {
    /// The nonce's size in bytes.
    const fn nonce_bytes(self) -> usize {
        match self {
            Cipher::Gcm => 12,
            Cipher::XChaCha => 24,
        }
    }

    /// The nonce's length in base64: a multiple of 3 bytes, so without padding and the prefix
    /// of the base64 of anything that starts with it.
    const fn nonce_b64(self) -> usize {
        self.nonce_bytes() / 3 * 4
    }

    /// What the associated data begins with.
    const fn tag(self) -> &'static [u8] {
        match self {
            Cipher::Gcm => b"workflow-rs/sealed/v3",
            Cipher::XChaCha => b"workflow-rs/sealed/v1",
        }
    }
}

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
    fn subject_bytes(&self) -> Built<SUBJECT_BYTES> {
        match self.subject {
            Subject::Run(run) | Subject::Chain { origin: run, .. } => run_subject(run),
            Subject::Token(token) => Built::of(&[b"hook:", token.as_bytes()]),
        }
    }

    /// The subjects a payload of this binding opens for, in the order they are tried: the
    /// one it is sealed for, then (for a chain's payload read by a later run) the run alone,
    /// as payloads written before chains shared them were sealed.
    fn open_subjects(&self) -> impl Iterator<Item = Built<SUBJECT_BYTES>> {
        let fallback = match self.subject {
            Subject::Chain { origin, run } if origin != run => Some(run_subject(run)),
            Subject::Run(_) | Subject::Token(_) | Subject::Chain { .. } => None,
        };
        std::iter::once(self.subject_bytes()).chain(fallback)
    }

    fn associated_data(
        &self,
        cipher: Cipher,
        subject: &[u8],
        key_id: &str,
        coded: bool,
    ) -> Built<AD_BYTES> {
        let mut ad = Built::of(&[cipher.tag(), &[u8::from(coded)]]);
        for part in [
            subject,
            self.kind.as_bytes(),
            self.place.as_bytes(),
            key_id.as_bytes(),
        ] {
            // Length-prefixed: no two bindings share a byte string.
            ad.push(&(part.len() as u64).to_be_bytes());
            ad.push(part);
        }
        ad
    }
}

/// A run's subject, `run:<id>`, written without the formatting machinery.
fn run_subject(run: RunId) -> Built<SUBJECT_BYTES> {
    let mut buf = [0u8; ulid::ULID_LEN];
    let id = run.ulid().array_to_str(&mut buf);
    Built::of(&[b"run:", id.as_bytes()])
}

/// Room on the stack for a subject: a run's (30 bytes) and most hook tokens'.
const SUBJECT_BYTES: usize = 64;
/// Room on the stack for associated data: a step's (about 150 bytes) and most others'.
const AD_BYTES: usize = 256;

/// Bytes built on the stack while they fit in `N`, on the heap beyond: a subject and an
/// associated data are built for every payload sealed or opened, most of them short.
pub(super) enum Built<const N: usize> {
    Stack([u8; N], usize),
    Heap(Vec<u8>),
}

impl<const N: usize> Built<N> {
    /// `parts` one after the other.
    #[inline]
    fn of(parts: &[&[u8]]) -> Self {
        let mut b = Built::Stack([0; N], 0);
        for part in parts {
            b.push(part);
        }
        b
    }

    #[inline]
    fn push(&mut self, bytes: &[u8]) {
        match self {
            Built::Stack(buf, len) => match buf.get_mut(*len..*len + bytes.len()) {
                Some(room) => {
                    room.copy_from_slice(bytes);
                    *len += bytes.len();
                }
                None => {
                    let mut v = Vec::with_capacity(2 * N + bytes.len());
                    v.extend_from_slice(&buf[..*len]);
                    v.extend_from_slice(bytes);
                    *self = Built::Heap(v);
                }
            },
            Built::Heap(v) => v.extend_from_slice(bytes),
        }
    }
}

impl<const N: usize> std::ops::Deref for Built<N> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Built::Stack(buf, len) => &buf[..*len],
            Built::Heap(v) => v,
        }
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
/// [`Codec`](super::Codec)'s (said in the envelope and bound by the associated data);
/// `remember`: kept among the payloads sealed lately, for a reader of this process that opens
/// it soon without the plaintext at hand (see [`super::recent`]).
pub(crate) fn seal(
    ring: &Keyring,
    plaintext: &[u8],
    binding: &Binding<'_>,
    coded: bool,
    remember: bool,
) -> Value {
    let key_id = ring.current();
    let subject = binding.subject_bytes();
    let cipher = Cipher::Gcm;
    let form = if coded { V4_CODED } else { V4 };
    let nonce: [u8; 12] = rand::random();
    let ad = binding.associated_data(cipher, &subject, key_id, coded);
    // The nonce, the ciphertext and the tag in one buffer, encoded in one pass.
    let mut bytes = Vec::with_capacity(nonce.len() + plaintext.len() + TAG_BYTES);
    bytes.extend_from_slice(&nonce);
    bytes.extend_from_slice(plaintext);
    // The current key is in the ring by construction. Encryption with a valid key fails only
    // for inputs over 64 GiB, far over any payload limit; a text without its tag would then
    // fail to open rather than leak.
    let tag = ring.gcm(key_id, &subject).and_then(|gcm| {
        gcm.encrypt_in_place_detached(
            aes_gcm::Nonce::from_slice(&nonce),
            &ad,
            &mut bytes[nonce.len()..],
        )
        .ok()
    });
    match tag {
        Some(tag) => bytes.extend_from_slice(&tag),
        None => bytes.truncate(nonce.len()),
    }
    // One string: the form's name, the key id, the nonce's 16 characters, then the
    // ciphertext's (12 bytes of nonce are 16 characters without padding, so the two
    // encodings are one).
    let prefix = if ring.compact() { STRING_PREFIX } else { "" };
    let nonce_at = prefix.len() + form.len() + 1 + key_id.len() + 1;
    let data_at = nonce_at + cipher.nonce_b64();
    // Encoded into the text's own buffer, sized once (the engine's string encoding goes
    // through a chunked writer).
    let mut text = Vec::with_capacity(nonce_at + bytes.len().div_ceil(3) * 4);
    text.extend_from_slice(prefix.as_bytes());
    text.extend_from_slice(form.as_bytes());
    text.push(b':');
    text.extend_from_slice(key_id.as_bytes());
    text.push(b':');
    text.resize(nonce_at + bytes.len().div_ceil(3) * 4, 0);
    let written = B64
        .encode_slice(&bytes, &mut text[nonce_at..])
        .unwrap_or_default();
    text.truncate(nonce_at + written);
    // The form, a printable key id and base64: ASCII, so this never fails.
    let sealed = String::from_utf8(text).unwrap_or_default();
    if remember {
        ring.recent().remember(
            &sealed[nonce_at..data_at],
            key_id,
            &ad,
            &sealed[data_at..],
            plaintext,
        );
    }
    if ring.compact() {
        return Value::String(sealed);
    }
    let mut m = Map::new();
    m.insert(MARKER.to_owned(), Value::String(sealed));
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

/// What `value`'s envelope says of its form when this build does not read that form (a newer
/// build wrote it: a form's name before the sealed text other than `gcm`, `v4` and `v4c`, a
/// version number other than 1); `None` for a value that is no envelope, or is one of the
/// forms read here (a malformed one included: it is corrupt, not newer).
pub(crate) fn unknown_form(value: &Value) -> Option<String> {
    if let Some(text) = string_form(value) {
        let name = cipher_name(text)?;
        return (name != V4 && name != V4_CODED).then(|| format!("cipher `{name}`"));
    }
    match value.as_object()?.get(MARKER)? {
        Value::String(sealed) => {
            let name = cipher_name(sealed)?;
            (!known_form(name)).then(|| format!("cipher `{name}`"))
        }
        Value::Number(n) if n.as_u64() == Some(VERSION) => None,
        Value::Number(n) => Some(format!("envelope version {n}")),
        _ => None,
    }
}

/// The form's name before the first `:` of a sealed text; `None` for a text without one
/// (version 2, whose text is base64 alone).
fn cipher_name(sealed: &str) -> Option<&str> {
    let colon = sealed.bytes().take(NAME_MAX).position(|b| b == b':')?;
    Some(&sealed[..colon])
}

/// Whether `value` is an envelope (sealed, or a codec's bytes).
pub(crate) fn is_sealed(value: &Value) -> bool {
    match value {
        Value::String(s) => s.starts_with(STRING_PREFIX),
        Value::Object(m) => m.contains_key(MARKER),
        _ => false,
    }
}

/// The sealed text of an envelope of version 5 (a string): what follows the marker and its
/// `:`.
fn string_form(value: &Value) -> Option<&str> {
    value.as_str()?.strip_prefix(STRING_PREFIX)
}

/// The key id of `value` when it is an encrypted envelope.
pub(crate) fn sealed_key(value: &Value) -> Option<&str> {
    if let Some(text) = string_form(value) {
        return v4_text(text)?.ok().map(|(key, ..)| key);
    }
    let m = value.as_object()?;
    match m.get(MARKER)? {
        Value::String(sealed) => match v4_text(sealed) {
            Some(parts) => parts.ok().map(|(key, ..)| key),
            None => m.get("key").and_then(Value::as_str),
        },
        _ => m.get("key").and_then(Value::as_str),
    }
}

/// A sealed text of version 4 (`v4:` or `v4c:`, its key id, then its base64): the key id,
/// whether its bytes are a codec's, and the base64, or why not. `None` for a text of another
/// form.
fn v4_text(sealed: &str) -> Option<Result<(&str, bool, &str), OpenError>> {
    let name = cipher_name(sealed).filter(|name| *name == V4 || *name == V4_CODED)?;
    Some(
        v4_parts(&sealed[name.len() + 1..])
            .map(|(key, data)| (key, name == V4_CODED, data))
            .ok_or_else(|| OpenError::Malformed("a sealed text without its key id".to_owned())),
    )
}

/// The key id and the base64 of a version 4 text after its form's `:`; `None` without a key
/// id (the base64 has no `:`, a key id may). A key id is at most 64 bytes, so its `:` is
/// sought among the text's first 65 bytes, not from the end of a long ciphertext (a `:`
/// beyond is not base64, which then does not decode).
fn v4_parts(text: &str) -> Option<(&str, &str)> {
    let head = &text.as_bytes()[..text.len().min(super::keys::MAX_ID_BYTES + 1)];
    let colon = head.iter().rposition(|b| *b == b':').filter(|at| *at > 0)?;
    Some((&text[..colon], &text[colon + 1..]))
}

/// The Poly1305 tag every ciphertext carries after the plaintext's bytes.
const TAG_BYTES: usize = 16;

/// What an envelope holds, of either version (see the module docs).
enum Envelope<'a> {
    /// Encrypted under key `key`: the nonce and the ciphertext, each in base64.
    Sealed {
        key: &'a str,
        coded: bool,
        cipher: Cipher,
        nonce: &'a str,
        data: &'a str,
    },
    /// A codec's bytes, not encrypted, in base64.
    Coded { data: &'a str },
}

impl<'a> Envelope<'a> {
    /// The envelope `value` is, or why it is not one.
    fn parse(value: &'a Value) -> Result<Envelope<'a>, OpenError> {
        if let Some(text) = string_form(value) {
            let Some(parts) = v4_text(text) else {
                return Err(match cipher_name(text) {
                    Some(name) => newer_cipher(name),
                    None => {
                        OpenError::Malformed("a sealed text without its form's name".to_owned())
                    }
                });
            };
            let (key, coded, data) = parts?;
            return Envelope::sealed(key, coded, Cipher::Gcm, data, text.len());
        }
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
            // Version 4 (the form's name, the key id), 3 (the cipher's name) or 2: the nonce's
            // base64, then the ciphertext's, in one string.
            Some(Value::String(sealed)) => {
                let (key, coded, cipher, text) = match v4_text(sealed) {
                    Some(parts) => {
                        let (key, coded, data) = parts?;
                        (key, coded, Cipher::Gcm, data)
                    }
                    None => match cipher_name(sealed) {
                        None => (field("key")?, coded, Cipher::XChaCha, sealed.as_str()),
                        Some(name) if known_form(name) => {
                            (field("key")?, coded, Cipher::Gcm, &sealed[name.len() + 1..])
                        }
                        Some(name) => return Err(newer_cipher(name)),
                    },
                };
                Envelope::sealed(key, coded, cipher, text, sealed.len())
            }
            Some(v) if v.as_u64() == Some(VERSION) => match m.get("key") {
                None => Ok(Envelope::Coded {
                    data: field("data")?,
                }),
                Some(_) => Ok(Envelope::Sealed {
                    key: field("key")?,
                    coded,
                    cipher: Cipher::XChaCha,
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

impl<'a> Envelope<'a> {
    /// A sealed envelope of `cipher` whose nonce and ciphertext are `text` (base64, the nonce
    /// first) in a sealed text of `len` characters.
    fn sealed(
        key: &'a str,
        coded: bool,
        cipher: Cipher,
        text: &'a str,
        len: usize,
    ) -> Result<Envelope<'a>, OpenError> {
        let at = cipher.nonce_b64();
        if text.len() < at || !text.is_char_boundary(at) {
            return Err(OpenError::Malformed(format!(
                "a sealed text of {len} characters"
            )));
        }
        let (nonce, data) = text.split_at(at);
        Ok(Envelope::Sealed {
            key,
            coded,
            cipher,
            nonce,
            data,
        })
    }
}

/// Why a sealed text whose form is named `name` does not open here.
fn newer_cipher(name: &str) -> OpenError {
    OpenError::Malformed(format!(
        "it is sealed with cipher `{name}`, which this build does not read (a newer build \
         wrote it)"
    ))
}

/// The length of the plaintext sealed in envelope `value`, read from the ciphertext's length
/// without opening it (either cipher adds exactly its tag): `None` for an envelope whose
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
    let (key_id, coded, cipher, nonce, data) = match Envelope::parse(value)? {
        Envelope::Coded { data } => {
            let data = B64
                .decode(data)
                .map_err(|e| OpenError::Malformed(format!("data: {e}")))?;
            return Ok((data, true));
        }
        Envelope::Sealed {
            key,
            coded,
            cipher,
            nonce,
            data,
        } => (key, coded, cipher, nonce, data),
    };
    let Some(ring) = ring.filter(|r| r.has(key_id)) else {
        return Err(OpenError::MissingKey(key_id.to_owned()));
    };
    let sealed = Sealed {
        key_id,
        coded,
        cipher,
        nonce,
        data,
    };
    let mut failed = None;
    for subject in binding.open_subjects() {
        match open_for(ring, &subject, binding, &sealed) {
            Err(e @ OpenError::Unauthentic { .. }) => failed = Some(e),
            done => return done,
        }
    }
    Err(failed.unwrap_or(OpenError::Unauthentic {
        key: key_id.to_owned(),
    }))
}

/// The parts of a sealed envelope.
struct Sealed<'a> {
    key_id: &'a str,
    coded: bool,
    cipher: Cipher,
    nonce: &'a str,
    data: &'a str,
}

/// [`open`] for one of the binding's subjects.
fn open_for(
    ring: &Keyring,
    subject: &[u8],
    binding: &Binding<'_>,
    sealed: &Sealed<'_>,
) -> Result<(Vec<u8>, bool), OpenError> {
    let Sealed {
        key_id,
        coded,
        cipher,
        nonce,
        data,
    } = *sealed;
    let ad = binding.associated_data(cipher, subject, key_id, coded);
    // Sealed here lately: the very envelope gives back the plaintext it was sealed from.
    if let Some(plain) = ring.recent().recall(nonce, key_id, &ad, data) {
        return Ok((plain, coded));
    }
    let missing = || OpenError::MissingKey(key_id.to_owned());
    let nonce = B64
        .decode(nonce)
        .map_err(|e| OpenError::Malformed(format!("nonce: {e}")))?;
    if nonce.len() != cipher.nonce_bytes() {
        return Err(OpenError::Malformed(format!(
            "a nonce of {} bytes",
            nonce.len()
        )));
    }
    let data = B64
        .decode(data)
        .map_err(|e| OpenError::Malformed(format!("data: {e}")))?;
    let payload = Payload {
        msg: &data,
        aad: &ad,
    };
    let opened = match cipher {
        Cipher::Gcm => ring
            .gcm(key_id, subject)
            .ok_or_else(missing)?
            .decrypt(aes_gcm::Nonce::from_slice(&nonce), payload),
        Cipher::XChaCha => {
            let key = ring.data_key(key_id, subject).ok_or_else(missing)?;
            XChaCha20Poly1305::new(&key.into()).decrypt(XNonce::from_slice(&nonce), payload)
        }
    };
    opened
        .map(|plain| (plain, coded))
        .map_err(|_| OpenError::Unauthentic {
            key: key_id.to_owned(),
        })
}

#[cfg(test)]
mod tests;
