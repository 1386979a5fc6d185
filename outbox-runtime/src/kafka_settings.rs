//! librdkafka settings from where operators keep them, by kcat's conventions:
//! a properties file, `KAFKA_`-prefixed environment variables and
//! `key=value` pairs (the command line's `-X`), later sources winning. So a
//! TLS or SASL cluster is reached by every tool and service the same way.
//!
//! ```
//! use txoutbox_runtime::kafka_settings::KafkaSettings;
//!
//! let mut settings = KafkaSettings::new();
//! settings.properties("# the cluster\nbootstrap.servers=kafka:9093\nsecurity.protocol=SASL_SSL\n")?;
//! settings.env([("KAFKA_SASL_MECHANISMS".to_owned(), "SCRAM-SHA-512".to_owned())]);
//! settings.pair("sasl.username=orders")?;
//! let config = settings.client_config();
//! assert_eq!(config.get("bootstrap.servers"), Some("kafka:9093"));
//! assert_eq!(config.get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
//! // Printing never shows a secret.
//! settings.pair("sasl.password=hunter2")?;
//! assert!(!format!("{settings:?}").contains("hunter2"));
//! # Ok::<(), txoutbox_runtime::kafka_settings::SettingsError>(())
//! ```

use std::fmt;

use rdkafka::ClientConfig;

use crate::redact::{REDACTED, Redacted, is_sensitive};

/// Environment variables with the `KAFKA_` prefix that are not librdkafka
/// settings: `KAFKA_BROKERS` is the framework's name for
/// `bootstrap.servers`; `KAFKA_BROKERS_TEST` names the test suite's broker.
const NOT_SETTINGS: &[&str] = &["KAFKA_BROKERS_TEST"];

/// A bad line or pair.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// Not `key=value`.
    #[error("{origin}: expected `key=value`, got `{shown}`")]
    NotAPair {
        /// Where it came from (`-X`, or the file and line).
        origin: String,
        /// The text, with a secret's value hidden.
        shown: String,
    },
}

/// librdkafka settings gathered from several sources, in order (a later one
/// wins). `Debug` hides secrets.
#[derive(Clone, Default)]
pub struct KafkaSettings {
    pairs: Vec<(String, String)>,
}

impl KafkaSettings {
    /// No settings yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the `key=value` lines of a librdkafka properties file (blank
    /// lines and lines starting with `#` are skipped; spaces around key and
    /// value are trimmed).
    pub fn properties(&mut self, text: &str) -> Result<&mut Self, SettingsError> {
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let pair = split(line, &format!("line {}", number + 1))?;
            self.pairs.push(pair);
        }
        Ok(self)
    }

    /// Adds the `KAFKA_`-prefixed variables of `vars` (e.g.
    /// `std::env::vars()`): `KAFKA_SASL_PASSWORD` sets `sasl.password`
    /// (lowercase, `_` for `.`), and `KAFKA_BROKERS` sets
    /// `bootstrap.servers`. `KAFKA_BROKERS_TEST` is left out.
    pub fn env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> &mut Self {
        let mut found: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(name, _)| {
                name.starts_with("KAFKA_") && !NOT_SETTINGS.contains(&name.as_str())
            })
            .map(|(name, value)| {
                let key = match name.as_str() {
                    "KAFKA_BROKERS" => "bootstrap.servers".to_owned(),
                    _ => name["KAFKA_".len()..]
                        .to_ascii_lowercase()
                        .replace('_', "."),
                };
                (key, value)
            })
            .collect();
        // The environment has no order of its own.
        found.sort();
        self.pairs.extend(found);
        self
    }

    /// Adds one `key=value` pair (a command line's `-X key=value`).
    pub fn pair(&mut self, pair: &str) -> Result<&mut Self, SettingsError> {
        let pair = split(pair, "-X")?;
        self.pairs.push(pair);
        Ok(self)
    }

    /// Sets `key` (after everything added so far).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.pairs.push((key.into(), value.into()));
        self
    }

    /// The value `key` ends up with, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The settings as an rdkafka configuration, later sources winning.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.pairs {
            config.set(key, value);
        }
        config
    }

    /// `text` with the value of every secret setting replaced by
    /// `[redacted]`: for error messages that may quote a value (librdkafka's
    /// "invalid value" errors do).
    pub fn redact(&self, text: &str) -> String {
        self.pairs
            .iter()
            .filter(|(key, value)| is_sensitive(key) && !value.is_empty())
            .fold(text.to_owned(), |text, (_, value)| {
                text.replace(value.as_str(), REDACTED)
            })
    }
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KafkaSettings")
            .field(&Redacted(&self.client_config()))
            .finish()
    }
}

fn split(text: &str, origin: &str) -> Result<(String, String), SettingsError> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(SettingsError::NotAPair {
            origin: origin.to_owned(),
            // A malformed secret must not be printed either.
            shown: if is_sensitive(text) {
                REDACTED.to_owned()
            } else {
                text.to_owned()
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_order_later_wins_and_env_names_map_to_keys() {
        let mut settings = KafkaSettings::new();
        settings
            .properties("bootstrap.servers = a:1\n\n# comment\nclient.id=file\n")
            .unwrap();
        settings.env([
            ("KAFKA_BROKERS".to_owned(), "b:2".to_owned()),
            ("KAFKA_BROKERS_TEST".to_owned(), "ignored".to_owned()),
            ("KAFKA_SSL_CA_LOCATION".to_owned(), "/ca.pem".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ]);
        settings.pair("client.id=flag").unwrap();
        assert_eq!(settings.get("bootstrap.servers"), Some("b:2"));
        assert_eq!(settings.get("client.id"), Some("flag"));
        assert_eq!(settings.get("ssl.ca.location"), Some("/ca.pem"));
        assert_eq!(settings.get("brokers.test"), None);
        let config = settings.client_config();
        assert_eq!(config.get("client.id"), Some("flag"));
    }

    #[test]
    fn malformed_input_is_refused_without_printing_secrets() {
        let mut settings = KafkaSettings::new();
        let error = settings.pair("sasl.password").unwrap_err();
        assert!(!error.to_string().contains("sasl.password"), "{error}");
        let error = settings.properties("ok=1\nnot a pair\n").unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        settings.pair("sasl.password=s3cret").unwrap();
        assert!(!format!("{settings:?}").contains("s3cret"));
        assert_eq!(
            settings.redact("invalid value \"s3cret\" for sasl.password"),
            "invalid value \"[redacted]\" for sasl.password"
        );
    }
}
