#![deny(warnings)]

use sqlx::{MySql, MySqlConnection, MySqlPool, MySqlTransaction, Transaction};
use txoutbox_core::{outbox_handler, Events};

/// On `Transaction<'_, MySql>`.
#[outbox_handler]
pub async fn create_order(tx: &mut Transaction<'_, MySql>, _events: &mut Events, amount: i64) -> Result<i64, txoutbox_core::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(amount)
}

/// On the alias, retried.
#[outbox_handler(retries = 2, isolation = "read_committed")]
pub async fn cancel_order(tx: &mut MySqlTransaction<'_>, _events: &mut Events, id: i64) -> Result<i64, txoutbox_core::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(id)
}

/// On a connection.
#[outbox_handler]
pub async fn ship(conn: &mut MySqlConnection, _events: &mut Events) -> Result<(), txoutbox_core::Error> {
    sqlx::query("SELECT 1").execute(conn).await.map(drop).map_err(Into::into)
}

#[allow(dead_code)]
async fn callers(pool: MySqlPool) -> Result<(), txoutbox_core::Error> {
    create_order(&pool, 1).await?;
    cancel_order(&pool, 2).await?;
    let mut conn = pool.acquire().await?;
    ship(&mut *conn).await?;
    create_order(pool, 3).await?;
    Ok(())
}

fn main() {}
