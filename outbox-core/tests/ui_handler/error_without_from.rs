use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

/// An error type that cannot hold the framework's errors.
#[derive(Debug)]
pub struct AppError;

#[outbox_handler]
async fn create_order(_tx: &mut Transaction<'_, Postgres>, _events: &mut Events) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
