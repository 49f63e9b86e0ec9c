//! Task ids: `tsk_` + base64url (no padding) of 16 CSPRNG bytes (docs/design.md §1
//! "Promotion"). Any other shape is malformed and answered without a store read (§7
//! "Ownership").

use base64::Engine;
use rand::RngCore;

const PREFIX: &str = "tsk_";

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
}
