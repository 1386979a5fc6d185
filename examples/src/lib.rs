//! Example system: an orders, an inventory and a payments service exchanging
//! events and commands through the outbox; the order fulfilment saga of the
//! orders service drives each order through the other two.
//!
//! - [`orders`]: HTTP API (`POST /orders`, `GET /orders/{id}`), an
//!   `#[outbox_handler]` recording `OrderCreated`, a relay, and an inbox-mode
//!   consumer running the [`fulfilment`] saga, which confirms or cancels
//!   each order.
//! - [`inventory`]: a dedup-mode consumer of `inventory.commands` that
//!   reserves and releases stock (a release at most once per order, never
//!   before its reservation takes effect) and answers through its outbox.
//! - [`payments`]: a dedup-mode consumer of `payment.commands` that charges
//!   each order once and answers `PaymentCompleted` or `PaymentFailed`
//!   through its own outbox; [`payments_sea_orm`] is its handler written
//!   with SeaORM entities (`demo --payments-orm sea-orm`).
//! - [`observability`]: what both serve to operators: `/metrics`
//!   (Prometheus), `/health/live` and `/health/ready`.
//! - the `demo` binary runs the three on embedded defaults and drives orders
//!   through HTTP; `orders`, `inventory` and `payments` run one service each.
//!
//! Every service runs on PostgreSQL or on MariaDB, whichever
//! `EXAMPLE_DATABASE_URL` names ([`database`]). Its logic (the decisions,
//! the amounts, the saga's transitions) is written once, in the service's
//! module, over a trait of the service's statements (`OrdersSql`,
//! `InventorySql`, `PaymentsSql`); each database implements that trait in
//! the service's `postgres.rs` and `mysql.rs`, next to its
//! `#[event_handler]`s, which are one line each. The saga is declared for
//! both databases by one `macro_rules!` ([`fulfilment`]).

pub mod database;
pub mod demo;
pub mod events;
pub mod fulfilment;
pub mod http_error;
pub mod inventory;
pub mod observability;
pub mod orders;
pub mod orders_error;
pub mod payments;
pub mod payments_sea_orm;
pub mod service;
pub mod setup;
pub mod telemetry;

/// Every Rust code block of the README compiles: rustdoc tests them here.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Rust code blocks of the guides compile too.
#[cfg(doctest)]
#[doc = include_str!("../../docs/handler.md")]
pub struct HandlerGuideDoctests;

/// See [`HandlerGuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../../docs/relay.md")]
pub struct RelayGuideDoctests;

/// See [`HandlerGuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../../docs/consumer.md")]
pub struct ConsumerGuideDoctests;

/// See [`HandlerGuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../../docs/attributes.md")]
pub struct AttributesGuideDoctests;

/// See [`HandlerGuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../../docs/sea-orm.md")]
pub struct SeaOrmGuideDoctests;
