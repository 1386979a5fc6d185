//! A SeaORM connection on a transaction the framework opened with sqlx.

use ::sea_orm::{ConnectionTrait, DbBackend, DbErr, ExecResult, QueryResult, Statement};
use sea_query_sqlx::SqlxValues;
use sqlx::PgConnection;
use tokio::sync::Mutex;

use super::exec_error;

/// SeaORM's `ConnectionTrait` on a PostgreSQL transaction the framework
/// holds: every statement SeaORM sends through it runs in that transaction.
///
/// Consumer handlers take it (`tx: &SeaConnection<'_>` in an
/// `#[event_handler]`, feature `sea-orm` of txoutbox-runtime): their writes
/// commit with the dedup row or the inbox mark, or roll back with them.
/// SeaORM's `DatabaseTransaction` cannot be built around a transaction
/// SeaORM did not begin, hence this type; code written against
/// `&impl ConnectionTrait` takes both.
///
/// It does not implement `TransactionTrait`: the framework commits or rolls
/// back; for a part that may fail on its own, send `SAVEPOINT s` /
/// `ROLLBACK TO SAVEPOINT s` with `execute_unprepared`.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use sea_orm::{ConnectionTrait, Statement};
/// use txoutbox_core::sea_orm::SeaConnection;
///
/// let mut tx = pool.begin().await?;
/// {
///     let sea = SeaConnection::new(&mut tx);
///     sea.execute_unprepared("UPDATE stock SET reserved = reserved + 1").await?;
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct SeaConnection<'c> {
    // SeaORM's methods take `&self`; statements on one connection run one at
    // a time anyway.
    conn: Mutex<&'c mut PgConnection>,
}

impl<'c> SeaConnection<'c> {
    /// SeaORM's view of `conn` (`&mut tx` for a `Transaction`).
    pub fn new(conn: &'c mut PgConnection) -> Self {
        Self {
            conn: Mutex::new(conn),
        }
    }
}

impl std::fmt::Debug for SeaConnection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeaConnection")
    }
}

fn query(stmt: &Statement) -> sqlx::query::Query<'_, sqlx::Postgres, SqlxValues> {
    let values = stmt.values.clone().unwrap_or(::sea_orm::Values(Vec::new()));
    sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), SqlxValues(values))
}

fn query_error(error: sqlx::Error) -> DbErr {
    DbErr::Query(::sea_orm::RuntimeErr::SqlxError(std::sync::Arc::new(error)))
}

#[async_trait::async_trait]
impl ConnectionTrait for SeaConnection<'_> {
    fn get_database_backend(&self) -> DbBackend {
        DbBackend::Postgres
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        let mut conn = self.conn.lock().await;
        match query(&stmt).execute(&mut **conn).await {
            Ok(done) => Ok(done.into()),
            Err(error) => Err(exec_error(error)),
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        let mut conn = self.conn.lock().await;
        match sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut **conn)
            .await
        {
            Ok(done) => Ok(done.into()),
            Err(error) => Err(exec_error(error)),
        }
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        let mut conn = self.conn.lock().await;
        match query(&stmt).fetch_optional(&mut **conn).await {
            Ok(row) => Ok(row.map(Into::into)),
            Err(error) => Err(query_error(error)),
        }
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        let mut conn = self.conn.lock().await;
        match query(&stmt).fetch_all(&mut **conn).await {
            Ok(rows) => Ok(rows.into_iter().map(Into::into).collect()),
            Err(error) => Err(query_error(error)),
        }
    }
}
