//! A request path through `roadkeeper_ingress::path::normalize`, with the checks of
//! `path::check`: no panic, and a normal form that is normal, stable and decodes as matched.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_ingress::path::check(data));
