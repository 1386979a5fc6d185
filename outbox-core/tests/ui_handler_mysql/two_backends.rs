use sqlx::{MySql, Postgres, Transaction};
use txoutbox_core::{outbox_handler, Events};

#[outbox_handler]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    _other: &mut Transaction<'_, MySql>,
) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
