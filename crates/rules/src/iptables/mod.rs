//! The iptables backend's planning, in upstream kube-proxy's layout: `iptables-restore` input
//! (and what `roadkeeper cleanup` removes).

pub mod cleanup;
pub mod plan;
pub mod sync;
