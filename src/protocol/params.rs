//! Typed params of every served method, parsed once by the front's wire validation
//! (`front/wire.rs`) after the method is known: the method picks its parser, never the
//! shape of the params (no serde enum tagging, which buffers values and loses the
//! number text `arbitrary_precision` keeps).
//!
//! Parsing never refuses: a field that is missing or of the wrong JSON type is
//! recorded as such, and refused where the order of checks puts it (docs/design.md
//! §12 "Order of checks": params after capability and limits; `inputResponses` after
//! ownership). No serde derive does the parsing: values the client passes through
//! (tool arguments, unknown fields, `inputResponses` answers) stay the `Value`s the
//! body parsed into, number text included.

use serde_json::{Map, Value};

use super::method::Method;

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

    pub fn into_valid(self) -> Option<T> {
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
    /// As [`TaskUpdate::parse`], moving the answers out instead of copying them.
    pub fn parse_owned(mut params: Map<String, Value>) -> Self {
        let task = TaskRef::parse(&params);
        Self {
            task,
            input_responses: match params.remove("inputResponses") {
                None => Field::Absent,
                Some(Value::Object(r)) => Field::Valid(r),
                Some(_) => Field::Invalid,
            },
        }
    }

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

/// What a request forwards to the upstream: its params without `_meta` and the MRTR
/// fields, which are the gateway's business, never the upstream's. Unknown fields and
/// tool arguments pass through untouched, in the order described at [`Forward::parse`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpstreamParams(Map<String, Value>);

impl UpstreamParams {
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    pub fn into_map(self) -> Map<String, Value> {
        self.0
    }

    /// `params.name` when it is a string: the tool of a `tools/call`, the prompt of a
    /// `prompts/get`.
    pub fn name(&self) -> Option<&str> {
        self.0.get("name").and_then(Value::as_str)
    }
}

/// The fields of a Multi Round-Trip retry (MCP 2026-07-28 "Multi Round-Trip
/// Requests").
#[derive(Clone, Debug, PartialEq)]
pub struct Mrtr {
    pub request_state: Field<String>,
    /// Answers by input key, in the client's order; each passes through as sent.
    pub input_responses: Field<Map<String, Value>>,
}

/// The params of a method the upstream answers (`tools/list`, `prompts/*`,
/// `resources/*`, `completion/complete`, and `tools/call` inside [`ToolCallParams`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub upstream: UpstreamParams,
    pub mrtr: Mrtr,
}

impl Forward {
    /// Split the MRTR fields off `params` (already without `_meta`), and drop the
    /// 2025-11-25 task augmentation (`task`): a task here is the gateway's to create
    /// (docs/design.md §22 "Clients of the 2025 era"), and an upstream that honoured
    /// the field would run a task of its own that nothing tracks or isolates.
    ///
    /// `Map::remove` under `preserve_order` swaps the last key into the removed key's
    /// slot, so the upstream's key order is the one these three removals leave, in
    /// this order, after the wire's removal of `_meta`: the order the upstream has
    /// always been sent (a property test holds it to the body's bytes).
    pub fn parse(mut params: Map<String, Value>) -> Self {
        let input_responses = match params.remove("inputResponses") {
            None => Field::Absent,
            Some(Value::Object(r)) => Field::Valid(r),
            Some(_) => Field::Invalid,
        };
        let request_state = match params.remove("requestState") {
            None => Field::Absent,
            Some(Value::String(s)) => Field::Valid(s),
            Some(_) => Field::Invalid,
        };
        params.remove("task");
        Self {
            upstream: UpstreamParams(params),
            mrtr: Mrtr {
                request_state,
                input_responses,
            },
        }
    }

    /// A list request that names a page (`cursor` present, null included), which the
    /// session's cached first page cannot answer.
    pub fn asks_page(&self) -> bool {
        self.upstream.0.contains_key("cursor")
    }

    /// The params as a map again, for a retry relayed to another replica, whose
    /// [`Forward::parse`] gives this value back. A malformed MRTR field is left out: it
    /// counts as absent (`requestState`, which is never relayed malformed) or as no
    /// answers (`inputResponses`) on either side.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut m = self.upstream.0.clone();
        if let Field::Valid(r) = &self.mrtr.input_responses {
            m.insert("inputResponses".into(), Value::Object(r.clone()));
        }
        if let Field::Valid(s) = &self.mrtr.request_state {
            m.insert("requestState".into(), Value::from(s.as_str()));
        }
        m
    }
}

impl AsRef<Forward> for Forward {
    fn as_ref(&self) -> &Forward {
        self
    }
}

/// The params of `tools/call` (MCP 2026-07-28 "Tools", "Calling Tools").
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallParams {
    pub name: Field<String>,
    /// `params.task`, the 2025-11-25 task augmentation (an object when valid): a
    /// 2025-11-25 session asks for a task with it. Never sent upstream
    /// ([`Forward::parse`]).
    pub task: Field<()>,
    /// Everything, `name` and `arguments` included, goes upstream as sent.
    pub fwd: Forward,
}

impl ToolCallParams {
    pub fn parse(params: Map<String, Value>) -> Self {
        Self {
            name: string(&params, "name"),
            task: match params.get("task") {
                None => Field::Absent,
                Some(Value::Object(_)) => Field::Valid(()),
                Some(_) => Field::Invalid,
            },
            fwd: Forward::parse(params),
        }
    }

    /// `params.arguments`; `Valid` is always an object. Read from the forwarded params
    /// rather than copied out, so the upstream's bytes are the client's.
    pub fn arguments(&self) -> Field<&Value> {
        match self.fwd.upstream.0.get("arguments") {
            None => Field::Absent,
            Some(a @ Value::Object(_)) => Field::Valid(a),
            Some(_) => Field::Invalid,
        }
    }
}

impl AsRef<Forward> for ToolCallParams {
    fn as_ref(&self) -> &Forward {
        &self.fwd
    }
}

/// The filter of `subscriptions/listen` (MCP 2026-07-28 `subscriptions/listen`):
/// `params.notifications`, where anything but an object is an empty filter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListenParams {
    /// The list-changed flags, each set only by `true`.
    pub tools_list_changed: bool,
    pub prompts_list_changed: bool,
    pub resources_list_changed: bool,
    /// `taskIds` is present, whatever its value: the filter needs the tasks extension.
    pub asks_task_ids: bool,
    /// The string entries of `taskIds` when it is an array (`None`: no array, and no
    /// `taskIds` in the acknowledgement).
    pub task_ids: Option<Vec<String>>,
    /// `resourceSubscriptions` is present (the acknowledgement then names it, even
    /// empty), with its string entries when it is an array.
    pub resource_subscriptions: Option<Vec<String>>,
}

impl ListenParams {
    pub fn parse(params: &Map<String, Value>) -> Self {
        let Some(Value::Object(n)) = params.get("notifications") else {
            return Self::default();
        };
        let flag = |k: &str| n.get(k).and_then(Value::as_bool) == Some(true);
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
        };
        Self {
            tools_list_changed: flag("toolsListChanged"),
            prompts_list_changed: flag("promptsListChanged"),
            resources_list_changed: flag("resourcesListChanged"),
            asks_task_ids: n.contains_key("taskIds"),
            task_ids: n.get("taskIds").and_then(strings),
            resource_subscriptions: n
                .get("resourceSubscriptions")
                .map(|v| strings(v).unwrap_or_default()),
        }
    }
}

/// The params of one request, typed by its method.
#[derive(Clone, Debug, PartialEq)]
pub enum Params {
    /// `server/discover`, whose params are not read.
    Discover,
    ToolsCall(ToolCallParams),
    /// Every other method the upstream answers.
    Forward(Forward),
    Listen(ListenParams),
    TaskGet(TaskRef),
    TaskUpdate(TaskUpdate),
    TaskCancel(TaskRef),
}

impl Params {
    /// The params of `method`, from its request's params without `_meta`.
    pub fn parse(method: Method, params: Map<String, Value>) -> Self {
        match method {
            Method::ServerDiscover => Self::Discover,
            Method::ToolsCall => Self::ToolsCall(ToolCallParams::parse(params)),
            Method::ToolsList
            | Method::PromptsList
            | Method::PromptsGet
            | Method::ResourcesList
            | Method::ResourcesTemplatesList
            | Method::ResourcesRead
            | Method::CompletionComplete => Self::Forward(Forward::parse(params)),
            Method::SubscriptionsListen => Self::Listen(ListenParams::parse(&params)),
            Method::TasksGet => Self::TaskGet(TaskRef::parse(&params)),
            Method::TasksUpdate => Self::TaskUpdate(TaskUpdate::parse_owned(params)),
            Method::TasksCancel => Self::TaskCancel(TaskRef::parse(&params)),
        }
    }

    /// The forwarded params and MRTR fields, for the methods the upstream answers.
    pub fn forward(&self) -> Option<&Forward> {
        match self {
            Self::ToolsCall(p) => Some(&p.fwd),
            Self::Forward(f) => Some(f),
            _ => None,
        }
    }

    /// The task a `tasks/*` request names, when it names one as a string.
    pub fn task_id(&self) -> Option<&str> {
        match self {
            Self::TaskGet(t)
            | Self::TaskCancel(t)
            | Self::TaskUpdate(TaskUpdate { task: t, .. }) => t.task_id.valid().map(String::as_str),
            _ => None,
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

    #[test]
    fn forward_splits_the_mrtr_fields_off_in_the_old_order() {
        let params: Map<String, Value> = serde_json::from_str(
            r#"{"requestState":"s","a":1,"task":{"ttl":5},"inputResponses":{"k":{}},"b":2,"c":3}"#,
        )
        .unwrap_or_default();
        let f = Forward::parse(params);
        // − inputResponses: c takes its slot; − requestState: b takes its slot;
        // − task: c takes its slot again.
        assert_eq!(
            serde_json::to_string(f.upstream.as_map()).ok().as_deref(),
            Some(r#"{"b":2,"a":1,"c":3}"#)
        );
        assert_eq!(f.mrtr.request_state, Field::Valid("s".into()));
        assert_eq!(Forward::parse(f.to_map()), f);
        let bad = Forward::parse(map(json!({"requestState": 1, "inputResponses": []})));
        assert_eq!(bad.mrtr.request_state, Field::Invalid);
        assert_eq!(bad.mrtr.input_responses, Field::Invalid);
    }

    #[test]
    fn tool_call_name_and_arguments() {
        let p = ToolCallParams::parse(map(json!({"name": "t", "arguments": {"x": 1}})));
        assert_eq!(p.name, Field::Valid("t".into()));
        assert_eq!(p.arguments(), Field::Valid(&json!({"x": 1})));
        assert_eq!(p.fwd.upstream.name(), Some("t"));
        let p = ToolCallParams::parse(map(json!({"name": 3, "arguments": [1]})));
        assert_eq!(p.name, Field::Invalid);
        assert_eq!(p.arguments(), Field::Invalid);
        assert_eq!(p.fwd.upstream.name(), None);
        assert_eq!(ToolCallParams::parse(Map::new()).arguments(), Field::Absent);
    }

    #[test]
    fn listen_filters_keep_their_quirks() {
        let l = |v: Value| ListenParams::parse(&map(json!({ "notifications": v })));
        let f = l(json!({"toolsListChanged": true, "promptsListChanged": 1,
                         "taskIds": null, "resourceSubscriptions": "x"}));
        assert!(f.tools_list_changed && !f.prompts_list_changed);
        // Present in any form asks for the extension; only an array lists ids.
        assert!(f.asks_task_ids);
        assert_eq!(f.task_ids, None);
        // Present in any form is acknowledged, even with nothing subscribed.
        assert_eq!(f.resource_subscriptions, Some(Vec::new()));
        let f = l(json!({"taskIds": ["a", 1, "b"], "resourceSubscriptions": ["u", null]}));
        assert_eq!(f.task_ids, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(f.resource_subscriptions, Some(vec!["u".to_string()]));
        assert_eq!(l(json!(["taskIds"])), ListenParams::default());
    }
}
