//! Command-line parsing helpers: value parsers with clear messages, and
//! one-line reports of bad values.

use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use clap::error::ErrorKind;

/// Parses the command line; a bad value is reported on one line with exit
/// code 2 (clap's default adds a hint paragraph), other clap errors keep
/// clap's own output (usage, help) and exit code.
pub(crate) fn parse<P: clap::Parser>() -> P {
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

/// One year as `humantime` counts it (365.25 days).
const YEAR_SECS: u64 = 31_557_600;

/// The longest age accepted where a duration means "that long ago" (the
/// retention flags, and `--from` / `--to` written as durations): 1000 years.
/// Far beyond any real retention or replay window, and it keeps the resulting
/// time inside both chrono's and PostgreSQL's range (which starts in 4713 BC).
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1000 * YEAR_SECS);
/// [`MAX_AGE`] as the user writes it.
pub(crate) const MAX_AGE_TEXT: &str = "1000y";

/// The longest `--connect-timeout` and `--pause`: one hour.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(3600);
const MAX_WAIT_TEXT: &str = "1h";

/// Years of a time written as RFC 3339 or a date: what RFC 3339 can write,
/// all of it inside PostgreSQL's range.
const YEARS: std::ops::RangeInclusive<i32> = 0..=9999;

const NOT_A_DURATION: &str = "not a duration; write a number and a unit, e.g. 30s, 15m, 12h or 7d";
const NOT_A_TIME: &str =
    "not a time; write RFC 3339 (2026-11-30T09:00:00Z), a date (2026-11-30) or a duration ago (2h)";

/// The accepted range of a duration meaning "that long ago", for messages.
pub(crate) fn age_range() -> String {
    format!("accepted: 0s to {MAX_AGE_TEXT}")
}

fn time_range() -> String {
    format!(
        "out of range; accepted: a time from 0000-01-01 to 9999-12-31, or a duration ago of at most {MAX_AGE_TEXT}"
    )
}

/// A duration such as `30s`, `15m`, `12h`, `7d` or `1h 30m`, of any size.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => "out of range; too large a duration".into(),
        _ => NOT_A_DURATION.into(),
    })
}

/// A duration of at most [`MAX_AGE`], meaning that long before now.
pub(crate) fn age(text: &str) -> Result<Duration, String> {
    at_most(text, MAX_AGE, MAX_AGE_TEXT)
}

/// A timeout or pause of at most [`MAX_WAIT`].
pub(crate) fn wait(text: &str) -> Result<Duration, String> {
    at_most(text, MAX_WAIT, MAX_WAIT_TEXT)
}

fn at_most(text: &str, max: Duration, max_text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(duration) if duration <= max => Ok(duration),
        Ok(_) | Err(humantime::DurationError::NumberOverflow) => {
            Err(format!("out of range; accepted: 0s to {max_text}"))
        }
        Err(_) => Err(NOT_A_DURATION.into()),
    }
}

/// `now - age`; `None` when `age` exceeds [`MAX_AGE`] or the result is not a
/// time chrono can hold.
pub(crate) fn ago(now: DateTime<Utc>, age: Duration) -> Option<DateTime<Utc>> {
    if age > MAX_AGE {
        return None;
    }
    now.checked_sub_signed(chrono::Duration::from_std(age).ok()?)
}

/// A point in time: RFC 3339 (`2026-11-30T09:00:00Z`), a date
/// (`2026-11-30`, midnight UTC) or a duration meaning that long ago (`2h`,
/// at most [`MAX_AGE`]).
pub(crate) fn time_point(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    let absolute = if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        Some(time.with_timezone(&Utc))
    } else if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        Some(
            date.and_hms_opt(0, 0, 0)
                .expect("midnight exists")
                .and_utc(),
        )
    } else {
        None
    };
    if let Some(time) = absolute {
        return Some(time)
            .filter(|time| YEARS.contains(&time.year()))
            .ok_or_else(time_range);
    }
    match humantime::parse_duration(text) {
        Ok(age) => ago(Utc::now(), age).ok_or_else(time_range),
        Err(humantime::DurationError::NumberOverflow) => Err(time_range()),
        Err(_) => Err(NOT_A_TIME.into()),
    }
}

/// A positive count.
pub(crate) fn positive(text: &str) -> Result<i64, String> {
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
        assert_eq!(
            time_point("0000-01-01").unwrap().to_rfc3339(),
            "0000-01-01T00:00:00+00:00"
        );
        assert_eq!(
            time_point("9999-12-31T23:59:59Z").unwrap().to_rfc3339(),
            "9999-12-31T23:59:59+00:00"
        );
        assert_eq!(positive("5"), Ok(5));
        assert!(positive("0").is_err() && positive("x").is_err());
    }

    #[test]
    fn out_of_range_durations_and_times_are_errors_not_panics() {
        assert_eq!(age("1000y").unwrap(), MAX_AGE);
        for text in [
            "1001y",
            "300000y",
            "300000000000y",
            "99999999999999999999999y",
        ] {
            let error = age(text).unwrap_err();
            assert_eq!(error, "out of range; accepted: 0s to 1000y", "{text}");
            let error = time_point(text).unwrap_err();
            assert!(
                error.starts_with("out of range; accepted: a time from 0000-01-01"),
                "{text}: {error}"
            );
        }
        assert_eq!(age("7x").unwrap_err(), NOT_A_DURATION);
        assert_eq!(wait("1h").unwrap(), MAX_WAIT);
        assert_eq!(wait("61m").unwrap_err(), "out of range; accepted: 0s to 1h");
        assert!(
            duration("300000000000y").is_ok(),
            "a threshold may be any size"
        );
        assert!(
            duration("99999999999999999999999y")
                .unwrap_err()
                .contains("out of range")
        );
        for text in ["-5000-01-01", "0000-01-01T00:00:00+01:00"] {
            assert!(
                time_point(text)
                    .unwrap_err()
                    .contains("0000-01-01 to 9999-12-31"),
                "{text}"
            );
        }
        let thousand_years_ago = time_point("1000y").unwrap();
        assert!(thousand_years_ago.year() < Utc::now().year() - 998);
        let now = Utc::now();
        assert_eq!(ago(now, Duration::ZERO), Some(now));
        assert_eq!(ago(now, MAX_AGE + Duration::from_secs(1)), None);
        assert_eq!(ago(DateTime::<Utc>::MIN_UTC, Duration::from_secs(1)), None);
    }
}
