//! The `#[event_handler]`s linked into this binary: a leaf that the
//! consumer (which runs them) and the topic planner (which derives their
//! dead-letter topics) both read. Not public: generated code registers
//! through `__private::handler_descriptor`, and users read the registry as
//! [`topics::Registered`](crate::topics::Registered).

/// An `#[event_handler]` linked into this binary: which (topic, event type)
/// it handles. Every `#[event_handler]` registers one; see
/// `registered_handlers`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct HandlerDescriptor {
    /// The topic of its event.
    pub topic: &'static str,
    /// Its event type.
    pub event_type: &'static str,
    /// The handler's name.
    pub name: &'static str,
}

impl HandlerDescriptor {
    /// For code `#[event_handler]` generates, through
    /// `txoutbox_runtime::__private::handler_descriptor`.
    pub(crate) const fn new(
        topic: &'static str,
        event_type: &'static str,
        name: &'static str,
    ) -> Self {
        Self {
            topic,
            event_type,
            name,
        }
    }
}

inventory::collect!(HandlerDescriptor);

/// Every `#[event_handler]` linked into this binary, sorted by topic, event
/// type and name: what `txoutbox_runtime::topics` derives the dead-letter
/// topics a service needs from.
pub(crate) fn registered_handlers() -> Vec<&'static HandlerDescriptor> {
    let mut handlers: Vec<_> = inventory::iter::<HandlerDescriptor>.into_iter().collect();
    handlers.sort_by_key(|h| (h.topic, h.event_type, h.name));
    handlers
}
