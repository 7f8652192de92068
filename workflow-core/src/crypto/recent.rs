//! Payloads this process sealed lately, by nonce. A payload is often opened by the process
//! that sealed it, moments later: the driver reads the input its client sealed, a waiter
//! reads the output its driver sealed. (A step's arguments and result are read back in the
//! clear by the call that sealed them, `Payloads::decode_known`, and are not kept here.)
//! Opening such an envelope returns the plaintext it was sealed from, without the cipher, but
//! only when the envelope is the very one sealed: the same key id, nonce, ciphertext and
//! associated data (so the same binding), for which decryption could only give that
//! plaintext. Anything else (another binding, altered bytes, a rekeyed payload) is opened by
//! the cipher as before.
//!
//! Bounded: only plaintexts up to [`MAX_PLAIN`] bytes are kept, at most [`KEPT`] of them, the
//! oldest forgotten first. Remembering is on the path of most seals, so an entry is two
//! allocations (what the envelope holds, its plaintext) under a fixed-size key.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// At most this many payloads are kept.
const KEPT: usize = 1024;
/// Larger plaintexts are not kept (so the cache holds at most about 16 MiB of them).
const MAX_PLAIN: usize = 16 << 10;
/// A nonce in base64 (12 or 24 bytes: 16 or 32 characters), zero-padded: the key of an entry.
type Nonce = [u8; 32];

/// The key of the entry of a nonce's base64; `None` for a text longer than any nonce.
fn key_of(nonce: &str) -> Option<Nonce> {
    let bytes = nonce.as_bytes();
    let mut key = [0u8; 32];
    key.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(key)
}

/// One sealed payload: what its envelope holds, and its plaintext.
struct Sealed {
    /// The key id, the associated data and the ciphertext (base64) one after the other.
    parts: Vec<u8>,
    /// Where the associated data and the ciphertext begin in `parts`.
    ad_at: usize,
    data_at: usize,
    plaintext: Vec<u8>,
}

impl Sealed {
    fn holds(&self, key_id: &str, associated_data: &[u8], data: &str) -> bool {
        let p = &self.parts;
        p[..self.ad_at] == *key_id.as_bytes()
            && p[self.ad_at..self.data_at] == *associated_data
            && p[self.data_at..] == *data.as_bytes()
    }
}

#[derive(Default)]
struct Kept {
    /// Hashed with foldhash: the nonces are random, and SipHash cost more than the rest of a
    /// lookup.
    by_nonce: HashMap<Nonce, Sealed, foldhash::fast::RandomState>,
    /// Nonces, oldest first.
    order: VecDeque<Nonce>,
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
        let Some(nonce) = key_of(nonce) else {
            return;
        };
        if plaintext.len() > MAX_PLAIN {
            return;
        }
        let mut parts = Vec::with_capacity(key_id.len() + associated_data.len() + data.len());
        parts.extend_from_slice(key_id.as_bytes());
        parts.extend_from_slice(associated_data);
        parts.extend_from_slice(data.as_bytes());
        let sealed = Sealed {
            parts,
            ad_at: key_id.len(),
            data_at: key_id.len() + associated_data.len(),
            plaintext: plaintext.to_vec(),
        };
        // A poisoned cache only held copies: it is left alone.
        let Ok(mut kept) = self.0.lock() else {
            return;
        };
        while kept.order.len() >= KEPT {
            if let Some(old) = kept.order.pop_front() {
                kept.by_nonce.remove(&old);
            }
        }
        kept.order.push_back(nonce);
        kept.by_nonce.insert(nonce, sealed);
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
        let nonce = key_of(nonce)?;
        let kept = self.0.lock().ok()?;
        let s = kept.by_nonce.get(&nonce)?;
        s.holds(key_id, associated_data, data)
            .then(|| s.plaintext.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nonce as an envelope holds it: 32 characters.
    fn n(name: &str) -> String {
        format!("{name:A>32}")
    }

    #[test]
    fn only_the_very_envelope_is_recalled_and_the_oldest_go_first() {
        let r = Recent::default();
        r.remember(&n("n1"), "k", b"ad", "data", b"plain");
        assert_eq!(
            r.recall(&n("n1"), "k", b"ad", "data"),
            Some(b"plain".to_vec())
        );
        assert_eq!(
            r.recall(&n("n1"), "k2", b"ad", "data"),
            None,
            "another key id"
        );
        assert_eq!(
            r.recall(&n("n1"), "k", b"ad2", "data"),
            None,
            "another binding"
        );
        assert_eq!(
            r.recall(&n("n1"), "k", b"ad", "datb"),
            None,
            "altered ciphertext"
        );
        // The parts are told apart, not only their concatenation.
        assert_eq!(
            r.recall(&n("n1"), "ka", b"d", "data"),
            None,
            "shifted parts"
        );
        assert_eq!(
            r.recall(&n("n2"), "k", b"ad", "data"),
            None,
            "another nonce"
        );
        assert_eq!(
            r.recall(&"n".repeat(33), "k", b"ad", "data"),
            None,
            "not a nonce"
        );
        // A nonce of 12 bytes (16 characters) is kept too.
        r.remember("ABCDEFGHIJKLMNOP", "k", b"ad", "d", b"short");
        assert_eq!(
            r.recall("ABCDEFGHIJKLMNOP", "k", b"ad", "d"),
            Some(b"short".to_vec())
        );
        r.remember(&n("big"), "k", b"ad", "d", &vec![0u8; MAX_PLAIN + 1]);
        assert_eq!(
            r.recall(&n("big"), "k", b"ad", "d"),
            None,
            "too large to keep"
        );
        for i in 0..KEPT {
            r.remember(&n(&format!("m{i}")), "k", b"ad", "d", b"p");
        }
        assert_eq!(
            r.recall(&n("n1"), "k", b"ad", "data"),
            None,
            "the oldest was forgotten"
        );
        assert!(r
            .recall(&n(&format!("m{}", KEPT - 1)), "k", b"ad", "d")
            .is_some());
        assert_eq!(r.0.lock().unwrap().by_nonce.len(), KEPT);
    }
}
