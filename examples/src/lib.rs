//! Example system: an orders service and a payments service exchanging events
//! through the outbox, exactly the story of the design seed.

pub mod events;
