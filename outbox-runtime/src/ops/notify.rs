//! The trigger behind optional wake-ups of relays across processes
//! (PostgreSQL `LISTEN`/`NOTIFY`): installed, removed and checked here, once
//! per database, like a migration (`outbox notify enable|disable|status`).
//!
//! A relay in the writer's process is woken at once by the in-process commit
//! signal. A relay in another process only sees new rows at its next poll
//! (within [`RelayBuilder::poll_interval`](crate::relay::RelayBuilder::poll_interval)).
//! With notifications enabled, a statement-level trigger on `outbox_event`
//! sends `NOTIFY outbox_event` from every transaction that inserts rows (or
//! un-parks them), and relays started with
//! [`RelayBuilder::listen_notify`](crate::relay::RelayBuilder::listen_notify)
//! wake up when such a transaction commits, whichever process or language
//! wrote it.
//!
//! Off by default, because of its costs (see `docs/relay.md`): PostgreSQL
//! serializes the commits of all notifying transactions of a cluster on one
//! lock, and every listening relay holds one more connection. Notifications
//! are only a hint: one lost while a listener reconnects is made up by the
//! next poll, and a relay polls whether or not notifications arrive.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_runtime::ops::notify;
//! use txoutbox_runtime::relay::Relay;
//!
//! notify::enable(&pool).await?; // once per database, like a migration
//! let mut kafka = rdkafka::ClientConfig::new();
//! kafka.set("bootstrap.servers", "localhost:9092");
//! let relay = Relay::builder(pool, kafka).listen_notify(true).spawn()?;
//! # Ok(()) }
//! ```

pub use crate::relay::notify::{CHANNEL, TRIGGER, disable, enable, is_enabled};
