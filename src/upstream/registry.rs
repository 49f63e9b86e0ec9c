//! Upstreams by name, with one transport per isolation scope.

pub struct Upstream;
pub struct UpstreamSet;
