//! The keys a runtime is given ([`Keys`]), checked into a [`Keyring`] by `build()`: which key
//! seals new payloads, which keys open old ones, and the per-run data keys derived from them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use aes_gcm::{Aes256Gcm, KeyInit};
use hkdf::Hkdf;
use sha2::Sha256;

use super::recent::Recent;

/// The size of every key, in bytes (256 bits).
pub(crate) const KEY_BYTES: usize = 32;

/// The longest key id accepted: ids are stored beside every payload, in the clear.
pub(super) const MAX_ID_BYTES: usize = 64;

/// The encryption keys of a runtime: one current key, which seals every new payload, and the
/// old keys still needed to read payloads sealed before a rotation. Give it to
/// [`RuntimeBuilder::encryption`](crate::RuntimeBuilder::encryption); `build()` checks it.
///
/// Keys are 32 bytes (`[u8; 32]`, `Vec<u8>`, ...); an id is a short printable name (at most 64
/// bytes) stored beside each payload, so a reader knows which key to use. The key itself is
/// never stored.
///
/// ```
/// use workflow_core::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder()
///     .in_memory()
///     .encryption(Keys::new().current("2026-12", [7u8; 32]).old("2025-06", vec![9u8; 32]))
///     .build()
///     .await?;
///
/// // A key of the wrong size is refused by `build()`, which names it.
/// let err = Runtime::builder()
///     .in_memory()
///     .encryption(Keys::new().current("short", vec![1u8; 16]))
///     .build()
///     .await
///     .unwrap_err();
/// assert!(err.to_string().contains("\"short\" is 16 bytes"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Keys {
    current: Vec<(String, Vec<u8>)>,
    old: Vec<(String, Vec<u8>)>,
    compact: bool,
}

impl fmt::Debug for Keys {
    // Ids only: a key must not reach a log through a `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids = |v: &[(String, Vec<u8>)]| v.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
        f.debug_struct("Keys")
            .field("current", &ids(&self.current))
            .field("old", &ids(&self.old))
            .field("compact", &self.compact)
            .finish()
    }
}

impl Keys {
    /// No keys yet.
    pub fn new() -> Self {
        Keys::default()
    }

    /// The key that seals every new payload, and its id.
    pub fn current(mut self, id: impl Into<String>, key: impl Into<Vec<u8>>) -> Self {
        self.current.push((id.into(), key.into()));
        self
    }

    /// A key that only opens payloads sealed with it before a rotation, and its id.
    pub fn old(mut self, id: impl Into<String>, key: impl Into<Vec<u8>>) -> Self {
        self.old.push((id.into(), key.into()));
        self
    }

    /// Seals new payloads in the envelope's compact form, a JSON string
    /// (`"$wf_sealed:v4:<key id>:<nonce and ciphertext>"`), instead of an object of one field
    /// (`{"$wf_sealed": "v4:<key id>:..."}`). The same ciphertext, a few bytes shorter, and
    /// cheaper to copy on its way to the store and back: about a fifth fewer of the
    /// instructions encryption adds to a one-step run (BENCHMARKS.md).
    ///
    /// Every build since this option reads both forms. Builds before it read only objects and
    /// would take a compact envelope for a plain string, so turn it on only once no worker or
    /// client of an older build works on the store (after a rolling upgrade has finished);
    /// turning it off again is always safe.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder()
    ///     .in_memory()
    ///     .encryption(Keys::new().current("2026-12", [7u8; 32]).compact_envelopes())
    ///     .build()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn compact_envelopes(mut self) -> Self {
        self.compact = true;
        self
    }

    /// Keys written as text, the format of `workflow --keys FILE` (and `WORKFLOW_KEYS`): one key
    /// a line, `current <id> <key>` once and `old <id> <key>` for each old key, each key 32
    /// bytes in base64 (`head -c 32 /dev/urandom | base64`) or 64 hex digits; blank lines and
    /// lines starting with `#` are skipped. The keys are checked as `build()` checks them.
    ///
    /// ```
    /// use workflow_core::Keys;
    ///
    /// let keys = Keys::parse(
    ///     "# rotated 2026-12\n\
    ///      current 2026-12 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n\
    ///      old 2025-06 0202020202020202020202020202020202020202020202020202020202020202\n",
    /// )?;
    /// assert_eq!(keys.ids(), ["2026-12", "2025-06"]);
    /// assert!(Keys::parse("current k c2hvcnQ=").unwrap_err().to_string().contains("\"k\" is 5 bytes"));
    /// # Ok::<(), workflow_core::KeyError>(())
    /// ```
    pub fn parse(text: &str) -> Result<Keys, KeyError> {
        use base64::Engine as _;
        let mut keys = Keys::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parse = |why: &str| KeyError::Parse {
                line: n + 1,
                why: why.to_owned(),
            };
            let mut words = line.split_whitespace();
            let (Some(role), Some(id), Some(text), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(parse("expected `current <id> <key>` or `old <id> <key>`"));
            };
            let key = if text.len() == 2 * KEY_BYTES && text.bytes().all(|b| b.is_ascii_hexdigit())
            {
                (0..KEY_BYTES)
                    .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| parse("the key is not hex"))?
            } else {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|_| parse("the key is neither base64 nor 64 hex digits"))?
            };
            keys = match role {
                "current" => keys.current(id, key),
                "old" => keys.old(id, key),
                _ => return Err(parse("a line starts with `current` or `old`")),
            };
        }
        keys.ring()?;
        Ok(keys)
    }

    /// The ids of the keys given, the current key's first.
    pub fn ids(&self) -> Vec<&str> {
        self.current
            .iter()
            .chain(&self.old)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// The keys checked: exactly one current key, every key 32 bytes, every id given once.
    pub(crate) fn ring(&self) -> Result<Keyring, KeyError> {
        let (current, key) = match self.current.as_slice() {
            [] => return Err(KeyError::NoCurrent),
            [one] => one,
            [a, b, ..] => {
                return Err(KeyError::TwoCurrent {
                    first: a.0.clone(),
                    second: b.0.clone(),
                })
            }
        };
        let mut keys: Vec<(String, Hkdf<Sha256>)> = Vec::new();
        for (id, key) in std::iter::once((current, key)).chain(self.old.iter().map(|(i, k)| (i, k)))
        {
            if id.is_empty() || id.len() > MAX_ID_BYTES || !id.chars().all(|c| c.is_ascii_graphic())
            {
                return Err(KeyError::InvalidId { id: id.clone() });
            }
            let key: [u8; KEY_BYTES] =
                key.as_slice().try_into().map_err(|_| KeyError::WrongSize {
                    id: id.clone(),
                    size: key.len(),
                })?;
            // The extraction step of HKDF depends on the key alone: done once here, so a
            // run's data key costs only the expansion.
            let extracted = Hkdf::<Sha256>::new(Some(HKDF_SALT), &key);
            if keys.iter().any(|(known, _)| known == id) {
                return Err(KeyError::Duplicate { id: id.clone() });
            }
            keys.push((id.clone(), extracted));
        }
        let _ = key;
        Ok(Keyring(Arc::new(Ring {
            current: current.clone(),
            compact: self.compact,
            ciphers: Mutex::new(keys.iter().map(|_| Derived::default()).collect()),
            derived: Mutex::new(keys.iter().map(|_| Derived::default()).collect()),
            keys,
            recent: Recent::default(),
        })))
    }
}

/// Why [`Keys`] were refused by `build()`; each message names the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A key is not 32 bytes long.
    #[error("encryption key {id:?} is {size} bytes; keys must be exactly 32 bytes (256 bits)")]
    WrongSize {
        /// The key's id.
        id: String,
        /// Its size in bytes.
        size: usize,
    },
    /// Two keys share an id.
    #[error("encryption key id {id:?} is given twice; every key needs an id of its own")]
    Duplicate {
        /// The shared id.
        id: String,
    },
    /// No current key: nothing could seal new payloads.
    #[error("no current encryption key: set one with `Keys::new().current(id, key)`")]
    NoCurrent,
    /// `current` was called twice.
    #[error(
        "two current encryption keys, {first:?} and {second:?}: keep one and give the other \
         with `.old(id, key)`"
    )]
    TwoCurrent {
        /// The first current key's id.
        first: String,
        /// The second's.
        second: String,
    },
    /// A line of a keys file ([`Keys::parse`]) is not a key.
    #[error("line {line} of the keys: {why}")]
    Parse {
        /// From 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// An id that is empty, longer than 64 bytes, or holds other than printable ASCII.
    #[error(
        "encryption key id {id:?} is not usable: ids are 1 to 64 printable ASCII characters \
         without spaces (they are stored beside each payload)"
    )]
    InvalidId {
        /// The id as given.
        id: String,
    },
}

crate::error::from_own_errors!(KeyError);

/// The salt of every data key's HKDF.
const HKDF_SALT: &[u8] = b"workflow-rs payload key v1";

struct Ring {
    current: String,
    /// [`Keys::compact_envelopes`]: new payloads are sealed in the string form.
    compact: bool,
    /// Every key with its id, the current one first, as HKDF extracted it (the keys
    /// themselves are not kept). A ring holds a few keys: they are found by their id's bytes
    /// faster than by hashing it.
    keys: Vec<(String, Hkdf<Sha256>)>,
    /// AES-256-GCM ciphers of the data keys derived lately, by key (as `keys` orders them),
    /// then subject: a run's payloads are sealed and opened many times in a row, and HKDF and
    /// the cipher's key schedule cost more than sealing a small payload.
    ciphers: Mutex<Vec<Derived<Arc<Aes256Gcm>>>>,
    /// XChaCha20-Poly1305 data keys derived lately, the same way: they open envelopes
    /// sealed before version 3.
    derived: Mutex<Vec<Derived<[u8; KEY_BYTES]>>>,
    /// Payloads sealed lately, opened again without the cipher (see `recent.rs`).
    recent: Recent,
}

/// What was derived from one key for each subject, found without building a key to look it
/// up (a lookup is made for every payload sealed or opened) and hashed with foldhash (the
/// subjects are run ids and hook tokens; SipHash cost more than the lookup's other work).
/// Emptied when it reaches [`DERIVED_KEPT`] entries.
struct Derived<T>(HashMap<Vec<u8>, T, foldhash::fast::RandomState>);

impl<T> Default for Derived<T> {
    fn default() -> Self {
        Derived(HashMap::default())
    }
}

impl<T: Clone> Derived<T> {
    fn get(cache: &Mutex<Vec<Self>>, key: usize, subject: &[u8]) -> Option<T> {
        // A poisoned cache only held derived keys: they are derived again.
        let c = cache.lock().ok()?;
        c.get(key)?.0.get(subject).cloned()
    }

    fn keep(cache: &Mutex<Vec<Self>>, key: usize, subject: &[u8], value: T) {
        let Ok(mut c) = cache.lock() else {
            return;
        };
        let Some(d) = c.get_mut(key) else {
            return;
        };
        if d.0.len() >= DERIVED_KEPT {
            d.0.clear();
        }
        d.0.insert(subject.to_vec(), value);
    }
}

/// At most this many derived data keys (and as many ciphers, about 1 MiB) are kept.
const DERIVED_KEPT: usize = 1024;

/// The HKDF info prefix of the AES-256-GCM data keys: they differ from the XChaCha20-Poly1305
/// keys of the same subject, so no key serves two ciphers.
const GCM_INFO: &[u8] = b"aes-256-gcm:";

/// Checked keys, cheap to clone: the current key's id and every key by id.
#[derive(Clone)]
pub(crate) struct Keyring(Arc<Ring>);

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&str> = self.0.keys.iter().map(|(id, _)| id.as_str()).collect();
        ids.sort_unstable();
        f.debug_struct("Keyring")
            .field("current", &self.0.current)
            .field("ids", &ids)
            .finish()
    }
}

impl Keyring {
    /// The id of the key new payloads are sealed with.
    pub(crate) fn current(&self) -> &str {
        &self.0.current
    }

    /// Whether new payloads are sealed in the envelope's compact form (a string).
    pub(crate) fn compact(&self) -> bool {
        self.0.compact
    }

    /// Payloads this keyring sealed lately.
    pub(super) fn recent(&self) -> &Recent {
        &self.0.recent
    }

    /// Whether key `id` was given.
    pub(crate) fn has(&self, id: &str) -> bool {
        self.key(id).is_some()
    }

    /// The data key of `subject` under key `id` (HKDF-SHA256 of the key, with the subject as
    /// its info), for XChaCha20-Poly1305: each run (or hook token) has its own, so one run's
    /// ciphertext means nothing under another's. `None` when key `id` was not given.
    pub(crate) fn data_key(&self, id: &str, subject: &[u8]) -> Option<[u8; KEY_BYTES]> {
        let (at, hk) = self.key(id)?;
        if let Some(k) = Derived::get(&self.0.derived, at, subject) {
            return Some(k);
        }
        let mut out = [0u8; KEY_BYTES];
        // 32 bytes is far below HKDF-SHA256's limit of 255 * 32, so expand cannot fail.
        hk.expand(subject, &mut out).ok()?;
        Derived::keep(&self.0.derived, at, subject, out);
        Some(out)
    }

    /// The AES-256-GCM cipher of `subject`'s data key under key `id` (derived as
    /// [`Keyring::data_key`], with its own info prefix), its key schedule made once.
    /// `None` when key `id` was not given.
    pub(crate) fn gcm(&self, id: &str, subject: &[u8]) -> Option<Arc<Aes256Gcm>> {
        let (at, hk) = self.key(id)?;
        if let Some(c) = Derived::get(&self.0.ciphers, at, subject) {
            return Some(c);
        }
        let mut out = [0u8; KEY_BYTES];
        hk.expand_multi_info(&[GCM_INFO, subject], &mut out).ok()?;
        let cipher = Arc::new(Aes256Gcm::new(&out.into()));
        out.fill(0);
        Derived::keep(&self.0.ciphers, at, subject, cipher.clone());
        Some(cipher)
    }

    /// Key `id`'s place in the ring and its HKDF.
    fn key(&self, id: &str) -> Option<(usize, &Hkdf<Sha256>)> {
        self.0
            .keys
            .iter()
            .enumerate()
            .find_map(|(at, (known, hk))| (known == id).then_some((at, hk)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_errors_name_the_key() {
        let err = Keys::new().current("a", vec![0u8; 31]).ring().unwrap_err();
        assert_eq!(
            err,
            KeyError::WrongSize {
                id: "a".into(),
                size: 31
            }
        );
        assert!(err.to_string().contains("\"a\" is 31 bytes"), "{err}");
        let err = Keys::new()
            .current("a", [0u8; 32])
            .old("b", vec![0u8; 33])
            .ring()
            .unwrap_err();
        assert_eq!(
            err,
            KeyError::WrongSize {
                id: "b".into(),
                size: 33
            }
        );
        let err = Keys::new()
            .current("a", [0u8; 32])
            .old("a", [1u8; 32])
            .ring()
            .unwrap_err();
        assert_eq!(err, KeyError::Duplicate { id: "a".into() });
        assert_eq!(
            Keys::new().old("a", [0u8; 32]).ring().unwrap_err(),
            KeyError::NoCurrent
        );
        assert!(matches!(
            Keys::new()
                .current("a", [0u8; 32])
                .current("b", [0u8; 32])
                .ring(),
            Err(KeyError::TwoCurrent { .. })
        ));
        assert!(matches!(
            Keys::new().current("a b", [0u8; 32]).ring(),
            Err(KeyError::InvalidId { .. })
        ));
        let ring = Keys::new()
            .current("new", [1u8; 32])
            .old("old", [2u8; 32])
            .ring()
            .unwrap();
        assert_eq!(ring.current(), "new");
        assert!(ring.has("old") && !ring.has("other"));
    }

    #[test]
    fn data_keys_differ_by_subject_and_key_and_nothing_prints_a_key() {
        let ring = Keys::new()
            .current("a", [1u8; 32])
            .old("b", [2u8; 32])
            .ring()
            .unwrap();
        let k = |id, s: &str| ring.data_key(id, s.as_bytes()).unwrap();
        assert_eq!(k("a", "run:1"), k("a", "run:1"));
        // Derived afresh once the cache was emptied: the same key.
        let first = k("a", "run:1");
        for i in 0..=DERIVED_KEPT {
            k("a", &format!("run:x{i}"));
        }
        assert_eq!(k("a", "run:1"), first);
        assert_ne!(k("a", "run:1"), k("a", "run:2"));
        assert_ne!(k("a", "run:1"), k("b", "run:1"));
        assert!(ring.data_key("c", b"run:1").is_none());
        let keys = Keys::new().current("a", [0xabu8; 32]);
        assert_eq!(
            format!("{keys:?}"),
            r#"Keys { current: ["a"], old: [], compact: false }"#
        );
        assert!(!format!("{ring:?}").contains("171"));
    }
}
