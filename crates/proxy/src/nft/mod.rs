//! The nftables backend's thin part: the planned ops (`roadkeeper_rules::nft`) sent to the kernel
//! as netlink batches, the kernel's answers, the runner and the proxier keeping state between
//! syncs.

pub mod answer;
pub mod apply;
pub mod netlink;
pub mod proxier;
