//! Typed params of the methods the engine answers itself (`tasks/get`, `tasks/update`,
//! `tasks/cancel`), parsed once from the request's params after the method is known.
//!
//! Parsing never refuses: a field that is missing or of the wrong JSON type is
//! recorded as such, and refused where the order of checks puts it (docs/design.md
//! §12 "Order of checks": params after capability and limits; `inputResponses` after
//! ownership). No serde derive does the parsing: values the client passes through
//! (`inputResponses` answers) stay the `Value`s the body parsed into, number text
//! included.

use serde_json::{Map, Value};

/// One field of a request's params, as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum Field<T> {
    Absent,
    /// Present, but not of the JSON type the method needs.
    Invalid,
    Valid(T),
}

impl<T> Field<T> {
    /// The value, when the client sent a valid one.
    pub fn valid(&self) -> Option<&T> {
        match self {
            Field::Valid(v) => Some(v),
            Field::Absent | Field::Invalid => None,
        }
    }
}

fn string(params: &Map<String, Value>, key: &str) -> Field<String> {
    match params.get(key) {
        None => Field::Absent,
        Some(Value::String(s)) => Field::Valid(s.clone()),
        Some(_) => Field::Invalid,
    }
}

/// The params of `tasks/get` and `tasks/cancel`, and the task of `tasks/update`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRef {
    pub task_id: Field<String>,
}

impl TaskRef {
    pub fn parse(params: &Map<String, Value>) -> Self {
        Self {
            task_id: string(params, "taskId"),
        }
    }

    /// A reference to a task id the gateway already holds (an idempotent replay, a
    /// listen filter's entry).
    pub fn to(task_id: &str) -> Self {
        Self {
            task_id: Field::Valid(task_id.to_string()),
        }
    }
}

/// The params of `tasks/update` (MCP Tasks extension, "Task Update Requests").
#[derive(Clone, Debug, PartialEq)]
pub struct TaskUpdate {
    pub task: TaskRef,
    /// Answers by input key, in the client's order; each answer passes through as sent.
    pub input_responses: Field<Map<String, Value>>,
}

impl TaskUpdate {
    pub fn parse(params: &Map<String, Value>) -> Self {
        Self {
            task: TaskRef::parse(params),
            input_responses: match params.get("inputResponses") {
                None => Field::Absent,
                Some(Value::Object(r)) => Field::Valid(r.clone()),
                Some(_) => Field::Invalid,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_task_id_is_valid_only_as_a_string() {
        let id = |v: Value| TaskRef::parse(&map(v)).task_id;
        assert_eq!(id(json!({"taskId": "tsk_x"})), Field::Valid("tsk_x".into()));
        assert_eq!(id(json!({})), Field::Absent);
        assert_eq!(id(json!({"taskId": 7})), Field::Invalid);
        assert_eq!(id(json!({"taskId": null})), Field::Invalid);
    }

    #[test]
    fn input_responses_pass_through_with_their_number_text() {
        let body = r#"{"taskId":"t","inputResponses":{"b":{"n":1e999},"a":{"n":-0,"m":1.50,"k":1234567890123456789012345678901234567890}}}"#;
        let params: Map<String, Value> = serde_json::from_str(body).unwrap_or_default();
        let u = TaskUpdate::parse(&params);
        let Field::Valid(r) = &u.input_responses else {
            panic!("{u:?}")
        };
        // The same bytes the untyped params give, key order included.
        assert_eq!(
            serde_json::to_string(r).ok(),
            serde_json::to_string(&params["inputResponses"]).ok()
        );
        assert_eq!(
            serde_json::to_string(r).ok().as_deref(),
            Some(
                r#"{"b":{"n":1e+999},"a":{"n":-0,"m":1.50,"k":1234567890123456789012345678901234567890}}"#
            )
        );
        let bad = TaskUpdate::parse(&map(json!({"taskId": "t", "inputResponses": []})));
        assert_eq!(bad.input_responses, Field::Invalid);
    }
}
