//! The IPVS proxier: keeps every Service's IPVS plan ([`IpvsState`]) and what the kernel holds
//! ([`IpvsTable`], drained real servers included), and applies full or partial syncs through an
//! [`IpvsRunner`]. A partial sync diffs only the virtual servers and addresses its Services touch
//! (one endpoint change is one real-server operation) and adds or deletes only their helper-set
//! elements; a full sync reads what the kernel holds back and rewrites the helper table whole.
//! Drained real servers (weight 0) are deleted once the kernel counts no connection on them, or
//! after [`DRAIN_BOUND`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use roadkeeper_cluster::{NamespacedName, Store};
use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
use roadkeeper_rules::ipvs::helpers::TABLE;
use roadkeeper_rules::ipvs::{
    HelperElement, HelperRules, IpvsOp, IpvsPlan, IpvsState, IpvsTable, RealServer, Touched, VirtualKey, element_script,
};
use roadkeeper_rules::nft::objects::family_keyword;
use roadkeeper_rules::table::{IpFamily, NodeInfo};

use crate::Error;
use crate::proxier::{Backend, SyncReport, SyncState};

/// How long a drained real server may keep connections before it is deleted anyway: IPVS's own
/// default idle timeout of an established TCP connection, after which IPVS forgets it too.
pub const DRAIN_BOUND: Duration = Duration::from_secs(900);

/// A real server's connections as the kernel counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// The real server.
    pub real: RealServer,
    /// Established connections.
    pub active: u32,
    /// Connections in other states (closing, or UDP flows).
    pub inactive: u32,
}

/// What the IPVS proxier asks of the kernel (the real one: [`super::runner::KernelRunner`]).
pub trait IpvsRunner: Send {
    /// What the kernel holds of ours: the addresses of `kube-ipvs0` and every virtual server
    /// outside `exclude` (`--ipvs-exclude-cidrs`) with its real servers and their weights.
    fn read(&mut self, exclude: &[ipnet::IpNet]) -> Result<IpvsTable, Error>;
    /// Applies IPVS operations and address changes, in order.
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<(), Error>;
    /// The connections of each real server of one virtual server.
    fn connections(&mut self, key: &VirtualKey) -> Result<Vec<Connections>, Error>;
    /// Applies an `nft -f` script to the helper tables (a full sync's whole tables).
    fn helpers(&mut self, script: &str) -> Result<(), Error>;
    /// Deletes `removed` from the helper tables' sets, then adds `added`, atomically (a partial
    /// sync's elements).
    fn elements(&mut self, added: &[HelperElement], removed: &[HelperElement]) -> Result<(), Error>;
    /// True while the helper tables and `kube-ipvs0` with `addresses` addresses are in place.
    fn in_place(&mut self, addresses: usize) -> Result<bool, Error>;
}

/// Plans and programs one node's IPVS mode.
pub struct IpvsProxier<R: IpvsRunner> {
    cfg: ProxyConfig,
    state: SyncState,
    runner: R,
    /// Every Service's plan, and the node-wide view.
    planned: IpvsState,
    /// What the kernel holds (drained real servers included).
    applied: IpvsTable,
    /// Every drained real server of `applied`, and when it was drained: kept from the operations
    /// applied (rebuilt only by a full sync), so that reaping costs O(drained), not O(table).
    drained_since: BTreeMap<(VirtualKey, RealServer), Instant>,
    /// The settings of the helper rules (their elements are `planned`'s).
    helper_settings: HelperRules,
}

impl<R: IpvsRunner> IpvsProxier<R> {
    /// A proxier that will start with a full sync. `cfg.mode` is taken as ipvs (its
    /// NodePort-address defaults apply).
    pub fn new(mut cfg: ProxyConfig, node: NodeInfo, runner: R) -> Self {
        cfg.mode = ProxyMode::Ipvs;
        let helper_settings = HelperRules::new(&cfg);
        IpvsProxier {
            cfg,
            state: SyncState::new(node),
            runner,
            planned: IpvsState::default(),
            applied: IpvsTable::default(),
            drained_since: BTreeMap::new(),
            helper_settings,
        }
    }

    /// The runner.
    pub fn runner(&mut self) -> &mut R {
        &mut self.runner
    }

    /// What the kernel holds, as the proxier knows it.
    pub fn applied(&self) -> &IpvsTable {
        &self.applied
    }

    /// Plans the Services `keys` (and those whose frontends changed owner with them) into
    /// `planned` and the service table; what they touched.
    fn plan<'a>(&mut self, keys: impl IntoIterator<Item = &'a NamespacedName>, store: &Store) -> (Touched, usize) {
        let ports = self.state.plan_ports(keys, store, &self.cfg);
        let mut touched = Touched::default();
        let services = ports.len();
        for (key, ports) in ports {
            let plan = IpvsPlan::new(&self.cfg, &self.state.node, &ports);
            touched.merge(self.planned.set(&key, plan));
            self.state.set_table(&key, ports);
        }
        (touched, services)
    }

    /// Applies `ops` and records them as applied.
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<(), Error> {
        if ops.is_empty() {
            return Ok(());
        }
        self.state.kernel.time(|| self.runner.apply(ops))?;
        self.applied.apply(ops);
        let now = Instant::now();
        for op in ops {
            match op {
                IpvsOp::AddDest(key, real, 0) | IpvsOp::EditDest(key, real, 0) => {
                    self.drained_since.entry((*key, *real)).or_insert(now);
                }
                IpvsOp::AddDest(key, real, _) | IpvsOp::EditDest(key, real, _) | IpvsOp::DelDest(key, real) => {
                    self.drained_since.remove(&(*key, *real));
                }
                IpvsOp::DelService(key) => self.drained_since.retain(|(drained, _), _| drained != key),
                IpvsOp::BindAddress(_)
                | IpvsOp::UnbindAddress(_)
                | IpvsOp::AddService(..)
                | IpvsOp::EditService(..) => {}
            }
        }
        Ok(())
    }

    /// Deletes the drained real servers whose connections are gone or whose bound has passed;
    /// how many it deleted.
    fn reap_drained(&mut self, now: Instant) -> Result<usize, Error> {
        let mut ops = Vec::new();
        let mut counted: BTreeMap<VirtualKey, Vec<Connections>> = BTreeMap::new();
        let drained: Vec<((VirtualKey, RealServer), Instant)> =
            self.drained_since.iter().map(|(k, t)| (*k, *t)).collect();
        for ((key, real), since) in drained {
            let connections = match counted.entry(key) {
                std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    entry.insert(self.state.kernel.time(|| self.runner.connections(&key))?)
                }
            };
            let idle = connections.iter().find(|c| c.real == real).is_none_or(|c| c.active + c.inactive == 0);
            if idle || now.duration_since(since) >= DRAIN_BOUND {
                ops.push(IpvsOp::DelDest(key, real));
            }
        }
        self.apply(&ops)?;
        Ok(ops.len())
    }

    /// The script that replaces both helper tables whole with the planned elements.
    fn helper_tables(&self) -> String {
        let elements: BTreeSet<HelperElement> = self.planned.elements();
        let mut script = String::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let ip = family_keyword(family);
            script.push_str(&format!("add table {ip} {TABLE}\ndelete table {ip} {TABLE}\n"));
            script.push_str(&self.helper_settings.script_with(family, &elements));
        }
        script
    }
}

impl<R: IpvsRunner> Backend for IpvsProxier<R> {
    fn state(&self) -> &SyncState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut SyncState {
        &mut self.state
    }

    /// Plans every Service, reads back what the kernel holds, applies the difference (virtual
    /// servers that are not ours to keep are deleted) and rewrites the helper tables.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error> {
        self.state.claims.clear();
        self.state.table.clear();
        self.planned = IpvsState::default();
        self.helper_settings = HelperRules::new(&self.cfg);
        let keys: Vec<NamespacedName> = store.services().map(|(k, _)| k.clone()).collect();
        let (_, services) = self.plan(&keys, store);
        let found = self.state.kernel.time(|| self.runner.read(&self.cfg.ipvs.exclude_cidrs))?;
        let ops = found.diff(&self.planned.table());
        // What the kernel holds drained now (a restarted proxy's, or ours): drained from now on.
        let now = Instant::now();
        let drained: BTreeMap<_, _> = found
            .drained()
            .map(|(key, real)| {
                let since = self.drained_since.get(&(*key, *real)).copied().unwrap_or(now);
                ((*key, *real), since)
            })
            .collect();
        self.drained_since = drained;
        self.applied = found;
        self.apply(&ops)?;
        let script = self.helper_tables();
        self.state.kernel.time(|| self.runner.helpers(&script))?;
        self.state.needs_full = false;
        let reaped = self.reap_drained(Instant::now())?;
        Ok(SyncReport { full: true, services_changed: services, ops: ops.len() + reaped + 1, ..SyncReport::default() })
    }

    /// Plans the changed Services and applies what they touched.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let (touched, services) = self.plan(changed, store);
        let ops = self.planned.diff(&self.applied, &touched);
        self.apply(&ops)?;
        let changes = !(touched.added.is_empty() && touched.removed.is_empty());
        if changes {
            self.state.kernel.time(|| self.runner.elements(&touched.added, &touched.removed))?;
        }
        let reaped = self.reap_drained(Instant::now())?;
        let helper_ops = usize::from(changes);
        Ok(SyncReport {
            full: false,
            services_changed: services,
            ops: ops.len() + reaped + helper_ops,
            ..SyncReport::default()
        })
    }

    fn rules_in_place(&mut self) -> Result<bool, Error> {
        let addresses = self.applied.addresses.len();
        self.runner.in_place(addresses)
    }

    /// Drained real servers wait for a later sync to be deleted.
    fn has_pending_work(&self) -> bool {
        !self.drained_since.is_empty()
    }
}

/// A runner that records what it is asked and holds the kernel's state as a model: for
/// `roadkeeper rules` and the tests.
#[derive(Debug, Default)]
pub struct Recorder {
    /// The IPVS table the kernel would hold.
    pub table: IpvsTable,
    /// Every batch of operations applied.
    pub batches: Vec<Vec<IpvsOp>>,
    /// Every helper change applied, as `nft -f` text: a full sync's script, a partial sync's
    /// element changes as [`element_script`] writes them.
    pub scripts: Vec<String>,
    /// The connections each real server holds (absent: none).
    pub connections: BTreeMap<(VirtualKey, RealServer), (u32, u32)>,
}

impl IpvsRunner for Recorder {
    fn read(&mut self, exclude: &[ipnet::IpNet]) -> Result<IpvsTable, Error> {
        let mut found = self.table.clone();
        found.virtual_servers.retain(|key, _| !exclude.iter().any(|cidr| cidr.contains(&key.address)));
        Ok(found)
    }

    fn apply(&mut self, ops: &[IpvsOp]) -> Result<(), Error> {
        self.table.apply(ops);
        self.batches.push(ops.to_vec());
        Ok(())
    }

    fn connections(&mut self, key: &VirtualKey) -> Result<Vec<Connections>, Error> {
        let reals = self.table.virtual_servers.get(key).map(|s| s.real_servers.keys().copied().collect::<Vec<_>>());
        Ok(reals
            .unwrap_or_default()
            .into_iter()
            .map(|real| {
                let (active, inactive) = self.connections.get(&(*key, real)).copied().unwrap_or_default();
                Connections { real, active, inactive }
            })
            .collect())
    }

    fn helpers(&mut self, script: &str) -> Result<(), Error> {
        self.scripts.push(script.to_string());
        Ok(())
    }

    fn elements(&mut self, added: &[HelperElement], removed: &[HelperElement]) -> Result<(), Error> {
        self.scripts.push(element_script(added, removed));
        Ok(())
    }

    fn in_place(&mut self, _addresses: usize) -> Result<bool, Error> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::Store;
    use roadkeeper_rules::table::Protocol;

    use super::*;
    use crate::proxier::Proxier;
    use crate::proxier::testing::{cluster, service};

    fn proxier(runner: Recorder) -> IpvsProxier<Recorder> {
        IpvsProxier::new(ProxyConfig::default(), NodeInfo::default(), runner)
    }

    fn changed(name: &str) -> BTreeSet<NamespacedName> {
        BTreeSet::from([NamespacedName::new("default", name)])
    }

    /// svc-1..=3 with 3 endpoints each, svc-1 with `eps`.
    fn store(eps: u8) -> Store {
        Store::from_objects(
            service("svc-1", 1, eps, 0).into_iter().chain((2..=3).flat_map(|n| service(&format!("svc-{n}"), n, 3, 0))),
        )
    }

    fn svc1() -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: "10.96.0.1".parse().unwrap(), port: 80 }
    }

    fn real(host: u8) -> RealServer {
        RealServer { address: format!("10.244.1.{host}").parse().unwrap(), port: 8080 }
    }

    #[test]
    fn a_full_sync_programs_the_plan_and_one_endpoint_change_is_one_operation() {
        let mut p = proxier(Recorder::default());
        let report = p.sync(&store(3), &BTreeSet::new()).unwrap();
        assert!(report.full);
        assert_eq!(p.runner.table.virtual_servers.len(), 3);
        assert_eq!(p.runner.table.addresses.len(), 3);
        assert!(p.runner.scripts[0].starts_with("add table ip roadkeeper-ipvs\ndelete table ip roadkeeper-ipvs\n"));
        assert!(
            p.runner.scripts[0]
                .contains("elements = { 10.96.0.1 . tcp . 80, 10.96.0.2 . tcp . 80, 10.96.0.3 . tcp . 80 }")
        );
        let report = p.sync(&store(4), &changed("svc-1")).unwrap();
        assert!(!report.full);
        assert_eq!(p.runner.batches.last().unwrap(), &[IpvsOp::AddDest(svc1(), real(4), 1)]);
        assert_eq!(
            p.runner.scripts.last().unwrap(),
            "add element ip roadkeeper-ipvs hairpin { 10.244.1.4 . tcp . 8080 . 10.244.1.4 }\n"
        );
        assert_eq!(&p.runner.table, p.applied());
    }

    #[test]
    fn a_deleted_service_leaves_ipvs_kube_ipvs0_and_the_helper_sets() {
        let mut p = proxier(Recorder::default());
        p.sync(&store(3), &BTreeSet::new()).unwrap();
        let two = Store::from_objects((2..=3).flat_map(|n| service(&format!("svc-{n}"), n, 3, 0)));
        p.sync(&two, &changed("svc-1")).unwrap();
        assert_eq!(
            p.runner.batches.last().unwrap(),
            &[IpvsOp::DelService(svc1()), IpvsOp::UnbindAddress("10.96.0.1".parse().unwrap())]
        );
        let script = p.runner.scripts.last().unwrap();
        assert!(script.contains("delete element ip roadkeeper-ipvs cluster-ips { 10.96.0.1 . tcp . 80 }"), "{script}");
        assert!(!script.contains("add element"), "{script}");
    }

    #[test]
    fn a_removed_endpoint_drains_until_its_connections_are_gone() {
        let mut p = proxier(Recorder::default());
        p.sync(&store(3), &BTreeSet::new()).unwrap();
        p.runner.connections.insert((svc1(), real(3)), (1, 0));
        p.sync(&store(2), &changed("svc-1")).unwrap();
        assert_eq!(p.runner.table.virtual_servers[&svc1()].real_servers.get(&real(3)), Some(&0), "drained");
        assert!(p.wants_retry(), "a later sync is wanted");
        p.sync(&store(2), &BTreeSet::new()).unwrap();
        assert_eq!(p.runner.table.virtual_servers[&svc1()].real_servers.get(&real(3)), Some(&0), "still connected");
        p.runner.connections.clear();
        p.sync(&store(2), &BTreeSet::new()).unwrap();
        assert_eq!(p.runner.table.virtual_servers[&svc1()].real_servers.get(&real(3)), None, "deleted once idle");
        assert!(!p.wants_retry());
    }

    #[test]
    fn a_drained_real_server_with_connections_goes_after_the_bound() {
        let mut p = proxier(Recorder::default());
        p.sync(&store(3), &BTreeSet::new()).unwrap();
        p.runner.connections.insert((svc1(), real(3)), (1, 0));
        p.sync(&store(2), &changed("svc-1")).unwrap();
        let start = p.drained_since[&(svc1(), real(3))];
        assert_eq!(p.reap_drained(start + DRAIN_BOUND - Duration::from_secs(1)).unwrap(), 0);
        assert_eq!(p.reap_drained(start + DRAIN_BOUND).unwrap(), 1);
    }

    #[test]
    fn the_drained_set_follows_the_operations_applied() {
        let mut p = proxier(Recorder::default());
        p.sync(&store(3), &BTreeSet::new()).unwrap();
        p.runner.connections.insert((svc1(), real(3)), (1, 0));
        p.sync(&store(2), &changed("svc-1")).unwrap();
        assert_eq!(p.drained_since.keys().collect::<Vec<_>>(), [&(svc1(), real(3))]);
        p.sync(&store(3), &changed("svc-1")).unwrap();
        assert!(p.drained_since.is_empty(), "its endpoint came back: weight 1 again");
        assert!(!p.wants_retry());
        p.sync(&store(2), &changed("svc-1")).unwrap();
        let gone = Store::from_objects((2..=3).flat_map(|n| service(&format!("svc-{n}"), n, 3, 0)));
        p.sync(&gone, &changed("svc-1")).unwrap();
        assert!(p.drained_since.is_empty(), "its virtual server went");
        // A restarted proxy finds the kernel's drained real servers, to reap them later.
        p.sync(&store(3), &changed("svc-1")).unwrap();
        p.sync(&store(2), &changed("svc-1")).unwrap();
        let kernel = std::mem::take(p.runner());
        let mut restarted = proxier(kernel);
        restarted.sync(&store(2), &BTreeSet::new()).unwrap();
        assert_eq!(restarted.drained_since.keys().collect::<Vec<_>>(), [&(svc1(), real(3))]);
        assert_eq!(&restarted.runner.table, restarted.applied());
    }

    #[test]
    fn a_full_sync_after_a_restart_deletes_only_what_is_stale() {
        let mut first = proxier(Recorder::default());
        first.sync(&store(3), &BTreeSet::new()).unwrap();
        let kernel = std::mem::take(first.runner());
        let mut second = proxier(kernel);
        second.sync(&cluster(2, 0), &BTreeSet::new()).unwrap();
        assert_eq!(
            second.runner.batches.last().unwrap(),
            &[
                IpvsOp::DelService(VirtualKey { address: "10.96.0.3".parse().unwrap(), ..svc1() }),
                IpvsOp::UnbindAddress("10.96.0.3".parse().unwrap())
            ]
        );
        let mut cfg = ProxyConfig::default();
        cfg.ipvs.exclude_cidrs = vec!["10.96.0.2/32".parse().unwrap()];
        let kernel = std::mem::take(second.runner());
        let mut third = IpvsProxier::new(cfg, NodeInfo::default(), kernel);
        third.sync(&cluster(1, 0), &BTreeSet::new()).unwrap();
        assert!(third.runner.table.virtual_servers.keys().any(|k| k.address.to_string() == "10.96.0.2"), "excluded");
    }
}
