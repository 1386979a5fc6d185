use std::fmt;

use sqlx::postgres::PgDatabaseError;

/// Errors of the outbox write path.
///
/// Your handler's error type needs `From<txoutbox_core::Error>` so that `?` works
/// on framework calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event could not be turned into its JSON payload.
    #[error("event `{event_type}` could not be serialized to JSON: {source}")]
    Serialize {
        /// The event type that failed.
        event_type: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// An event serialized to something other than a JSON object.
    #[error("event `{event_type}` must serialize to a JSON object, got {found}")]
    PayloadNotObject {
        /// The event type that failed.
        event_type: &'static str,
        /// What it serialized to instead.
        found: &'static str,
    },
    /// An event's payload holds a field the framework fills itself
    /// (`event_type`) with another value: a field the derive cannot see (a
    /// `#[serde(flatten)]`ed one, a hand-written `Serialize`) put it there.
    /// The derive refuses a field of that name at compile time.
    #[error(
        "event `{event_type}` serializes `{field}` as {found}, but the framework puts the event \
         type there: rename the field that produces it"
    )]
    ReservedPayloadField {
        /// The event type that failed.
        event_type: &'static str,
        /// The payload field, `event_type`.
        field: &'static str,
        /// What the payload held instead (shortened JSON).
        found: String,
    },
    /// An event's headers of its own cannot be sent: a name that is not a
    /// valid header name or is one of the framework's, a name given twice, a
    /// value too long or holding a NUL, or too many or too large in all (see
    /// [`wire::user_headers_problem`](crate::wire::user_headers_problem)).
    #[error("event `{event_type}` cannot carry these headers: {problem}")]
    InvalidHeaders {
        /// The event type that failed.
        event_type: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// An event's partition key is longer than
    /// [`MAX_PARTITION_KEY_BYTES`](crate::MAX_PARTITION_KEY_BYTES) bytes (UTF-8):
    /// the outbox refuses it when the event is recorded, before anything is
    /// written, because PostgreSQL cannot index such a key (see
    /// `docs/wire-format.md`).
    #[error(
        "event `{event_type}` has a partition key of {len} bytes; the outbox accepts at most {max} \
         (txoutbox_core::MAX_PARTITION_KEY_BYTES): use a shorter key, e.g. an id or a hash of it"
    )]
    PartitionKeyTooLong {
        /// The event type that failed.
        event_type: &'static str,
        /// The key's length in bytes.
        len: usize,
        /// The limit, [`MAX_PARTITION_KEY_BYTES`](crate::MAX_PARTITION_KEY_BYTES).
        max: usize,
    },
    /// The handler returned `Ok`, but a statement of its transaction had
    /// failed and the handler did not return that error: PostgreSQL refuses
    /// every later statement of an aborted transaction and answers `COMMIT`
    /// with a rollback, so nothing of it was written. The framework checks
    /// this before it commits (see [`check_committable`](crate::check_committable))
    /// and reports it instead of a success.
    #[error(
        "the transaction was aborted by a failed statement whose error was not returned, so nothing \
         of it can be committed: return the error (`?`), run a statement that may fail under a \
         savepoint (`SAVEPOINT s` ... `ROLLBACK TO SAVEPOINT s`), or avoid the error in SQL \
         (e.g. `INSERT ... ON CONFLICT DO NOTHING`)"
    )]
    TransactionAborted,
    /// The handler ended the transaction it was given (a `COMMIT` or
    /// `ROLLBACK` statement of its own): the framework owns that transaction
    /// and commits or rolls it back after the handler returns.
    #[error(
        "the handler ended the transaction it was given (a COMMIT or ROLLBACK of its own): the \
         framework commits or rolls back that transaction itself; remove the statement, or use a \
         savepoint to undo part of the work"
    )]
    TransactionEnded,
    /// MySQL / MariaDB (feature `mysql`): after the handler ran, its
    /// connection was no longer inside a transaction, so nothing of the
    /// outbox was written and nothing is committed.
    #[cfg(feature = "mysql")]
    #[error(
        "the handler's transaction is no longer open: MySQL rolls a transaction back on a \
         deadlock (error 1213), and statements after it run outside any transaction, in \
         autocommit; a handler that swallows that error (or runs COMMIT or ROLLBACK itself) \
         leaves its later writes committed on their own. Nothing of the outbox was written; \
         return the error (`?`) so that `retries` can re-run the handler"
    )]
    TransactionLost,
    /// A database error (connecting, running the handler's transaction, inserting the outbox rows, committing).
    #[error("database error: {}", DbErrorDisplay(.0))]
    Database(#[from] sqlx::Error),
    /// A SeaORM error (feature `sea-orm`): beginning the handler's
    /// `DatabaseTransaction`, inserting the outbox rows through it,
    /// committing it.
    #[cfg(feature = "sea-orm")]
    #[error("database error: {}", crate::sea_orm::DbErrDisplay(.0))]
    SeaOrm(#[from] ::sea_orm::DbErr),
}

/// Renders a [`sqlx::Error`] for people: a PostgreSQL error as its message, its
/// SQLSTATE code, and its `detail:` and `hint:` when the server sent them.
///
/// sqlx's own `Display` of a database error writes only the message plus
/// "at line N", a line of PostgreSQL's C source (the error's `line` field,
/// which with `file` and `routine` locates the server code that raised it):
/// meaningless to a user, and it drops the detail that says *which* key
/// clashed. Use this wherever a database error is shown: logs, command-line
/// output, error texts stored in tables or headers. Other errors (I/O, pool
/// timeouts, decoding) are written as sqlx writes them.
///
/// The text is one line unless the server's own detail or hint has several.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) {
/// use txoutbox_core::DbErrorDisplay;
///
/// if let Err(error) = sqlx::query("SELECT * FROM missing").execute(&pool).await {
///     // relation "missing" does not exist (SQLSTATE 42P01)
///     tracing::warn!(error = %DbErrorDisplay(&error), "query failed");
/// }
/// # }
/// ```
///
/// ```
/// use txoutbox_core::DbErrorDisplay;
///
/// let error = sqlx::Error::PoolTimedOut;
/// assert_eq!(DbErrorDisplay(&error).to_string(), error.to_string());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DbErrorDisplay<'a>(pub &'a sqlx::Error);

impl fmt::Display for DbErrorDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(database) = self.0.as_database_error() else {
            return fmt::Display::fmt(self.0, f);
        };
        let Some(postgres) = database.try_downcast_ref::<PgDatabaseError>() else {
            // Another driver: its message and code, if any.
            f.write_str(database.message())?;
            if let Some(code) = database.code() {
                write!(f, " (SQLSTATE {code})")?;
            }
            return Ok(());
        };
        write!(f, "{} (SQLSTATE {})", postgres.message(), postgres.code())?;
        if let Some(detail) = postgres.detail() {
            write!(f, "; detail: {detail}")?;
        }
        if let Some(hint) = postgres.hint() {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}
