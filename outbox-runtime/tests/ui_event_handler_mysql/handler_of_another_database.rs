#[path = "../ui_event_handler/event.rs"]
mod event;

use event::*;
use sqlx::{MySql, Transaction};
use txoutbox_runtime::consumer::{Consumer, event_handler};

/// A handler on a MySQL transaction ...
#[event_handler]
async fn on_paid(_tx: &mut Transaction<'_, MySql>, _event: Paid) -> Result<(), sqlx::Error> {
    Ok(())
}

/// ... registered on a consumer of a PostgreSQL pool.
fn build(pool: sqlx::PgPool) {
    let _ = Consumer::builder(pool, rdkafka::ClientConfig::new(), "payments").handler(on_paid);
}

fn main() {}
