//! The wire format (`docs/wire-format.md`) in one place, encode and decode:
//! the headers of an outbox row's record (the relay, `outbox replay`), the
//! reading of a record's bytes (the consumer), and the dead-letter record (the
//! consumer's dead-letter path). A leaf: it uses nothing of the relay, the
//! consumer or `ops`. The header names are `txoutbox_core::wire`'s.

pub(crate) mod cloudevents;
pub(crate) mod dead_letter;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod raw_headers;
