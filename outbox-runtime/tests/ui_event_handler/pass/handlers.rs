#[path = "../event.rs"]
mod event;

#[allow(unused_imports)]
use event::*;
use txoutbox_runtime::consumer::event_handler;
#[allow(unused_imports)]
use sqlx::{Postgres, Transaction};

/// Handles payments.
#[event_handler]
pub async fn on_paid(tx: &mut Transaction<'_, Postgres>, event: Paid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1").bind(event.amount).execute(&mut **tx).await?;
    Ok(())
}

#[derive(Debug)]
struct MyError;

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mine")
    }
}

#[event_handler]
async fn with_meta(
    _tx: &mut Transaction<'_, Postgres>,
    event: Paid,
    meta: &txoutbox_runtime::consumer::EventMeta,
) -> Result<(), MyError> {
    if meta.event_id != event.event_id {
        return Err(MyError);
    }
    Ok(())
}

/// Reacts with an event of its own, in either parameter order.
#[event_handler]
async fn with_events(
    _tx: &mut Transaction<'_, Postgres>,
    event: Paid,
    events: &mut txoutbox_core::Events,
    _meta: &txoutbox_runtime::consumer::EventMeta,
) -> Result<(), sqlx::Error> {
    events.record(event);
    Ok(())
}

#[allow(dead_code)]
fn assemble(pool: sqlx::PgPool) {
    use txoutbox_runtime::consumer::{Consumer, EventHandler};
    assert_eq!(<on_paid as EventHandler>::NAME, "on_paid");
    let _ = Consumer::builder(pool.clone(), rdkafka::ClientConfig::new(), "g").handler(on_paid);
    let _ = Consumer::builder(pool.clone(), rdkafka::ClientConfig::new(), "g").handler(with_meta);
    let _ = Consumer::builder(pool, rdkafka::ClientConfig::new(), "g").handler(with_events);
}

fn main() {}
