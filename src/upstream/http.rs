//! Legacy Streamable HTTP upstream transport (spec C3).
