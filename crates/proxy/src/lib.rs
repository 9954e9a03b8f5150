//! roadkeeper's node proxy: from Services and EndpointSlices to kernel rules.
//!
//! The pure core: [`table`] computes the node's service table; [`nft`] and [`iptables`] plan each
//! backend's rules from it; [`conntrack`] decides which UDP/SCTP flows went stale. The thin shell:
//! the backends' runners (nft, netlink, iptables-restore), [`proxier`] (the trait the sync loop
//! drives), [`node`] (this node's identity), [`health`] (what `/healthz` reports).

pub mod claims;
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
pub mod text;
mod tool;

/// Errors of the proxy crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration (flag or file), naming the field.
    #[error("config: {0}")]
    Config(String),
    /// The `nft` tool failed (cleanup); the text is its own error output.
    #[error("nft: {0}")]
    Nft(String),
    /// nf_tables did not apply a transaction or answer a listing over netlink.
    #[error("nf_tables: {0}")]
    Netlink(#[from] nft::answer::NetlinkError),
    /// iptables-restore refused a line of its input (the rules are at fault); its own error output.
    #[error("iptables: {0}")]
    IptablesRefused(String),
    /// iptables-restore (or another iptables tool) failed for another reason (permission, the
    /// xtables lock, a missing binary); the text is its own error output.
    #[error("iptables: {0}")]
    Iptables(String),
    /// Listing or deleting conntrack entries over netlink failed.
    #[error("conntrack: {0}")]
    Conntrack(String),
}

impl Error {
    /// True when the kernel refused rules because of what they hold, so that leaving out the
    /// offending Services can help (the refusal bisection runs only then); false for permission,
    /// resource and transport failures.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::Netlink(err) => err.caused_by_content(),
            Error::IptablesRefused(_) => true,
            _ => false,
        }
    }
}
