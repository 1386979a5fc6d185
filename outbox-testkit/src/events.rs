//! Test events, declared with `#[derive(DomainEvent)]` in the crate that uses
//! them (each test binary names its own topics).

/// Declares `pub struct $name { event_id, order_id, amount }`, an event of
/// aggregate `Order` on topic `$topic` with event type `$event_type`, keyed
/// by `order_id` (`#[derive(DomainEvent)]`), and `$name::new(amount)` with
/// fresh random ids.
///
/// The calling crate needs `txoutbox-core`, `serde` and `schemars` (with
/// `uuid1`) as (dev-)dependencies: the derives name them.
///
/// ```
/// use txoutbox_core::DomainEvent;
///
/// txoutbox_testkit::test_event!(Paid, "testkit.paid", "Paid");
///
/// let paid = Paid::new(5);
/// assert_eq!(<Paid as DomainEvent>::TOPIC, "testkit.paid");
/// assert_eq!(<Paid as DomainEvent>::PARTITION_KEY_FIELD, "order_id");
/// assert_eq!(paid.partition_key(), paid.order_id.to_string());
/// assert_eq!(paid.event_id(), paid.event_id);
/// ```
#[macro_export]
macro_rules! test_event {
    // `tt`, not `literal`: a `literal` fragment reaches the derive wrapped in
    // an invisible group, which its attribute parser does not look into.
    ($name:ident, $topic:tt, $event_type:tt) => {
        #[derive(
            Debug,
            Clone,
            ::serde::Serialize,
            ::serde::Deserialize,
            ::schemars::JsonSchema,
            ::txoutbox_core::DomainEvent,
        )]
        #[event(topic = $topic, event_type = $event_type, aggregate = "Order")]
        pub struct $name {
            pub event_id: $crate::__private::uuid::Uuid,
            #[partition_key]
            pub order_id: $crate::__private::uuid::Uuid,
            pub amount: i64,
        }

        impl $name {
            /// An event of `amount` with a fresh event id and order id.
            pub fn new(amount: i64) -> Self {
                Self {
                    event_id: $crate::__private::uuid::Uuid::new_v4(),
                    order_id: $crate::__private::uuid::Uuid::new_v4(),
                    amount,
                }
            }
        }
    };
}
