//! stdio upstream transport: a pool of children (spec C7, design.md policy 14).
