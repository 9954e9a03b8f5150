//! The eBPF proxier: plans every Service port's frontends ([`EbpfPlan`]), keeps their map
//! layout ([`Layout`]: identifiers and slots kept across syncs, adopted from the kernel at a full
//! sync) and applies the ordered map updates through an [`EbpfRunner`]. A partial sync lays out
//! only the changed Services: one endpoint change is a few map updates at any cluster size.

use std::collections::{BTreeMap, BTreeSet};

use std::net::IpAddr;

use roadkeeper_cluster::{NamespacedName, Store};
use roadkeeper_rules::config::ProxyConfig;
use roadkeeper_rules::conntrack::ServingMap;
use roadkeeper_rules::ebpf::{EbpfPlan, Frontend, FrontendKey, Layout, MapOp, Maps, Refusal};
use roadkeeper_rules::table::ServicePortName;

use crate::Error;
use crate::proxier::{Backend, SyncReport, SyncState};

/// What the eBPF proxier asks of the kernel (the real one: `super::kernel::EbpfKernel`).
pub trait EbpfRunner: Send {
    /// What the maps hold.
    fn read(&mut self) -> Result<Maps, Error>;
    /// Applies map updates, in order.
    fn apply(&mut self, ops: &[MapOp]) -> Result<(), Error>;
    /// True while the programs are attached.
    fn in_place(&mut self) -> Result<bool, Error>;
    /// Attaches the programs again (someone removed them).
    fn repair(&mut self) -> Result<(), Error>;
    /// Deletes the flows of external traffic, and destroys the connected UDP sockets, whose
    /// backend `serving` calls stale; how many.
    fn delete_stale_flows(&mut self, serving: &ServingMap) -> Result<u64, Error>;
}

/// A runner that keeps the maps as a model and records every update: the kernel of the unit
/// tests (the knftables `Fake` pattern).
#[derive(Debug, Default)]
pub struct FakeMaps {
    /// What the maps hold.
    pub maps: Maps,
    /// Every update applied, in order.
    pub applied: Vec<MapOp>,
}

impl EbpfRunner for FakeMaps {
    fn read(&mut self) -> Result<Maps, Error> {
        Ok(self.maps.clone())
    }

    fn apply(&mut self, ops: &[MapOp]) -> Result<(), Error> {
        for op in ops {
            self.maps.apply(op);
        }
        self.applied.extend_from_slice(ops);
        Ok(())
    }

    fn in_place(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    fn repair(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// The model holds no flows nor sockets: they are the kernel programs' own state.
    fn delete_stale_flows(&mut self, _: &ServingMap) -> Result<u64, Error> {
        Ok(0)
    }
}

/// Plans and programs one node's eBPF mode.
pub struct EbpfProxier<R: EbpfRunner> {
    cfg: ProxyConfig,
    state: SyncState,
    runner: R,
    layout: Layout,
    /// The Service ports laid out per Service, so that a port a Service no longer has is removed.
    ports_of: BTreeMap<NamespacedName, BTreeSet<ServicePortName>>,
}

impl<R: EbpfRunner> EbpfProxier<R> {
    /// A proxier that will start with a full sync (adopting what the maps hold), its maps sized
    /// by `cfg.ebpf.limits`.
    pub fn new(cfg: ProxyConfig, node: roadkeeper_rules::table::NodeInfo, runner: R) -> Self {
        EbpfProxier { cfg, state: SyncState::new(node), runner, layout: Layout::default(), ports_of: BTreeMap::new() }
    }

    /// The runner.
    pub fn runner(&mut self) -> &mut R {
        &mut self.runner
    }

    /// What the maps hold, as the proxier laid them out.
    pub fn maps(&self) -> &Maps {
        self.layout.maps()
    }

    /// Plans the Services `keys` (and those whose frontends changed owner with them) and lays
    /// out each of their ports; the updates in order, the refusals, and how many Services.
    fn lay_out<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a NamespacedName>,
        store: &Store,
    ) -> (Vec<MapOp>, Vec<Refusal>, usize) {
        let planned = self.state.plan_ports(keys, store, &self.cfg);
        let services = planned.len();
        let (mut ops, mut refusals) = (Vec::new(), Vec::new());
        for (key, ports) in planned {
            let plan = EbpfPlan::new(&self.cfg, &self.state.node, &ports);
            let mut by_port: BTreeMap<ServicePortName, Vec<(&FrontendKey, &Frontend)>> = BTreeMap::new();
            for (frontend_key, frontend) in &plan.frontends {
                by_port.entry(frontend.service.clone()).or_default().push((frontend_key, frontend));
            }
            let before = self.ports_of.remove(&key).unwrap_or_default();
            for gone in before.iter().filter(|name| !by_port.contains_key(*name)) {
                ops.extend(self.layout.set(gone, &[], &self.cfg.ebpf.limits).expect("removing a port needs no room"));
            }
            for (name, frontends) in &by_port {
                match self.layout.set(name, frontends, &self.cfg.ebpf.limits) {
                    Ok(set) => ops.extend(set),
                    Err(refusal) => refusals.push(refusal),
                }
            }
            if !by_port.is_empty() {
                self.ports_of.insert(key.clone(), by_port.into_keys().collect());
            }
            self.state.set_table(&key, ports);
        }
        (ops, refusals, services)
    }

    /// Applies `ops` through the runner, timed.
    fn apply(&mut self, ops: &[MapOp]) -> Result<(), Error> {
        if ops.is_empty() {
            return Ok(());
        }
        self.state.kernel.time(|| self.runner.apply(ops))
    }

    /// The report of a sync: refusals once per Service, each with the reasons of its ports.
    fn report(full: bool, services: usize, ops: usize, refusals: Vec<Refusal>) -> SyncReport {
        let mut by_service: BTreeMap<NamespacedName, Vec<String>> = BTreeMap::new();
        for refusal in refusals {
            by_service.entry(refusal.service.service.clone()).or_default().push(refusal.to_string());
        }
        let refused = by_service.into_iter().map(|(service, reasons)| (service, reasons.join("; "))).collect();
        SyncReport { full, services_changed: services, ops, refused, ..SyncReport::default() }
    }
}

impl<R: EbpfRunner> Backend for EbpfProxier<R> {
    fn state(&self) -> &SyncState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut SyncState {
        &mut self.state
    }

    /// Attaches the programs again if someone removed them, adopts what the maps hold, lays out
    /// every Service and deletes what none claims.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error> {
        if !self.runner.in_place()? {
            self.runner.repair()?;
        }
        let found = self.state.kernel.time(|| self.runner.read())?;
        self.layout = Layout::adopt(found);
        self.ports_of.clear();
        self.state.claims.clear();
        self.state.table.clear();
        let keys: Vec<NamespacedName> = store.services().map(|(k, _)| k.clone()).collect();
        let (mut ops, refusals, services) = self.lay_out(&keys, store);
        ops.extend(self.layout.sweep());
        self.apply(&ops)?;
        self.state.needs_full = false;
        Ok(Self::report(true, services, ops.len(), refusals))
    }

    /// Lays out the changed Services and applies their updates.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let (ops, refusals, services) = self.lay_out(changed, store);
        self.apply(&ops)?;
        Ok(Self::report(false, services, ops.len(), refusals))
    }

    fn rules_in_place(&mut self) -> Result<bool, Error> {
        self.runner.in_place()
    }

    /// The socket programs translate each `connect()`/`sendmsg()` anew: what can pin a client to
    /// an endpoint is a flow the interface programs hold (external traffic) or a connected UDP
    /// socket.
    fn cleanup_stale_flows(&mut self, node_ips: &[IpAddr]) -> Result<u64, Error> {
        let serving = ServingMap::new(&self.state.table, node_ips);
        if serving.is_empty() {
            return Ok(0);
        }
        self.state.kernel.time(|| self.runner.delete_stale_flows(&serving))
    }
}

#[cfg(test)]
#[path = "proxier_tests.rs"]
mod tests;
