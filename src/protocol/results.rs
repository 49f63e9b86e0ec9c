//! Translation of legacy upstream answers into 2026-07-28 results (the translations
//! docs/design.md lists under payload fidelity): add `resultType`, cache hints (MCP
//! 2026-07-28 "Caching") and the upstream's identity in `_meta`; map legacy error
//! codes. Nothing else in a payload changes.

use serde_json::{Map, Value};

use super::{META_RELATED_TASK, META_SERVER_INFO, Method, RpcError, error};

/// Add `_meta["io.modelcontextprotocol/serverInfo"]`, keeping any other `_meta` keys.
pub fn add_server_info(result: &mut Map<String, Value>, server_info: &Value) {
    let meta = result
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(m) = meta {
        m.remove(META_RELATED_TASK);
        m.insert(META_SERVER_INFO.into(), server_info.clone());
    } else {
        let mut m = Map::new();
        m.insert(META_SERVER_INFO.into(), server_info.clone());
        *meta = Value::Object(m);
    }
}

/// Turn a legacy `result` into a 2026 `complete` result for `method`.
pub fn complete(method: Method, result: Value, server_info: &Value) -> Value {
    let mut obj = match result {
        Value::Object(o) => o,
        // A legacy server answering with a non-object result is broken; wrap it so
        // the client still gets a well-formed result rather than a gateway error.
        other => {
            let mut o = Map::new();
            o.insert("value".into(), other);
            o
        }
    };
    obj.insert("resultType".into(), Value::from("complete"));
    if let Some(ttl_ms) = method.cache_ttl_ms() {
        obj.entry("ttlMs").or_insert_with(|| Value::from(ttl_ms));
        // Conservative: a cached copy may be reused only within the same
        // authorization context (MCP 2026-07-28 "Caching": `cacheScope`); a legacy
        // upstream gives no hint, so `private` is the safe default.
        obj.entry("cacheScope")
            .or_insert_with(|| Value::from("private"));
    }
    add_server_info(&mut obj, server_info);
    Value::Object(obj)
}

/// Map a legacy upstream error to what a 2026 client may see (MCP 2026-07-28
/// "Overview", "Error Codes": legacy `-32002` becomes `-32602`).
pub fn map_error(mut e: RpcError) -> RpcError {
    match e.code {
        error::LEGACY_RESOURCE_NOT_FOUND => e.code = error::INVALID_PARAMS,
        // Codes reserved by the 2026 spec must not leak with a legacy meaning
        // (-32042 URL elicitation required, -32001/-32003/-32004 old numbering).
        c if (-32099..=-32020).contains(&c) || matches!(c, -32001 | -32003 | -32004) => {
            e.code = error::INTERNAL_ERROR;
        }
        _ => {}
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn complete_adds_fields() {
        let si = json!({"name":"up","version":"1"});
        let r = complete(Method::ToolsList, json!({"tools":[]}), &si);
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["cacheScope"], "private");
        assert!(r["ttlMs"].is_u64());
        assert_eq!(r["_meta"]["io.modelcontextprotocol/serverInfo"], si);
        let r = complete(
            Method::ToolsCall,
            json!({"content":[],"_meta":{"x":1}}),
            &si,
        );
        assert!(r.get("ttlMs").is_none());
        assert_eq!(r["_meta"]["x"], 1);
    }

    #[test]
    fn legacy_not_found_maps() {
        assert_eq!(map_error(RpcError::new(-32002, "nf")).code, -32602);
        assert_eq!(map_error(RpcError::new(-32042, "url")).code, -32603);
        assert_eq!(map_error(RpcError::new(-32000, "x")).code, -32000);
    }
}
