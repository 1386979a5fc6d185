//! The PostgreSQL server the example's tests create their databases on.
//! Included with `#[path]` by each test that needs it.

use sqlx::Connection;

/// Scheme, credentials and host of `DATABASE_URL` (`postgres://user@host:port`,
/// without the database): the services name their own databases on it.
pub(crate) fn server_url() -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (set in .cargo/config.toml)");
    let (server, _database) = url.rsplit_once('/').expect("DATABASE_URL names a database");
    server.to_owned()
}

/// Drops each of `names` on `server`, ending its connections.
pub(crate) async fn drop_databases(server: &str, names: &[String]) {
    let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    for name in names {
        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// The two databases a demo named `name` creates.
pub(crate) fn demo_databases(name: &str) -> Vec<String> {
    vec![format!("{name}_orders"), format!("{name}_payments")]
}
