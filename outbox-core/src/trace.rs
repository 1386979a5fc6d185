//! W3C trace context carried across the outbox.
//!
//! The framework does not depend on an OpenTelemetry SDK. The trace context an
//! event carries is the one set with [`with_traceparent`] for the current task
//! (the consumer runtime sets it from the incoming `traceparent` header, and you
//! can set it from your HTTP middleware), so a trace crosses the outbox.

use std::future::Future;

tokio::task_local! {
    static TRACEPARENT: Option<String>;
}

/// Runs `future` with `traceparent` as the current trace context.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use txoutbox_core::trace::{current_traceparent, with_traceparent};
/// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned();
/// let seen = with_traceparent(Some(tp.clone()), async { current_traceparent() }).await;
/// assert_eq!(seen, Some(tp));
/// assert_eq!(current_traceparent(), None);
/// # });
/// ```
pub async fn with_traceparent<F: Future>(traceparent: Option<String>, future: F) -> F::Output {
    let traceparent = traceparent.filter(|tp| is_valid_traceparent(tp));
    TRACEPARENT.scope(traceparent, future).await
}

/// The trace context of the current task, if one was set with [`with_traceparent`].
pub fn current_traceparent() -> Option<String> {
    TRACEPARENT.try_with(Clone::clone).ok().flatten()
}

/// Whether `value` is a well-formed W3C `traceparent` (version 00 layout:
/// `vv-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero).
pub fn is_valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_traceparent() {
        assert!(is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"
        ));
        assert!(!is_valid_traceparent(
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent("garbage"));
        assert!(!is_valid_traceparent(
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
    }
}
