//! roadkeeper's node proxy, the thin part: what `roadkeeper_rules` plans, applied to the kernel.
//!
//! [`nft`] sends the nftables ops as netlink batches and reads the kernel's answers; [`iptables`]
//! runs `iptables-restore`; [`ebpf`] loads eBPF mode's programs and writes their maps; [`ipvs`] programs IPVS over generic netlink and `kube-ipvs0` over
//! rtnetlink; [`conntrack`] dumps and deletes stale flows over ctnetlink;
//! [`proxier`] is the trait the sync loop drives, with the state every backend keeps; [`node`]
//! finds this node's identity; [`health`] is what `/healthz` reports; [`sysctls`] writes
//! kube-proxy's conntrack settings and IPVS mode's.

pub mod conntrack;
pub mod ebpf;
pub mod health;
pub mod iptables;
pub mod ipvs;
mod netlink_socket;
pub mod nft;
pub mod node;
pub mod proxier;
pub mod sysctls;
mod tool;

/// Errors of the proxy crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `nft` tool failed (cleanup, IPVS mode's helper tables); the text is its own error
    /// output.
    #[error("nft: {0}")]
    Nft(String),
    /// nf_tables did not apply a transaction or answer a listing over netlink (in the message,
    /// so not a source as well: printed once).
    #[error("nf_tables: {0}")]
    Netlink(nft::answer::NetlinkError),
    /// iptables-restore refused a line of its input (the rules are at fault); its own error output.
    #[error("iptables: {0}")]
    IptablesRefused(String),
    /// iptables-restore (or another iptables tool) failed for another reason (permission, the
    /// xtables lock, a missing binary); the text is its own error output.
    #[error("iptables: {0}")]
    Iptables(String),
    /// eBPF mode's kernel side failed: `what` names the program, map or file.
    #[error("eBPF: {what}")]
    Ebpf {
        /// What failed.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// eBPF mode cannot run here (a refused program, a missing filesystem); the text says what
    /// and which modes would work.
    #[error("eBPF: {0}")]
    EbpfSetup(String),
    /// Listing or deleting conntrack entries over netlink failed.
    #[error("conntrack: {0}")]
    Conntrack(String),
    /// IPVS mode could not program or read the kernel (IPVS over generic netlink, `kube-ipvs0`
    /// over rtnetlink), or the kernel has no IPVS.
    #[error(transparent)]
    Ipvs(#[from] ipvs::exchange::IpvsError),
}

impl From<nft::answer::NetlinkError> for Error {
    fn from(error: nft::answer::NetlinkError) -> Self {
        Self::Netlink(error)
    }
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
