#[path = "../ui_event_handler/event.rs"]
mod event;

use event::*;
use sqlx::MySqlConnection;
use txoutbox_runtime::consumer::event_handler;

#[event_handler]
async fn on_paid(_tx: &mut MySqlConnection, _event: Paid) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
