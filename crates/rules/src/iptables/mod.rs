//! The iptables backend's planning, in upstream kube-proxy's layout: `iptables-restore` input.

pub mod plan;
pub mod sync;
