//! Example system: an orders service and a payments service exchanging events
//! through the outbox, exactly the story of the design seed.
//!
//! - [`orders`]: HTTP API (`POST /orders`, `GET /orders/{id}`), an
//!   `#[outbox_handler]` recording `OrderCreated`, a relay, and an inbox-mode
//!   consumer of `payment.events` that marks orders paid.
//! - [`inventory`]: a dedup-mode consumer of `inventory.commands` that
//!   reserves and releases stock (a release at most once per order, never
//!   before its reservation takes effect) and answers through its outbox.
//! - [`payments`]: a dedup-mode consumer of `order.events` that charges each
//!   order once and records `PaymentCompleted` through its own outbox.
//! - [`observability`]: what both serve to operators: `/metrics`
//!   (Prometheus), `/health/live` and `/health/ready`.
//! - the `demo` binary runs both on embedded defaults and drives orders
//!   through HTTP; `orders` and `payments` run one service each.

pub mod demo;
pub mod events;
pub mod http_error;
pub mod inventory;
pub mod observability;
pub mod orders;
pub mod payments;
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
