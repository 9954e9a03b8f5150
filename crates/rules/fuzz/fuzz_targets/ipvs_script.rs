//! IPVS mode's helper-table scripts (`nft -f` text) through the tracer's parser and model,
//! `roadkeeper_rules::trace::ipvs::check`: no panic; a script is applied whole or refused, and
//! what it leaves traces to paths adding up to probability 1 or to a bounded error.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_rules::trace::ipvs::check(data));
