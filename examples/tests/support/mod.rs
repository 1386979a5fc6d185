//! Helpers of the examples' tests.

pub mod dashboard;
