use txoutbox_core::outbox_handler;
use sqlx::{Postgres, Transaction};

#[outbox_handler]
async fn create_order(_tx: &mut Transaction<'_, Postgres>, _amount: i64) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
