use sea_orm::{DatabaseTransaction, DbErr};
use sqlx::{Postgres, Transaction};
use txoutbox_core::{outbox_handler, Events};

#[outbox_handler]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    _orm: &DatabaseTransaction,
) -> Result<(), DbErr> {
    Ok(())
}

fn main() {}
