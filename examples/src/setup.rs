//! Infrastructure set-up shared by the example services and the demo: the
//! database (created on first use, migrated; PostgreSQL or MariaDB, see
//! [`crate::database`]) and the Kafka broker (a real one from
//! `KAFKA_BROKERS`, or librdkafka's in-process mock cluster).

use std::str::FromStr;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool, PgPool};

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://` (MariaDB >= 10.6; MySQL is not supported
    /// by the framework yet).
    MySql,
}

impl Backend {
    /// The database `url` names, by its scheme.
    pub fn of_url(url: &str) -> Result<Self, SetupError> {
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            Some("mysql" | "mariadb") => Ok(Self::MySql),
            _ => Err(SetupError::UnknownDatabase { url: redact(url) }),
        }
    }

    /// An `EXAMPLE_DATABASE_URL` of this database, for hints.
    pub fn example_url(self) -> &'static str {
        match self {
            Self::Postgres => "postgres://user:password@host:5432/outbox_demo",
            Self::MySql => "mysql://user:password@host:3306/outbox_demo",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Postgres => "PostgreSQL",
            Self::MySql => "MariaDB",
        })
    }
}

/// The variable that names the examples' database server and base name. Not
/// `DATABASE_URL`, which `.cargo/config.toml` sets for the tests (and so for
/// every `cargo run` of this workspace): the demo's databases stay apart from
/// the tests'.
pub const DATABASE_URL_VAR: &str = "EXAMPLE_DATABASE_URL";

/// Default `EXAMPLE_DATABASE_URL`: the local PostgreSQL. Each service
/// uses its own database named after this one (`outbox_demo_orders`,
/// `outbox_demo_payments`), as two real services would. A `mysql://` (or
/// `mariadb://`) URL runs them on MariaDB instead, e.g.
/// `mysql://root@127.0.0.1:3306/outbox_demo`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/outbox_demo";

/// `EXAMPLE_DATABASE_URL` from the environment, or [`DEFAULT_DATABASE_URL`].
pub fn database_url_from_env() -> String {
    std::env::var(DATABASE_URL_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned())
}

/// Why the example could not set up its infrastructure; printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A binary that needs a real Kafka cluster was started without one.
    #[error(
        "set KAFKA_BROKERS (e.g. 127.0.0.1:9092); the `demo` binary runs both services on a mock cluster"
    )]
    NoBrokers,
    /// The database URL names neither PostgreSQL nor MariaDB.
    #[error(
        "EXAMPLE_DATABASE_URL `{url}` names no database the example runs on: \
         start it with postgres:// (PostgreSQL) or mysql:// / mariadb:// (MariaDB)"
    )]
    UnknownDatabase {
        /// The URL as given (password redacted).
        url: String,
    },
    /// The database URL does not parse.
    #[error("EXAMPLE_DATABASE_URL `{url}` is not a valid {backend} URL: {reason}")]
    BadDatabaseUrl {
        /// The database the URL's scheme names.
        backend: Backend,
        /// The URL as given (password redacted).
        url: String,
        /// The parser's reason.
        reason: String,
    },
    /// The server does not answer or refuses the login.
    #[error(
        "cannot reach {backend} at {server}: {reason}\n\
         hint: start it (scripts/services.sh up) or point EXAMPLE_DATABASE_URL at a server you can reach, \
         e.g. EXAMPLE_DATABASE_URL={}",
        .backend.example_url()
    )]
    DatabaseUnreachable {
        /// The database the URL's scheme names.
        backend: Backend,
        /// host:port of the server.
        server: String,
        /// The driver's reason.
        reason: String,
    },
    /// A statement of the set-up failed.
    #[error(
        "database set-up of `{database}` failed: {}",
        txoutbox_core::DbErrorDisplay(.source)
    )]
    Database {
        /// Database name.
        database: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The in-process mock Kafka cluster could not start.
    #[error("could not start librdkafka's in-process mock cluster: {0}")]
    MockCluster(#[source] rdkafka::error::KafkaError),
}

/// Connects to the database named like `url`'s with `suffix` appended
/// (`outbox_demo` + `_orders`), creating it first if it does not exist.
///
/// Errors are meant for people: an unreachable server says so and how to
/// point `EXAMPLE_DATABASE_URL` elsewhere.
pub async fn connect_database(url: &str, suffix: &str) -> Result<PgPool, SetupError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| SetupError::BadDatabaseUrl {
        backend: Backend::Postgres,
        url: redact(url),
        reason: e.to_string(),
    })?;
    // The demo prints its own progress; per-statement logs would drown it.
    let options = options.disable_statement_logging();
    let database = format!(
        "{}{suffix}",
        options.get_database().unwrap_or("outbox_demo")
    );
    let options = options.database(&database);
    let server = format!("{}:{}", options.get_host(), options.get_port());
    let unreachable = |e: sqlx::Error| SetupError::DatabaseUnreachable {
        backend: Backend::Postgres,
        server: server.clone(),
        reason: txoutbox_core::DbErrorDisplay(&e).to_string(),
    };

    let maintenance = options.clone().database("postgres");
    let mut admin = sqlx::PgConnection::connect_with(&maintenance)
        .await
        .map_err(unreachable)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&database)
            .fetch_one(&mut admin)
            .await
            .map_err(|source| SetupError::Database {
                database: database.clone(),
                source,
            })?;
    if !exists {
        let create = format!("CREATE DATABASE \"{}\"", database.replace('"', "\"\""));
        if let Err(source) = sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
        {
            // Another process may have created it between the check and now.
            let raced = source
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|code| code == "42P04");
            if !raced {
                return Err(SetupError::Database { database, source });
            }
        }
    }
    let _ = admin.close().await;

    PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .map_err(unreachable)
}

/// [`connect_database`] on MariaDB: `url` is `mysql://` or `mariadb://`
/// (user, password, host, port and base name as for PostgreSQL). The
/// database is created with `CREATE DATABASE IF NOT EXISTS` over a
/// connection to `information_schema`, which every user may open.
pub async fn connect_mysql_database(url: &str, suffix: &str) -> Result<MySqlPool, SetupError> {
    let options = MySqlConnectOptions::from_str(url).map_err(|e| SetupError::BadDatabaseUrl {
        backend: Backend::MySql,
        url: redact(url),
        reason: e.to_string(),
    })?;
    let options = options.disable_statement_logging();
    let database = format!(
        "{}{suffix}",
        options.get_database().unwrap_or("outbox_demo")
    );
    let options = options.database(&database);
    let server = format!("{}:{}", options.get_host(), options.get_port());
    let unreachable = |e: sqlx::Error| SetupError::DatabaseUnreachable {
        backend: Backend::MySql,
        server: server.clone(),
        reason: txoutbox_core::DbErrorDisplay(&e).to_string(),
    };

    let maintenance = options.clone().database("information_schema");
    let mut admin = sqlx::MySqlConnection::connect_with(&maintenance)
        .await
        .map_err(unreachable)?;
    let create = format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        database.replace('`', "``")
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
        .map_err(|source| SetupError::Database {
            database: database.clone(),
            source,
        })?;
    let _ = admin.close().await;

    MySqlPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .map_err(unreachable)
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The Kafka cluster the example talks to.
pub enum Broker {
    /// librdkafka's in-process mock cluster (no `KAFKA_BROKERS` configured).
    Mock(MockCluster<'static, DefaultProducerContext>),
    /// A real cluster at these bootstrap servers.
    External(String),
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Broker {
    /// `KAFKA_BROKERS` if set and non-empty, otherwise a fresh in-process mock
    /// cluster with one broker.
    pub fn from_env() -> Result<Self, SetupError> {
        match std::env::var("KAFKA_BROKERS") {
            Ok(servers) if !servers.trim().is_empty() => Ok(Self::External(servers)),
            _ => MockCluster::new(1)
                .map(Self::Mock)
                .map_err(SetupError::MockCluster),
        }
    }

    /// `KAFKA_BROKERS` for the binaries that need a real cluster; an error
    /// naming the variable (and the `demo` alternative) if it is unset.
    pub fn external_from_env() -> Result<String, SetupError> {
        match std::env::var("KAFKA_BROKERS") {
            Ok(servers) if !servers.trim().is_empty() => Ok(servers),
            _ => Err(SetupError::NoBrokers),
        }
    }

    /// Bootstrap servers to hand to librdkafka.
    pub fn bootstrap_servers(&self) -> String {
        match self {
            Self::Mock(cluster) => cluster.bootstrap_servers(),
            Self::External(servers) => servers.clone(),
        }
    }

    /// Human description, e.g. for the demo's banner.
    pub fn describe(&self) -> String {
        match self {
            Self::Mock(cluster) => format!(
                "librdkafka in-process mock cluster at {} (no KAFKA_BROKERS set)",
                cluster.bootstrap_servers()
            ),
            Self::External(servers) => format!("Kafka at {servers} (KAFKA_BROKERS)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(
            redact("mysql://root:pw@127.0.0.1:3306/db"),
            "mysql://root:***@127.0.0.1:3306/db"
        );
    }

    #[test]
    fn the_scheme_picks_the_database() {
        let of = |url| Backend::of_url(url).ok();
        assert_eq!(of("postgres://u@h/db"), Some(Backend::Postgres));
        assert_eq!(of("postgresql://u@h/db"), Some(Backend::Postgres));
        assert_eq!(of("mysql://root@127.0.0.1:3306/db"), Some(Backend::MySql));
        assert_eq!(of("MariaDB://root@h/db"), Some(Backend::MySql));
        assert_eq!(of("sqlite://db"), None);
        assert_eq!(of("127.0.0.1:5432"), None);
        let error = Backend::of_url("oracle://u:secret@h/db").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
