//! The kernel's sock_diag answers (dumps of UDP sockets, acks of `SOCK_DESTROY`) through every
//! parser of `roadkeeper_proxy::ebpf::sockets`: no panic, whatever the bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| roadkeeper_proxy::ebpf::sockets::parse_all(data));
