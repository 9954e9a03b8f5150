//! What every backend's proxier offers the sync loop: the [`Proxier`] trait, the per-sync
//! [`SyncReport`], and helpers shared by the backends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::Error;
use roadkeeper_rules::claims::FrontendClaims;
use roadkeeper_rules::config::ProxyConfig;
use roadkeeper_rules::plan::plan_ports;
use roadkeeper_rules::table::{NodeInfo, ServicePort};

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
    /// Frontend claims skipped after the sync because an older Service owns the frontend (see
    /// [`roadkeeper_rules::claims`]).
    pub frontend_conflicts: usize,
}

/// What the periodic check of our rules found.
#[derive(Debug)]
pub enum RulesCheck {
    /// Our rules are in place.
    InPlace,
    /// Someone deleted or flushed them: a full resync puts them back.
    Missing,
    /// They could not be read (permission, resources, the xtables lock): nothing is known.
    Unknown(Error),
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
    /// True when the kernel refused some Service at the last sync or the backend has work left:
    /// a sync is worth running at the next `syncPeriod` even without changes.
    fn wants_retry(&self) -> bool;
    /// Whether our rules are in place (nobody deleted or flushed them), or whether that cannot
    /// be told.
    fn check_rules(&mut self) -> RulesCheck;
    /// The current service table.
    fn table(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>>;
    /// Deletes the UDP/SCTP flows that still pin a client to an endpoint that no longer serves
    /// its frontend (NodePorts on `node_ips`); how many. Run after each sync.
    fn cleanup_stale_flows(&mut self, node_ips: &[IpAddr]) -> Result<u64, Error>;
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
    /// Who owns each frontend several Services claim.
    pub(crate) claims: FrontendClaims,
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
            claims: FrontendClaims::default(),
            kernel: Stopwatch::default(),
        }
    }

    /// The service ports of the Services `keys` and of those whose frontends changed owner
    /// because of them ([`plan_ports`]), updating the frontend claims; each conflict is logged.
    pub(crate) fn plan_ports<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a NamespacedName>,
        store: &Store,
        cfg: &ProxyConfig,
    ) -> BTreeMap<NamespacedName, Vec<ServicePort>> {
        let planned = plan_ports(&mut self.claims, keys, store, &self.node, cfg);
        for conflict in &planned.conflicts {
            tracing::warn!(
                frontend = %conflict.frontend,
                owner = %conflict.owner,
                skipped = %conflict.skipped,
                "frontend conflict: {conflict}"
            );
        }
        planned.ports
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
    /// True while the backend's rules are in place, an error when they cannot be read
    /// ([`Proxier::check_rules`]).
    fn rules_in_place(&mut self) -> Result<bool, Error>;
    /// True when a later sync has work left even without changes (IPVS: drained real servers
    /// waiting for their connections to end).
    fn has_pending_work(&self) -> bool {
        false
    }
    /// [`Proxier::cleanup_stale_flows`]: the rules translate through conntrack, so its entries
    /// are the flows.
    fn cleanup_stale_flows(&mut self, node_ips: &[IpAddr]) -> Result<u64, Error> {
        crate::conntrack::cleanup_stale_flows(&self.state().table, node_ips)
    }
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
        report.frontend_conflicts = state.claims.conflicts();
        report.duration = start.elapsed();
        report.kernel = state.kernel.spent;
        Ok(report)
    }

    /// True when the kernel refused some Service at the last sync, or the backend has work left
    /// (a retry is worth scheduling).
    fn wants_retry(&self) -> bool {
        !self.state().refused.is_empty() || self.has_pending_work()
    }

    fn check_rules(&mut self) -> RulesCheck {
        match self.rules_in_place() {
            Ok(true) => RulesCheck::InPlace,
            Ok(false) => RulesCheck::Missing,
            Err(err) => RulesCheck::Unknown(err),
        }
    }

    fn table(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>> {
        &self.state().table
    }

    fn cleanup_stale_flows(&mut self, node_ips: &[IpAddr]) -> Result<u64, Error> {
        Backend::cleanup_stale_flows(self, node_ips)
    }
}

/// Finds the items the kernel refuses, each with its refusal: alone, or together with items
/// before it (two Services claiming the same map element refuse only together). `check` tries a
/// subset. The first item whose addition to a known-good prefix fails is blamed and left out,
/// then the search goes on in the rest: O(bad · log n) checks. Nothing is blamed when the empty
/// subset already fails (the layout itself is refused).
pub(crate) fn bisect<T: Clone, E>(items: &[T], check: &mut dyn FnMut(&[T]) -> Result<(), E>) -> Vec<(T, E)> {
    let mut bad = Vec::new();
    if check(&[]).is_err() {
        return bad;
    }
    // `accepted` passes; `accepted + rest` is what is left to try.
    let mut accepted: Vec<T> = Vec::new();
    let mut rest = items;
    let with = |accepted: &[T], prefix: &[T]| -> Vec<T> { accepted.iter().chain(prefix).cloned().collect() };
    loop {
        let Err(mut failure) = check(&with(&accepted, rest)) else { return bad };
        // The shortest prefix of `rest` that fails on top of `accepted`: `lo` passes, `hi` fails.
        let (mut lo, mut hi) = (0, rest.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match check(&with(&accepted, &rest[..mid])) {
                Ok(()) => lo = mid,
                Err(err) => (hi, failure) = (mid, err),
            }
        }
        bad.push((rest[hi - 1].clone(), failure));
        accepted.extend_from_slice(&rest[..hi - 1]);
        rest = &rest[hi..];
    }
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
            if s.contains(&5) || s.contains(&30) { Err(()) } else { Ok(()) }
        });
        assert_eq!(bad.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![5, 30]);
        assert!(calls < 30, "{calls}");
    }

    #[test]
    fn bisect_blames_the_later_of_two_items_refused_only_together() {
        let items: Vec<u32> = (0..40).collect();
        let bad = bisect(&items, &mut |s| {
            let clash = s.contains(&3) && s.contains(&27);
            if clash {
                Err("3 and 27")
            } else if s.contains(&33) {
                Err("33 alone")
            } else {
                Ok(())
            }
        });
        assert_eq!(bad, vec![(27, "3 and 27"), (33, "33 alone")]);
        assert!(bisect(&items, &mut |_: &[u32]| Err::<(), _>(())).is_empty(), "a refused layout blames nobody");
    }
}
