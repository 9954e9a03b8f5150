//! The nftables backend: pure planning of objects and scripts, plus the thin `nft` runner.

pub mod answer;
pub mod apply;
pub mod layout;
pub mod netlink;
pub mod objects;
pub mod proxier;
pub mod rule;
pub mod service;
pub mod transaction;
