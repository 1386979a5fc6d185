//! Printing librdkafka configurations without their secrets.
//!
//! `ClientConfig`'s own `Debug` drops a handful of password keys but prints
//! others in clear (`sasl.oauthbearer.config`, `ssl.key.pem`, the JWT
//! assertion's private key...). Everything of this crate that shows a Kafka
//! configuration goes through [`Redacted`] instead.

use std::fmt;

use rdkafka::ClientConfig;

/// What a redacted value is printed as.
pub(crate) const REDACTED: &str = "[redacted]";

/// librdkafka's properties flagged sensitive (`_RK_SENSITIVE` in its
/// `rdkafka_conf.c`) whose names the patterns of [`is_sensitive`] do not
/// already catch.
const SENSITIVE_KEYS: &[&str] = &[
    "sasl.username",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions",
    "sasl.jaas.config",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.location",
];

/// Name parts that mark a value as a secret, whatever the full key.
const SENSITIVE_PARTS: &[&str] = &["password", "secret", "passphrase", "private.key"];

/// Whether the value of librdkafka setting `key` must not be printed.
pub(crate) fn is_sensitive(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    SENSITIVE_KEYS.contains(&key.as_str()) || SENSITIVE_PARTS.iter().any(|part| key.contains(part))
}

/// `Debug` of a librdkafka configuration with every sensitive value replaced
/// by `[redacted]` (the key stays, so one can see that it is set). Keys are
/// printed in order.
pub(crate) struct Redacted<'a>(pub &'a ClientConfig);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.config_map().into_iter().map(|(key, value)| {
                let shown = if is_sensitive(key) { REDACTED } else { value };
                (key, shown)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_other_settings_shown() {
        let mut config = ClientConfig::new();
        let secrets = [
            ("sasl.password", "pw-1"),
            ("sasl.username", "user-1"),
            ("sasl.oauthbearer.config", "principal=me secret=pw-2"),
            ("sasl.oauthbearer.client.secret", "pw-3"),
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY----- pw-4"),
            ("ssl.key.password", "pw-5"),
            ("ssl.keystore.password", "pw-6"),
            ("sasl.oauthbearer.assertion.private.key.pem", "pw-7"),
            ("sasl.oauthbearer.assertion.private.key.passphrase", "pw-8"),
            ("ssl.truststore.password", "pw-9"),
        ];
        for (key, value) in secrets {
            config.set(key, value);
        }
        config
            .set("bootstrap.servers", "broker:9092")
            .set("security.protocol", "sasl_ssl");
        let printed = format!("{:?}", Redacted(&config));
        for (key, value) in secrets {
            assert!(printed.contains(key), "{key} is listed: {printed}");
            assert!(!printed.contains(value), "{key} leaked: {printed}");
        }
        assert!(printed.contains("broker:9092"), "{printed}");
        assert!(printed.contains("sasl_ssl"), "{printed}");
        assert!(printed.contains(REDACTED), "{printed}");
    }
}
