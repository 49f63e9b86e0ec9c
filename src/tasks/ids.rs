//! Task ids: `tsk_` + base64url (no padding) of 16 CSPRNG bytes (docs/design.md §1
//! "Promotion"). Any other shape is malformed and answered without a store read (§7
//! "Ownership"). 2025-era session ids (§22 "Clients of the 2025 era") are made the
//! same way: `mcs_` + base64url of 32 CSPRNG bytes, visible ASCII only, so they fit an
//! `Mcp-Session-Id` header as they are.

use base64::Engine;
use rand::RngCore;

const PREFIX: &str = "tsk_";
const SESSION_PREFIX: &str = "mcs_";

pub fn new_task_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// A request route id (in-flight call); never shown to clients.
pub fn new_route_id() -> String {
    let mut bytes = [0u8; 12];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "rt_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

pub fn is_well_formed(id: &str) -> bool {
    id.strip_prefix(PREFIX)
        .is_some_and(|rest| is_canonical_base64url(rest, 22))
}

/// Whether `s` is `len` characters of base64url (no padding) that decode canonically:
/// the bits past the last whole byte are zero, as an encoder writes them. Checked in
/// place rather than by decoding, since every `tasks/get` checks its id: 22 characters
/// carry 16 bytes and 4 spare bits, 43 carry 32 bytes and 2.
fn is_canonical_base64url(s: &str, len: usize) -> bool {
    let spare_bits = (len * 6) % 8;
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && s.bytes()
            .last()
            .is_some_and(|b| base64url_value(b) & ((1 << spare_bits) - 1) == 0)
}

/// The 6-bit value of a base64url character (one already checked to be one).
fn base64url_value(b: u8) -> u8 {
    match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'-' => 62,
        _ => 63,
    }
}

/// A 2025-era client session id (an `Mcp-Session-Id`): unguessable, and never a
/// credential by itself (the session is bound to its principal).
pub fn new_session_id() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{SESSION_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Whether `id` has the shape [`new_session_id`] gives; any other is answered like an
/// unknown session without a store read.
pub fn is_well_formed_session(id: &str) -> bool {
    id.strip_prefix(SESSION_PREFIX)
        .is_some_and(|rest| is_canonical_base64url(rest, 43))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_well_formed_and_distinct() {
        let a = new_task_id();
        let b = new_task_id();
        assert!(is_well_formed(&a), "{a}");
        assert_ne!(a, b);
        assert!(!is_well_formed("tsk_short"));
        assert!(!is_well_formed("gate-test"));
        assert!(!is_well_formed(&a.replace("tsk_", "tsx_")));
    }

    /// The in-place check accepts exactly what the base64 crate decodes to 16 (or 32)
    /// bytes: every last character on random bodies, and the other characters' rules.
    #[test]
    fn canonical_check_matches_decoding() {
        let decodes = |body: &str, bytes: usize| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(body)
                .is_ok_and(|b| b.len() == bytes)
        };
        let alphabet: Vec<char> =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=.~ "
                .chars()
                .collect();
        for (len, bytes) in [(22, 16), (43, 32)] {
            for _ in 0..50 {
                let mut raw = vec![0u8; bytes];
                rand::rng().fill_bytes(&mut raw);
                let body: String = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(&raw)
                    .chars()
                    .take(len - 1)
                    .collect();
                for &last in &alphabet {
                    let s = format!("{body}{last}");
                    assert_eq!(is_canonical_base64url(&s, len), decodes(&s, bytes), "{s}");
                }
            }
            let fresh =
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(vec![0xffu8; bytes]);
            assert!(is_canonical_base64url(&fresh, len), "{fresh}");
            for &c in &alphabet {
                let s = format!("{c}{}", &fresh[1..]);
                assert_eq!(is_canonical_base64url(&s, len), decodes(&s, bytes), "{s}");
            }
            assert!(!is_canonical_base64url(&fresh[1..], len));
            assert!(!is_canonical_base64url(&format!("{fresh}A"), len));
        }
        for _ in 0..200 {
            let id = new_task_id();
            assert!(is_well_formed(&id), "{id}");
            let s = new_session_id();
            assert!(is_well_formed_session(&s), "{s}");
        }
    }

    #[test]
    fn session_ids_are_well_formed_visible_ascii_and_distinct() {
        let a = new_session_id();
        let b = new_session_id();
        assert!(is_well_formed_session(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(a.len(), 47);
        assert!(a.bytes().all(|c| (0x21..=0x7e).contains(&c)), "{a}");
        assert!(!is_well_formed_session(&new_task_id()));
        assert!(!is_well_formed(&a));
        assert!(!is_well_formed_session("mcs_short"));
        assert!(!is_well_formed_session(&a.replace("mcs_", "mcx_")));
        assert!(!is_well_formed_session(&format!("{a}A")));
    }
}
