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
    id.strip_prefix(PREFIX).is_some_and(|rest| {
        rest.len() == 22
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(rest)
                .is_ok_and(|b| b.len() == 16)
    })
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
    id.strip_prefix(SESSION_PREFIX).is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(rest)
                .is_ok_and(|b| b.len() == 32)
    })
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
