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
use std::sync::{Arc, OnceLock};

use tokio_postgres::types::{ToSql, Type};
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

/// How statements reach the server (docs/design.md §27 "Connection poolers").
#[derive(Debug, Clone)]
pub(super) enum Pooling {
    /// The connection is the gateway's for its lifetime: the session settings came in
    /// the start-up packet, and a pooled connection prepares each statement once.
    Direct,
    /// Behind a transaction-mode pooler, whose next transaction may run on another
    /// server connection: a statement outside a transaction runs in one of its own
    /// that starts with the settings as `SET LOCAL`, and statements are unnamed
    /// (parsed, bound and run in one message), so none outlives its transaction.
    Transaction {
        /// `SET LOCAL …` of every setting, for a transaction already begun.
        settings: Arc<str>,
        /// `BEGIN;` and the same.
        begin: Arc<str>,
    },
}

impl Pooling {
    /// Transaction pooling with these `(name, value)` settings (values are the
    /// gateway's own: numbers, `on`/`off`, a checked schema name).
    pub(super) fn transaction(settings: &[(&str, &str)]) -> Self {
        let settings: String = settings
            .iter()
            .map(|(k, v)| format!("SET LOCAL {k} TO {v}; "))
            .collect();
        Self::Transaction {
            begin: format!("BEGIN; {settings}").into(),
            settings: settings.into(),
        }
    }

    /// Apply the settings to a transaction the caller began (nothing when direct).
    pub(super) async fn enter<C: Session>(&self, tx: &C) -> Result<(), Error> {
        match self {
            Self::Direct => Ok(()),
            Self::Transaction { settings, .. } => tx.plain().batch_execute(settings).await,
        }
    }
}

/// A statement checked and numbered for parameters `P` (see the module docs).
pub(super) struct Stmt<P> {
    sql: String,
    pooling: Pooling,
    /// Behind a transaction pooler: the parameter types the server inferred, learnt
    /// once, so each run is an unnamed statement with them.
    types: OnceLock<Vec<Type>>,
    params: PhantomData<fn(&P)>,
}

/// One run of a statement, the same way direct and behind a transaction pooler:
/// `$direct` with the connection's prepared statement, `$typed` with the unnamed one.
macro_rules! run {
    ($stmt:ident, $c:ident, $values:ident, $direct:ident, $typed:ident) => {
        async move {
            if let Pooling::Direct = $stmt.pooling {
                let s = $c.statement(&$stmt.sql).await?;
                return $c.plain().$direct(&s, &$values).await;
            }
            $stmt
                .within($c, async {
                    let typed = $stmt.typed($c, &$values).await?;
                    $c.plain().$typed(&$stmt.sql, &typed).await
                })
                .await
        }
    };
}

impl<P: Params> Stmt<P> {
    pub(super) fn new(pooling: &Pooling) -> Result<Self, SqlError> {
        Ok(Self {
            sql: number(P::STATEMENT, P::SQL, P::NAMES)?,
            pooling: pooling.clone(),
            types: OnceLock::new(),
            params: PhantomData,
        })
    }

    /// `values` with their types, for an unnamed statement. The first run learns the
    /// types by preparing the statement, which it drops at once: its `Close` reaches
    /// the server before the transaction ends, so no named statement is left on a
    /// server connection the pooler lends to others. (A prepared statement that rows
    /// still held would be closed only once they were dropped, after the commit.)
    async fn typed<'v, C: Session>(
        &self,
        c: &C,
        values: &[Value<'v>],
    ) -> Result<Vec<(Value<'v>, Type)>, Error> {
        let types = match self.types.get() {
            Some(t) => t,
            None => {
                let learnt = c.plain().prepare(&self.sql).await?.params().to_vec();
                self.types.get_or_init(|| learnt)
            }
        };
        Ok(values.iter().copied().zip(types.iter().cloned()).collect())
    }

    /// Run `op` on `c`: as it is inside the caller's transaction, else in a
    /// transaction of its own that opens with the settings.
    async fn within<C: Session, T>(
        &self,
        c: &C,
        op: impl Future<Output = Result<T, Error>> + Send,
    ) -> Result<T, Error> {
        let begin = match &self.pooling {
            Pooling::Transaction { begin, .. } if !C::IN_TRANSACTION => begin,
            _ => return op.await,
        };
        c.plain().batch_execute(begin).await?;
        match op.await {
            Ok(v) => {
                c.plain().batch_execute("COMMIT").await?;
                Ok(v)
            }
            Err(e) => {
                // The statement's error is the one that says what went wrong; a
                // connection that broke takes the transaction with it anyway.
                let _ = c.plain().batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
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
        run!(self, c, values, query, query_typed)
    }

    pub(super) fn query_one<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<Row, Error>> + Send + 's {
        let values = p.values();
        run!(self, c, values, query_one, query_typed_one)
    }

    pub(super) fn query_opt<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<Option<Row>, Error>> + Send + 's {
        let values = p.values();
        run!(self, c, values, query_opt, query_typed_opt)
    }

    /// Rows changed.
    pub(super) fn execute<'s, C: Session>(
        &'s self,
        c: &'s C,
        p: &'s P::With<'_>,
    ) -> impl Future<Output = Result<u64, Error>> + Send + 's {
        let values = p.values();
        run!(self, c, values, execute, execute_typed)
    }
}

/// A connection (or a transaction on one) that statements run on. A pooled one
/// prepares each statement once and keeps it (deadpool's cache, keyed by the numbered
/// text, which each [`Stmt`] holds from start-up); a dedicated one (migrations,
/// publishing) prepares it per execution, as passing the text would.
pub(super) trait Session: Sync {
    /// Whether statements on it run inside a transaction the caller began.
    const IN_TRANSACTION: bool;
    type Plain: tokio_postgres::GenericClient + Sync;
    fn plain(&self) -> &Self::Plain;
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send;
}

impl Session for deadpool_postgres::Client {
    const IN_TRANSACTION: bool = false;
    type Plain = tokio_postgres::Client;
    fn plain(&self) -> &tokio_postgres::Client {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare_cached(sql)
    }
}

impl<'a> Session for deadpool_postgres::Transaction<'a> {
    const IN_TRANSACTION: bool = true;
    type Plain = tokio_postgres::Transaction<'a>;
    fn plain(&self) -> &tokio_postgres::Transaction<'a> {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare_cached(sql)
    }
}

impl Session for tokio_postgres::Client {
    const IN_TRANSACTION: bool = false;
    type Plain = Self;
    fn plain(&self) -> &Self {
        self
    }
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, Error>> + Send {
        self.prepare(sql)
    }
}

impl<'a> Session for tokio_postgres::Transaction<'a> {
    const IN_TRANSACTION: bool = true;
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
            /// Every statement of the set, checked and numbered, run the way
            /// `pooling` says.
            $vis fn new(
                pooling: &$crate::store::postgres::sql::Pooling,
            ) -> Result<Self, $crate::store::postgres::sql::SqlError> {
                Ok(Self {
                    $($field: $crate::store::postgres::sql::Stmt::new(pooling)?,)*
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
        let set = Examples::new(&Pooling::Direct).expect("statements");
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
    fn behind_a_transaction_pooler_the_settings_open_each_transaction() {
        let p = Pooling::transaction(&[("search_path", "tg"), ("statement_timeout", "8000")]);
        let Pooling::Transaction { settings, begin } = p else {
            panic!("not transaction pooling");
        };
        assert_eq!(
            &*settings,
            "SET LOCAL search_path TO tg; SET LOCAL statement_timeout TO 8000; "
        );
        assert_eq!(&*begin, &format!("BEGIN; {settings}"));
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
        let store =
            super::super::statements::Statements::new(&Pooling::Direct).expect("store statements");
        // The fenced update names the route once per statement, numbered by each
        // statement's own fields.
        assert!(store.update_write.sql().contains("rr.route_id = $8"));
        assert!(store.update_read.sql().contains("rr.route_id = $2"));
        super::super::migrate::MigrationSql::new(&Pooling::Direct).expect("migration statements");
    }
}
