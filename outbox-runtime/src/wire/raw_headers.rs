//! A record's headers as the bytes the producer sent.
//!
//! rdkafka's `Headers::get` and `try_get` turn a header's name into `&str`
//! with `to_str().unwrap()`: a foreign producer that sends a name that is
//! not UTF-8 (nothing in Kafka's protocol forbids it) makes every consumer
//! that iterates the headers panic, and every member that takes the
//! partition over dies the same way. This module reads names and values
//! through librdkafka's C accessor instead, as bytes; deciding what is text
//! is the caller's business. It is the crate's only `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, Headers, OwnedHeaders};

/// One header: its name (without librdkafka's terminating NUL; a name with
/// a NUL inside is cut there, as librdkafka stores names as C strings) and
/// its value, `None` for a null value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawHeader<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) value: Option<&'a [u8]>,
}

/// Every header of `headers`, in order.
pub(crate) fn raw_headers(headers: &OwnedHeaders) -> Vec<RawHeader<'_>> {
    borrowed_headers(headers.as_borrowed())
}

fn borrowed_headers(headers: &BorrowedHeaders) -> Vec<RawHeader<'_>> {
    (0..headers.count())
        .filter_map(|index| header_at(headers, index))
        .collect()
}

/// Every header of `headers` as (name, value) bytes, in order, without the
/// panic of rdkafka's accessors on a name that is not UTF-8: for tests that
/// read back what a foreign producer sent. Not a public API.
#[cfg(feature = "test-hooks")]
pub fn headers_as_bytes(headers: &BorrowedHeaders) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    borrowed_headers(headers)
        .into_iter()
        .map(|h| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
        .collect()
}

fn header_at(headers: &BorrowedHeaders, index: usize) -> Option<RawHeader<'_>> {
    // `BorrowedHeaders` is rdkafka's zero-sized stand-in for librdkafka's
    // `rd_kafka_headers_t`: a reference to it is the native pointer (rdkafka
    // converts it back the same way for its own calls).
    let native = std::ptr::from_ref(headers).cast::<rd::rd_kafka_headers_t>();
    let mut name: *const c_char = std::ptr::null();
    let mut value: *const c_void = std::ptr::null();
    let mut size: usize = 0;
    // SAFETY: `native` is a live header list for the lifetime of `headers`;
    // librdkafka writes the three out-pointers and checks `index` itself.
    let error =
        unsafe { rd::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size) };
    if error != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
        return None;
    }
    // SAFETY: librdkafka stores each name NUL-terminated and each value as
    // `size` bytes, owned by the header list, which `headers` borrows.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    let value =
        (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
    Some(RawHeader { name, value })
}

/// Headers with any bytes as names and values, which rdkafka's
/// `OwnedHeaders::insert` (names as `&str`) cannot build: for tests that
/// play a foreign producer. Not a public API.
#[cfg(feature = "test-hooks")]
pub fn headers_from_bytes(headers: &[(&[u8], Option<&[u8]>)]) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len());
    let native = std::ptr::from_ref(owned.as_borrowed())
        .cast::<rd::rd_kafka_headers_t>()
        .cast_mut();
    for (name, value) in headers {
        let (value_ptr, value_len) = match value {
            Some(value) => (value.as_ptr().cast::<c_void>(), value.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `native` is the list `owned` owns and nobody else reads
        // yet; librdkafka copies `name` and `value` (with their lengths).
        let error = unsafe {
            rd::rd_kafka_header_add(
                native,
                name.as_ptr().cast::<c_char>(),
                name.len() as isize,
                value_ptr,
                value_len,
            )
        };
        assert_eq!(
            error,
            rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
            "a new header list is writable"
        );
    }
    owned
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Header;

    use super::*;

    #[test]
    fn names_and_values_are_read_as_bytes() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "event_type",
                value: Some("Paid"),
            })
            .insert(Header {
                key: "empty",
                value: None::<&[u8]>,
            });
        assert_eq!(
            raw_headers(&headers),
            [
                RawHeader {
                    name: b"event_type",
                    value: Some(b"Paid")
                },
                RawHeader {
                    name: b"empty",
                    value: None
                },
            ]
        );
    }
}
