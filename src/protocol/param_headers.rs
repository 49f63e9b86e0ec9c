//! Which `tools/call` arguments a 2026 client also sends as `Mcp-Param-*` headers
//! (docs/design.md §12 "HTTP front"): a top-level property of a tool's `inputSchema`
//! annotated `"x-mcp-header": "{Name}"` travels as `Mcp-Param-{Name}` whenever the call
//! gives it a value, and the front checks the header against the body.
//!
//! The map is derived from the upstream's `tools/list` (the gateway's cached copy), one
//! entry per tool that has valid annotations. A tool whose annotations are invalid
//! (a name that is not an RFC 9110 token, two names equal but for case, a property that
//! is not a primitive, an annotation below the top level) keeps no entry: its headers
//! are not checked, and [`ToolHeaders::from_tools_list`] says why so the caller can log
//! it. Not checking is the safe side: it can never refuse a call the upstream accepts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The schema keyword that names a parameter's header.
pub const ANNOTATION: &str = "x-mcp-header";
/// Every parameter header's name starts with this (lowercase, as `http` spells names).
pub const HEADER_PREFIX: &str = "mcp-param-";

/// One annotated parameter of a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamHeader {
    /// The name after `Mcp-Param-`, as the tool declares it (`Region`).
    pub name: String,
    /// The top-level property of `arguments` the header carries.
    pub property: String,
}

impl ParamHeader {
    /// The header's name in lowercase (`mcp-param-region`), as a `HeaderMap` holds it.
    pub fn header_name(&self) -> String {
        format!("{HEADER_PREFIX}{}", self.name.to_ascii_lowercase())
    }
}

/// The annotated parameters of every tool of one upstream that has any, by tool name.
/// Present (even empty) means the tool list is known; the front checks nothing for an
/// upstream whose list it has never seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolHeaders {
    tools: BTreeMap<String, Vec<ParamHeader>>,
}

/// A tool left out of the map, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    pub tool: String,
    pub reason: String,
}

impl ToolHeaders {
    /// The map for a `tools/list` result (`{"tools": [...]}`), with the tools whose
    /// annotations are invalid left out and listed.
    pub fn from_tools_list(list: &Value) -> (Self, Vec<Excluded>) {
        let mut map = Self::default();
        let mut excluded = Vec::new();
        let tools = list.get("tools").and_then(Value::as_array);
        for tool in tools.into_iter().flatten() {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            match tool_params(tool) {
                Ok(params) if params.is_empty() => {}
                Ok(params) => {
                    map.tools.insert(name.to_string(), params);
                }
                Err(reason) => excluded.push(Excluded {
                    tool: name.to_string(),
                    reason,
                }),
            }
        }
        (map, excluded)
    }

    /// The annotated parameters of `tool` (none when it has none or is unknown).
    pub fn for_tool(&self, tool: &str) -> &[ParamHeader] {
        self.tools.get(tool).map_or(&[], Vec::as_slice)
    }

    /// Add (or replace) the annotated parameters of `tool`: the gateway's own tools,
    /// which no upstream list names.
    pub fn insert(&mut self, tool: String, params: Vec<ParamHeader>) {
        self.tools.insert(tool, params);
    }

    /// Whether no tool has annotated parameters.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// The annotated top-level parameters of one tool, or why its annotations are invalid.
fn tool_params(tool: &Value) -> Result<Vec<ParamHeader>, String> {
    let Some(props) = tool
        .get("inputSchema")
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
    else {
        return Ok(Vec::new());
    };
    let mut params: Vec<ParamHeader> = Vec::new();
    for (property, schema) in props {
        if let Value::Object(inner) = schema {
            let nested = inner
                .iter()
                .any(|(k, v)| k != ANNOTATION && has_annotation(v));
            if nested {
                return Err(format!(
                    "{ANNOTATION} below the top level (under property {property:?})"
                ));
            }
        }
        let Some(annotation) = schema.get(ANNOTATION) else {
            continue;
        };
        let Some(name) = annotation.as_str().filter(|n| is_token(n)) else {
            return Err(format!(
                "{ANNOTATION} of property {property:?} is not an RFC 9110 token"
            ));
        };
        let primitive = matches!(
            schema.get("type").and_then(Value::as_str),
            Some("string" | "integer" | "number" | "boolean")
        );
        if !primitive {
            return Err(format!(
                "property {property:?} with {ANNOTATION} is not a string, number or boolean"
            ));
        }
        if params.iter().any(|p| p.name.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "{ANNOTATION} {name:?} is declared twice (names are case-insensitive)"
            ));
        }
        params.push(ParamHeader {
            name: name.to_string(),
            property: property.clone(),
        });
    }
    Ok(params)
}

/// Whether an annotation appears anywhere in `v`.
fn has_annotation(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| k == ANNOTATION || has_annotation(v)),
        Value::Array(a) => a.iter().any(has_annotation),
        _ => false,
    }
}

/// An RFC 9110 token ("Tokens"): one or more `tchar`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether a decoded header value carries `body`, the argument's value: a string
/// exactly, a boolean as `true`/`false`, a number as any decimal spelling of the same
/// number (integers compared exactly, others as `f64`). An object or an array cannot
/// travel in a header, so it never matches.
pub fn header_matches(header: &str, body: &Value) -> bool {
    match body {
        Value::String(s) => header == s,
        Value::Bool(b) => header == if *b { "true" } else { "false" },
        Value::Number(n) => {
            let Ok(Value::Number(h)) = serde_json::from_str::<Value>(header) else {
                return false;
            };
            if let (Some(a), Some(b)) = (h.as_i64(), n.as_i64()) {
                a == b
            } else if let (Some(a), Some(b)) = (h.as_u64(), n.as_u64()) {
                a == b
            } else {
                matches!((h.as_f64(), n.as_f64()), (Some(a), Some(b)) if a == b)
            }
        }
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(tools: Value) -> Value {
        json!({ "tools": tools })
    }

    fn tool(name: &str, props: Value) -> Value {
        json!({"name": name, "inputSchema": {"type": "object", "properties": props}})
    }

    #[test]
    fn top_level_annotations_form_the_map() {
        let (map, excluded) = ToolHeaders::from_tools_list(&list(json!([
            tool("route", json!({
                "region": {"type": "string", "x-mcp-header": "Region"},
                "count": {"type": "integer", "x-mcp-header": "Count"},
                "note": {"type": "string"}
            })),
            tool("plain", json!({"a": {"type": "string"}})),
            {"name": "no_schema"},
        ])));
        assert!(excluded.is_empty(), "{excluded:?}");
        let route = map.for_tool("route");
        assert_eq!(route.len(), 2);
        assert_eq!(route[0].name, "Region");
        assert_eq!(route[0].property, "region");
        assert_eq!(route[0].header_name(), "mcp-param-region");
        assert!(map.for_tool("plain").is_empty());
        assert!(map.for_tool("unknown").is_empty());
        // Tools without annotations take no room; the map is still known.
        let (empty, _) = ToolHeaders::from_tools_list(&list(json!([tool("plain", json!({}))])));
        assert!(empty.is_empty());
        assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
    }

    #[test]
    fn invalid_annotations_exclude_the_tool() {
        let cases = [
            (
                "bad token",
                json!({"r": {"type": "string", "x-mcp-header": "Re gion"}}),
            ),
            (
                "colon",
                json!({"r": {"type": "string", "x-mcp-header": "a:b"}}),
            ),
            (
                "empty",
                json!({"r": {"type": "string", "x-mcp-header": ""}}),
            ),
            (
                "non-ascii",
                json!({"r": {"type": "string", "x-mcp-header": "Régión"}}),
            ),
            (
                "not a string",
                json!({"r": {"type": "string", "x-mcp-header": 7}}),
            ),
            (
                "object",
                json!({"r": {"type": "object", "x-mcp-header": "R"}}),
            ),
            ("no type", json!({"r": {"x-mcp-header": "R"}})),
            (
                "duplicate",
                json!({
                    "a": {"type": "string", "x-mcp-header": "Region"},
                    "b": {"type": "string", "x-mcp-header": "REGION"}
                }),
            ),
            (
                "nested",
                json!({"o": {"type": "object", "properties": {
                    "r": {"type": "string", "x-mcp-header": "R"}
                }}}),
            ),
        ];
        for (what, props) in cases {
            let (map, excluded) = ToolHeaders::from_tools_list(&list(json!([
                tool("bad", props),
                tool(
                    "good",
                    json!({"g": {"type": "boolean", "x-mcp-header": "G"}})
                ),
            ])));
            assert!(map.for_tool("bad").is_empty(), "{what}");
            assert_eq!(map.for_tool("good").len(), 1, "{what}");
            assert_eq!(excluded.len(), 1, "{what}");
            assert_eq!(excluded[0].tool, "bad", "{what}");
        }
    }

    #[test]
    fn the_map_round_trips_through_json() {
        let (map, _) = ToolHeaders::from_tools_list(&list(json!([tool(
            "route",
            json!({"region": {"type": "string", "x-mcp-header": "Region"}})
        )])));
        let text = serde_json::to_string(&map).unwrap();
        assert_eq!(text, r#"{"route":[{"name":"Region","property":"region"}]}"#);
        assert_eq!(serde_json::from_str::<ToolHeaders>(&text).unwrap(), map);
    }

    #[test]
    fn header_values_match_by_type() {
        let num = |t: &str| serde_json::from_str::<Value>(t).unwrap();
        assert!(header_matches("Hello", &json!("Hello")));
        assert!(!header_matches("hello", &json!("Hello")));
        assert!(header_matches("", &json!("")));
        assert!(header_matches("true", &json!(true)));
        assert!(!header_matches("True", &json!(true)));
        assert!(header_matches("false", &json!(false)));
        assert!(header_matches("42", &num("42")));
        assert!(header_matches("42.0", &num("42")));
        assert!(header_matches("-7", &num("-7")));
        assert!(header_matches("9007199254740991", &num("9007199254740991")));
        assert!(!header_matches(
            "9007199254740990",
            &num("9007199254740991")
        ));
        assert!(header_matches("1.5", &num("1.50")));
        assert!(!header_matches("42x", &num("42")));
        assert!(!header_matches("\"42\"", &num("42")));
        assert!(!header_matches("{}", &json!({})));
        assert!(!header_matches("[]", &json!([])));
    }
}
