use sqlx::{MySql, Transaction};
use txoutbox_core::{outbox_handler, Events};

#[outbox_handler]
async fn create_order(_tx: &Transaction<'_, MySql>, _events: &mut Events) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
