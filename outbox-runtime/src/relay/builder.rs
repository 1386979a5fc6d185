//! Building a relay: the builder, its setters, and the producer settings the
//! relay forces on the user's librdkafka configuration.

use std::fmt;
use std::time::Duration;

use rdkafka::ClientConfig;
use sqlx::PgPool;

use super::config::{RelayConfig, validate};
use super::error::RelayError;
use super::run::{Relay, RelayHandle};
use crate::redact::Redacted;

impl Relay {
    /// Starts configuring a relay over `pool` (the service's database, with
    /// the outbox migrations applied) publishing through a producer built
    /// from `kafka` (any librdkafka settings: `bootstrap.servers`, TLS, SASL,
    /// compression, linger...). The relay adds `enable.idempotence=true` and
    /// `acks=all`, and sets `message.timeout.ms` from
    /// [`RelayConfig::delivery_timeout`].
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::RelayError> {
    /// let mut kafka = rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "localhost:9092");
    /// let handle = txoutbox_runtime::relay::Relay::builder(pool, kafka).spawn()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: PgPool, kafka: ClientConfig) -> RelayBuilder {
        RelayBuilder::new(pool, kafka)
    }
}

/// Builds and starts a [`Relay`]; created by [`Relay::builder`].
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::relay::RelayError> {
/// use std::time::Duration;
/// use rdkafka::ClientConfig;
///
/// let mut kafka = ClientConfig::new();
/// kafka.set("bootstrap.servers", "localhost:9092").set("compression.type", "lz4");
/// let relay = txoutbox_runtime::relay::Relay::builder(pool, kafka)
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(200))
///     .spawn()?;
/// // ... serve requests ...
/// let summary = relay.shutdown().await?;
/// println!("published {} events", summary.published);
/// # Ok(()) }
/// ```
#[must_use = "a relay builder does nothing until `spawn` is called"]
pub struct RelayBuilder {
    pool: PgPool,
    kafka: ClientConfig,
    config: RelayConfig,
}

/// Shows the tuning and the librdkafka settings, with secrets (passwords,
/// SASL/OAUTHBEARER configuration, private keys) replaced by `[redacted]`.
impl fmt::Debug for RelayBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayBuilder")
            .field("pool", &self.pool)
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
    pub(super) fn new(pool: PgPool, kafka: ClientConfig) -> Self {
        Self {
            pool,
            kafka,
            config: RelayConfig::default(),
        }
    }

    /// Replaces the whole tuning at once.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    setters! {
        /// See [`RelayConfig::batch_size`].
        batch_size: usize;
        /// See [`RelayConfig::poll_interval`].
        poll_interval: Duration;
        /// See [`RelayConfig::schedule_poll_interval`].
        schedule_poll_interval: Duration;
        /// See [`RelayConfig::delivery_timeout`].
        delivery_timeout: Duration;
        /// See [`RelayConfig::partition_stall_timeout`].
        partition_stall_timeout: Duration;
        /// See [`RelayConfig::max_attempts`].
        max_attempts: u32;
        /// See [`RelayConfig::retry_backoff_initial`].
        retry_backoff_initial: Duration;
        /// See [`RelayConfig::retry_backoff_max`].
        retry_backoff_max: Duration;
        /// See [`RelayConfig::error_backoff_initial`].
        error_backoff_initial: Duration;
        /// See [`RelayConfig::error_backoff_max`].
        error_backoff_max: Duration;
        /// See [`RelayConfig::lanes`].
        lanes: u32;
        /// See [`RelayConfig::rebalance_interval`].
        rebalance_interval: Duration;
        /// See [`RelayConfig::metrics_interval`].
        metrics_interval: Duration;
        /// See [`RelayConfig::lease_timeout`].
        lease_timeout: Duration;
        /// See [`RelayConfig::database_timeout`].
        database_timeout: Duration;
        /// See [`RelayConfig::listen_notify`].
        listen_notify: bool;
        /// See [`RelayConfig::shutdown_timeout`].
        shutdown_timeout: Duration;
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
    pub fn build(self) -> Result<Relay, RelayError> {
        validate(&self.config)?;
        let kafka = producer_config(&self.kafka, &self.config)?;
        Relay::new(self.pool, kafka, self.config)
    }

    /// `build()?.spawn()`: validates, creates the producer and starts the
    /// relay as a tokio task. Must be called inside a tokio runtime.
    pub fn spawn(self) -> Result<RelayHandle, RelayError> {
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
) -> Result<ClientConfig, RelayError> {
    let refuse = |setting: &str, value: &str| {
        Err(RelayError::IdempotenceRequired {
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

    #[tokio::test]
    async fn debug_output_redacts_the_kafka_secrets() {
        let pool = PgPool::connect_lazy("postgres://user:db-pw@127.0.0.1:1/none").unwrap();
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
