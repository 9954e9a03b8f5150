//! The nftables backend's planning: the fixed layout of our tables, one Service's objects, and
//! the transactions (full and partial syncs) as typed ops whose `Display` is `nft` syntax.

pub mod layout;
pub mod node;
pub mod objects;
pub mod rule;
pub mod service;
pub mod transaction;
