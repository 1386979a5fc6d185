// A derived event shared by the UI test cases.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, txoutbox_core::DomainEvent)]
#[event(topic = "payments", aggregate = "Payment")]
pub struct Paid {
    #[partition_key]
    pub event_id: uuid::Uuid,
    pub amount: i64,
}

// Not an event: no DomainEvent impl.
#[derive(Debug, serde::Deserialize)]
pub struct NotAnEvent {
    pub amount: i64,
}
