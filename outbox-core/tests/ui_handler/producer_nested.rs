use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

use std::sync::Arc;

/// Any type whose name ends with `Producer`, however it is wrapped.
pub struct KafkaProducer;

#[outbox_handler]
async fn create_order(
    _tx: &mut Transaction<'_, Postgres>,
    _events: &mut Events,
    _producers: Option<Arc<KafkaProducer>>,
) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

fn main() {}
