//! Idempotency index keys (docs/design.md §9 "Idempotency"): how the engine builds the
//! key of a `(tenant, subject, upstream, tool, key)` tuple, and how a store tells
//! which tenant a stored key belongs to (a tenant purge, docs/design.md §27 "Tenant
//! purge", removes a tenant's claims by that prefix, including claims whose task is
//! long gone).

/// The parts joined by NUL with each NUL inside a part written as NUL 0xFF. A UTF-8
/// part never holds 0xFF, so one key names one tuple (tenant "a\0b" with subject "c" is
/// not tenant "a" with subject "b\0c"), and parts without NUL give the keys they
/// always gave.
pub fn index_key(tenant: &str, subject: &str, upstream: &str, tool: &str, key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in [tenant, subject, upstream, tool, key].iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        escape_into(&mut out, part);
    }
    out
}

fn escape_into(out: &mut Vec<u8>, part: &str) {
    for &b in part.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
}

/// What every key of `tenant` starts with: the escaped tenant and the NUL after it.
/// A key with this prefix belongs to `tenant` unless the byte after it is 0xFF (then
/// the NUL was inside a longer tenant name: see [`belongs_to`]).
pub(crate) fn tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(tenant.len() + 1);
    escape_into(&mut out, tenant);
    out.push(0);
    out
}

/// Whether the index key `key` is one of `tenant`'s ([`tenant_prefix`] = `prefix`).
pub(crate) fn belongs_to(key: &[u8], prefix: &[u8]) -> bool {
    key.starts_with(prefix) && key.get(prefix.len()) != Some(&0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_belongs_to_its_tenant_only() {
        let k = |t: &str, s: &str| index_key(t, s, "u", "t", "k");
        let a = tenant_prefix("a");
        assert!(belongs_to(&k("a", "b"), &a));
        assert!(belongs_to(&k("a", ""), &a));
        assert!(
            belongs_to(&k("a", "\0x"), &a),
            "a subject that starts with NUL"
        );
        assert!(
            !belongs_to(&k("a\0b", "c"), &a),
            "a longer tenant with a NUL"
        );
        assert!(!belongs_to(&k("ab", "c"), &a));
        assert!(!belongs_to(&k("", "a"), &a));
        let nul = tenant_prefix("a\0b");
        assert!(belongs_to(&k("a\0b", "c"), &nul));
        assert!(!belongs_to(&k("a", "b\0c"), &nul));
    }
}
