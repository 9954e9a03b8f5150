//! Allocation of key blocks in the shared `endpoint-select` verdict map.
//!
//! Upstream kube-proxy gives every Service an anonymous `numgen` map; the kernel looks sets up by
//! walking a per-table list, so thousands of anonymous maps make every transaction slower
//! (kubernetes#139513). roadkeeper uses ONE named map instead: each endpoint set owns a block of
//! `BLOCK_SIZE` consecutive keys and its chain does `numgen random mod N offset <block start>`.

use std::collections::{BTreeMap, BTreeSet};

use crate::table::IpFamily;

/// log2 of the keys reserved per endpoint set.
const BLOCK_BITS: u32 = 12;
/// Endpoints per endpoint set that random choice can address; more are truncated with a warning.
pub const BLOCK_SIZE: usize = 1 << BLOCK_BITS;

/// Which block each endpoint-set chain owns; the lowest free block is handed out first so the
/// result is deterministic for a given order of requests.
#[derive(Debug, Default, Clone)]
pub struct SlotAllocator {
    owned: BTreeMap<(IpFamily, String), u32>,
    free: BTreeSet<u32>,
    next: u32,
}

impl SlotAllocator {
    /// The first key of the block owned by `chain`, allocating one if needed.
    pub fn block_start(&mut self, family: IpFamily, chain: &str) -> u32 {
        let key = (family, chain.to_string());
        if let Some(block) = self.owned.get(&key) {
            return block << BLOCK_BITS;
        }
        let block = self.free.pop_first().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.owned.insert(key, block);
        block << BLOCK_BITS
    }

    /// Returns the block of a chain that no longer exists.
    pub fn release(&mut self, family: IpFamily, chain: &str) {
        if let Some(block) = self.owned.remove(&(family, chain.to_string())) {
            self.free.insert(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_stable_and_reused() {
        let mut slots = SlotAllocator::default();
        assert_eq!(slots.block_start(IpFamily::V4, "a"), 0);
        assert_eq!(slots.block_start(IpFamily::V4, "b"), 4096);
        assert_eq!(slots.block_start(IpFamily::V4, "a"), 0);
        slots.release(IpFamily::V4, "a");
        assert_eq!(slots.block_start(IpFamily::V6, "c"), 0);
        assert_eq!(slots.block_start(IpFamily::V4, "d"), 8192);
    }
}
