//! Builders shared by the benchmarks, the load harness and the integration tests'
//! harness (each includes this file with `#[path]` and uses a part of it): stored
//! records, HS256 tokens and the `[auth]` table that trusts them, free loopback ports.
#![allow(dead_code)]

use serde_json::{Map, Value, json};
use taskgate::store::{RequestRoute, SCHEMA_VERSION, TaskRecord, TaskStatus, now_ms};

/// An argument fingerprint of the real length (SHA-256, hex), so a stored record is
/// the size a real one is.
pub(crate) const FINGERPRINT: &str =
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A working task of `tenant`/`subject`, created now, that lives for `ttl_ms`.
pub(crate) fn task(id: &str, tenant: &str, subject: &str, ttl_ms: u64) -> TaskRecord {
    let now = now_ms();
    TaskRecord {
        v: SCHEMA_VERSION,
        task_id: id.into(),
        tenant: tenant.into(),
        subject: subject.into(),
        upstream: "demo".into(),
        tool: "echo".into(),
        args_fingerprint: FINGERPRINT.into(),
        idempotency_key: None,
        status: TaskStatus::Working,
        status_message: None,
        created_at_ms: now,
        last_updated_at_ms: now,
        ttl_ms,
        poll_interval_ms: 1000,
        expires_at_ms: now + ttl_ms,
        result: None,
        error: None,
        input_requests: Map::new(),
        issued_keys: Vec::new(),
        cancel_requested: false,
        trace: None,
    }
}

/// The route of task `task_id`'s upstream call, started now, for `tenant`/`subject`.
pub(crate) fn route(route_id: &str, task_id: &str, tenant: &str, subject: &str) -> RequestRoute {
    let now = now_ms();
    RequestRoute {
        v: SCHEMA_VERSION,
        route_id: route_id.into(),
        upstream: "demo".into(),
        tenant: tenant.into(),
        subject: subject.into(),
        method: "tools/call".into(),
        started_at_ms: now,
        deadline_ms: now + 60_000,
        task_id: Some(task_id.into()),
        upstream_task: None,
    }
}

/// Who signs the tokens a gateway under test trusts: the HS256 secret, issuer and
/// audience of its `[auth]` table. Each user names its own (`tests/common`, the
/// benches), so a token of one is never valid at the other.
pub(crate) struct Hs256Issuer {
    pub(crate) secret: &'static str,
    pub(crate) issuer: &'static str,
    pub(crate) audience: &'static str,
}

impl Hs256Issuer {
    /// The `[auth]` table (JWT, HS256 only) of a gateway that trusts this issuer.
    pub(crate) fn auth_section(&self) -> String {
        format!(
            "[auth]\nmode = \"jwt\"\nalgorithms = [\"HS256\"]\nhs256_secret = \"{}\"\nissuer = \"{}\"\naudience = \"{}\"\n",
            self.secret, self.issuer, self.audience
        )
    }

    /// The claims of `sub` in `tenant`, issued now and valid for `ttl_s` seconds.
    pub(crate) fn claims(&self, sub: &str, tenant: &str, ttl_s: u64) -> Value {
        let now = jsonwebtoken::get_current_timestamp();
        json!({"sub": sub, "tenant": tenant, "iss": self.issuer, "aud": self.audience,
               "iat": now, "exp": now + ttl_s})
    }

    /// A token carrying [`Hs256Issuer::claims`].
    pub(crate) fn token(&self, sub: &str, tenant: &str, ttl_s: u64) -> String {
        self.sign(&self.claims(sub, tenant, ttl_s))
    }

    /// A token carrying `claims` as they are (a test's own, or claims edited to be
    /// refused).
    pub(crate) fn sign(&self, claims: &Value) -> String {
        hs256_token(self.secret, claims)
    }
}

/// An HS256 token carrying `claims`, signed with `secret`.
pub(crate) fn hs256_token(secret: &str, claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A free loopback port (bound and released; good enough on loopback).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
