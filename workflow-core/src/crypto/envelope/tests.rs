//! The envelope's forms, bindings and versions, sealed and opened.

use super::*;
use crate::crypto::Keys;

fn ring(id: &str, byte: u8) -> Keyring {
    Keys::new().current(id, [byte; 32]).ring().unwrap()
}

/// The sealed text of envelope `v` of version 4 (its one field) or 5 (after the marker and its
/// `:`).
fn text_of(v: &Value) -> &str {
    match v {
        Value::String(s) => s.strip_prefix(STRING_PREFIX).unwrap(),
        _ => v[MARKER].as_str().unwrap(),
    }
}

/// A version 4 envelope of sealed text `text`, as `seal` writes it.
fn with_text(text: &str) -> Value {
    let mut m = Map::new();
    m.insert(MARKER.to_owned(), Value::from(text));
    Value::Object(m)
}

/// Envelope `v` of version 4 or 5 as version 4 writes it: the text in an object's one field.
fn as_version_4(v: &Value) -> Value {
    with_text(text_of(v))
}

/// Envelope `v` as version 5 holds it: the same text in a string after the marker.
fn as_version_5(v: &Value) -> Value {
    Value::from(format!("{STRING_PREFIX}{}", text_of(v)))
}

/// Version 4 envelope `v` as version 3 wrote it: the same nonce and ciphertext after
/// `gcm:`, the key id (and the codec's flag) in fields of their own.
fn as_version_3(v: &Value) -> Value {
    let text = text_of(v);
    let (form, rest) = text.split_once(':').unwrap();
    let (key, data) = v4_parts(rest).unwrap();
    let mut m = Map::new();
    m.insert(
        MARKER.to_owned(),
        Value::from(format!("{GCM_PREFIX}{data}")),
    );
    if form == V4_CODED {
        m.insert("coded".to_owned(), Value::from(1));
    }
    m.insert("key".to_owned(), Value::from(key));
    Value::Object(m)
}

/// `plaintext` sealed as version 2 was (XChaCha20-Poly1305, no cipher name): what stores
/// hold from before version 3.
fn seal_version_2(ring: &Keyring, plaintext: &[u8], binding: &Binding<'_>, coded: bool) -> Value {
    let key_id = ring.current();
    let subject = binding.subject_bytes();
    let key = ring.data_key(key_id, &subject).unwrap();
    let nonce: [u8; 24] = rand::random();
    let ad = binding.associated_data(Cipher::XChaCha, &subject, key_id, coded);
    let data = XChaCha20Poly1305::new(&key.into())
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: &ad,
            },
        )
        .unwrap();
    let mut m = Map::new();
    m.insert(
        MARKER.to_owned(),
        Value::from(format!("{}{}", B64.encode(nonce), B64.encode(data))),
    );
    if coded {
        m.insert("coded".to_owned(), Value::from(1));
    }
    m.insert("key".to_owned(), Value::from(key_id));
    Value::Object(m)
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
    let v = seal(&r, b"secret marker", &b, false, true);
    assert_eq!(sealed_key(&v), Some("k1"));
    assert!(!v.to_string().contains("secret"), "{v}");
    assert_eq!(open(Some(&r), &v, &b).unwrap().0, b"secret marker");
    for n in 0..40 {
        let plain = vec![b'x'; n];
        assert_eq!(
            sealed_plain_len(&seal(&r, &plain, &b, false, true)),
            Some(n)
        );
    }
    assert_eq!(sealed_plain_len(&seal(&r, b"x", &b, true, true)), None);
    assert_eq!(sealed_plain_len(&wrap(b"x")), None);
    // Two seals of one value differ (fresh nonces).
    assert_ne!(seal(&r, b"secret marker", &b, false, true), v);
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
    // One field: the form, the key id, the nonce and the ciphertext.
    let text = text_of(&v);
    assert!(text.starts_with("v4:k1:"), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    // Sealed compact, the same ciphertext in a string: opens alike, for a ring without the
    // option too.
    let compact = Keys::new()
        .current("k1", [1; 32])
        .compact_envelopes()
        .ring()
        .unwrap();
    let c = seal(&compact, b"secret marker", &b, false, true);
    assert!(c.as_str().unwrap().starts_with("$wf_sealed:v4:k1:"), "{c}");
    assert_eq!(sealed_key(&c), Some("k1"));
    assert_eq!(sealed_plain_len(&c), Some(13));
    assert_eq!(open(Some(&r), &c, &b).unwrap().0, b"secret marker");
    assert_eq!(open(Some(&compact), &v, &b).unwrap().0, b"secret marker");
    // The same text in the string of version 5 opens alike.
    let v5 = as_version_5(&v);
    assert!(is_sealed(&v5) && sealed_key(&v5) == Some("k1"), "{v5}");
    assert_eq!(open(Some(&r), &v5, &b).unwrap().0, b"secret marker");
    assert!(matches!(
        open(
            Some(&r),
            &v5,
            &at(Subject::Run(other), "step_result", "s-1")
        ),
        Err(OpenError::Unauthentic { .. })
    ));
    // A flipped ciphertext byte is caught.
    let mut bytes = B64.decode(&text["v4:k1:".len()..]).unwrap();
    bytes[Cipher::Gcm.nonce_bytes()] ^= 1;
    let mut bad = with_text(&format!("v4:k1:{}", B64.encode(bytes)));
    assert!(matches!(
        open(Some(&r), &bad, &b),
        Err(OpenError::Unauthentic { .. })
    ));
    // Named under another key id, or as the other cipher, it does not open either.
    bad = with_text(&text.replace("v4:k1:", "v4:k2:"));
    assert_eq!(
        open(Some(&ring("k2", 1)), &bad, &b),
        Err(OpenError::Unauthentic { key: "k2".into() })
    );
    bad = with_text(&text["v4:k1:".len()..]);
    assert!(open(Some(&r), &bad, &b).is_err());
    // A sealed text too short to hold a nonce, without a key id or without a form's name
    // (which version 3 read from a field a string does not have), is not an envelope; in
    // the object of version 4 neither.
    for short in [
        "AAAA",
        "gcm:AAAA",
        "gcm:AAAAAAAAAAAAAAAAAAAAAAAA",
        "v4:k1:AAAA",
        "v4:AAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        for bad in [with_text(short), as_version_5(&with_text(short))] {
            assert!(
                matches!(open(Some(&r), &bad, &b), Err(OpenError::Malformed(_))),
                "{bad}"
            );
        }
    }
    // A string without the marker is a plain value, not an envelope.
    assert!(!is_sealed(&Value::from(text)));
    assert!(!is_sealed(&Value::from("$wf_sealed")));
    // A key id may hold a `:`.
    let colon = ring("2026:12", 1);
    let v = seal(&colon, b"secret marker", &b, false, true);
    assert_eq!(sealed_key(&v), Some("2026:12"));
    assert_eq!(open(Some(&colon), &v, &b).unwrap().0, b"secret marker");
    // The longest id (64 bytes), ending in a `:`.
    let id = "k:".repeat(32);
    let longest = ring(&id, 1);
    let v = seal(&longest, b"secret marker", &b, false, true);
    assert_eq!(sealed_key(&v), Some(id.as_str()));
    assert_eq!(open(Some(&longest), &v, &b).unwrap().0, b"secret marker");
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
    let v = seal(&ring("a", 1), b"x", &b, false, true);
    let rotated = Keys::new()
        .current("b", [2; 32])
        .old("a", [1; 32])
        .ring()
        .unwrap();
    assert_eq!(open(Some(&rotated), &v, &b).unwrap().0, b"x");
    assert_eq!(
        sealed_key(&seal(&rotated, b"x", &b, false, true)),
        Some("b")
    );
    // The codec flag is bound: an envelope stripped of it does not open (version 4: the
    // form `v4c` named `v4`; version 3: without its `coded` field).
    let coded = seal(&rotated, b"x", &b, true, true);
    assert_eq!(
        open(Some(&rotated), &coded, &b).unwrap(),
        (b"x".to_vec(), true)
    );
    let stripped = with_text(&text_of(&coded).replacen("v4c:", "v4:", 1));
    let mut stripped_3 = as_version_3(&coded);
    assert_eq!(
        open(Some(&rotated), &stripped_3, &b).unwrap(),
        (b"x".to_vec(), true)
    );
    stripped_3.as_object_mut().unwrap().remove("coded");
    for bad in [stripped, stripped_3] {
        assert!(
            matches!(
                open(Some(&rotated), &bad, &b),
                Err(OpenError::Unauthentic { .. })
            ),
            "{bad}"
        );
    }
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
    let v = seal(&r, b"m", &chain(origin, origin), false, true);
    assert_eq!(open(Some(&r), &v, &chain(origin, later)).unwrap().0, b"m");
    // Sealed by a later run: opened by the first.
    let v = seal(&r, b"m", &chain(origin, later), false, true);
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
    let old = seal(&r, b"old", &own, false, true);
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
                    &seal(&r, b"m", &chain(origin, later), false, true),
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
/// stores hold from before version 2: the nonce and ciphertext of version 2 `v` split in
/// two fields.
fn as_version_1(v: &Value) -> Value {
    const NONCE_B64: usize = Cipher::XChaCha.nonce_b64();
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
fn versions_1_to_5_open_and_are_measured() {
    let run = RunId::new();
    let b = Binding {
        subject: Subject::Run(run),
        kind: "step_result",
        place: "s-1",
    };
    for coded in [false, true] {
        let v2 = seal_version_2(&ring("k1", 1), b"\"old secret\"", &b, coded);
        let v1 = as_version_1(&v2);
        let v4 = seal(&ring("k1", 1), b"\"old secret\"", &b, coded, true);
        let (v3, v5) = (as_version_3(&v4), as_version_5(&v4));
        for old in [v1, v2, v3, v4, v5] {
            assert_eq!(sealed_key(&old), Some("k1"));
            assert!(is_sealed(&old));
            // A fresh ring: nothing sealed lately, so the cipher opens it.
            let fresh = ring("k1", 1);
            assert_eq!(
                open(Some(&fresh), &old, &b).unwrap(),
                (b"\"old secret\"".to_vec(), coded)
            );
            assert_eq!(
                sealed_plain_len(&old),
                (!coded).then_some(b"\"old secret\"".len())
            );
            // Still bound to its place and key.
            let elsewhere = Binding { place: "s-2", ..b };
            assert!(matches!(
                open(Some(&fresh), &old, &elsewhere),
                Err(OpenError::Unauthentic { .. })
            ));
            assert_eq!(
                open(Some(&ring("k2", 1)), &old, &b),
                Err(OpenError::MissingKey("k1".into()))
            );
        }
    }
    // A version 1 envelope as the release before version 2 wrote it, field for field.
    let text = seal_version_2(&ring("k1", 1), b"1", &b, false);
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
    // The same nonce and ciphertext in one string: version 2 as stores hold it.
    let v2: Value = serde_json::from_str(
        r#"{"$wf_sealed":"ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7qU8z+e19AmJAjuAYrXA7O17qcONvMCz32hTZiu5/EiL/oxc3i6/8jKFs","key":"2025-06"}"#,
    )
    .unwrap();
    assert_eq!(open(Some(&keys), &v2, &b).unwrap(), (plain.to_vec(), false));
    assert_eq!(sealed_plain_len(&v2), Some(plain.len()));
    // Sealed again (as `workflow rekey` does): version 4 under the current key.
    let again = seal(&keys, plain, &b, false, true);
    assert!(text_of(&again).starts_with("v4:2026-12:"), "{again}");
    assert_eq!(open(Some(&keys), &again, &b).unwrap().0, plain);
    assert_eq!(open(Some(&fresh_copy()), &again, &b).unwrap().0, plain);
}

/// A ring of the keys of `a_stored_version_1_envelope_opens` that sealed nothing: what
/// another process has.
fn fresh_copy() -> Keyring {
    Keys::new()
        .current("2026-12", [1; 32])
        .old("2025-06", [7; 32])
        .ring()
        .unwrap()
}

#[test]
fn long_subjects_and_places_still_bind() {
    let r = ring("k1", 1);
    let token = "t".repeat(300);
    let place = "p".repeat(300);
    let at = |token, place| Binding {
        subject: Subject::Token(token),
        kind: "hook_payload",
        place,
    };
    let v = seal(&r, b"long", &at(&token, &place), false, true);
    let fresh = ring("k1", 1);
    assert_eq!(
        open(Some(&fresh), &v, &at(&token, &place)).unwrap().0,
        b"long"
    );
    let other = format!("{}u", "t".repeat(299));
    assert!(matches!(
        open(Some(&fresh), &v, &at(&other, &place)),
        Err(OpenError::Unauthentic { .. })
    ));
    assert!(matches!(
        open(Some(&fresh), &v, &at(&token, &place[1..])),
        Err(OpenError::Unauthentic { .. })
    ));
}

#[test]
fn forms_of_newer_builds_are_told_apart_from_corrupt_ones() {
    let r = ring("k1", 1);
    let b = Binding {
        subject: Subject::Run(RunId::new()),
        kind: "input",
        place: "",
    };
    let v4 = seal(&r, b"1", &b, false, true);
    let v4c = seal(&r, b"1", &b, true, true);
    let v2 = seal_version_2(&r, b"1", &b, false);
    for known in [
        &v4,
        &v4c,
        &as_version_5(&v4),
        &as_version_5(&v4c),
        &as_version_3(&v4),
        &v2,
        &as_version_1(&v2),
        &wrap(b"1"),
        &Value::from("plain"),
    ] {
        assert_eq!(unknown_form(known), None, "{known}");
    }
    let newer = serde_json::json!({"$wf_sealed": "x2:AAAA", "key": "k1"});
    assert_eq!(unknown_form(&newer).as_deref(), Some("cipher `x2`"));
    assert!(
        matches!(open(Some(&r), &newer, &b), Err(OpenError::Malformed(m)) if m.contains("`x2`"))
    );
    let newer = as_version_5(&with_text("x2:k1:AAAA"));
    assert_eq!(unknown_form(&newer).as_deref(), Some("cipher `x2`"));
    assert!(
        matches!(open(Some(&r), &newer, &b), Err(OpenError::Malformed(m)) if m.contains("`x2`"))
    );
    let v9 = serde_json::json!({"$wf_sealed": 9, "key": "k1"});
    assert_eq!(unknown_form(&v9).as_deref(), Some("envelope version 9"));
    // A `:` beyond where a cipher's name may reach, or a marker of another type: corrupt,
    // not newer.
    let far = format!("{}:AAAA", "A".repeat(NAME_MAX));
    assert_eq!(
        unknown_form(&serde_json::json!({"$wf_sealed": far, "key": "k1"})),
        None
    );
    assert_eq!(unknown_form(&as_version_5(&with_text(&far))), None);
    assert_eq!(unknown_form(&serde_json::json!({"$wf_sealed": true})), None);
}

/// A version 3 envelope made outside this crate (Python's `cryptography`: HKDF-SHA256 with
/// the info `aes-256-gcm:run:<id>`, AES-256-GCM with the associated data of
/// `Binding::associated_data`): key "2026-12" = 32 bytes of 1, run
/// `01JF8Z3V5K6M7N8P9QRSTVWXYZ`, a step result at `stp_1`.
#[test]
fn a_version_3_envelope_made_elsewhere_opens() {
    let run: RunId = "01JF8Z3V5K6M7N8P9QRSTVWXYZ".parse().unwrap();
    let b = Binding {
        subject: Subject::Run(run),
        kind: "step_result",
        place: "stp_1",
    };
    let keys = Keys::new().current("2026-12", [1; 32]).ring().unwrap();
    // Version 3, then the same nonce and ciphertext in version 4's one string and in version
    // 5's string.
    let [stored, v4, v5] =
        [STORED_V3, STORED_V4, STORED_V5].map(|text| serde_json::from_str::<Value>(text).unwrap());
    for form in [&stored, &v4, &v5] {
        assert_eq!(sealed_key(form), Some("2026-12"));
        assert_eq!(
            open(Some(&keys), form, &b).unwrap(),
            (b"\"written by version 3\"".to_vec(), false)
        );
        assert_eq!(sealed_plain_len(form), Some(22));
    }
    assert_eq!(as_version_4(&v5), v4);
    assert_eq!(as_version_3(&v5), stored);
}

const STORED_V3: &str = r#"{"$wf_sealed":"gcm:YWJjZGVmZ2hpamtspgBjLiaDW4uGgcTOFijRvVaKgKu2TuHmaLPHZbHZvTWhM91qLyo=","key":"2026-12"}"#;
const STORED_V4: &str = r#"{"$wf_sealed":"v4:2026-12:YWJjZGVmZ2hpamtspgBjLiaDW4uGgcTOFijRvVaKgKu2TuHmaLPHZbHZvTWhM91qLyo="}"#;
const STORED_V5: &str = r#""$wf_sealed:v4:2026-12:YWJjZGVmZ2hpamtspgBjLiaDW4uGgcTOFijRvVaKgKu2TuHmaLPHZbHZvTWhM91qLyo=""#;
