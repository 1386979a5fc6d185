use txoutbox_core::{outbox_handler, Events};
use sqlx::{PgPool, Postgres, Transaction};

/// A command.
#[derive(Debug, Clone)]
pub struct CreateOrder {
    pub amount: i64,
}

#[derive(Debug)]
pub enum AppError {
    Outbox(txoutbox_core::Error),
    Db(sqlx::Error),
}

impl From<txoutbox_core::Error> for AppError {
    fn from(error: txoutbox_core::Error) -> Self {
        Self::Outbox(error)
    }
}

impl From<sqlx::Error> for AppError {
    fn from(error: sqlx::Error) -> Self {
        Self::Db(error)
    }
}

/// Creates an order (docs, visibility and attributes are kept).
#[outbox_handler]
#[allow(clippy::needless_pass_by_value)]
pub async fn create_order(
    tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    cmd: CreateOrder,
) -> Result<i64, AppError> {
    let id: i64 = sqlx::query_scalar("SELECT $1")
        .bind(cmd.amount)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

/// On a bare connection, with a destructuring pattern.
#[outbox_handler(isolation = "Repeatable Read")]
pub(crate) async fn with_connection(
    _events: &mut Events,
    CreateOrder { amount }: CreateOrder,
    conn: &mut sqlx::PgConnection,
) -> Result<i64, AppError> {
    let id: i64 = sqlx::query_scalar("SELECT $1").bind(amount).fetch_one(conn).await?;
    Ok(id)
}

/// Arguments named like the wrapper's own locals (`db`, `tx`, `events`) do not
/// clash with them: the generated names are hygienic.
#[outbox_handler(retries = 1)]
pub async fn hygiene(
    conn: &mut Transaction<'_, Postgres>,
    collector: &mut Events,
    db: String,
    tx: i32,
    events: Vec<u8>,
) -> Result<usize, txoutbox_core::Error> {
    let _ = (conn, collector);
    Ok(db.len() + tx as usize + events.len())
}

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
async fn callers(pool: PgPool) -> Result<(), AppError> {
    let future = create_order(&pool, CreateOrder { amount: 1 });
    assert_send(&future);
    future.await?;
    create_order(pool.clone(), CreateOrder { amount: 1 }).await?;
    let mut conn = pool.acquire().await?;
    with_connection(&mut *conn, CreateOrder { amount: 2 }).await?;
    hygiene(&pool, "db".into(), 1, vec![]).await?;
    // The handler itself, on a transaction and collector of your own.
    let mut tx = pool.begin().await?;
    let mut events = Events::new();
    create_order_in_tx(&mut tx, &mut events, CreateOrder { amount: 3 }).await?;
    Ok(())
}

fn main() {}
