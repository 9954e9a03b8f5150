//! A URL given to `roadkeeper trace`, through `roadkeeper_road::request::check`: no panic, and a
//! parsed request is well formed and parses again to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_road::request::check(data));
