//! roadkeeper's node proxy: from Services and EndpointSlices to kernel rules.
//!
//! The pure core: [`table`] computes the node's service table; [`nft`] and [`iptables`] plan each
//! backend's rules from it; [`conntrack`] decides which UDP/SCTP flows went stale. The thin shell:
//! the backends' runners (nft, netlink, iptables-restore), [`proxier`] (the trait the sync loop
//! drives), [`node`] (this node's identity), [`health`] (what `/healthz` reports).

pub mod config;
pub mod conntrack;
pub mod hash;
pub mod health;
pub mod iptables;
mod netlink_socket;
pub mod nft;
pub mod node;
pub mod proxier;
pub mod table;
mod tool;

/// Errors of the proxy crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration (flag or file), naming the field.
    #[error("config: {0}")]
    Config(String),
    /// nft refused a command; the text is nft's own error output.
    #[error("nft: {0}")]
    Nft(String),
    /// iptables-restore (or another iptables tool) failed; the text is its own error output.
    #[error("iptables: {0}")]
    Iptables(String),
    /// Listing or deleting conntrack entries over netlink failed.
    #[error("conntrack: {0}")]
    Conntrack(String),
}
