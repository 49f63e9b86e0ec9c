//! The JSON-RPC envelope of a 2025-era POST (docs/design.md §22 "Clients of the 2025
//! era"): one message — request, notification, or the client's response to a request
//! the gateway relayed — or, for a 2025-03-26 session, a batch of them. Pure; the
//! 2026 envelope rules live in `front/wire.rs`.

use http::StatusCode;
use serde_json::{Map, Value};

use crate::protocol::{self, RequestId, RpcError};
use crate::upstream::InputAnswer;

use super::super::wire::Reject;

/// One legacy message.
#[derive(Debug)]
pub(super) enum Message {
    Request {
        id: RequestId,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// The client's answer to a request relayed on a call's stream.
    Response { id: RequestId, answer: InputAnswer },
}

impl Message {
    pub(super) fn id(&self) -> Option<&RequestId> {
        match self {
            Message::Request { id, .. } | Message::Response { id, .. } => Some(id),
            Message::Notification { .. } => None,
        }
    }
}

fn bad(id: Option<RequestId>, why: &str) -> Box<Reject> {
    Box::new(Reject::new(
        StatusCode::BAD_REQUEST,
        id,
        RpcError::invalid_request(why),
    ))
}

/// The body: one message, or a non-empty batch.
pub(super) fn parse_body(v: Value) -> Result<Vec<Message>, Box<Reject>> {
    match v {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad(None, "an empty batch"));
            }
            items.into_iter().map(parse).collect()
        }
        one => Ok(vec![parse(one)?]),
    }
}

/// One message's envelope (JSON-RPC 2.0): 400 `-32600` naming what is wrong, with the
/// id when it could be read.
pub(super) fn parse(v: Value) -> Result<Message, Box<Reject>> {
    let Value::Object(mut msg) = v else {
        return Err(bad(None, "a JSON-RPC message must be an object"));
    };
    let id = match msg.remove("id") {
        None => None,
        Some(id) => match protocol::canonical_id(id) {
            Some(id) => Some(id),
            None => return Err(bad(None, "id must be a string or an integer")),
        },
    };
    if !protocol::fields::is_jsonrpc_2(&msg) {
        return Err(bad(id, "jsonrpc must be \"2.0\""));
    }
    let method = match msg.remove("method") {
        Some(Value::String(m)) if !m.is_empty() => m,
        Some(_) => return Err(bad(id, "method must be a string")),
        None => return response(id, msg),
    };
    let params = match msg.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(bad(id, "params must be an object")),
    };
    Ok(match id {
        Some(id) => Message::Request { id, method, params },
        None => Message::Notification { method, params },
    })
}

fn response(id: Option<RequestId>, mut msg: Map<String, Value>) -> Result<Message, Box<Reject>> {
    let answer = match (msg.remove("result"), msg.remove("error")) {
        (Some(r), None) => InputAnswer::Result(r),
        (None, Some(e)) if e.is_object() => InputAnswer::Error(RpcError::from_value(&e)),
        (None, None) => return Err(bad(id, "missing method")),
        _ => return Err(bad(id, "a response carries one of result and error")),
    };
    match id {
        Some(id) => Ok(Message::Response { id, answer }),
        None => Err(bad(None, "a response needs the id of its request")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(r: Result<Vec<Message>, Box<Reject>>) -> (u16, i64, Option<Value>) {
        match r {
            Err(rej) => (rej.status.as_u16(), rej.error.code, rej.id),
            Ok(m) => panic!("{m:?}"),
        }
    }

    #[test]
    fn envelopes() {
        let ok = parse_body(json!({"jsonrpc":"2.0","id":"a","method":"ping"}));
        assert!(matches!(ok.as_deref(), Ok([Message::Request { .. }])));
        let n = parse_body(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        assert!(matches!(n.as_deref(), Ok([Message::Notification { .. }])));
        let r = parse_body(json!({"jsonrpc":"2.0","id":"g-1","result":{"action":"accept"}}));
        assert!(matches!(r.as_deref(), Ok([Message::Response { .. }])));
        let e = parse_body(json!({"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"no"}}));
        assert!(matches!(
            e.as_deref(),
            Ok([Message::Response {
                answer: InputAnswer::Error(_),
                ..
            }])
        ));
        let b = parse_body(json!([
            {"jsonrpc":"2.0","id":1,"method":"ping"},
            {"jsonrpc":"2.0","method":"notifications/initialized"}
        ]));
        assert_eq!(b.map(|m| m.len()).ok(), Some(2));
    }

    #[test]
    fn bad_envelopes_are_400_32600_with_the_id() {
        assert_eq!(code(parse_body(json!([]))), (400, -32600, None));
        assert_eq!(code(parse_body(json!(3))), (400, -32600, None));
        assert_eq!(
            code(parse_body(json!({"jsonrpc":"1.0","id":1,"method":"ping"}))),
            (400, -32600, Some(json!(1)))
        );
        assert_eq!(
            code(parse_body(
                json!({"jsonrpc":"2.0","id":2,"method":"ping","params":[1]})
            )),
            (400, -32600, Some(json!(2)))
        );
        assert_eq!(
            code(parse_body(json!({"jsonrpc":"2.0","id":{},"method":"ping"}))),
            (400, -32600, None)
        );
        assert_eq!(
            code(parse_body(json!({"jsonrpc":"2.0","id":3}))),
            (400, -32600, Some(json!(3)))
        );
        assert_eq!(
            code(parse_body(json!({"jsonrpc":"2.0","result":{}}))),
            (400, -32600, None)
        );
    }
}
