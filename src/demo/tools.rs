//! The demo server's tools.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::call::{CallCtx, Outbound, ToolOutcome, Transport};
use crate::protocol::{RpcError, notification};

/// Largest payload the `big` tool will produce.
const MAX_BIG: u64 = 64 * 1024 * 1024;
/// Longest sleep accepted by `sleep`/`slow_required` (1 hour).
const MAX_SLEEP_MS: u64 = 3_600_000;

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

/// The `tools/list` entries.
pub(crate) fn list() -> Vec<Value> {
    let sleep_props = json!({
        "ms": {"type": "integer", "minimum": 0, "description": "How long to sleep"},
        "steps": {"type": "integer", "minimum": 1, "description": "Number of progress steps (default 1)"},
        "poll_disconnect": {"type": "boolean", "description": "HTTP: close the SSE connection after a priming event (2025-11-25 polling)"},
    });
    let mut slow = tool(
        "slow_required",
        "Like sleep, but must be run as a task",
        schema(
            json!({"ms": {"type": "integer", "minimum": 0}, "steps": {"type": "integer", "minimum": 1}}),
            &["ms"],
        ),
    );
    if let Some(obj) = slow.as_object_mut() {
        obj.insert("execution".into(), json!({"taskSupport": "required"}));
    }
    vec![
        tool(
            "echo",
            "Echoes the text back",
            schema(json!({"text": {"type": "string"}}), &["text"]),
        ),
        tool(
            "echo_arguments",
            "Echoes its arguments back as JSON text, exactly as received",
            json!({"type": "object"}),
        ),
        // The one tool with `x-mcp-header` parameters (docs/design.md §12 "HTTP front"):
        // a 2026 client sends `region` and `zone` as `Mcp-Param-Region`/`Mcp-Param-Zone`
        // too, and the gateway checks them.
        tool(
            "route",
            "Echoes its arguments back as JSON text; region and zone also travel as Mcp-Param-* headers",
            schema(
                json!({
                    "region": {"type": "string", "x-mcp-header": "Region"},
                    "zone": {"type": "integer", "x-mcp-header": "Zone"},
                    "note": {"type": "string"}
                }),
                &["region"],
            ),
        ),
        tool(
            "sleep",
            "Sleeps, reporting progress",
            schema(sleep_props, &["ms"]),
        ),
        measure_tool(),
        tool(
            "slow_elicit",
            "Sleeps, then asks the client for input (elicitation/create)",
            schema(
                json!({"ms": {"type": "integer", "minimum": 0}, "message": {"type": "string"}}),
                &["ms"],
            ),
        ),
        tool(
            "elicit",
            "Asks the client for input (elicitation/create)",
            schema(json!({"message": {"type": "string"}}), &[]),
        ),
        tool(
            "elicit_twice",
            "Asks the client two questions concurrently",
            schema(json!({}), &[]),
        ),
        tool(
            "sample",
            "Asks the client's LLM (sampling/createMessage)",
            schema(json!({"prompt": {"type": "string"}}), &["prompt"]),
        ),
        tool(
            "roots",
            "Lists the client's roots (roots/list)",
            schema(json!({}), &[]),
        ),
        tool(
            "fail",
            "Returns a tool error (isError)",
            schema(json!({"message": {"type": "string"}}), &[]),
        ),
        tool(
            "rpc_error",
            "Answers with a JSON-RPC error",
            schema(
                json!({"code": {"type": "integer"}, "message": {"type": "string"}}),
                &[],
            ),
        ),
        tool(
            "counter",
            "Increments a side-effect counter",
            schema(json!({"key": {"type": "string"}}), &[]),
        ),
        tool(
            "stats",
            "Reports call/cancel/counter statistics",
            schema(json!({}), &[]),
        ),
        tool(
            "crash",
            "Exits the process (stdio) or drops the connection (HTTP)",
            schema(json!({}), &[]),
        ),
        slow,
        tool(
            "big",
            "Returns a text of the given size",
            schema(
                json!({"bytes": {"type": "integer", "minimum": 0}}),
                &["bytes"],
            ),
        ),
        tool(
            "touch_tools",
            "Emits notifications/tools/list_changed",
            schema(json!({}), &[]),
        ),
        tool(
            "expire_session",
            "HTTP: forgets the session after answering",
            schema(json!({}), &[]),
        ),
    ]
}

/// The resource whose changes `counter` reports to subscribers.
const COUNTER_URI: &str = "demo://counter";

pub(crate) fn text_result(text: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": text.into()}]})
}

pub(crate) fn error_result(text: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": text.into()}], "isError": true})
}

fn ok(text: impl Into<String>) -> ToolOutcome {
    ToolOutcome::Result(text_result(text))
}

fn tool_error(text: impl Into<String>) -> ToolOutcome {
    ToolOutcome::Result(error_result(text))
}

/// The one tool with an `outputSchema`: its answer carries `structuredContent`
/// that conforms to it (docs/design.md §28: a handle-mode tool is listed to plain
/// clients without it).
fn measure_tool() -> Value {
    let mut t = tool(
        "measure",
        "Sleeps, then reports how long it slept as structured content",
        schema(json!({"ms": {"type": "integer", "minimum": 0}}), &["ms"]),
    );
    if let Some(obj) = t.as_object_mut() {
        obj.insert(
            "outputSchema".into(),
            schema(json!({"elapsedMs": {"type": "integer"}}), &["elapsedMs"]),
        );
    }
    t
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn describe_error(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string())
}

/// Runs the tool `name`.
pub(crate) async fn call(ctx: &CallCtx, name: &str, args: &Value) -> ToolOutcome {
    match name {
        "echo" => match str_arg(args, "text") {
            Some(t) => ok(t),
            None => ToolOutcome::Error(RpcError::invalid_params("echo: missing string 'text'")),
        },
        "echo_arguments" | "route" => ok(args.to_string()),
        "sleep" | "slow_required" => sleep(ctx, args).await,
        "measure" => {
            let ms = sleep_ms(args);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ToolOutcome::Result(json!({
                "content": [{"type": "text", "text": format!("{{\"elapsedMs\":{ms}}}")}],
                "structuredContent": {"elapsedMs": ms},
            }))
        }
        "slow_elicit" => {
            if !ctx.session.caps().elicitation {
                return tool_error("client did not declare the elicitation capability");
            }
            tokio::time::sleep(Duration::from_millis(sleep_ms(args))).await;
            let message = str_arg(args, "message").unwrap_or("Please provide an answer");
            match elicit_once(ctx, message).await {
                Ok(t) => ok(t),
                Err(e) => tool_error(e),
            }
        }
        "elicit" => {
            if !ctx.session.caps().elicitation {
                return tool_error("client did not declare the elicitation capability");
            }
            let message = str_arg(args, "message").unwrap_or("Please provide an answer");
            match elicit_once(ctx, message).await {
                Ok(t) => ok(t),
                Err(e) => tool_error(e),
            }
        }
        "elicit_twice" => {
            if !ctx.session.caps().elicitation {
                return tool_error("client did not declare the elicitation capability");
            }
            let (a, b) = tokio::join!(
                elicit_once(ctx, "First question"),
                elicit_once(ctx, "Second question")
            );
            match (a, b) {
                (Ok(a), Ok(b)) => ToolOutcome::Result(json!({"content": [
                    {"type": "text", "text": a},
                    {"type": "text", "text": b},
                ]})),
                (Err(e), _) | (_, Err(e)) => tool_error(e),
            }
        }
        "sample" => {
            if !ctx.session.caps().sampling {
                return tool_error("client did not declare the sampling capability");
            }
            let prompt = str_arg(args, "prompt").unwrap_or("Say hello");
            let params = json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                "maxTokens": 100,
            });
            match ctx.request("sampling/createMessage", params).await {
                Ok(r) => {
                    let content = r.get("content");
                    let text = content
                        .and_then(|c| match c {
                            Value::Array(items) => items
                                .iter()
                                .find_map(|i| i.get("text").and_then(Value::as_str)),
                            other => other.get("text").and_then(Value::as_str),
                        })
                        .map(str::to_string)
                        .unwrap_or_else(|| content.map(Value::to_string).unwrap_or_default());
                    ok(text)
                }
                Err(e) => tool_error(format!("sampling failed: {}", describe_error(&e))),
            }
        }
        "roots" => {
            if !ctx.session.caps().roots {
                return tool_error("client did not declare the roots capability");
            }
            match ctx.request("roots/list", json!({})).await {
                Ok(r) => ok(r.get("roots").cloned().unwrap_or(json!([])).to_string()),
                Err(e) => tool_error(format!("roots/list failed: {}", describe_error(&e))),
            }
        }
        "fail" => tool_error(str_arg(args, "message").unwrap_or("demo tool failure")),
        "rpc_error" => {
            let code = args.get("code").and_then(Value::as_i64).unwrap_or(-32000);
            let message = str_arg(args, "message").unwrap_or("demo failure");
            ToolOutcome::Error(RpcError::new(code, message))
        }
        "counter" => {
            let key = str_arg(args, "key").unwrap_or("default");
            let n = ctx.session.stats().bump(key);
            if ctx.session.subscribed(COUNTER_URI) {
                ctx.session
                    .standalone()
                    .send(Outbound::Message(notification(
                        "notifications/resources/updated",
                        json!({"uri": COUNTER_URI}),
                    )));
            }
            ok(format!("count={n}"))
        }
        "stats" => ok(ctx.session.stats().snapshot().to_string()),
        "crash" => match ctx.session.transport() {
            Transport::Stdio => {
                tracing::warn!("demo: crash tool called, exiting with code 3");
                // `exit` runs the process's exit handlers: the binary registers one
                // that writes out buffered log lines.
                std::process::exit(3)
            }
            Transport::Http => {
                ctx.sink.send(Outbound::Abort);
                ToolOutcome::NoResponse
            }
        },
        "big" => {
            let n = args.get("bytes").and_then(Value::as_u64).unwrap_or(1024);
            if n > MAX_BIG {
                return ToolOutcome::Error(RpcError::invalid_params(format!(
                    "big: at most {MAX_BIG} bytes"
                )));
            }
            // n <= 64 MiB, fits usize on every supported target.
            ok("x".repeat(n as usize))
        }
        "touch_tools" => {
            ctx.session
                .standalone()
                .send(Outbound::Message(notification(
                    "notifications/tools/list_changed",
                    json!({}),
                )));
            ok("ok")
        }
        "expire_session" => match ctx.session.transport() {
            Transport::Stdio => ok("not supported"),
            Transport::Http => {
                ctx.expire_after.store(true, Ordering::SeqCst);
                ok("session expired")
            }
        },
        _ => ToolOutcome::Error(RpcError::invalid_params(format!("Unknown tool: {name}"))),
    }
}

/// `ms` of a sleeping tool: 1 s when absent, at most [`MAX_SLEEP_MS`].
fn sleep_ms(args: &Value) -> u64 {
    args.get("ms")
        .and_then(Value::as_u64)
        .unwrap_or(1000)
        .min(MAX_SLEEP_MS)
}

async fn sleep(ctx: &CallCtx, args: &Value) -> ToolOutcome {
    let ms = sleep_ms(args);
    let steps = args
        .get("steps")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .clamp(1, 10_000);
    if args.get("poll_disconnect").and_then(Value::as_bool) == Some(true) {
        ctx.sink.send(Outbound::PollDisconnect { retry_ms: 200 });
    }
    ctx.log("info", json!("sleep started"));
    let per_step = Duration::from_millis(ms) / steps as u32;
    for i in 1..=steps {
        tokio::time::sleep(per_step).await;
        ctx.progress(i, steps, format!("step {i}/{steps}"));
    }
    ok(format!("slept {ms} ms"))
}

async fn elicit_once(ctx: &CallCtx, message: &str) -> Result<String, String> {
    let params = json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    });
    match ctx.request("elicitation/create", params).await {
        Ok(r) => {
            let action = r.get("action").and_then(Value::as_str).unwrap_or("unknown");
            let content = r.get("content").cloned().unwrap_or(Value::Null);
            Ok(format!("elicited: {action} {content}"))
        }
        Err(e) => Err(format!("elicitation failed: {}", describe_error(&e))),
    }
}
