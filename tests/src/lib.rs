//! Shared helpers of the end-to-end and fault-injection tests.
