//! Reading a header that must not repeat, for every step that reads one (the HTTP
//! checks, the wire validation).

use http::{HeaderMap, HeaderValue};

/// A header that must appear at most once appeared more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Repeated;

/// The one value of a header that must not repeat: `Ok(None)` when absent,
/// `Err(Repeated)` when it appears more than once (a proxy and the gateway could each
/// read a different copy, so a repeat is never resolved by picking one).
pub(super) fn single(
    headers: &HeaderMap,
    name: impl http::header::AsHeaderName,
) -> Result<Option<&HeaderValue>, Repeated> {
    let mut all = headers.get_all(name).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(Repeated);
    }
    Ok(first)
}
