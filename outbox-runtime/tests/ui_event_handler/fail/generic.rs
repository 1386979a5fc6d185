#[path = "../event.rs"]
mod event;

#[allow(unused_imports)]
use event::*;
use txoutbox_runtime::consumer::event_handler;
#[allow(unused_imports)]
use sqlx::{Postgres, Transaction};

#[event_handler]
async fn on_paid<E: Send>(_tx: &mut Transaction<'_, Postgres>, _event: E) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
