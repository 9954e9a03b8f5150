//! The iptables backend, in upstream kube-proxy's layout: pure planning of `iptables-restore`
//! input ([`plan`]), the thin runner of the iptables tools ([`restore`]) and the proxier keeping
//! state between syncs ([`proxier`]).

pub mod plan;
pub mod proxier;
pub mod restore;

pub use proxier::IptablesProxier;
pub use restore::{IptablesBinary, IptablesRunner, Recorder, cleanup};

#[cfg(test)]
mod kernel_tests;
