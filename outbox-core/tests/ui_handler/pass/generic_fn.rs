use txoutbox_core::{outbox_handler, DomainEvent, Events};
use sqlx::{PgPool, Postgres, Transaction};

/// Generic over the event type and a const, with a where clause and `impl Trait`.
#[outbox_handler]
pub async fn record_batch<E, const N: usize>(
    _tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    batch: [E; N],
    label: impl Into<String> + Send,
) -> Result<String, txoutbox_core::Error>
where
    E: DomainEvent,
{
    for event in batch {
        events.record(event);
    }
    Ok(label.into())
}

/// Aliased types, marked explicitly.
type Tx<'c> = Transaction<'c, Postgres>;
type Collector = Events;

#[outbox_handler(retries = 1)]
async fn with_aliases(#[tx] _tx: &mut Tx<'_>, #[events] _events: &mut Collector) -> Result<(), txoutbox_core::Error> {
    Ok(())
}

#[derive(serde::Serialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "pings", aggregate = "Ping")]
struct Pinged {
    #[partition_key]
    event_id: uuid::Uuid,
}

#[allow(dead_code)]
async fn callers(pool: PgPool) -> Result<(), txoutbox_core::Error> {
    let ping = Pinged { event_id: uuid::Uuid::new_v4() };
    record_batch(&pool, [ping], "one").await?;
    record_batch::<Pinged, 0>(&pool, [], String::from("none")).await?;
    with_aliases(&pool).await?;
    Ok(())
}

fn main() {}
