use txoutbox_core::DomainEvent;
use uuid::Uuid;

#[derive(DomainEvent)]
#[event(topic = "order.events", aggregate = "Order")]
union OrderCreated {
    event_id: Uuid,
    order_id: u64,
}

fn main() {}
