use txoutbox_core::{outbox_handler, Events};
use sqlx::{PgPool, Postgres, Transaction};

pub struct OrderService {
    prefix: String,
}

impl OrderService {
    /// `&self`, retried: the service is shared by every attempt.
    #[outbox_handler(isolation = "serializable", retries = 3)]
    pub async fn create_order(
        &self,
        _tx: &mut Transaction<'_, Postgres>,
        _events: &mut Events,
        name: String,
    ) -> Result<String, txoutbox_core::Error> {
        Ok(format!("{}{name}", self.prefix))
    }

    /// `&mut self`, parameters in any order.
    #[outbox_handler]
    pub async fn rename(
        &mut self,
        prefix: &str,
        _events: &mut Events,
        _tx: &mut sqlx::PgTransaction<'_>,
    ) -> Result<(), txoutbox_core::Error> {
        self.prefix = prefix.to_owned();
        Ok(())
    }
}

#[allow(dead_code)]
async fn callers(pool: PgPool) -> Result<(), txoutbox_core::Error> {
    let mut service = OrderService { prefix: String::new() };
    service.rename(&pool, "order-").await?;
    let future = service.create_order(&pool, "a".into());
    fn assert_send<T: Send>(_: &T) {}
    assert_send(&future);
    future.await?;
    txoutbox_core::testing::record_events(&pool, async |tx, events| {
        service.create_order_in_tx(tx, events, "b".into()).await
    })
    .await?;
    Ok(())
}

fn main() {}
