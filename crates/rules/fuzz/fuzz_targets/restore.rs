//! `iptables-restore` input through the tracer's parser and model,
//! `roadkeeper_rules::trace::iptables::check`: no panic, lines render back to themselves, and
//! what restores traces to paths adding up to probability 1 or to a bounded loop error.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_rules::trace::iptables::check(data));
