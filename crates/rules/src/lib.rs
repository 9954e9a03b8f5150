//! What roadkeeper's node proxy programs, computed: pure functions from the cluster state, this
//! node and the config to the rules, with no kernel in sight (applying them is
//! `roadkeeper_proxy`'s job).
//!
//! [`table`] turns a Service and its EndpointSlices into the node's service ports; [`claims`]
//! gives every frontend one owner; [`nft`] and [`iptables`] plan each backend's rules from the
//! table, as typed objects and `nft` syntax, or as `iptables-restore` input; [`ipvs`] plans IPVS
//! mode's virtual servers and helper rules; [`plan`] is the one
//! path from the cluster state to them (a node's whole plan: what a full sync programs);
//! [`conntrack`] decides which UDP/SCTP flows went stale; [`sysctls`] which conntrack sysctls to
//! write; [`text`] keeps names from leaving their place in rule text; [`config`] is kube-proxy's
//! configuration; [`hash`] upstream's chain-name hashes.

pub mod claims;
pub mod config;
pub mod conntrack;
pub mod ebpf;
pub mod hash;
pub mod iptables;
pub mod ipvs;
pub mod nft;
pub mod plan;
pub mod sysctls;
pub mod table;
pub mod text;
pub mod trace;

/// Errors of this crate: a configuration (flag or file) that cannot be used, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration (flag or file), naming the field.
    #[error("config: {0}")]
    Config(String),
}
