use txoutbox_core::{outbox_handler, Events};
use sqlx::{Postgres, Transaction};

struct Service;

impl Service {
    #[outbox_handler(retries = 3)]
    async fn create_order(
        &mut self,
        _tx: &mut Transaction<'_, Postgres>,
        _events: &mut Events,
    ) -> Result<(), txoutbox_core::Error> {
        Ok(())
    }
}

fn main() {}
