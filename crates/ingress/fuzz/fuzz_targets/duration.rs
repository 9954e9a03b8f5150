//! A Gateway API duration (`timeouts.request`) through `gateway::duration::parse`, with the checks
//! of `gateway::duration::check`: no panic, accepted inputs within the grammar's bounds, and the
//! canonical form read back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_ingress::gateway::duration::check(data));
