//! What a client sends through `roadkeeper_ingress::flood::FrameBudget`, with the checks of
//! `flood::check`: no panic, and the same verdict whether the bytes come at once or one by one.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_ingress::flood::check(data));
