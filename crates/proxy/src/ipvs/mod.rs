//! IPVS mode's kernel side, the thin part: [`proxier`] (the backend the sync loop drives) and
//! [`runner`] (modules, IPVS, `kube-ipvs0`, the helper tables, cleanup) over the layers below;
//! [`elements`] encodes the helper tables' elements for nf_tables netlink.
//!
//! [`message`] encodes the generic-netlink messages of the kernel's `IPVS` family for the
//! operations `roadkeeper_rules::ipvs` plans. Our own encoding, on the framing helpers the
//! nf_tables and ctnetlink clients share, rather than a crate: `netlink-packet-generic` and
//! `netlink-packet-core` give only the generic framing, which we already have, and the one IPVS
//! message crate (`netlink-packet-ipvs` 0.0.1) is an early release with no users to speak of; the
//! IPVS messages are a dozen attributes, pinned down here byte for byte by tests.
//!
//! [`kernel`] sends them ([`kernel::IpvsKernel`]) and lists the virtual and real servers the
//! kernel holds; [`dummy`] keeps `kube-ipvs0` and its addresses over rtnetlink; [`exchange`] is
//! their request/answer layer (bounded, pure parsing) and [`exchange::IpvsError`]. Their kernel
//! tests are ignored on kernels without IPVS and run in the VM (`tests/vm/run.sh --backend ipvs`).
//! `untrusted` (feature `fuzzing`) runs every parser of their answers on any bytes, for the fuzz
//! target `crates/proxy/fuzz`.

pub mod dummy;
pub mod elements;
pub mod exchange;
pub mod kernel;
pub mod message;
pub mod proxier;
pub mod runner;
#[cfg(any(test, feature = "fuzzing"))]
pub mod untrusted;

#[cfg(test)]
mod kernel_tests;
