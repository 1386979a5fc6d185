//! The two databases the example services run on, PostgreSQL and MariaDB,
//! and what every service needs of its database whichever it is.
//!
//! The services are written once against [`ExampleDatabase`] plus a trait
//! of their own SQL (`OrdersSql`, `InventorySql`, `PaymentsSql`), which
//! each database implements in the service's `postgres.rs` and `mysql.rs`.
//! `EXAMPLE_DATABASE_URL`'s scheme picks the database ([`Backend::of_url`]):
//! `postgres://` (the default) or `mysql://` / `mariadb://`.

use std::future::Future;

use sqlx::{MySql, Pool, Postgres};
use txoutbox_runtime::migrations::MigrateError;
use txoutbox_runtime::saga::SagaDatabase;

pub use crate::setup::Backend;
use crate::setup::{SetupError, connect_database, connect_mysql_database};

/// Why a service's schema could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The framework's migrations failed.
    #[error(transparent)]
    Framework(#[from] MigrateError),
    /// The service's own script failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Service(#[source] sqlx::Error),
}

/// What the example services need of their database, beyond the
/// framework's consumers and sagas (`SagaDatabase`): connecting (the
/// database created if missing), the schema, and the pool as the relay and
/// the operator library take it. Implemented for [`Postgres`] and [`MySql`].
pub trait ExampleDatabase: SagaDatabase {
    /// Which database this is.
    const BACKEND: Backend;

    /// Connects to the database named like `url`'s with `suffix` appended
    /// (`outbox_demo` + `_orders`), creating it first if it does not exist.
    fn connect(
        url: &str,
        suffix: &str,
    ) -> impl Future<Output = Result<Pool<Self>, SetupError>> + Send;

    /// The framework's migrations, then the service's own `schema` (an
    /// idempotent script: `examples/migrations/<service>.sql`, or
    /// `examples/migrations/mysql/<service>.sql`).
    fn migrate(
        pool: &Pool<Self>,
        schema: &'static str,
    ) -> impl Future<Output = Result<(), SchemaError>> + Send;

    /// The pool as [`Relay::builder`](txoutbox_runtime::relay::Relay::builder) takes it.
    fn relay_database(pool: Pool<Self>) -> txoutbox_runtime::relay::Database;

    /// The pool as the operator library (`ops::status` for
    /// `/health/ready`) takes it.
    fn ops_database(pool: &Pool<Self>) -> txoutbox_runtime::ops::Database<'_>;
}

impl ExampleDatabase for Postgres {
    const BACKEND: Backend = Backend::Postgres;

    async fn connect(url: &str, suffix: &str) -> Result<Pool<Self>, SetupError> {
        connect_database(url, suffix).await
    }

    async fn migrate(pool: &Pool<Self>, schema: &'static str) -> Result<(), SchemaError> {
        txoutbox_runtime::migrations::run(pool).await?;
        sqlx::raw_sql(schema)
            .execute(pool)
            .await
            .map_err(SchemaError::Service)?;
        Ok(())
    }

    fn relay_database(pool: Pool<Self>) -> txoutbox_runtime::relay::Database {
        pool.into()
    }

    fn ops_database(pool: &Pool<Self>) -> txoutbox_runtime::ops::Database<'_> {
        pool.into()
    }
}

impl ExampleDatabase for MySql {
    const BACKEND: Backend = Backend::MySql;

    async fn connect(url: &str, suffix: &str) -> Result<Pool<Self>, SetupError> {
        connect_mysql_database(url, suffix).await
    }

    async fn migrate(pool: &Pool<Self>, schema: &'static str) -> Result<(), SchemaError> {
        txoutbox_runtime::migrations::run(pool).await?;
        sqlx::raw_sql(schema)
            .execute(pool)
            .await
            .map_err(SchemaError::Service)?;
        Ok(())
    }

    fn relay_database(pool: Pool<Self>) -> txoutbox_runtime::relay::Database {
        pool.into()
    }

    fn ops_database(pool: &Pool<Self>) -> txoutbox_runtime::ops::Database<'_> {
        pool.into()
    }
}
