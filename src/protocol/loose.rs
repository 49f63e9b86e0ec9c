//! Member types for reading a `serde_json::Value` into a derived struct with the same
//! forgiving semantics as a lookup by name (`v.get("k").and_then(Value::as_str)`): the
//! struct names the members it reads, ignores the rest, and one member of an
//! unexpected type neither fails the whole record nor is read as something it is not.
//!
//! Both are meant for a `Value` source (`T::deserialize(&value)`), the way the gateway
//! reads what it has already parsed: there every member is a value of its own, so a
//! member that is not what [`Loose`] wants is skipped whole, and repeated keys were
//! already collapsed to the last one as a `Value` map keeps them.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A member read as a `T` when it has `T`'s shape, and as nothing when it has another
/// one (with `#[serde(default)]`, also when it is missing): `Loose<String>` is
/// `.and_then(Value::as_str)`, `Loose<u64>` is `.and_then(Value::as_u64)`, number text
/// included (`arbitrary_precision` reads the digits, as `as_u64` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loose<T>(pub Option<T>);

impl<T> Loose<T> {
    pub fn into_inner(self) -> Option<T> {
        self.0
    }
}

impl<T> Default for Loose<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self(T::deserialize(deserializer).ok()))
    }
}

/// A struct read from a JSON object only. serde also reads a derived struct from an
/// array, by position, which a lookup by name never did: `["HS256"]` is no header
/// with an `alg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object<T>(pub T);

impl<T> Object<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for Members<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(Members(PhantomData))
            .map(Object)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::{Number, Value, json};

    use super::{Loose, Object};

    #[derive(Debug, Deserialize, PartialEq)]
    struct Record {
        #[serde(default)]
        name: Loose<String>,
        #[serde(default)]
        count: Loose<u64>,
        #[serde(default)]
        inner: Loose<Object<Inner>>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        id: u32,
    }

    fn read(v: &Value) -> Option<Record> {
        Object::<Record>::deserialize(v)
            .ok()
            .map(Object::into_inner)
    }

    #[test]
    fn loose_members_read_like_lookups() {
        let values = [
            json!({}),
            json!({"name": "a", "count": 3, "inner": {"id": 7}}),
            json!({"name": 5, "count": "3", "inner": [7]}),
            json!({"name": null, "count": -1, "inner": {"id": "7"}}),
            json!({"name": ["a"], "count": 1.5, "inner": null, "other": {"x": 1}}),
            serde_json::from_str::<Value>(r#"{"count": 1e3}"#).unwrap_or_default(),
            serde_json::from_str::<Value>(r#"{"count": -0}"#).unwrap_or_default(),
            serde_json::from_str::<Value>(r#"{"count": 18446744073709551616}"#).unwrap_or_default(),
        ];
        for v in values {
            let r = read(&v).unwrap();
            assert_eq!(
                r.name.0.as_deref(),
                v.get("name").and_then(Value::as_str),
                "{v}"
            );
            assert_eq!(r.count.0, v.get("count").and_then(Value::as_u64), "{v}");
            let id = v
                .get("inner")
                .and_then(|i| i.get("id"))
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok());
            assert_eq!(r.inner.0.map(|i| i.0.id), id, "{v}");
        }
    }

    #[test]
    fn object_refuses_what_is_not_an_object() {
        assert!(read(&json!(["a", 3])).is_none());
        assert!(read(&json!("a")).is_none());
        assert!(read(&json!(null)).is_none());
        let n: Value = serde_json::from_str("1.50").unwrap_or_default();
        assert!(matches!(n, Value::Number(_)));
        assert!(read(&n).is_none());
        assert!(Object::<Record>::deserialize(&json!({"name": "a"})).is_ok());
        assert!(
            Loose::<Number>::deserialize(&json!("1"))
                .unwrap()
                .0
                .is_none()
        );
    }
}
