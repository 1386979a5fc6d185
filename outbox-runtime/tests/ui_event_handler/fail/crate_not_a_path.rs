#[path = "../event.rs"]
mod event;

use event::*;
use txoutbox_runtime::consumer::event_handler;
use sqlx::{Postgres, Transaction};

#[event_handler(crate = "not a path")]
async fn on_paid(_tx: &mut Transaction<'_, Postgres>, _event: Paid) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
