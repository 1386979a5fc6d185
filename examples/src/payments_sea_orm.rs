//! The payments service's handler written with SeaORM 2 instead of sqlx:
//! the same behaviour as [`crate::payments`], on SeaORM entities
//! ([`entity::payment`], [`entity::payment_policy`]) over the same tables.
//! The demo runs it with `--payments-orm sea-orm`
//! ([`PaymentsOrm::SeaOrm`]).
//!
//! A consumer handler takes `tx: &SeaConnection<'_>`: SeaORM's
//! `ConnectionTrait` on the consumer's own transaction, so the payment row
//! written with an active model, the outbox row of the answer and the
//! `processed_event` dedup row commit together, as on the sqlx path.

use chrono::Utc;
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, DbErr, EntityTrait};
use txoutbox_core::Events;
use txoutbox_runtime::consumer::event_handler;
use txoutbox_runtime::sea_orm::SeaConnection;
use uuid::Uuid;

use crate::events::{ChargePayment, PaymentCompleted, PaymentFailed};

/// Which library the payments service's handler is written with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PaymentsOrm {
    /// Plain sqlx ([`crate::payments`]).
    #[default]
    Sqlx,
    /// SeaORM entities (this module).
    SeaOrm,
}

impl std::str::FromStr for PaymentsOrm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sqlx" => Ok(Self::Sqlx),
            "sea-orm" => Ok(Self::SeaOrm),
            other => Err(format!("`{other}`: expected `sqlx` or `sea-orm`")),
        }
    }
}

/// The payments tables as SeaORM entities (`examples/migrations/payments.sql`).
pub mod entity {
    /// A charge: one row per order, `completed` or `declined`.
    pub mod payment {
        use sea_orm::entity::prelude::*;

        /// A row of `payments`.
        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "payments")]
        pub struct Model {
            /// The payment id.
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: Uuid,
            /// The order charged (unique).
            #[sea_orm(unique)]
            pub order_id: Uuid,
            /// Cents.
            pub amount: i64,
            /// When the row was written.
            pub completed_at: DateTimeWithTimeZone,
            /// `completed` or `declined`.
            pub status: String,
        }

        /// No relations.
        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    /// The payment policy, one row.
    pub mod payment_policy {
        use sea_orm::entity::prelude::*;

        /// The row of `payment_policy`.
        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "payment_policy")]
        pub struct Model {
            /// Always `true`: the table holds one row.
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: bool,
            /// Charges above this many cents are declined.
            pub decline_over: i64,
        }

        /// No relations.
        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use entity::{payment, payment_policy};

/// Charges the order once, as [`crate::payments`]' handler does: records
/// `PaymentCompleted`, or `PaymentFailed` when the amount is over the
/// policy's limit; a second charge of the same order changes nothing.
#[event_handler]
pub(crate) async fn on_charge_payment_sea_orm(
    tx: &SeaConnection<'_>,
    event: ChargePayment,
    events: &mut Events,
) -> Result<(), DbErr> {
    let policy = payment_policy::Entity::find()
        .one(tx)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("payment_policy has no row".into()))?;
    let declined = event.amount > policy.decline_over;
    let payment_id = Uuid::now_v7();
    let row = payment::ActiveModel {
        id: Set(payment_id),
        order_id: Set(event.order_id),
        amount: Set(event.amount),
        completed_at: Set(Utc::now().into()),
        status: Set(if declined { "declined" } else { "completed" }.to_owned()),
    };
    let inserted = payment::Entity::insert(row)
        .on_conflict(
            OnConflict::column(payment::Column::OrderId)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(tx)
        .await?;
    if inserted == 0 {
        // Already charged (a replay, or the same order under another event id).
        return Ok(());
    }
    if declined {
        events.record(PaymentFailed {
            event_id: Uuid::now_v7(),
            payment_id,
            order_id: event.order_id,
            amount: event.amount,
            reason: format!(
                "{} cents is over the limit of {}",
                event.amount, policy.decline_over
            ),
            failed_at: Utc::now(),
        });
    } else {
        events.record(PaymentCompleted {
            event_id: Uuid::now_v7(),
            payment_id,
            order_id: event.order_id,
            amount: event.amount,
            completed_at: Utc::now(),
        });
    }
    Ok(())
}
