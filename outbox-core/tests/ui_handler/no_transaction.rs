use txoutbox_core::{outbox_handler, Events};

#[outbox_handler]
async fn create_order(_events: &mut Events, _amount: i64) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
