//! W3C trace context carried across the outbox.
//!
//! An event records the trace context current when it is recorded, in the
//! row's `traceparent` column; the relay sends it as the `traceparent` header
//! and the consumer runs the handler inside it, so a trace crosses the outbox.
//!
//! Where the context comes from:
//!
//! - With the `opentelemetry` feature and a `tracing-opentelemetry` layer
//!   installed, the current `tracing` span's OpenTelemetry context (so the
//!   span of `#[outbox_handler]`, `outbox.unit_of_work`, is the parent of the
//!   relay's `outbox.publish` span, itself the parent of the consumer's
//!   `outbox.handle` span). See [`span_traceparent`] and [`follow_traceparent`].
//! - Otherwise the one set with [`with_traceparent`] for the current task (the
//!   consumer runtime sets it from the incoming header; your HTTP middleware
//!   can set it from the request's). No OpenTelemetry SDK is needed for this.

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

/// The trace context an event recorded now carries: the current `tracing`
/// span's OpenTelemetry context when there is one (feature `opentelemetry`),
/// else the one set with [`with_traceparent`] for the current task.
pub fn current_traceparent() -> Option<String> {
    span_traceparent(&tracing::Span::current())
        .or_else(|| TRACEPARENT.try_with(Clone::clone).ok().flatten())
}

/// The W3C `traceparent` of `span`'s OpenTelemetry context: `Some` only with
/// the `opentelemetry` feature, a `tracing-opentelemetry` layer installed and
/// `span` enabled; `None` otherwise.
pub fn span_traceparent(span: &tracing::Span) -> Option<String> {
    #[cfg(feature = "opentelemetry")]
    {
        otel::traceparent_of(span)
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = span;
        None
    }
}

/// Makes `span` a child of the remote span `traceparent` names (feature
/// `opentelemetry`, with a `tracing-opentelemetry` layer installed): how the
/// relay's publish span continues the trace of the handler that recorded the
/// event, and the consumer's handling span the trace of the publish. Does
/// nothing without the feature, or when `traceparent` is `None` or malformed.
/// Call it before `span` is first entered.
pub fn follow_traceparent(span: &tracing::Span, traceparent: Option<&str>) {
    #[cfg(feature = "opentelemetry")]
    if let Some(traceparent) = traceparent {
        otel::set_remote_parent(span, traceparent);
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = (span, traceparent);
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub(super) fn traceparent_of(span: &tracing::Span) -> Option<String> {
        if span.is_none() {
            return None;
        }
        let context = span.context();
        let otel_span = context.span();
        let span_context = otel_span.span_context();
        span_context.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                span_context.trace_id(),
                span_context.span_id(),
                span_context.trace_flags().to_u8()
            )
        })
    }

    pub(super) fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
        if span.is_none() || !super::is_valid_traceparent(traceparent) {
            return;
        }
        let mut parts = traceparent.split('-').skip(1);
        let (Some(trace_id), Some(span_id), Some(flags)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Ok(trace_id), Ok(span_id), Ok(flags)) = (
            TraceId::from_hex(trace_id),
            SpanId::from_hex(span_id),
            u8::from_str_radix(flags, 16),
        ) else {
            return;
        };
        let remote = SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::new(flags),
            true,
            TraceState::default(),
        );
        let parent = opentelemetry::Context::new().with_remote_span_context(remote);
        let _ = span.set_parent(parent);
    }
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
