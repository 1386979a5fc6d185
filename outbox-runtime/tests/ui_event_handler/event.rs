// A hand-written event shared by the UI test cases.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Paid {
    pub event_id: uuid::Uuid,
    pub amount: i64,
}

impl txoutbox_core::DomainEvent for Paid {
    const TOPIC: &'static str = "payments";
    const EVENT_TYPE: &'static str = "Paid";
    const AGGREGATE_TYPE: &'static str = "Payment";
    const PARTITION_KEY_FIELD: &'static str = "event_id";
    fn event_id(&self) -> uuid::Uuid {
        self.event_id
    }
    fn aggregate_id(&self) -> String {
        self.event_id.to_string()
    }
    fn partition_key(&self) -> String {
        self.event_id.to_string()
    }
}

// Not an event: no DomainEvent impl.
#[derive(Debug, serde::Deserialize)]
pub struct NotAnEvent {
    pub amount: i64,
}
