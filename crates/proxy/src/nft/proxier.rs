//! The nftables proxier: keeps what it last applied per Service, plans changed Services, and
//! applies full or partial syncs as transactions. A transaction the kernel refuses is narrowed
//! down to the offending Services, which keep their last good rules.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::Error;
use crate::config::ProxyConfig;
use crate::nft::apply::{NftRunner, Timed};
use crate::nft::layout::Layout;
use crate::nft::objects::Objects;
use crate::nft::rule::Op;
use crate::nft::service::{PlanContext, plan_service};
use crate::nft::transaction;
use crate::proxier::{Proxier, SyncReport, bisect};
use crate::table::{IpFamily, NodeInfo, ServicePort, Skip, service_ports};

/// Plans and programs one node's nftables rules.
pub struct NftProxier<R: NftRunner> {
    cfg: ProxyConfig,
    node: NodeInfo,
    service_cidrs: Vec<IpNet>,
    runner: Timed<R>,
    /// Objects in the kernel, per Service.
    applied: BTreeMap<NamespacedName, Objects>,
    /// Services the kernel refused at the last sync: retried with every later sync.
    refused: BTreeSet<NamespacedName>,
    /// The service table, per Service (for display and health checks).
    table: BTreeMap<NamespacedName, Vec<ServicePort>>,
    needs_full: bool,
}

impl<R: NftRunner> NftProxier<R> {
    /// A proxier that will start with a full sync.
    pub fn new(cfg: ProxyConfig, node: NodeInfo, runner: R) -> Self {
        NftProxier {
            cfg,
            node,
            service_cidrs: Vec::new(),
            runner: Timed { inner: runner, spent: Duration::ZERO },
            applied: BTreeMap::new(),
            table: BTreeMap::new(),
            refused: BTreeSet::new(),
            needs_full: true,
        }
    }

    /// The runner (for health checks of the kernel state).
    pub fn runner(&mut self) -> &mut R {
        &mut self.runner.inner
    }

    /// The fixed layout of each family's table.
    pub fn layouts(&self) -> Vec<Layout> {
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|family| Layout {
                family,
                cluster_cidrs: self.family_cidrs(family),
                masquerade_mark: self.cfg.masquerade_mark(),
                nodeport_ips: self.node.nodeport_ips(family, &self.cfg),
                nodeport_all_local: self.cfg.nodeport_addresses.covers_all(family),
                service_cidrs: self
                    .service_cidrs
                    .iter()
                    .filter(|c| IpFamily::of(&c.addr()) == family)
                    .copied()
                    .collect(),
            })
            .collect()
    }

    fn family_cidrs(&self, family: IpFamily) -> Vec<IpNet> {
        self.cfg.cluster_cidrs.iter().filter(|c| IpFamily::of(&c.addr()) == family).copied().collect()
    }

    fn context(&self, family: IpFamily) -> PlanContext {
        PlanContext {
            cluster_cidrs: self.family_cidrs(family),
            masquerade_all: self.cfg.masquerade_all,
            node_ips: self.node.primary_ips.iter().filter(|ip| IpFamily::of(ip) == family).copied().collect::<Vec<IpAddr>>(),
        }
    }

    /// Plans one Service (its table entries and nft objects); absent or skipped Services plan
    /// to nothing.
    fn plan(&self, key: &NamespacedName, store: &Store) -> (Vec<ServicePort>, Objects) {
        let Some(svc) = store.service(key) else { return (Vec::new(), Objects::default()) };
        let slices = store.slices_for(key);
        let ports = match service_ports(key, svc, &slices, &self.node, &self.cfg) {
            Ok(ports) => ports,
            Err(Skip::Headless | Skip::ExternalName | Skip::OtherProxy) => Vec::new(),
        };
        let mut objects = Objects::default();
        for family in [IpFamily::V4, IpFamily::V6] {
            let of_family: Vec<ServicePort> = ports.iter().filter(|p| p.family == family).cloned().collect();
            if !of_family.is_empty() {
                let ctx = self.context(family);
                objects.extend(plan_service(&of_family, &ctx));
            }
        }
        (ports, objects)
    }

    /// Rewrites everything we own, the layout and every Service's objects, in one netlink
    /// transaction.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error> {
        let keys: Vec<NamespacedName> = store.services().map(|(k, _)| k.clone()).collect();
        let mut planned: BTreeMap<NamespacedName, (Vec<ServicePort>, Objects)> =
            keys.iter().map(|key| (key.clone(), self.plan(key, store))).collect();
        let existing = self.runner.existing()?;
        let layouts = self.layouts();
        let ops_for = |planned: &BTreeMap<NamespacedName, (Vec<ServicePort>, Objects)>, only: Option<&[NamespacedName]>| {
            let included = |key: &NamespacedName| only.is_none_or(|keys| keys.contains(key));
            let objects = planned.iter().filter(|(k, _)| included(k)).map(|(_, (_, o))| o);
            transaction::full_sync(&layouts, objects, &existing)
        };
        let mut refused = Vec::new();
        let mut ops = ops_for(&planned, None);
        if let Err(err) = self.runner.apply_ops(&ops) {
            tracing::warn!(error = %err, "full sync refused by the kernel; looking for the offending Services");
            let runner = &mut self.runner;
            let bad = bisect(&keys, &mut |subset| runner.check_ops(&ops_for(&planned, Some(subset))).is_ok());
            if bad.is_empty() {
                return Err(err);
            }
            for key in &bad {
                let why = self.runner.check_ops(&ops_for(&planned, Some(std::slice::from_ref(key)))).err();
                let why = why.map(|e| e.to_string()).unwrap_or_else(|| err.to_string());
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
                // Keep the last good objects of a refused Service, if it had any.
                let last_good = self.applied.get(key).cloned().unwrap_or_default();
                planned.insert(key.clone(), (Vec::new(), last_good));
                refused.push((key.clone(), why));
            }
            ops = ops_for(&planned, None);
            self.runner.apply_ops(&ops)?;
        }
        self.needs_full = false;
        self.applied.clear();
        self.table.clear();
        let changed = planned.len();
        for (key, (ports, objects)) in planned {
            if !objects.is_empty() {
                self.applied.insert(key.clone(), objects);
            }
            self.set_table(&key, ports);
        }
        Ok(SyncReport { full: true, services_changed: changed, ops: ops.len(), refused, ..SyncReport::default() })
    }

    /// Applies only the differences of the `changed` Services, as one transaction of ops.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let mut plans: BTreeMap<NamespacedName, (Vec<ServicePort>, Objects, Vec<Op>)> = BTreeMap::new();
        for key in changed {
            let (ports, objects) = self.plan(key, store);
            let empty = Objects::default();
            let ops = transaction::partial_sync(self.applied.get(key).unwrap_or(&empty), &objects);
            if ops.is_empty() {
                self.set_table(key, ports);
                continue;
            }
            plans.insert(key.clone(), (ports, objects, ops));
        }
        let join = |keys: &[&NamespacedName]| keys.iter().flat_map(|k| plans[*k].2.iter().cloned()).collect::<Vec<Op>>();
        let keys: Vec<&NamespacedName> = plans.keys().collect();
        let mut ops = join(&keys);
        let mut refused = Vec::new();
        if !ops.is_empty()
            && let Err(err) = self.runner.apply_ops(&ops)
        {
            tracing::warn!(error = %err, "partial sync refused by the kernel; looking for the offending Services");
            let runner = &mut self.runner;
            let bad = bisect(&keys, &mut |subset| runner.check_ops(&join(subset)).is_ok());
            if bad.is_empty() {
                self.needs_full = true;
                return Err(err);
            }
            for key in &bad {
                let why = self.runner.check_ops(&plans[*key].2).err().map(|e| e.to_string()).unwrap_or_else(|| err.to_string());
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
                refused.push(((*key).clone(), why));
            }
            let good: Vec<&NamespacedName> = keys.iter().filter(|k| !bad.contains(k)).copied().collect();
            ops = join(&good);
            if !ops.is_empty() {
                self.runner.apply_ops(&ops).inspect_err(|_| self.needs_full = true)?;
            }
        }
        let refused_keys: BTreeSet<NamespacedName> = refused.iter().map(|(k, _)| k.clone()).collect();
        let mut services_changed = 0;
        for (key, (ports, objects, _)) in plans {
            if refused_keys.contains(&key) {
                continue;
            }
            services_changed += 1;
            if objects.is_empty() { self.applied.remove(&key) } else { self.applied.insert(key.clone(), objects) };
            self.set_table(&key, ports);
        }
        Ok(SyncReport { full: false, services_changed, ops: ops.len(), refused, ..SyncReport::default() })
    }

    /// Records the service table entries of one Service.
    fn set_table(&mut self, key: &NamespacedName, ports: Vec<ServicePort>) {
        if ports.is_empty() {
            self.table.remove(key);
        } else {
            self.table.insert(key.clone(), ports);
        }
    }
}

impl<R: NftRunner> Proxier for NftProxier<R> {
    /// Updates what the node knows about itself; a change forces a full sync.
    fn set_node(&mut self, node: NodeInfo) {
        if node != self.node {
            self.node = node;
            self.needs_full = true;
        }
    }

    /// Updates the service CIDRs; a change forces a full sync.
    fn set_service_cidrs(&mut self, cidrs: Vec<IpNet>) {
        if cidrs != self.service_cidrs {
            self.service_cidrs = cidrs;
            self.needs_full = true;
        }
    }

    /// Asks for a full sync at the next [`sync`](Self::sync) (after a failure, or when someone
    /// removed our table).
    fn force_full_sync(&mut self) {
        self.needs_full = true;
    }

    /// Brings the kernel up to date: a full sync when needed, else a partial sync of `changed`.
    fn sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let start = Instant::now();
        self.runner.spent = Duration::ZERO;
        let mut report = if self.needs_full {
            self.full_sync(store)?
        } else {
            let retried: BTreeSet<NamespacedName> = changed.union(&self.refused).cloned().collect();
            self.partial_sync(store, &retried)?
        };
        self.refused = report.refused.iter().map(|(key, _)| key.clone()).collect();
        report.duration = start.elapsed();
        report.kernel = self.runner.spent;
        Ok(report)
    }

    /// True when the kernel refused some Service at the last sync (a retry is worth scheduling).
    fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    /// The current service table.
    fn table(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>> {
        &self.table
    }

    fn healthy(&mut self) -> bool {
        self.runner.inner.healthy().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::Object;

    use super::*;
    use crate::nft::apply::Recorder;
    use crate::nft::transaction::{Existing, script};

    /// Service `name` (ClusterIP 10.96.0.<n>) and its slice with endpoints 10.244.<n>.<1..=eps>
    /// (the first one shifted by `generation`).
    fn service(name: &str, n: u8, eps: u8, generation: u8) -> [Object; 2] {
        let svc = format!("metadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: 10.96.0.{n}, ports: [{{port: 80}}]}}\n");
        let mut slice = format!(
            "metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n"
        );
        for e in 1..=eps {
            let host = if e == 1 { e + generation * 10 } else { e };
            slice.push_str(&format!("- {{addresses: [10.244.{n}.{host}]}}\n"));
        }
        [Object::Service(serde_saphyr::from_str(&svc).unwrap()), Object::EndpointSlice(serde_saphyr::from_str(&slice).unwrap())]
    }

    fn cluster(size: u8, changed_generation: u8) -> Store {
        Store::from_objects((1..=size).flat_map(|n| service(&format!("svc-{n}"), n, 3, if n == 1 { changed_generation } else { 0 })))
    }

    fn proxier<R: NftRunner>(runner: R) -> NftProxier<R> {
        NftProxier::new(ProxyConfig::default(), NodeInfo::default(), runner)
    }

    fn changed(name: &str) -> BTreeSet<NamespacedName> {
        BTreeSet::from([NamespacedName::new("default", name)])
    }

    #[test]
    fn one_change_sends_the_same_ops_whatever_the_cluster_size() {
        let mut ops_per_size = Vec::new();
        for size in [2, 200] {
            let mut p = proxier(Recorder::default());
            p.sync(&cluster(size, 0), &BTreeSet::new()).unwrap();
            let report = p.sync(&cluster(size, 1), &changed("svc-1")).unwrap();
            assert!(!report.full);
            ops_per_size.push(p.runner().scripts.last().unwrap().clone());
        }
        assert_eq!(ops_per_size[0], ops_per_size[1]);
        assert!(ops_per_size[0].lines().all(|l| l.contains("default/svc-1")), "{}", ops_per_size[0]);
    }

    /// Refuses every batch that touches Services whose name contains `poison`.
    #[derive(Default)]
    struct Refuser {
        poison: Option<String>,
        applied: Vec<String>,
    }

    impl Refuser {
        fn judge(&self, ops: &[Op]) -> Result<(), Error> {
            let text = script(ops);
            match &self.poison {
                Some(p) if text.contains(p.as_str()) => Err(Error::Nft(format!("Invalid argument: {p}"))),
                _ => Ok(()),
            }
        }
    }

    impl NftRunner for Refuser {
        fn apply(&mut self, _script: &str) -> Result<(), Error> {
            Ok(())
        }
        fn check(&mut self, _script: &str) -> Result<(), Error> {
            Ok(())
        }
        fn apply_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
            self.judge(ops)?;
            self.applied.push(script(ops));
            Ok(())
        }
        fn check_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
            self.judge(ops)
        }
        fn existing(&mut self) -> Result<Existing, Error> {
            Ok(Existing::default())
        }
        fn healthy(&mut self) -> Result<bool, Error> {
            Ok(true)
        }
    }

    #[test]
    fn a_refused_service_keeps_its_last_good_rules_and_the_others_apply() {
        let before = Store::from_objects(service("good", 1, 2, 0).into_iter().chain(service("bad", 2, 2, 0)));
        let after = Store::from_objects(service("good", 1, 2, 1).into_iter().chain(service("bad", 2, 2, 1)));
        let mut p = proxier(Refuser::default());
        p.sync(&before, &BTreeSet::new()).unwrap();
        let bad_before = p.applied[&NamespacedName::new("default", "bad")].clone();
        p.runner().poison = Some("default/bad".into());
        let both = changed("good").into_iter().chain(changed("bad")).collect();
        let report = p.sync(&after, &both).unwrap();
        assert_eq!(report.refused.len(), 1);
        assert_eq!(report.refused[0].0, NamespacedName::new("default", "bad"));
        assert!(report.refused[0].1.contains("Invalid argument"), "{:?}", report.refused);
        assert_eq!(report.services_changed, 1);
        let last = p.runner().applied.last().unwrap().clone();
        assert!(last.contains("default/good") && !last.contains("default/bad"), "{last}");
        assert_eq!(p.applied[&NamespacedName::new("default", "bad")], bad_before, "last good objects are kept");
        // Once the kernel accepts it again, the next sync retries `bad` without being asked.
        assert!(p.has_refused());
        p.runner().poison = None;
        let report = p.sync(&after, &BTreeSet::new()).unwrap();
        assert_eq!(report.services_changed, 1);
        assert_ne!(p.applied[&NamespacedName::new("default", "bad")], bad_before);
    }

}
