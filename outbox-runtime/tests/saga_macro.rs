//! The code `#[saga]` generates, run against real PostgreSQL: each message
//! goes through the generated handler as the consumer would call it (one
//! transaction, the recorded messages inserted, commit). A start handler
//! creates the saga and its commands go to the outbox; step handlers with and
//! without `ctx` change the state; a per-handler `#[correlate(..)]` finds the
//! saga by another field; a failing handler changes nothing; messages of an
//! unknown saga, and a second start, are ignored.

#![allow(missing_docs)]

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use txoutbox_core::{Command, DomainEvent};
use txoutbox_runtime::saga::saga;
use txoutbox_runtime::saga::{Saga, SagaContext};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-macro.orders", aggregate = "Order")]
pub struct Placed {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub sku: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-macro.stock", aggregate = "Stock")]
pub struct Reserved {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-macro.payments", aggregate = "Payment")]
pub struct Failed {
    pub event_id: Uuid,
    #[partition_key]
    pub order_id: Uuid,
    pub reason: String,
}

/// Correlated by `saga`, not `order_id`.
#[derive(Debug, Serialize, Deserialize, JsonSchema, DomainEvent)]
#[event(topic = "saga-macro.timeouts", aggregate = "Saga")]
pub struct TimedOut {
    pub event_id: Uuid,
    #[partition_key]
    pub saga: Uuid,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, Command)]
#[command(topic = "saga-macro.inventory.commands", aggregate = "Stock")]
pub struct Reserve {
    pub event_id: Uuid,
    #[partition_key]
    pub sku: String,
    #[aggregate_id]
    pub order_id: Uuid,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Fulfil {
    order_id: Uuid,
    reserved: bool,
    timeouts: u32,
}

#[saga(
    id = Uuid,
    correlate = order_id,
    starts_with(Placed),
    handles(Reserved, Failed, TimedOut)
)]
impl Fulfil {
    async fn on_placed(event: Placed, ctx: &mut SagaContext<'_>) -> Result<Self, String> {
        ctx.send(Reserve {
            event_id: Uuid::new_v4(),
            sku: event.sku,
            order_id: event.order_id,
        });
        Ok(Self {
            order_id: event.order_id,
            reserved: false,
            timeouts: 0,
        })
    }

    async fn on_reserved(&mut self, _event: Reserved) -> Result<(), String> {
        self.reserved = true;
        Ok(())
    }

    async fn on_failed(&mut self, event: Failed) -> Result<(), String> {
        self.reserved = false;
        Err(format!("payment failed: {}", event.reason))
    }

    #[correlate(saga)]
    async fn on_timed_out(
        &mut self,
        _event: TimedOut,
        ctx: &mut SagaContext<'_>,
    ) -> Result<(), String> {
        self.timeouts += 1;
        ctx.complete();
        Ok(())
    }
}

// One message through a generated handler, as the consumer runs it.
use txoutbox_runtime::testing::handle as apply;

async fn row(pool: &PgPool, id: Uuid) -> Option<(String, i64, Fulfil)> {
    let row: Option<(String, i64, serde_json::Value)> = sqlx::query_as(
        "SELECT status, version, state FROM saga_state WHERE saga_type = $1 AND saga_id = $2",
    )
    .bind(<Fulfil as Saga>::NAME)
    .bind(id.to_string())
    .fetch_optional(pool)
    .await
    .unwrap();
    row.map(|(status, version, state)| (status, version, serde_json::from_value(state).unwrap()))
}

async fn commands_sent(pool: &PgPool) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT topic, event_type, aggregate_id FROM outbox_event WHERE event_type = 'Reserve'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn generated_handlers_run_a_saga_through_its_steps(pool: PgPool) {
    txoutbox_runtime::migrations::run(&pool).await.unwrap();
    assert_eq!(<Fulfil as Saga>::NAME, "fulfil");
    let order_id = Uuid::new_v4();
    let placed = |sku: &str| Placed {
        event_id: Uuid::new_v4(),
        order_id,
        sku: sku.into(),
    };

    apply(&pool, Fulfil::on_placed_handler(), placed("sku-1"))
        .await
        .unwrap();
    let (status, started, state) = row(&pool, order_id).await.unwrap();
    assert_eq!(status, "running");
    assert_eq!(
        state,
        Fulfil {
            order_id,
            reserved: false,
            timeouts: 0
        }
    );
    assert_eq!(
        commands_sent(&pool).await,
        [(
            "saga-macro.inventory.commands".to_owned(),
            "Reserve".to_owned(),
            order_id.to_string()
        )]
    );

    // A second start of the same saga is ignored.
    apply(&pool, Fulfil::on_placed_handler(), placed("sku-2"))
        .await
        .unwrap();
    assert_eq!(row(&pool, order_id).await.unwrap().1, started);
    assert_eq!(commands_sent(&pool).await.len(), 1);

    // A step without `ctx`.
    let reserved = Reserved {
        event_id: Uuid::new_v4(),
        order_id,
    };
    apply(&pool, Fulfil::on_reserved_handler(), reserved)
        .await
        .unwrap();
    let (_, version, state) = row(&pool, order_id).await.unwrap();
    assert!(version > started, "{version} after {started}");
    assert!(state.reserved);

    // A failing step is the handler's error, and changes nothing.
    let failed = Failed {
        event_id: Uuid::new_v4(),
        order_id,
        reason: "card declined".into(),
    };
    let error = apply(&pool, Fulfil::on_failed_handler(), failed)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("payment failed: card declined"),
        "{error}"
    );
    let (_, after_failure, state) = row(&pool, order_id).await.unwrap();
    assert_eq!(after_failure, version);
    assert!(state.reserved);

    // Correlated by `saga`, with `ctx`: ends the saga.
    let timed_out = TimedOut {
        event_id: Uuid::new_v4(),
        saga: order_id,
    };
    apply(&pool, Fulfil::on_timed_out_handler(), timed_out)
        .await
        .unwrap();
    let (status, _, state) = row(&pool, order_id).await.unwrap();
    assert_eq!(status, "completed");
    assert_eq!(state.timeouts, 1);

    // A message of a saga that never started creates nothing.
    let stranger = Uuid::new_v4();
    let reserved = Reserved {
        event_id: Uuid::new_v4(),
        order_id: stranger,
    };
    apply(&pool, Fulfil::on_reserved_handler(), reserved)
        .await
        .unwrap();
    assert!(row(&pool, stranger).await.is_none());
}
