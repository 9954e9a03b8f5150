//! Network test lab for roadkeeper: throwaway network-namespace hosts wired up
//! like a Kubernetes node ([`Lab`]) or a whole multi-node cluster network ([`cluster`]), an echo
//! server, a small static web server ([`web`]), TCP/UDP probes, and a node's own cgroup and
//! bpffs for eBPF mode ([`cgroup`]).
//!
//! Everything here needs root (CAP_NET_ADMIN / CAP_SYS_ADMIN) and `ip` (iproute2).

pub mod addressing;
pub mod cgroup;
pub mod cluster;
mod cmd;
pub mod echo;
pub mod manifests;
pub mod netns;
mod pktinfo;
pub mod probe;
pub mod reply;
pub mod topology;
pub mod web;

pub use echo::EchoServer;
pub use netns::{Netns, Process};
pub use probe::ProbeResult;
pub use reply::Reply;
pub use topology::{Lab, Pod};
