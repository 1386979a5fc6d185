//! Building a relay: the builder, its setters, and the producer settings the
//! relay forces on the user's librdkafka configuration.

use std::fmt;
use std::time::Duration;

use rdkafka::ClientConfig;
use txoutbox_core::Backoff;

use super::backend::Backend;
use super::config::{RelayConfig, validate};
use super::database::Database;
use super::error::BuildError;
use super::run::{Relay, RelayHandle};
use crate::redact::Redacted;

impl Relay {
    /// Starts configuring a relay over `pool` (the service's database, with
    /// the outbox migrations applied: a `PgPool`, or a `MySqlPool` with the
    /// feature `mysql`, see [`Database`]) publishing through a producer built
    /// from `kafka` (any librdkafka settings: `bootstrap.servers`, TLS, SASL,
    /// compression, linger...). The relay adds `enable.idempotence=true` and
    /// `acks=all`, and sets `message.timeout.ms` from
    /// [`RelayBuilder::delivery_timeout`].
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::BuildError> {
    /// let mut kafka = rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "localhost:9092");
    /// let handle = txoutbox_runtime::relay::Relay::builder(pool, kafka).spawn()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: impl Into<Database>, kafka: ClientConfig) -> RelayBuilder {
        RelayBuilder::new(pool.into(), kafka)
    }
}

/// Builds and starts a [`Relay`]; created by [`Relay::builder`].
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use rdkafka::ClientConfig;
/// use txoutbox_core::Backoff;
/// use txoutbox_runtime::relay::Relay;
///
/// let mut kafka = ClientConfig::new();
/// kafka.set("bootstrap.servers", "localhost:9092").set("compression.type", "lz4");
/// let relay = Relay::builder(pool, kafka)
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(200))
///     .error_backoff(Backoff::new(Duration::from_millis(50), Duration::from_secs(5)))
///     .spawn()?; // a relay::BuildError
/// // ... serve requests ...
/// let summary = relay.shutdown().await?; // a RelayError
/// println!("published {} events", summary.published);
/// # Ok(()) }
/// ```
#[must_use = "a relay builder does nothing until `spawn` is called"]
pub struct RelayBuilder {
    database: Database,
    kafka: ClientConfig,
    config: RelayConfig,
}

/// Shows the tuning and the librdkafka settings, with secrets (passwords,
/// SASL/OAUTHBEARER configuration, private keys) replaced by `[redacted]`.
impl fmt::Debug for RelayBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayBuilder")
            .field("database", &self.database)
            .field("kafka", &Redacted(&self.kafka))
            .field("config", &self.config)
            .finish()
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.config.$name = value;
            self
        }
    )*};
}

impl RelayBuilder {
    pub(super) fn new(database: Database, kafka: ClientConfig) -> Self {
        Self {
            database,
            kafka,
            config: RelayConfig::default(),
        }
    }

    setters! {
        /// Rows claimed, published and marked per batch. Default `1000`; at
        /// least 1 (`build` refuses 0).
        batch_size: usize;
        /// Longest wait between two polls when the outbox is idle. Default
        /// `500 ms`; positive.
        ///
        /// The relay polls again at once while batches come back full, waits for
        /// the in-process commit signal otherwise, and backs off from 5 ms up to
        /// this interval while polls find nothing (commits in another process are
        /// seen within this interval).
        poll_interval: Duration;
        /// Longest sleep of the relay's scheduler, which moves scheduled events
        /// (`Events::record_after` / `record_at`) into the outbox when due.
        /// Default `200 ms`; positive.
        ///
        /// The scheduler sleeps until the earliest due time it found, but at
        /// most this long: an event scheduled meanwhile with an earlier due time
        /// (or whose due time has passed) is seen within this interval. Each
        /// wake-up costs one indexed `min()` query.
        schedule_poll_interval: Duration;
        /// How long librdkafka may try to deliver a message (`message.timeout.ms`):
        /// the longest a row stays in flight before its delivery counts as
        /// failed (the claim itself holds no transaction open meanwhile).
        /// Default `30 s`; at least 1 ms.
        delivery_timeout: Duration;
        /// How long a batch waits for its last delivery reports once other rows
        /// got through, before it is settled without them. Default `2 s`;
        /// positive.
        ///
        /// Reports missing that long while other partitions deliver mean a
        /// partition whose leader is down (librdkafka keeps its records until
        /// `delivery_timeout`): the batch's delivered rows are marked at once,
        /// the late ones wait on their own (holding their keys, not the
        /// pipeline), and the relay holds back further rows of that partition,
        /// without counting attempts, until it is back. This bounds how long an
        /// outage of some partitions delays the events of the others; see
        /// `docs/relay.md`, *Partial broker outages*.
        partition_stall_timeout: Duration;
        /// Failed attempts after which a row is parked (`parked_at` set), so that it
        /// no longer blocks later events of its key. Default `10`; at least 1.
        /// Only refusals of the record itself count (too large, invalid); an
        /// unavailable broker or partition never does, nor a topic the broker
        /// refuses as a whole (unknown topic, not authorized: the relay holds
        /// the topic, see `docs/relay.md`, *Refused topics*).
        max_attempts: u32;
        /// Delay before retrying a row the broker refused: the retry after
        /// attempt `n` waits [`Backoff::delay`]`(n)`, doubling from the
        /// initial delay up to the maximum, with jitter. Default `1 s` to
        /// `5 min`.
        retry_backoff: Backoff;
        /// Pause after failed batches (broker unreachable, database gone):
        /// after `n` failures in a row the relay waits
        /// [`Backoff::delay`]`(n)`, doubling up to the maximum, with jitter.
        /// The same backoff spaces the probes of an unavailable partition or
        /// of a topic the broker refuses, and the maximum is the scheduler's
        /// wait while its table is missing. Default `100 ms` to `10 s`.
        error_backoff: Backoff;
        /// Number of lanes partition keys are hashed into. Each lane is published
        /// by one relay at a time; **every relay on a database must use the same
        /// value**: a relay whose count differs from a running relay's is refused
        /// (its task ends with [`RelayError::LaneCountMismatch`](super::RelayError::LaneCountMismatch)); to change the
        /// count, stop every relay of the database first. Bounds the useful
        /// number of relays. Default `64`; between 1 and 2^31-1.
        lanes: u32;
        /// How often a relay re-checks its lane ownership and the number of live
        /// relays, taking or releasing lanes for a fair share. Default `2 s`
        /// ([`DEFAULT_REBALANCE_INTERVAL`](super::DEFAULT_REBALANCE_INTERVAL)); positive.
        rebalance_interval: Duration;
        /// How often the backlog gauges are refreshed. Default `10 s`.
        metrics_interval: Duration;
        /// How long a relay may go without renewing its membership before another
        /// relay ends its database session (`pg_terminate_backend`) and takes its
        /// lanes. Default `10 s` ([`DEFAULT_LEASE_TIMEOUT`](super::DEFAULT_LEASE_TIMEOUT)).
        ///
        /// A relay renews its lease on its own connection every
        /// `min(rebalance_interval, lease_timeout / 3)`, also while it waits for
        /// the broker. A relay whose host froze or vanished (power loss, network
        /// partition: the connection stays open, so PostgreSQL keeps its locks)
        /// therefore loses its lanes within `lease_timeout + 2 x
        /// rebalance_interval` (14 s by default) while another relay runs. The
        /// relay's session also gets server-side TCP keepalive derived from this
        /// value (probes after `lease_timeout` of silence, every `lease_timeout /
        /// 5`, five of them; `tcp_user_timeout = 2 x lease_timeout`), which ends
        /// a vanished host's session after about `2 x lease_timeout` even when no
        /// other relay can end it. Must exceed `database_timeout` plus the
        /// renewal period (`build` refuses it otherwise). Ending another
        /// relay's session needs the same database role or
        /// `pg_signal_backend`; without it a warning is logged and only
        /// keepalive applies.
        lease_timeout: Duration;
        /// The longest the relay waits for any statement (and for connecting) on
        /// its own connection: claims, marks, lane changes, renewals. After it
        /// the relay drops the connection with its lanes (its unmarked batches
        /// are published again by the lanes' next owner) and reconnects. Keeps a
        /// relay whose connection froze from waiting for hours. Default `5 s`;
        /// positive.
        database_timeout: Duration;
        /// Also wake up on PostgreSQL notifications from other processes' commits
        /// (see [`ops::notify`](crate::ops::notify): needs the trigger installed
        /// with [`ops::notify::enable`](crate::ops::notify::enable) or `outbox
        /// notify enable`).
        /// Costs one extra connection per relay. Default `false`: commits in the
        /// relay's own process wake it at once; others are seen within
        /// `poll_interval`. PostgreSQL only: MySQL has no `LISTEN`, and `build`
        /// refuses the setting there.
        listen_notify: bool;
        /// Bound of [`RelayHandle::shutdown`]: after it, the task is aborted (its
        /// unmarked rows are published again later). Default `45 s`.
        shutdown_timeout: Duration;
    }

    /// The names of the event's headers on every record this relay sends.
    /// Default: the wire format's (`event_id`, `event_type`,
    /// `aggregate_type`, `aggregate_id`). [`HeaderNames::debezium`] gives
    /// the names of Debezium's outbox event router, for a service that
    /// replaces it without its consumers noticing (`docs/wire-format.md`,
    /// "Moving a service from Debezium to this relay"). `build` refuses
    /// names that are empty, repeated or the framework's own
    /// ([`BuildError::HeaderNames`]).
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool, kafka: rdkafka::ClientConfig) -> Result<(), txoutbox_runtime::relay::BuildError> {
    /// use txoutbox_runtime::relay::{HeaderNames, Relay};
    ///
    /// let relay = Relay::builder(pool, kafka)
    ///     .header_names(HeaderNames::debezium())
    ///     .spawn()?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`HeaderNames::debezium`]: super::HeaderNames::debezium
    pub fn header_names(mut self, names: super::HeaderNames) -> Self {
        self.config.header_names = names;
        self
    }

    /// Publishes every record as a CloudEvent in binary content mode as
    /// well: the `ce_` headers of [`CloudEvents`](super::CloudEvents) next to
    /// (or, with `without_framework_headers`, instead of) the framework's,
    /// the value unchanged. Default: off. See `docs/wire-format.md`,
    /// "CloudEvents".
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool, kafka: rdkafka::ClientConfig) -> Result<(), txoutbox_runtime::relay::BuildError> {
    /// use txoutbox_runtime::relay::{CloudEvents, Relay};
    ///
    /// let relay = Relay::builder(pool, kafka)
    ///     .cloudevents(CloudEvents::binary().source("https://orders.example.com"))
    ///     .spawn()?;
    /// # Ok(()) }
    /// ```
    pub fn cloudevents(mut self, cloudevents: super::CloudEvents) -> Self {
        self.config.cloudevents = Some(cloudevents);
        self
    }

    /// Testing only: abandons every batch after delivery and before
    /// marking, as a crash at that point would. Not a public API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn crash_before_mark(mut self, value: bool) -> Self {
        self.config.crash_before_mark = value;
        self
    }

    /// Validates the configuration and creates the producer: a [`Relay`]
    /// to [`spawn`](Relay::spawn) or [`run`](Relay::run).
    ///
    /// Fails if the Kafka configuration disables idempotence or weakens
    /// `acks` (the relay's producer is always idempotent with `acks=all`), if
    /// a tuning value is out of range, or if librdkafka refuses the
    /// configuration.
    pub fn build(mut self) -> Result<Relay, BuildError> {
        validate(&self.config)?;
        let database = match &self.database {
            Database::Postgres(pool) => pool.database_name(),
            #[cfg(feature = "mysql")]
            Database::MySql(pool) => {
                if self.config.listen_notify {
                    return Err(BuildError::InvalidConfig(
                        "listen_notify needs PostgreSQL's LISTEN/NOTIFY; on MySQL and MariaDB \
                         a relay sees other processes' commits within poll_interval (lower it \
                         for lower latency)",
                    ));
                }
                pool.connect_options().get_database().map(str::to_owned)
            }
        };
        self.config.cloudevents = self
            .config
            .cloudevents
            .take()
            .map(|cloudevents| cloudevents.resolved(database.as_deref()));
        let kafka = producer_config(&self.kafka, &self.config)?;
        Relay::new(self.database, kafka, self.config)
    }

    /// `build()?.spawn()`: validates, creates the producer and starts the
    /// relay as a tokio task. Must be called inside a tokio runtime.
    pub fn spawn(self) -> Result<RelayHandle, BuildError> {
        Ok(self.build()?.spawn())
    }
}

/// The user's librdkafka settings plus the ones the relay forces.
///
/// Idempotence is what keeps librdkafka's internal retries from duplicating or
/// reordering messages of a partition, which per-key order relies on; a
/// setting that weakens it is refused rather than silently overridden, so a
/// misconfiguration is noticed.
pub(super) fn producer_config(
    user: &ClientConfig,
    config: &RelayConfig,
) -> Result<ClientConfig, BuildError> {
    let refuse = |setting: &str, value: &str| {
        Err(BuildError::IdempotenceRequired {
            setting: setting.to_owned(),
            value: value.to_owned(),
        })
    };
    if let Some(value) = user.get("enable.idempotence")
        && !value.trim().eq_ignore_ascii_case("true")
    {
        return refuse("enable.idempotence", value);
    }
    for key in ["acks", "request.required.acks"] {
        if let Some(value) = user.get(key)
            && !matches!(value.trim(), "all" | "-1")
        {
            return refuse(key, value);
        }
    }
    let mut kafka = user.clone();
    // The relay batches by itself (a claim is up to `batch_size` rows, all
    // enqueued at once), so librdkafka's linger (5 ms by default) would only
    // delay every batch's acknowledgement; what is enqueued while requests
    // are in flight still goes out together. See docs/relay.md, "Producer
    // settings".
    if user.get("linger.ms").is_none() && user.get("queue.buffering.max.ms").is_none() {
        kafka.set("linger.ms", DEFAULT_LINGER_MS);
    }
    kafka
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            config.delivery_timeout.as_millis().max(1).to_string(),
        );
    kafka.remove("request.required.acks");
    kafka.remove("delivery.timeout.ms");
    Ok(kafka)
}

/// The relay's producer `linger.ms` unless the user sets `linger.ms` (or
/// its alias `queue.buffering.max.ms`).
pub(crate) const DEFAULT_LINGER_MS: &str = "0";

/// Benchmarks only: the producer settings of a relay built from `user`
/// with the default configuration, for a bench's plain producer to measure
/// the broker with the relay's client settings. Not a public API.
#[cfg(feature = "test-hooks")]
pub fn producer_settings_for_benchmark(user: &ClientConfig) -> ClientConfig {
    producer_config(user, &RelayConfig::default()).unwrap_or_else(|_| user.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(key: &str, value: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "x:1").set(key, value);
        config
    }

    #[test]
    fn idempotence_off_or_weak_acks_are_refused_naming_the_setting() {
        for (key, value) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("acks", "0"),
            ("request.required.acks", "1"),
        ] {
            let err = producer_config(&with(key, value), &RelayConfig::default()).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("enable.idempotence=true and acks=all"),
                "{text}"
            );
            assert!(text.contains(key), "{text}");
        }
    }

    #[test]
    fn linger_is_zero_unless_the_user_sets_it() {
        let config = producer_config(&with("client.id", "x"), &RelayConfig::default()).unwrap();
        assert_eq!(config.get("linger.ms"), Some(DEFAULT_LINGER_MS));
        let config = producer_config(&with("linger.ms", "20"), &RelayConfig::default()).unwrap();
        assert_eq!(config.get("linger.ms"), Some("20"));
        let config = producer_config(
            &with("queue.buffering.max.ms", "20"),
            &RelayConfig::default(),
        )
        .unwrap();
        assert_eq!(config.get("queue.buffering.max.ms"), Some("20"));
        assert_eq!(config.get("linger.ms"), None, "the alias is not overridden");
    }

    #[tokio::test]
    async fn debug_output_redacts_the_kafka_secrets() {
        let pool = sqlx::PgPool::connect_lazy("postgres://user:db-pw@127.0.0.1:1/none").unwrap();
        let mut kafka = with("bootstrap.servers", "broker:9092");
        kafka
            .set("sasl.password", "pw-1")
            .set("sasl.oauthbearer.config", "principal=me secret=pw-2")
            .set("sasl.oauthbearer.client.secret", "pw-3")
            .set("ssl.key.pem", "-----BEGIN PRIVATE KEY----- pw-4")
            .set("ssl.keystore.password", "pw-5");
        let printed = format!("{:?}", Relay::builder(pool, kafka).batch_size(7));
        for secret in ["pw-1", "pw-2", "pw-3", "pw-4", "pw-5", "db-pw"] {
            assert!(!printed.contains(secret), "{secret} leaked: {printed}");
        }
        for shown in ["broker:9092", "sasl.oauthbearer.config", "batch_size: 7"] {
            assert!(printed.contains(shown), "{shown} missing: {printed}");
        }
    }

    #[test]
    fn forced_settings_are_added_and_others_pass_through() {
        let config =
            producer_config(&with("compression.type", "lz4"), &RelayConfig::default()).unwrap();
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("message.timeout.ms"), Some("30000"));
        assert_eq!(config.get("compression.type"), Some("lz4"));
        for (key, value) in [("acks", "-1"), ("enable.idempotence", "TRUE")] {
            assert!(producer_config(&with(key, value), &RelayConfig::default()).is_ok());
        }
    }
}
