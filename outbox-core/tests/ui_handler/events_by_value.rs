use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

#[outbox_handler]
async fn create_order(_tx: &mut Transaction<'_, Postgres>, _events: Events) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
