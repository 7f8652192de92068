//! Payloads this process sealed lately, by nonce. A payload is often opened by the process
//! that sealed it, moments later: the driver reads the input its client sealed, the workflow
//! takes the step result its attempt sealed, a waiter reads the output its driver sealed.
//! Opening such an envelope returns the plaintext it was sealed from, without the cipher, but
//! only when the envelope is the very one sealed: the same key id, nonce, ciphertext and
//! associated data (so the same binding), for which decryption could only give that
//! plaintext. Anything else (another binding, altered bytes, a rekeyed payload) is opened by
//! the cipher as before.
//!
//! Bounded: only plaintexts up to [`MAX_PLAIN`] bytes are kept, at most [`KEPT`] of them, the
//! oldest forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// At most this many payloads are kept.
const KEPT: usize = 1024;
/// Larger plaintexts are not kept (so the cache holds at most about 16 MiB of them).
const MAX_PLAIN: usize = 16 << 10;

/// One sealed payload: what its envelope holds, and its plaintext.
struct Sealed {
    key_id: String,
    associated_data: Vec<u8>,
    /// The envelope's ciphertext, as stored (base64).
    data: String,
    plaintext: Vec<u8>,
}

#[derive(Default)]
struct Kept {
    /// By the envelope's nonce (base64).
    by_nonce: HashMap<String, Sealed>,
    /// Nonces, oldest first.
    order: VecDeque<String>,
}

/// Payloads sealed lately, by nonce.
#[derive(Default)]
pub(super) struct Recent(Mutex<Kept>);

impl Recent {
    /// Keeps the plaintext of the envelope just sealed with these parts.
    pub(super) fn remember(
        &self,
        nonce: &str,
        key_id: &str,
        associated_data: &[u8],
        data: &str,
        plaintext: &[u8],
    ) {
        if plaintext.len() > MAX_PLAIN {
            return;
        }
        // A poisoned cache only held copies: it is left alone.
        let Ok(mut kept) = self.0.lock() else {
            return;
        };
        while kept.order.len() >= KEPT {
            if let Some(old) = kept.order.pop_front() {
                kept.by_nonce.remove(&old);
            }
        }
        kept.order.push_back(nonce.to_owned());
        kept.by_nonce.insert(
            nonce.to_owned(),
            Sealed {
                key_id: key_id.to_owned(),
                associated_data: associated_data.to_vec(),
                data: data.to_owned(),
                plaintext: plaintext.to_vec(),
            },
        );
    }

    /// The plaintext of the envelope with these parts, if this process sealed that very
    /// envelope lately.
    pub(super) fn recall(
        &self,
        nonce: &str,
        key_id: &str,
        associated_data: &[u8],
        data: &str,
    ) -> Option<Vec<u8>> {
        let kept = self.0.lock().ok()?;
        let s = kept.by_nonce.get(nonce)?;
        (s.key_id == key_id && s.associated_data == associated_data && s.data == data)
            .then(|| s.plaintext.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_very_envelope_is_recalled_and_the_oldest_go_first() {
        let r = Recent::default();
        r.remember("n1", "k", b"ad", "data", b"plain");
        assert_eq!(r.recall("n1", "k", b"ad", "data"), Some(b"plain".to_vec()));
        assert_eq!(r.recall("n1", "k2", b"ad", "data"), None, "another key id");
        assert_eq!(r.recall("n1", "k", b"ad2", "data"), None, "another binding");
        assert_eq!(
            r.recall("n1", "k", b"ad", "datb"),
            None,
            "altered ciphertext"
        );
        assert_eq!(r.recall("n2", "k", b"ad", "data"), None, "another nonce");
        r.remember("big", "k", b"ad", "d", &vec![0u8; MAX_PLAIN + 1]);
        assert_eq!(r.recall("big", "k", b"ad", "d"), None, "too large to keep");
        for i in 0..KEPT {
            r.remember(&format!("m{i}"), "k", b"ad", "d", b"p");
        }
        assert_eq!(
            r.recall("n1", "k", b"ad", "data"),
            None,
            "the oldest was forgotten"
        );
        assert!(r
            .recall(&format!("m{}", KEPT - 1), "k", b"ad", "d")
            .is_some());
        assert_eq!(r.0.lock().unwrap().by_nonce.len(), KEPT);
    }
}
