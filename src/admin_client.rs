//! `taskgate admin …`: a client of the operator API (README "Operations"). It sends
//! one request to `/admin/…` on a gateway's `metrics_listen` and prints the answer as
//! an aligned table, or as the JSON the API gave with `--json`.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::Value;

/// What went wrong before an answer came back, or the API's refusal.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    #[error("bad URL {0:?}")]
    Url(String),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("request to {url} failed: {reason}")]
    Transport { url: String, reason: String },
    #[error("{status}: {message}")]
    Refused { status: u16, message: String },
}

/// How long [`call`] waits for an answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// `method` `base` + `path` with the bearer `token`; the JSON answer of a 2xx
/// within `within` (a purge of a large tenant takes longer than a list).
pub async fn call(
    base: &str,
    path: &str,
    method: http::Method,
    token: Option<&str>,
    ca_file: Option<&Path>,
    within: Duration,
) -> Result<Value, AdminClientError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: http::Uri = url
        .parse()
        .map_err(|_| AdminClientError::Url(url.clone()))?;
    let tls = crate::tls::client::client_config(ca_file, None)?;
    let connector = crate::tls::client::https_connector(&tls, Duration::from_secs(10));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|_| AdminClientError::Url(url.clone()))?;
    let failed = |reason: String| AdminClientError::Transport {
        url: url.clone(),
        reason,
    };
    let resp = tokio::time::timeout(within, client.request(req))
        .await
        .map_err(|_| failed(format!("no answer within {} s", within.as_secs())))?
        .map_err(|e| failed(e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?
        .to_bytes();
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let message = refusal_message(&value, &body);
        return Err(AdminClientError::Refused { status, message });
    }
    Ok(value)
}

/// What a refusal says: its body's [`Refusal::message`], else the whole body.
fn refusal_message(value: &Value, body: &[u8]) -> String {
    value
        .as_object()
        .and_then(|m| Refusal::deserialize(m).ok())
        .and_then(Refusal::message)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

/// The members of a refusal's body (an object) that [`call`] reports: the operator API
/// answers errors in the OAuth style, `error` and an optional `error_description`.
#[derive(Deserialize)]
struct Refusal {
    #[serde(default)]
    error_description: Member,
    #[serde(default)]
    error: Member,
}

impl Refusal {
    /// `error_description` when there is one (`null` included), else `error`; the one
    /// chosen is the message only if it is a string (otherwise the caller shows the
    /// whole body).
    fn message(self) -> Option<String> {
        match self.error_description {
            Member::Missing => self.error,
            described => described,
        }
        .into_text()
    }
}

/// A member of a [`Refusal`]: a string, anything else (`null` included), or not there
/// at all.
#[derive(Default)]
enum Member {
    Text(String),
    Other,
    #[default]
    Missing,
}

impl<'de> Deserialize<'de> for Member {
    /// Matched by the member's type, not as an untagged enum, which would buffer it
    /// (tests/serde_buffering.rs).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Member::Text(s),
            _ => Member::Other,
        })
    }
}

impl Member {
    fn into_text(self) -> Option<String> {
        match self {
            Member::Text(s) => Some(s),
            Member::Other | Member::Missing => None,
        }
    }
}

/// Rows of strings as columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    for row in rows {
        out.push(line(row.iter().map(String::as_str).collect()));
    }
    out.join("\n")
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The task rows of a list or of one task.
pub fn tasks_table(tasks: &[Value]) -> String {
    let now = crate::store::now_ms();
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let age_s = now.saturating_sub(t["created_at_ms"].as_u64().unwrap_or(now)) / 1000;
            vec![
                text(&t["id"]),
                text(&t["status"]),
                text(&t["tenant"]),
                text(&t["subject"]),
                text(&t["upstream"]),
                text(&t["tool"]),
                format!("{age_s}s"),
                text(&t["status_message"]),
            ]
        })
        .collect();
    table(
        &[
            "ID", "STATUS", "TENANT", "SUBJECT", "UPSTREAM", "TOOL", "AGE", "MESSAGE",
        ],
        &rows,
    )
}

/// The per-tenant counts, one column per status.
pub fn tenants_table(tenants: &[Value]) -> String {
    let statuses = crate::store::TaskStatus::ALL.map(crate::store::TaskStatus::as_str);
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            let mut row = vec![text(&t["tenant"])];
            row.extend(
                statuses
                    .iter()
                    .map(|s| t["tasks"][*s].as_u64().unwrap_or(0).to_string()),
            );
            row
        })
        .collect();
    let mut header = vec!["TENANT"];
    header.extend(statuses.iter().map(|s| match *s {
        "input_required" => "INPUT_REQUIRED",
        "working" => "WORKING",
        "completed" => "COMPLETED",
        "failed" => "FAILED",
        _ => "CANCELLED",
    }));
    table(&header, &rows)
}

/// What a purge removed, one row per kind, and what it cancelled first.
pub fn purge_table(report: &Value) -> String {
    let count = |v: &Value| v.as_u64().unwrap_or(0).to_string();
    let mut rows = vec![
        vec![
            "cancelled tasks".to_string(),
            count(&report["cancelled_tasks"]),
        ],
        vec![
            "cancelled calls".to_string(),
            count(&report["cancelled_calls"]),
        ],
    ];
    if let Some(removed) = report["removed"].as_object() {
        for (kind, n) in removed {
            rows.push(vec![kind.replace('_', " "), count(n)]);
        }
    }
    rows.push(vec!["batches".to_string(), count(&report["batches"])]);
    rows.push(vec![
        "duration".to_string(),
        format!("{} ms", count(&report["duration_ms"])),
    ]);
    format!(
        "tenant {} purged\n{}",
        text(&report["tenant"]),
        table(&["WHAT", "COUNT"], &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_the_lookups_did() {
        fn by_lookup(value: &Value, body: &[u8]) -> String {
            value
                .get("error_description")
                .or_else(|| value.get("error"))
                .and_then(Value::as_str)
                .map_or_else(
                    || String::from_utf8_lossy(body).into_owned(),
                    str::to_string,
                )
        }
        let bodies = [
            r#"{"error":"invalid_token","error_description":"token expired"}"#,
            r#"{"error":"invalid_token"}"#,
            r#"{"error":"invalid_token","error_description":null}"#,
            r#"{"error":"invalid_token","error_description":5}"#,
            r#"{"error":5}"#,
            r#"{"error":{"code":1},"error_description":["x"]}"#,
            r#"{}"#,
            r#"["invalid_token"]"#,
            r#""invalid_token""#,
            "<html>bad gateway</html>",
            "",
        ];
        for body in bodies {
            let value: Value = serde_json::from_slice(body.as_bytes()).unwrap_or(Value::Null);
            assert_eq!(
                refusal_message(&value, body.as_bytes()),
                by_lookup(&value, body.as_bytes()),
                "{body}"
            );
        }
    }

    #[test]
    fn columns_align_to_the_widest_cell() {
        let t = table(
            &["ID", "STATUS"],
            &[
                vec!["tsk_1".into(), "working".into()],
                vec!["tsk_longer".into(), "failed".into()],
            ],
        );
        assert_eq!(
            t,
            "ID          STATUS\ntsk_1       working\ntsk_longer  failed"
        );
    }
}
