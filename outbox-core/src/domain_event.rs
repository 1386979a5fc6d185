use uuid::Uuid;

/// A fact that happened in your domain and must reach other services.
///
/// Implement it with `#[derive(DomainEvent)]` (see the attribute reference in
/// `docs/attributes.md`); a hand-written implementation is possible but the
/// derive also checks your declaration at compile time and registers the event
/// for the schema export.
///
/// The JSON payload is the serde serialization of the value; it always carries
/// the event id under `"event_id"` (see `docs/wire-format.md`).
pub trait DomainEvent: serde::Serialize + Send + Sync + 'static {
    /// Kafka topic the event is published to.
    const TOPIC: &'static str;
    /// Name of the event type, sent in the `event_type` header; consumers dispatch on it.
    const EVENT_TYPE: &'static str;
    /// Kind of aggregate the event belongs to (the `aggregate_type` column).
    const AGGREGATE_TYPE: &'static str;
    /// Name of the field (as serialized) that holds the partition key; used in schemas.
    const PARTITION_KEY_FIELD: &'static str;
    /// Headers of the user's own that every record of this type carries
    /// (`#[event(headers("name" = "value", ...))]`), as (name, value).
    /// Default: none. Headers given when an event is recorded
    /// ([`Events::with_headers`](crate::Events::with_headers)) come after
    /// these; see `docs/wire-format.md`, "Headers of your own".
    const HEADERS: &'static [(&'static str, &'static str)] = &[];

    /// Unique id of this event; receivers deduplicate on it.
    fn event_id(&self) -> Uuid;
    /// Id of the aggregate instance the event belongs to (the `aggregate_id` column).
    fn aggregate_id(&self) -> String;
    /// Kafka record key: events with the same key keep their order.
    fn partition_key(&self) -> String;
}

/// A type that can serve as a Kafka partition key (and as an aggregate id).
///
/// Implemented for strings, UUIDs, integers, `char` and `bool`, and references
/// and `Option`-free wrappers of those. Implement it for your own id newtypes:
///
/// ```
/// struct OrderId(u64);
/// impl txoutbox_core::PartitionKey for OrderId {
///     fn to_partition_key(&self) -> String { format!("order-{}", self.0) }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a partition key or aggregate id",
    label = "this field's type has no stable text form for a Kafka key",
    note = "use a String, Uuid or integer field, or implement `txoutbox_core::PartitionKey` for `{Self}`"
)]
pub trait PartitionKey {
    /// The key as text; must be stable across processes and releases.
    fn to_partition_key(&self) -> String;
}

macro_rules! partition_key_via_to_string {
    ($($t:ty),* $(,)?) => {
        $(impl PartitionKey for $t {
            fn to_partition_key(&self) -> String { self.to_string() }
        })*
    };
}

partition_key_via_to_string!(
    String, str, Uuid, char, bool, u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

impl<T: PartitionKey + ?Sized> PartitionKey for &T {
    fn to_partition_key(&self) -> String {
        (**self).to_partition_key()
    }
}

impl<T: PartitionKey + ?Sized> PartitionKey for Box<T> {
    fn to_partition_key(&self) -> String {
        (**self).to_partition_key()
    }
}

impl<T: PartitionKey + ?Sized> PartitionKey for std::sync::Arc<T> {
    fn to_partition_key(&self) -> String {
        (**self).to_partition_key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_plain_text() {
        let id = Uuid::nil();
        assert_eq!(
            id.to_partition_key(),
            "00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(42_u64.to_partition_key(), "42");
        assert_eq!((-7_i32).to_partition_key(), "-7");
        assert_eq!("abc".to_partition_key(), "abc");
        assert_eq!(String::from("x").to_partition_key(), "x");
        assert_eq!(std::sync::Arc::new(5_u8).to_partition_key(), "5");
    }
}
