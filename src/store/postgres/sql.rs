//! The one way this backend writes a statement (ARCHITECTURE.md "PostgreSQL schema").
//!
//! A statement is declared with [`statements!`]: a name, a struct of its parameters and
//! its text, which names every parameter by its field (`$task_id`), never by position.
//! When the store is built, [`Stmt::new`] checks the text against the struct and rewrites
//! it, once, into the positional form PostgreSQL takes: `$k` is the struct's `k`-th
//! field. A request fills in the struct by field name, and its values are bound in field
//! order, so text and binding cannot drift apart; no SQL text is built per request.
//!
//! A name in the text that is no field, a field the text never uses, or a positional
//! `$1` is a [`SqlError`] from the statement set's `new` — which the unit tests below
//! run for every set — never a request's error. A fragment shared by statements is a
//! `macro_rules!` string joined with `concat!`: composed by name, never by rewriting
//! another statement's placeholders.

use std::marker::PhantomData;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, GenericClient, Row, Statement};

/// One bound value.
pub(super) type Value<'s> = &'s (dyn ToSql + Sync);

/// A statement's parameters, with its name and text (implemented by [`statements!`]).
pub(super) trait Params: Sync {
    /// The statement's name in its set (for [`SqlError`]).
    const STATEMENT: &'static str;
    /// The text, naming each parameter (`$task_id`).
    const SQL: &'static str;
    /// The fields in declaration order: `$k` of the numbered text is `NAMES[k - 1]`.
    const NAMES: &'static [&'static str];
    /// The same struct borrowing for `'p` (a set stores `Stmt<S<'static>>`; a request
    /// passes `S<'p>`).
    type With<'p>: Params;
    /// The values of [`NAMES`](Self::NAMES), in that order.
    fn values(&self) -> Vec<Value<'_>>;
}

/// Why a statement's text does not fit its parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlError {
    #[error("statement {statement}: ${name} is not one of its parameters")]
    Unknown {
        statement: &'static str,
        name: String,
    },
    #[error("statement {statement}: parameter {name} is never used")]
    Unused {
        statement: &'static str,
        name: &'static str,
    },
    #[error("statement {statement}: a positional parameter (${digits}); name it after its field")]
    Positional {
        statement: &'static str,
        digits: String,
    },
    #[error("statement {statement}: a `$` that names no parameter (at byte {at})")]
    Stray { statement: &'static str, at: usize },
}

/// A statement checked and numbered for parameters `P` (see the module docs).
pub(super) struct Stmt<P> {
    sql: String,
    params: PhantomData<fn(&P)>,
}

impl<P: Params> Stmt<P> {
    pub(super) fn new() -> Result<Self, SqlError> {
        Ok(Self {
            sql: number(P::STATEMENT, P::SQL, P::NAMES)?,
            params: PhantomData,
        })
    }

    /// The numbered text (`$1`…`$n`).
    #[cfg(test)]
    pub(super) fn sql(&self) -> &str {
        &self.sql
    }

    // The values are taken before the future starts: a future holding the parameter
    // struct's associated types could not be proven `Send` for every lifetime.

    pub(super) fn query<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 's {
        let values = p.values();
        async move {
            let s = c.statement(&self.sql).await?;
            c.plain().query(&s, &values).await
        }
    }

    pub(super) fn query_one<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<Row, Error>> + Send + 's {
        let values = p.values();
        async move {
            let s = c.statement(&self.sql).await?;
            c.plain().query_one(&s, &values).await
        }
    }

    pub(super) fn query_opt<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<Option<Row>, Error>> + Send + 's {
        let values = p.values();
        async move {
            let s = c.statement(&self.sql).await?;
            c.plain().query_opt(&s, &values).await
        }
    }

    /// Rows changed.
    pub(super) fn execute<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<u64, Error>> + Send + 's {
        let values = p.values();
        async move {
            let s = c.statement(&self.sql).await?;
            c.plain().execute(&s, &values).await
        }
    }
}

/// A connection (or a transaction on one) that statements run on. A pooled one
/// prepares each statement once and keeps it (deadpool's cache, keyed by the numbered
/// text, which each [`Stmt`] holds from start-up); a dedicated one (migrations,
/// publishing) prepares it per execution, as passing the text would.
pub(super) trait Session: Sync {
    type Plain: tokio_postgres::GenericClient + Sync;
    fn plain(&self) -> &Self::Plain;
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send;
}

impl Session for deadpool_postgres::Client {
    type Plain = tokio_postgres::Client;
    fn plain(&self) -> &tokio_postgres::Client {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare_cached(sql)
    }
}

impl<'a> Session for deadpool_postgres::Transaction<'a> {
    type Plain = tokio_postgres::Transaction<'a>;
    fn plain(&self) -> &tokio_postgres::Transaction<'a> {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare_cached(sql)
    }
}

impl Session for tokio_postgres::Client {
    type Plain = Self;
    fn plain(&self) -> &Self {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare(sql)
    }
}

impl<'a> Session for tokio_postgres::Transaction<'a> {
    type Plain = Self;
    fn plain(&self) -> &Self {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare(sql)
    }
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `text` with each `$name` replaced by `$k`, `k` the position of `name` in `names`
/// (from 1). Quoted literals and identifiers (`'…'`, `"…"`) are copied as they are; a
/// `$` inside a word is part of an identifier (PostgreSQL allows `a$b`).
fn number(statement: &'static str, text: &str, names: &[&'static str]) -> Result<String, SqlError> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let mut used = vec![false; names.len()];
    // Everything before `copied` is in `out`.
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                // To the closing quote; a doubled quote closes and reopens, which
                // copies the same.
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
                i += 1;
            }
            b'$' if i > 0 && is_word(b[i - 1]) => i += 1,
            b'$' => {
                let start = i + 1;
                let mut end = start;
                while end < b.len() && is_word(b[end]) {
                    end += 1;
                }
                let word = &text[start..end];
                if word.is_empty() || b.get(end) == Some(&b'$') {
                    // A lone `$`, or dollar quoting (`$tag$`), which no statement uses.
                    return Err(SqlError::Stray { statement, at: i });
                }
                if word.as_bytes()[0].is_ascii_digit() {
                    return Err(SqlError::Positional {
                        statement,
                        digits: word.to_string(),
                    });
                }
                let Some(k) = names.iter().position(|n| *n == word) else {
                    return Err(SqlError::Unknown {
                        statement,
                        name: word.to_string(),
                    });
                };
                used[k] = true;
                out.push_str(&text[copied..i]);
                out.push('$');
                out.push_str(&(k + 1).to_string());
                copied = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[copied.min(text.len())..]);
    match used.iter().position(|u| !u) {
        Some(k) => Err(SqlError::Unused {
            statement,
            name: names[k],
        }),
        None => Ok(out),
    }
}

/// Declares a set of statements: for each, a parameter struct (fields `pub(super)`) with
/// its [`Params`] impl, and a field of the set holding the numbered [`Stmt`]; the set's
/// `new` numbers them all (see the module docs).
///
/// ```text
/// statements! {
///     pub(super) struct Set;
///     /// Docs of the statement.
///     field_name: ParamStruct<'a> { task_id: &'a str, version: i64 }
///         = "UPDATE … WHERE task_id = $task_id AND version = $version";
/// }
/// ```
macro_rules! statements {
    (@with $name:ident $p:lifetime) => { $name };
    (@with $name:ident $p:lifetime $lt:lifetime) => { $name<$p> };
    (
        $(#[$set_meta:meta])*
        $vis:vis struct $set:ident;
        $(
            $(#[$meta:meta])*
            $field:ident: $name:ident $(<$lt:lifetime>)? { $($param:ident: $ty:ty),* $(,)? }
                = $sql:expr;
        )*
    ) => {
        $(
            $(#[$meta])*
            $vis struct $name $(<$lt>)? { $(pub(super) $param: $ty,)* }

            impl $(<$lt>)? $crate::store::postgres::sql::Params for $name $(<$lt>)? {
                const STATEMENT: &'static str = stringify!($field);
                const SQL: &'static str = $sql;
                const NAMES: &'static [&'static str] = &[$(stringify!($param)),*];
                type With<'p> = statements!(@with $name 'p $($lt)?);
                fn values(&self) -> Vec<$crate::store::postgres::sql::Value<'_>> {
                    vec![$(&self.$param as $crate::store::postgres::sql::Value<'_>),*]
                }
            }
        )*

        $(#[$set_meta])*
        $vis struct $set {
            $(
                $(#[$meta])*
                $vis $field: $crate::store::postgres::sql::Stmt<
                    statements!(@with $name 'static $($lt)?)
                >,
            )*
        }

        impl $set {
            /// Every statement of the set, checked and numbered.
            $vis fn new() -> Result<Self, $crate::store::postgres::sql::SqlError> {
                Ok(Self {
                    $($field: $crate::store::postgres::sql::Stmt::new()?,)*
                })
            }
        }
    };
}
pub(super) use statements;

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fragment {
        () => {
            "EXISTS (SELECT 1 FROM r WHERE r.route_id = $route_id)"
        };
    }

    statements! {
        struct Examples;
        /// A parameter used twice keeps one number; numbers follow the fields.
        fenced: Fenced<'a> { task_id: &'a str, version: i64, route_id: Option<&'a str> }
            = concat!(
                "UPDATE t SET v = v + 1 WHERE task_id = $task_id AND version = $version",
                " AND ($route_id::text IS NULL OR ", fragment!(), ")"
            );
        /// No parameters.
        plain: Plain {} = "SELECT count(*) FROM t WHERE s IN ('$x', \"a$b\") AND a$b = 1";
    }

    #[test]
    fn names_become_numbers_in_field_order() {
        let set = Examples::new().expect("statements");
        assert_eq!(
            set.fenced.sql(),
            "UPDATE t SET v = v + 1 WHERE task_id = $1 AND version = $2 \
             AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM r WHERE r.route_id = $3))"
        );
        // Quoted text and a `$` inside an identifier are not parameters.
        assert_eq!(set.plain.sql(), Plain::SQL);
        let p = Fenced {
            task_id: "tsk_1",
            version: 7,
            route_id: None,
        };
        let values = p.values();
        assert_eq!(values.len(), 3);
        assert_eq!(format!("{:?}", values[1]), "7");
    }

    #[test]
    fn a_name_the_struct_lacks_or_a_field_never_used_is_refused() {
        let names = &["task_id", "version"];
        assert_eq!(
            number(
                "s",
                "WHERE task_id = $task_id AND version = $verison",
                names
            ),
            Err(SqlError::Unknown {
                statement: "s",
                name: "verison".into()
            })
        );
        assert_eq!(
            number("s", "WHERE task_id = $task_id", names),
            Err(SqlError::Unused {
                statement: "s",
                name: "version"
            })
        );
        assert_eq!(
            number("s", "WHERE task_id = $1 AND version = $version", names),
            Err(SqlError::Positional {
                statement: "s",
                digits: "1".into()
            })
        );
        assert!(matches!(
            number("s", "SELECT $$x$$, $task_id, $version", names),
            Err(SqlError::Stray { .. })
        ));
        // A name that is a prefix of another is matched whole.
        assert_eq!(
            number("s", "$version_x", &["version", "version_x"]),
            Err(SqlError::Unused {
                statement: "s",
                name: "version"
            })
        );
    }

    #[test]
    fn the_store_and_migration_statements_all_fit_their_parameters() {
        let store = super::super::statements::Statements::new().expect("store statements");
        // The fenced update names the route once per statement, numbered by each
        // statement's own fields.
        assert!(store.update_write.sql().contains("rr.route_id = $8"));
        assert!(store.update_read.sql().contains("rr.route_id = $2"));
        super::super::migrate::MigrationSql::new().expect("migration statements");
    }
}
