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
