//! What every backend's proxier offers the sync loop: the [`Proxier`] trait, the per-sync
//! [`SyncReport`], and helpers shared by the backends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::Error;
use crate::config::ProxyConfig;
use crate::table::{NodeInfo, ServicePort, service_ports};

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

/// What every backend keeps besides its own rules: this node, the service CIDRs, whether the
/// next sync must be full, the Services the kernel refused, the service table, and the time spent
/// in the runner during the current sync.
#[derive(Debug)]
pub struct SyncState {
    /// What the node knows about itself.
    pub(crate) node: NodeInfo,
    /// The service CIDRs.
    pub(crate) service_cidrs: Vec<IpNet>,
    /// The next sync must rewrite everything.
    pub(crate) needs_full: bool,
    /// Services the kernel refused at the last sync: retried with every later sync.
    pub(crate) refused: BTreeSet<NamespacedName>,
    /// The service table, per Service (for display and health checks).
    pub(crate) table: BTreeMap<NamespacedName, Vec<ServicePort>>,
    /// Time spent in the runner during the current sync ([`SyncReport::kernel`]).
    pub(crate) kernel: Stopwatch,
}

impl SyncState {
    /// The state of a proxier that will start with a full sync.
    pub fn new(node: NodeInfo) -> Self {
        SyncState {
            node,
            service_cidrs: Vec::new(),
            needs_full: true,
            refused: BTreeSet::new(),
            table: BTreeMap::new(),
            kernel: Stopwatch::default(),
        }
    }

    /// The service ports this node proxies for Service `key`; none when the Service is absent,
    /// headless, ExternalName or handled by another proxy.
    pub(crate) fn service_ports(&self, key: &NamespacedName, store: &Store, cfg: &ProxyConfig) -> Vec<ServicePort> {
        let Some(svc) = store.service(key) else { return Vec::new() };
        let slices = store.slices_for(key);
        // Every `Skip` reason means nothing to proxy.
        service_ports(key, svc, &slices, &self.node, cfg).unwrap_or_default()
    }

    /// Records the service table entries of one Service (none: it leaves the table).
    pub(crate) fn set_table(&mut self, key: &NamespacedName, ports: Vec<ServicePort>) {
        if ports.is_empty() {
            self.table.remove(key);
        } else {
            self.table.insert(key.clone(), ports);
        }
    }
}

/// Adds up the wall time of the calls it runs: what a backend wraps around its runner's calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stopwatch {
    /// Time spent in timed calls so far.
    pub spent: Duration,
}

impl Stopwatch {
    /// Runs `f`, adding its wall time to [`spent`](Self::spent).
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.spent += start.elapsed();
        out
    }
}

/// A backend's own part of a proxier: planning and applying its rules. Every backend is a
/// [`Proxier`]; the state handling they share (node, service CIDRs, full-sync requests, refused
/// Services, the service table, sync timing) lives in its [`SyncState`].
pub trait Backend: Send {
    /// The shared state.
    fn state(&self) -> &SyncState;
    /// The shared state, to change.
    fn state_mut(&mut self) -> &mut SyncState;
    /// Rewrites everything the backend owns. Runner calls are timed with `state.kernel`.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error>;
    /// Applies only the `changed` Services. Runner calls are timed with `state.kernel`.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error>;
    /// True while the backend's rules are in place ([`Proxier::healthy`]).
    fn rules_in_place(&mut self) -> bool;
}

impl<B: Backend> Proxier for B {
    fn set_node(&mut self, node: NodeInfo) {
        let state = self.state_mut();
        if node != state.node {
            state.node = node;
            state.needs_full = true;
        }
    }

    /// Updates the service CIDRs (unallocated addresses in them are dropped); a change forces a
    /// full sync.
    fn set_service_cidrs(&mut self, cidrs: Vec<IpNet>) {
        let state = self.state_mut();
        if cidrs != state.service_cidrs {
            state.service_cidrs = cidrs;
            state.needs_full = true;
        }
    }

    /// Asks for a full sync at the next [`sync`](Self::sync) (after a failure, or when someone
    /// removed our rules).
    fn force_full_sync(&mut self) {
        self.state_mut().needs_full = true;
    }

    /// A full sync when needed, else a partial sync of `changed` and the Services refused last
    /// time. Any error makes the next sync a full one.
    fn sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let start = Instant::now();
        let state = self.state_mut();
        state.kernel = Stopwatch::default();
        let result = if state.needs_full {
            self.full_sync(store)
        } else {
            let retried: BTreeSet<NamespacedName> = changed.union(&state.refused).cloned().collect();
            self.partial_sync(store, &retried)
        };
        let state = self.state_mut();
        let mut report = result.inspect_err(|_| state.needs_full = true)?;
        state.refused = report.refused.iter().map(|(key, _)| key.clone()).collect();
        report.duration = start.elapsed();
        report.kernel = state.kernel.spent;
        Ok(report)
    }

    /// True when the kernel refused some Service at the last sync (a retry is worth scheduling).
    fn has_refused(&self) -> bool {
        !self.state().refused.is_empty()
    }

    fn healthy(&mut self) -> bool {
        self.rules_in_place()
    }

    fn table(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>> {
        &self.state().table
    }
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

/// Clusters the backends' proxier tests sync.
#[cfg(test)]
pub(crate) mod testing {
    use roadkeeper_cluster::{Object, Store};

    /// Service `name` (ClusterIP 10.96.0.<n>) and its slice with endpoints 10.244.<n>.<1..=eps>
    /// (the first one shifted by `generation`).
    pub(crate) fn service(name: &str, n: u8, eps: u8, generation: u8) -> [Object; 2] {
        let svc = format!(
            "metadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: 10.96.0.{n}, ports: [{{port: 80}}]}}\n"
        );
        let mut slice = format!(
            "metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n"
        );
        for e in 1..=eps {
            let host = if e == 1 { e + generation * 10 } else { e };
            slice.push_str(&format!("- {{addresses: [10.244.{n}.{host}]}}\n"));
        }
        [
            Object::Service(serde_saphyr::from_str(&svc).unwrap()),
            Object::EndpointSlice(serde_saphyr::from_str(&slice).unwrap()),
        ]
    }

    /// Services `svc-1..=size` with 3 endpoints each; svc-1's first endpoint shifted by
    /// `changed_generation`.
    pub(crate) fn cluster(size: u8, changed_generation: u8) -> Store {
        Store::from_objects(
            (1..=size).flat_map(|n| service(&format!("svc-{n}"), n, 3, if n == 1 { changed_generation } else { 0 })),
        )
    }
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
