//! The methods a 2026-07-28 client may call on the gateway (the MCP 2026-07-28 schema's
//! client requests, plus the MCP Tasks extension's `tasks/*`), and everything the
//! gateway decides by method, in one table: the front validates and dispatches with it,
//! the engine answers with it and the edge routes with it. Adding a method, or a
//! property that differs by method, is one row or one column here.

use std::fmt;

/// One served method. The wire name is [`Method::as_str`]; an unknown name is no
/// `Method` at all (`from_wire` answers `None`), so a match over it is exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    ServerDiscover,
    ToolsList,
    ToolsCall,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    CompletionComplete,
    SubscriptionsListen,
    TasksGet,
    TasksUpdate,
    TasksCancel,
}

/// What the gateway does differently per method.
struct Spec {
    method: Method,
    wire: &'static str,
    /// The body field `Mcp-Name` must equal (MCP 2026-07-28 Streamable HTTP, "Standard
    /// Request Headers"; MCP Tasks extension, "Streamable HTTP: Routing Headers").
    name_field: Option<&'static str>,
    /// The server capability the upstream must declare, or the method answers 404
    /// (docs/design.md §14 "Upstream sessions").
    capability: Option<&'static str>,
    /// Answered from the store, never by the upstream (docs/design.md §14 "Task plane").
    task_plane: bool,
    /// May answer `input_required` (MCP 2026-07-28 "Multi Round-Trip Requests").
    mrtr: bool,
    /// Takes a slot of the upstream's queue (docs/design.md §8 "Flow control");
    /// `tools/list` is served from the session's cache and takes none.
    queued: bool,
    /// `ttlMs` of a cacheable result (MCP 2026-07-28 "Caching"): lists change only with
    /// a list-changed notification, which the gateway relays, so a short hint is safe;
    /// resource contents can change at any time, so they are immediately stale.
    cache_ttl_ms: Option<u64>,
}

const LIST_TTL_MS: Option<u64> = Some(60_000);

/// The table, in the order of [`Method::ALL`] (a test holds them together). The order
/// is the fuzz corpus's: its inputs name a method by index.
const TABLE: [Spec; 13] = [
    spec(Method::ServerDiscover, "server/discover", None, None).ttl(LIST_TTL_MS),
    spec(Method::ToolsList, "tools/list", None, Some("tools")).ttl(LIST_TTL_MS),
    spec(Method::ToolsCall, "tools/call", Some("name"), Some("tools"))
        .mrtr()
        .queued(),
    spec(Method::PromptsList, "prompts/list", None, Some("prompts"))
        .queued()
        .ttl(LIST_TTL_MS),
    spec(
        Method::PromptsGet,
        "prompts/get",
        Some("name"),
        Some("prompts"),
    )
    .mrtr()
    .queued(),
    spec(
        Method::ResourcesList,
        "resources/list",
        None,
        Some("resources"),
    )
    .queued()
    .ttl(LIST_TTL_MS),
    spec(
        Method::ResourcesTemplatesList,
        "resources/templates/list",
        None,
        Some("resources"),
    )
    .queued()
    .ttl(LIST_TTL_MS),
    spec(
        Method::ResourcesRead,
        "resources/read",
        Some("uri"),
        Some("resources"),
    )
    .mrtr()
    .queued()
    .ttl(Some(0)),
    spec(
        Method::CompletionComplete,
        "completion/complete",
        None,
        Some("completions"),
    )
    .queued(),
    spec(
        Method::SubscriptionsListen,
        "subscriptions/listen",
        None,
        None,
    )
    .task_plane(),
    spec(Method::TasksGet, "tasks/get", Some("taskId"), None).task_plane(),
    spec(Method::TasksUpdate, "tasks/update", Some("taskId"), None).task_plane(),
    spec(Method::TasksCancel, "tasks/cancel", Some("taskId"), None).task_plane(),
];

const fn spec(
    method: Method,
    wire: &'static str,
    name_field: Option<&'static str>,
    capability: Option<&'static str>,
) -> Spec {
    Spec {
        method,
        wire,
        name_field,
        capability,
        task_plane: false,
        mrtr: false,
        queued: false,
        cache_ttl_ms: None,
    }
}

impl Spec {
    const fn task_plane(mut self) -> Self {
        self.task_plane = true;
        self
    }
    const fn mrtr(mut self) -> Self {
        self.mrtr = true;
        self
    }
    const fn queued(mut self) -> Self {
        self.queued = true;
        self
    }
    const fn ttl(mut self, ms: Option<u64>) -> Self {
        self.cache_ttl_ms = ms;
        self
    }
}

impl Method {
    /// Every served method, in the table's order.
    pub const ALL: [Method; 13] = [
        Method::ServerDiscover,
        Method::ToolsList,
        Method::ToolsCall,
        Method::PromptsList,
        Method::PromptsGet,
        Method::ResourcesList,
        Method::ResourcesTemplatesList,
        Method::ResourcesRead,
        Method::CompletionComplete,
        Method::SubscriptionsListen,
        Method::TasksGet,
        Method::TasksUpdate,
        Method::TasksCancel,
    ];

    fn spec(self) -> &'static Spec {
        // `ALL` and `TABLE` share their order (the test `the_table_is_in_the_order_of_all`).
        &TABLE[self as usize]
    }

    /// The method a wire name stands for; `None` for a removed or unknown one.
    pub fn from_wire(name: &str) -> Option<Method> {
        TABLE.iter().find(|s| s.wire == name).map(|s| s.method)
    }

    /// [`Method::from_wire`] for raw header bytes (the edge reads them unparsed).
    pub fn from_wire_bytes(name: &[u8]) -> Option<Method> {
        TABLE
            .iter()
            .find(|s| s.wire.as_bytes() == name)
            .map(|s| s.method)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        self.spec().wire
    }

    /// The body field `Mcp-Name` must equal, if the method has one.
    pub fn name_field(self) -> Option<&'static str> {
        self.spec().name_field
    }

    /// The server capability the upstream must declare for this method.
    pub fn capability(self) -> Option<&'static str> {
        self.spec().capability
    }

    /// `tasks/get`, `tasks/update` and `tasks/cancel`: the methods that name a task,
    /// need the tasks extension and are routed by their task id.
    pub fn is_task_method(self) -> bool {
        matches!(
            self,
            Method::TasksGet | Method::TasksUpdate | Method::TasksCancel
        )
    }

    /// Answered from the store, whatever state the upstream is in.
    pub fn is_task_plane(self) -> bool {
        self.spec().task_plane
    }

    /// May answer `input_required`.
    pub fn is_mrtr_eligible(self) -> bool {
        self.spec().mrtr
    }

    /// Takes a slot of the upstream's queue.
    pub fn takes_queue_slot(self) -> bool {
        self.spec().queued
    }

    /// `ttlMs` for a cacheable result; `None` for a result that carries no cache hints.
    pub fn cache_ttl_ms(self) -> Option<u64> {
        self.spec().cache_ttl_ms
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Method {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Method {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Method::from_wire(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown method {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_the_order_of_all() {
        for (i, m) in Method::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].method, *m);
            assert_eq!(*m as usize, i);
        }
    }

    #[test]
    fn wire_names_round_trip_and_unknown_names_are_no_method() {
        for m in Method::ALL {
            assert_eq!(Method::from_wire(m.as_str()), Some(m));
            assert_eq!(Method::from_wire_bytes(m.as_str().as_bytes()), Some(m));
            assert_eq!(m.to_string(), m.as_str());
            let json = serde_json::to_string(&m).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", m.as_str()));
            assert_eq!(serde_json::from_str::<Method>(&json).ok(), Some(m));
        }
        for gone in [
            "initialize",
            "tasks/result",
            "tasks/list",
            "ping",
            "",
            "tools/call ",
        ] {
            assert_eq!(Method::from_wire(gone), None, "{gone}");
        }
    }

    #[test]
    fn the_columns_say_what_the_protocol_says() {
        let names = |f: fn(Method) -> bool| -> Vec<&str> {
            Method::ALL
                .into_iter()
                .filter(|m| f(*m))
                .map(Method::as_str)
                .collect()
        };
        assert_eq!(
            names(Method::is_mrtr_eligible),
            ["tools/call", "prompts/get", "resources/read"]
        );
        assert_eq!(
            names(Method::is_task_plane),
            [
                "subscriptions/listen",
                "tasks/get",
                "tasks/update",
                "tasks/cancel"
            ]
        );
        assert_eq!(
            names(Method::is_task_method),
            ["tasks/get", "tasks/update", "tasks/cancel"]
        );
        assert_eq!(
            names(|m| m.cache_ttl_ms().is_some()),
            [
                "server/discover",
                "tools/list",
                "prompts/list",
                "resources/list",
                "resources/templates/list",
                "resources/read"
            ]
        );
        assert_eq!(Method::ResourcesRead.cache_ttl_ms(), Some(0));
        assert!(!Method::ToolsList.takes_queue_slot());
        assert!(!Method::ServerDiscover.takes_queue_slot());
        assert_eq!(
            names(Method::takes_queue_slot).len(),
            7,
            "the queued methods of docs/design.md §8"
        );
    }
}
