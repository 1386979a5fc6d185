//! The generated code does not depend on the user's names: local types,
//! traits, modules and macros named like what the expansion uses change
//! nothing. (Only `schemars` is not shadowed: `#[derive(JsonSchema)]` itself
//! resolves `schemars::` relative to the user's scope.)
#![allow(dead_code, unused_macros)]

use serde::Serialize;

struct String;
struct Result;
struct Option;
struct Uuid;
struct Box;
trait PartitionKey {}
trait DomainEvent {}
trait EventIdField {}
mod txoutbox_core {}
mod core {}
mod std {}
mod inventory {}
macro_rules! concat {
    () => {};
}
macro_rules! module_path {
    () => {};
}
macro_rules! unreachable {
    () => {};
}

#[derive(::txoutbox_core::DomainEvent, Serialize, ::schemars::JsonSchema)]
#[event(topic = "hygiene", aggregate = "Hygiene")]
struct Clean {
    event_id: ::uuid::Uuid,
    #[partition_key]
    key: ::std::string::String,
}

fn main() {
    use ::txoutbox_core::DomainEvent as _;
    let clean = Clean {
        event_id: ::uuid::Uuid::nil(),
        key: ::std::string::String::from("k"),
    };
    assert_eq!(clean.partition_key(), "k");
    let registered = ::txoutbox_core::schema::registered_events();
    assert!(registered[0].rust_type.ends_with("::Clean"));
}
