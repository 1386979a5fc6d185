//! How the tool reaches Kafka: kcat's conventions (see
//! `txoutbox_runtime::kafka_settings`), so TLS and SASL clusters work.

use std::path::PathBuf;

use txoutbox_runtime::kafka_settings::KafkaSettings;

use crate::error::CliError;

/// Kafka connection options. Sources, later winning: `--kafka-config`,
/// `KAFKA_*` environment variables (`KAFKA_BROKERS` is
/// `bootstrap.servers`, `KAFKA_SASL_PASSWORD` is `sasl.password`, ...),
/// `--brokers`, `-X`.
#[derive(Debug, clap::Args)]
pub(crate) struct KafkaArgs {
    /// Kafka bootstrap servers (also `KAFKA_BROKERS`).
    #[arg(long, value_name = "HOST:PORT,...")]
    brokers: Option<String>,
    /// A librdkafka setting, e.g. `-X security.protocol=SASL_SSL`; repeatable.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    kafka_setting: Vec<String>,
    /// A librdkafka properties file: `key=value` lines, `#` comments.
    #[arg(long, value_name = "FILE")]
    kafka_config: Option<PathBuf>,
}

impl KafkaArgs {
    /// The settings from every source; a usage error if no broker is named.
    pub(crate) fn settings(&self) -> Result<KafkaSettings, CliError> {
        self.settings_from(std::env::vars())
    }

    fn settings_from(
        &self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<KafkaSettings, CliError> {
        let mut settings = KafkaSettings::new();
        if let Some(path) = &self.kafka_config {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CliError::Usage(format!(
                    "cannot read --kafka-config {}: {e}",
                    path.display()
                ))
            })?;
            settings
                .properties(&text)
                .map_err(|e| CliError::Usage(format!("--kafka-config {}: {e}", path.display())))?;
        }
        settings.env(env);
        if let Some(brokers) = &self.brokers {
            settings.set("bootstrap.servers", brokers);
        }
        for pair in &self.kafka_setting {
            settings
                .pair(pair)
                .map_err(|e| CliError::Usage(e.to_string()))?;
        }
        if settings.get("bootstrap.servers").is_none_or(str::is_empty) {
            return Err(CliError::Usage(
                "no brokers given: pass --brokers, -X bootstrap.servers=..., --kafka-config, or set KAFKA_BROKERS"
                    .into(),
            ));
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(brokers: Option<&str>, pairs: &[&str]) -> KafkaArgs {
        KafkaArgs {
            brokers: brokers.map(str::to_owned),
            kafka_setting: pairs.iter().map(|p| (*p).to_owned()).collect(),
            kafka_config: None,
        }
    }

    #[test]
    fn flags_win_over_the_environment() {
        let env = [
            ("KAFKA_BROKERS".to_owned(), "env:1".to_owned()),
            ("KAFKA_SECURITY_PROTOCOL".to_owned(), "SSL".to_owned()),
        ];
        let settings = args(Some("flag:2"), &["security.protocol=SASL_SSL"])
            .settings_from(env)
            .unwrap();
        assert_eq!(settings.get("bootstrap.servers"), Some("flag:2"));
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
    }

    #[test]
    fn no_broker_is_a_usage_error() {
        let error = args(None, &[]).settings_from([]).unwrap_err();
        assert!(
            matches!(&error, CliError::Usage(text) if text.contains("no brokers given")),
            "{error:?}"
        );
    }
}
