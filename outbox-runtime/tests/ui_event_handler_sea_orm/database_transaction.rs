#[path = "../ui_event_handler/event.rs"]
mod event;

use event::*;
use txoutbox_runtime::consumer::event_handler;

#[event_handler]
async fn on_paid(_tx: &sea_orm::DatabaseTransaction, _event: Paid) -> Result<(), sea_orm::DbErr> {
    Ok(())
}

fn main() {}
