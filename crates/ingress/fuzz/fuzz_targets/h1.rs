//! Bytes as an HTTP/1 request head, response head and chunked body, through
//! `roadkeeper_ingress::h1::check`: no panic, heads within their bytes, and a chunked body that
//! decodes the same however it is split.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_ingress::h1::check(data));
