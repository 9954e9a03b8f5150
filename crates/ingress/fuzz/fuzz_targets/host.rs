//! A `Host` field through `roadkeeper_ingress::host::request_host`, with the checks of
//! `host::check`: no panic, and a routing name that is lowercase, without port, and stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_ingress::host::check(data));
