#![deny(warnings)]

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use txoutbox_core::{outbox_handler, Events};

/// Its own error type, converting both SeaORM's and the framework's errors.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error(transparent)]
    Outbox(#[from] txoutbox_core::Error),
}

/// Returns SeaORM's own error.
#[outbox_handler]
pub async fn create_order(tx: &DatabaseTransaction, _events: &mut Events, amount: i64) -> Result<i64, DbErr> {
    tx.execute_unprepared("SELECT 1").await?;
    Ok(amount)
}

/// Retried, with an error of its own.
#[outbox_handler(isolation = "Serializable", retries = 2)]
pub async fn cancel_order(tx: &DatabaseTransaction, _events: &mut Events, id: i64) -> Result<i64, OrderError> {
    tx.execute_unprepared("SELECT 1").await?;
    Ok(id)
}

pub struct Orders;

impl Orders {
    /// A method, on a borrowed connection.
    #[outbox_handler]
    pub async fn ship(&self, tx: &DatabaseTransaction, _events: &mut Events) -> Result<(), DbErr> {
        tx.execute_unprepared("SELECT 1").await.map(drop)
    }
}

#[allow(dead_code)]
async fn callers(db: DatabaseConnection) -> Result<(), OrderError> {
    create_order(&db, 1).await?;
    cancel_order(&db, 2).await?;
    Orders.ship(&db).await?;
    let outer = sea_orm::TransactionTrait::begin(&db).await?;
    create_order(&outer, 3).await?;
    outer.commit().await?;
    create_order(db, 4).await?;
    Ok(())
}

fn main() {}
