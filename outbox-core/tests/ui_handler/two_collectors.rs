use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

#[outbox_handler]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    _more: &mut txoutbox_core::Events,
) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
