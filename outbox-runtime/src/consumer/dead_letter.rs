//! Setting a message aside: to its dead-letter topic, or, when the broker
//! will not take it, into `consumer_dead_letter` (migration 0009).
//!
//! A dead letter is published with a bounded number of tries. A record the
//! broker can never take (too large for the dead-letter topic even without
//! its value) is parked at once; a dead-letter topic the broker refuses as a
//! whole (missing with auto-creation off, not writable) is parked after its
//! tries, and for a minute afterwards further dead letters for it are parked
//! without trying. Either way the message's offset may then be stored, so a
//! dead-letter topic that cannot be written never holds a partition for
//! longer than the tries take; the receive loop runs this beside its
//! batches, so it never holds any other partition at all.

use rdkafka::Message;
use rdkafka::message::OwnedMessage;

use super::database::ParkedDeadLetter;
use super::dlq::Refusal;
use super::shared::Shared;
use super::summary::Totals;
use super::telemetry as m;
use crate::wire::dead_letter::DeadLetterReason;
use crate::wire::raw_headers::raw_headers;

/// Publish tries before a dead letter is parked.
const PUBLISH_TRIES: u32 = 3;

/// How a dead letter ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// On its dead-letter topic.
    Published,
    /// In `consumer_dead_letter`.
    Parked,
    /// The consumer is shutting down: its offset must stay unstored.
    Interrupted,
}

impl Settled {
    pub(crate) fn finished(self) -> bool {
        self != Self::Interrupted
    }
}

/// Publishes `message` to its dead-letter topic with `reason` and `error`,
/// or parks it; see the module documentation.
pub(crate) async fn dead_letter(
    ctx: &Shared,
    message: &OwnedMessage,
    reason: DeadLetterReason,
    error: &str,
) -> Settled {
    let dlq = ctx.dlq.topic_for(message.topic());
    let mut tries = 0;
    let refused = loop {
        if let Some(why) = ctx.dlq.refused(&dlq) {
            break why;
        }
        let failure = match ctx.dlq.publish(message, reason, error).await {
            Ok(()) => {
                metrics::counter!(m::DEAD_LETTERED, "group" => ctx.group(), "topic" => message.topic().to_owned(), "reason" => reason.as_str())
                    .increment(1);
                Totals::add(&ctx.counts.totals.dead_lettered, 1);
                tracing::warn!(
                    topic = message.topic(),
                    partition = message.partition(),
                    offset = message.offset(),
                    %reason,
                    error,
                    "message dead-lettered"
                );
                return Settled::Published;
            }
            Err(failure) => failure,
        };
        tries += 1;
        let why = failure.to_string();
        match Refusal::of(&failure) {
            Refusal::OfTheRecord => break why,
            Refusal::OfTheTopic => ctx.dlq.note_refusal(&dlq, &why),
            Refusal::Transient => {}
        }
        if tries >= PUBLISH_TRIES {
            break why;
        }
        tracing::warn!(error = %failure, %dlq, tries, "dead-letter publish failed; retrying");
        if !ctx.db.pause(ctx.settings.backoff.delay(tries)).await {
            return Settled::Interrupted;
        }
    };
    park(ctx, message, reason, error, &dlq, &refused).await
}

/// Keeps `message` in `consumer_dead_letter`, retrying while the database
/// does not answer (an outage: the offset waits for it).
async fn park(
    ctx: &Shared,
    message: &OwnedMessage,
    reason: DeadLetterReason,
    error: &str,
    dlq: &str,
    refused: &str,
) -> Settled {
    let headers: Vec<(&[u8], Option<&[u8]>)> = message
        .headers()
        .map(raw_headers)
        .unwrap_or_default()
        .into_iter()
        .map(|h| (h.name, h.value))
        .collect();
    let error = storable_text(error);
    let refused = storable_text(refused);
    let row = ParkedDeadLetter {
        group: &ctx.settings.group_id,
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key(),
        value: message.payload(),
        headers,
        reason: reason.as_str(),
        error: &error,
        dead_letter_topic: dlq,
        publish_error: &refused,
    };
    let mut db_retry = 0;
    while let Err(failure) = ctx.db_unless_stalled(ctx.db.park_dead_letter(&row)).await {
        if !ctx.db.failed(&failure, &mut db_retry).await {
            return Settled::Interrupted;
        }
    }
    metrics::counter!(m::DEAD_LETTERS_PARKED, "group" => ctx.group(), "topic" => message.topic().to_owned(), "reason" => reason.as_str())
        .increment(1);
    Totals::add(&ctx.counts.totals.dead_letters_parked, 1);
    tracing::error!(
        topic = message.topic(),
        partition = message.partition(),
        offset = message.offset(),
        %reason,
        %error,
        %dlq,
        %refused,
        "the dead-letter topic refused the message; kept in consumer_dead_letter"
    );
    Settled::Parked
}

/// `text` as PostgreSQL `text` can hold it (no NUL character).
pub(crate) fn storable_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\\0").into()
    } else {
        text.into()
    }
}
