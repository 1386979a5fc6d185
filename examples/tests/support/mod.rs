//! Helpers of the examples' tests.

pub(crate) mod dashboard;
