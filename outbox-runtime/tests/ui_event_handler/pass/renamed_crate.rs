//! `crate = "..."` for a service that reaches the runtime through a
//! re-export (or a renamed dependency).
#[path = "../event.rs"]
mod event;

mod framework {
    pub use txoutbox_runtime::*;
}

use event::*;
use framework::consumer::{EventHandler, event_handler};
use sqlx::{Postgres, Transaction};

#[event_handler(crate = "crate::framework")]
async fn on_paid(_tx: &mut Transaction<'_, Postgres>, _event: Paid) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {
    assert_eq!(<on_paid as EventHandler>::NAME, "on_paid");
}
