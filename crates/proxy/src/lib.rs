//! roadkeeper's node proxy: from Services and EndpointSlices to kernel rules.
//!
//! The pure core: [`table`] computes the node's service table; [`nft`] plans nftables objects and
//! scripts from it. The thin shell: [`nft::apply`] runs `nft`, [`proxier`] keeps state between
//! syncs, [`node`] reads this node's identity.

pub mod config;
pub mod hash;
pub mod nft;
pub mod node;
pub mod proxier;
pub mod table;

/// Errors of the proxy crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration (flag or file), naming the field.
    #[error("config: {0}")]
    Config(String),
    /// nft refused a command; the text is nft's own error output.
    #[error("nft: {0}")]
    Nft(String),
}
