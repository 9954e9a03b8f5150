//! What every backend's proxier offers the sync loop: the [`Proxier`] trait, the per-sync
//! [`SyncReport`], and helpers shared by the backends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ipnet::IpNet;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::Error;
use crate::table::{NodeInfo, ServicePort};

/// What one sync did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    /// A full sync (everything rewritten) rather than a partial one.
    pub full: bool,
    /// Services whose objects changed in the kernel.
    pub services_changed: usize,
    /// Kernel operations sent (script lines or netlink messages).
    pub ops: usize,
    /// Services the kernel refused, with its error; they keep their last good rules.
    pub refused: Vec<(NamespacedName, String)>,
    /// Wall time of the sync.
    pub duration: Duration,
    /// The part of `duration` spent in the kernel and its tools (the rest is roadkeeper's own).
    pub kernel: Duration,
    /// Stale UDP/SCTP conntrack entries deleted after the sync (filled by the sync loop).
    pub conntrack_deleted: u64,
}

/// A node proxy backend: turns the store into kernel rules, fully or for changed Services.
pub trait Proxier: Send {
    /// Updates what the node knows about itself; a change forces a full sync.
    fn set_node(&mut self, node: NodeInfo);
    /// Updates the service CIDRs; a change forces a full sync.
    fn set_service_cidrs(&mut self, cidrs: Vec<IpNet>);
    /// Asks for a full sync at the next [`sync`](Self::sync).
    fn force_full_sync(&mut self);
    /// Brings the kernel up to date: a full sync when needed, else only the `changed` Services
    /// (plus those the kernel refused before).
    fn sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error>;
    /// True when the kernel refused some Service at the last sync.
    fn has_refused(&self) -> bool;
    /// True while our rules are in place (nobody deleted or flushed them).
    fn healthy(&mut self) -> bool;
    /// The current service table.
    fn table(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>>;
}

/// The service CIDRs declared by ServiceCIDR objects.
pub fn service_cidrs(store: &Store) -> Vec<IpNet> {
    let mut cidrs: Vec<IpNet> = store
        .service_cidrs()
        .filter_map(|c| c.spec.as_ref()?.cidrs.clone())
        .flatten()
        .filter_map(|c| c.parse().ok())
        .collect();
    cidrs.sort();
    cidrs.dedup();
    cidrs
}

/// Finds the items whose inclusion makes `ok` fail, by bisection: O(bad * log n) checks.
pub(crate) fn bisect<T: Clone>(items: &[T], ok: &mut dyn FnMut(&[T]) -> bool) -> Vec<T> {
    if items.is_empty() || ok(items) {
        return Vec::new();
    }
    if items.len() == 1 {
        return items.to_vec();
    }
    let (left, right) = items.split_at(items.len() / 2);
    let mut bad = bisect(left, ok);
    bad.extend(bisect(right, ok));
    bad
}

#[cfg(test)]
mod tests {
    use super::bisect;

    #[test]
    fn bisect_finds_each_bad_item() {
        let items: Vec<u32> = (0..37).collect();
        let mut calls = 0;
        let bad = bisect(&items, &mut |s| {
            calls += 1;
            !s.contains(&5) && !s.contains(&30)
        });
        assert_eq!(bad, vec![5, 30]);
        assert!(calls < 30, "{calls}");
    }
}
