use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

#[outbox_handler(isolation = "serializable", retry = 3)]
async fn create_order(_tx: &mut Transaction<'_, Postgres>, _events: &mut Events) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
