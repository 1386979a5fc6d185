use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

/// A command that cannot be cloned, so it cannot be given to a second attempt.
pub struct CreateOrder {
    pub amount: i64,
}

#[outbox_handler(isolation = "serializable", retries = 3)]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    cmd: CreateOrder,
) -> Result<i64, txoutbox_core::Error> {
    Ok(cmd.amount)
}

fn main() {}
