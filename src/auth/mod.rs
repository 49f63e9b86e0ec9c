//! JWT bearer authentication (design.md policy 13).
