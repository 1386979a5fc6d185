use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

/// Converts from the framework's error, but is no `std::error::Error`, so a
/// serialization failure inside it could not be recognized for a retry.
#[derive(Debug)]
pub struct AppError;

impl From<txoutbox_core::Error> for AppError {
    fn from(_: txoutbox_core::Error) -> Self {
        AppError
    }
}

#[outbox_handler(retries = 3)]
async fn create_order(_tx: &mut Transaction<'_, Postgres>, _events: &mut Events) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
