//! Command-line parsing helpers: value parsers with clear messages, and
//! one-line reports of bad values.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use clap::error::ErrorKind;

/// Parses the command line; a bad value is reported on one line with exit
/// code 2 (clap's default adds a hint paragraph), other clap errors keep
/// clap's own output (usage, help) and exit code.
pub fn parse<P: clap::Parser>() -> P {
    match P::try_parse() {
        Ok(parsed) => parsed,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ValueValidation | ErrorKind::InvalidValue
            ) =>
        {
            let rendered = e.render().to_string();
            eprintln!(
                "{}",
                rendered.lines().next().unwrap_or("error: invalid value")
            );
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    }
}

/// A duration such as `30s`, `15m`, `12h`, `7d` or `1h 30m`.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|_| {
        "not a duration; write a number and a unit, e.g. 30s, 15m, 12h or 7d".to_owned()
    })
}

/// A point in time: RFC 3339 (`2026-11-30T09:00:00Z`), a date
/// (`2026-11-30`, midnight UTC) or a duration meaning that long ago (`2h`).
pub fn time_point(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc());
    }
    if let Ok(ago) = humantime::parse_duration(text) {
        let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
        return Ok(Utc::now() - ago);
    }
    Err(
        "not a time; write RFC 3339 (2026-11-30T09:00:00Z), a date (2026-11-30) or a duration ago (2h)"
            .into(),
    )
}

/// A positive count.
pub fn positive(text: &str) -> Result<i64, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number greater than 0".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times() {
        assert_eq!(duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(duration("1h 30m").unwrap(), Duration::from_secs(5_400));
        assert!(duration("7x").unwrap_err().contains("e.g. 30s"));
        assert!(duration("").is_err());
        assert_eq!(
            time_point("2026-11-30").unwrap().to_rfc3339(),
            "2026-11-30T00:00:00+00:00"
        );
        assert_eq!(
            time_point("2026-11-30T10:00:00+01:00")
                .unwrap()
                .to_rfc3339(),
            "2026-11-30T09:00:00+00:00"
        );
        let ago = Utc::now() - time_point("2h").unwrap();
        assert!((ago.num_seconds() - 7_200).abs() < 5);
        assert!(time_point("yesterday").is_err());
        assert_eq!(positive("5"), Ok(5));
        assert!(positive("0").is_err() && positive("x").is_err());
    }
}
