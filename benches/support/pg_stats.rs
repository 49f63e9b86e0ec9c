//! PostgreSQL statistics the store benchmarks report next to their rows (shared by
//! `benches/store_backends.rs` and the load harness's `stores` scenario).

/// `pg_stat_wal.wal_sync`: how often the database has flushed its WAL so far.
pub(crate) async fn wal_syncs(url: &str) -> i64 {
    // With the URL's sslmode/sslrootcert (scripts/pg.sh's cluster is TLS only).
    let client = taskgate::store::postgres::connect_url(url).await.unwrap();
    client
        .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
        .await
        .unwrap()
        .get(0)
}

/// Start counting statements afresh (`pg_stat_statements`, which `scripts/pg.sh`
/// preloads; the extension is created here if missing).
pub(crate) async fn reset_statements(url: &str) {
    let client = taskgate::store::postgres::connect_url(url).await.unwrap();
    client
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset();",
        )
        .await
        .unwrap();
}

/// The statements run in this database since [`reset_statements`]: `(calls, text,
/// top level)`, most called first, the text on one line; this module's own left out.
/// A statement that is not top level ran inside another (a foreign key's check): no
/// round trip of its own.
pub(crate) async fn statements(url: &str) -> Vec<(i64, String, bool)> {
    let client = taskgate::store::postgres::connect_url(url).await.unwrap();
    client
        .query(
            "SELECT calls, regexp_replace(query, '\\s+', ' ', 'g'), toplevel FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_wal%'
             ORDER BY calls DESC, query",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// How many tasks schema `schema` holds.
pub(crate) async fn tasks_in(url: &str, schema: &str) -> i64 {
    let client = taskgate::store::postgres::connect_url(url).await.unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {schema}.task_routes"), &[])
        .await
        .unwrap()
        .get(0)
}
