//! What every macro of the crate shares: the error context ([`Errors`]), the
//! entry shape ([`entry`]), the `crate = ".."` override ([`crate_path`]),
//! "did you mean" suggestions ([`suggest`]), case conversion ([`case`]) and
//! respanning ([`respan`]) and reading parameter types ([`types`]).
//!
//! A macro module (`domain_event`, `outbox_handler`, `event_handler`, `saga`)
//! is a pipeline over these: parse the attribute and the item, validate them
//! into a model, expand the model, recording every mistake in one [`Errors`]
//! on the way.

pub(crate) mod args;
pub(crate) mod case;
pub(crate) mod crate_path;
pub(crate) mod entry;
mod errors;
pub(crate) mod respan;
pub(crate) mod suggest;
pub(crate) mod types;

pub(crate) use errors::Errors;
