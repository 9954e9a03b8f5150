//! The kernel's answers to IPVS mode (acks and dumps of the generic-netlink `IPVS` family,
//! rtnetlink links and addresses) through every parser of `roadkeeper_proxy::ipvs`: no panic,
//! whatever the bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_proxy::ipvs::untrusted::parse_all(data));
