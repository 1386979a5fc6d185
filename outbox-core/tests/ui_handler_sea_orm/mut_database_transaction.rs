use sea_orm::{DatabaseTransaction, DbErr};
use txoutbox_core::{outbox_handler, Events};

#[outbox_handler]
async fn create_order(_tx: &mut DatabaseTransaction, _events: &mut Events) -> Result<(), DbErr> {
    Ok(())
}

fn main() {}
