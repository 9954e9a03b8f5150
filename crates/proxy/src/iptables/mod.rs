//! The iptables backend's thin part: the runner of the iptables tools ([`restore`]) and the
//! proxier keeping state between syncs ([`proxier`]); the planning is
//! `roadkeeper_rules::iptables::plan`.

pub mod proxier;
pub mod restore;

pub use proxier::IptablesProxier;
pub use restore::{IptablesBinary, IptablesRunner, Recorder, cleanup};

#[cfg(test)]
mod kernel_tests;
