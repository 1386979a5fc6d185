use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

/// Stands in for `rdkafka::producer::FutureProducer`: the check is by name.
pub struct FutureProducer;

#[outbox_handler]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    _producer: &FutureProducer,
) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
