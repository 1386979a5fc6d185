//! Connecting to the service database with a clear failure.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool, PgPool};
use txoutbox_core::DbErrorDisplay;

use crate::error::CliError;

/// Whether `url` names a MariaDB / MySQL server (`mysql://`, `mariadb://`).
pub(crate) fn is_mysql(url: Option<&str>) -> bool {
    url.is_some_and(|url| url.starts_with("mysql://") || url.starts_with("mariadb://"))
}

/// [`connect`] for a MariaDB URL (every command but `notify`).
pub(crate) async fn connect_mysql(url: &str, timeout: Duration) -> Result<MySqlPool, CliError> {
    let url = url
        .strip_prefix("mariadb://")
        .map_or_else(|| url.to_owned(), |rest| format!("mysql://{rest}"));
    let options = MySqlConnectOptions::from_str(&url)
        .map_err(|e| CliError::Usage(format!("invalid database URL: {e}")))?;
    // Never print the URL itself: it may carry a password.
    let target = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    );
    probe(&options, &target, timeout).await?;
    Ok(MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .connect_lazy_with(options))
}

/// Connects once (to report the real cause of a failure, which a pool would
/// hide behind a timeout), then opens a small pool.
pub(crate) async fn connect(url: Option<&str>, timeout: Duration) -> Result<PgPool, CliError> {
    let url = url.ok_or_else(|| {
        CliError::Usage("no database given: pass --database-url or set DATABASE_URL".into())
    })?;
    // The parser accepts any scheme; a SQLite URL is a mistake here, and a
    // MariaDB one reaches here only for `notify`.
    if is_mysql(Some(url)) {
        return Err(CliError::Usage(
            "invalid database URL for this command: `outbox notify` needs PostgreSQL (MariaDB has no LISTEN/NOTIFY: relays there poll, see docs/mysql.md); expected postgres://user@host:port/database".into(),
        ));
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(CliError::Usage(
            "invalid database URL: expected postgres://user@host:port/database (or mysql:// / mariadb:// for MariaDB)".into(),
        ));
    }
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| CliError::Usage(format!("invalid database URL: {e}")))?
        .application_name("outbox-cli");
    // Never print the URL itself: it may carry a password.
    let target = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    );
    probe(&options, &target, timeout).await?;
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .connect_lazy_with(options))
}

/// Connects once to `target` (host, port and database, as printed), so that
/// a failure reports its real cause, which a pool would hide behind a
/// timeout.
async fn probe<O>(options: &O, target: &str, timeout: Duration) -> Result<(), CliError>
where
    O: ConnectOptions,
    O::Connection: Sized,
{
    let unreachable = |cause: String| {
        CliError::Usage(format!(
            "cannot connect to the database at {target}: {cause}"
        ))
    };
    match tokio::time::timeout(timeout, options.connect()).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(unreachable(DbErrorDisplay(&e).to_string())),
        Err(_) => Err(unreachable(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        ))),
    }
}
