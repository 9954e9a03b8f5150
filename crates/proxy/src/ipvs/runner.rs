//! The kernel under IPVS mode: [`KernelRunner`] loads the modules, opens IPVS and `kube-ipvs0`,
//! and serves the [`IpvsRunner`] calls of the proxier: IPVS over generic netlink
//! ([`IpvsKernel`]), addresses over rtnetlink ([`DummyInterface`]), the helper tables with
//! `nft -f` (whole, in a full sync) and their elements over nf_tables netlink (a partial sync:
//! [`super::elements`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use roadkeeper_cluster::NodePortRange;
use roadkeeper_rules::config::IpvsConfig;
use roadkeeper_rules::ipvs::helpers::TABLE;
use roadkeeper_rules::ipvs::plan::{DUMMY_INTERFACE, cleanup_virtual_servers};
use roadkeeper_rules::ipvs::{HelperElement, IpvsOp, IpvsTable, Scheduler, VirtualKey, VirtualServer};
use roadkeeper_rules::nft::objects::family_keyword;
use roadkeeper_rules::table::IpFamily;

use super::dummy::DummyInterface;
use super::elements;
use super::kernel::IpvsKernel;
use super::proxier::{Connections, IpvsRunner};
use crate::Error;
use crate::nft::netlink::Session;
use crate::tool::{self, ToolError};

/// The modules IPVS mode needs, as upstream checks them: IPVS, the schedulers it names, and
/// connection tracking (the helper rules' masquerading).
const MODULES: [&str; 5] = ["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack"];

/// IPVS, `kube-ipvs0` and the helper tables of this network namespace.
#[derive(Debug)]
pub struct KernelRunner {
    ipvs: IpvsKernel,
    dummy: DummyInterface,
    /// The nf_tables socket of the helper tables' element changes.
    helpers: Session,
}

impl KernelRunner {
    /// Loads the modules (those already loaded or built in need nothing), opens IPVS (an error
    /// saying so when the kernel has none), makes or finds `kube-ipvs0` and sets IPVS's
    /// timeouts from `cfg`.
    pub fn open(cfg: &IpvsConfig) -> Result<KernelRunner, Error> {
        load_modules(cfg);
        let mut ipvs = IpvsKernel::open()?;
        let dummy = DummyInterface::ensure(DUMMY_INTERFACE)?;
        ipvs.set_timeouts(cfg.tcp_timeout, cfg.tcp_fin_timeout, cfg.udp_timeout)?;
        Ok(KernelRunner { ipvs, dummy, helpers: Session::default() })
    }
}

/// Loads the modules IPVS mode needs that are not loaded yet (`/sys/module/<name>`; none: no
/// `modprobe` runs, so a proxy container without `SYS_MODULE` or `/lib/modules` is quiet once
/// `proxy --init-only` or the node loaded them). A failure is logged: built-in modules have no
/// entry to load, and [`IpvsKernel::open`] tells whether IPVS is there.
pub fn load_modules(cfg: &IpvsConfig) {
    let scheduler_module = format!("ip_vs_{}", cfg.scheduler);
    let mut modules: Vec<&str> = MODULES.to_vec();
    if !modules.contains(&scheduler_module.as_str()) {
        modules.push(&scheduler_module);
    }
    modules.retain(|m| !std::path::Path::new("/sys/module").join(m).exists());
    if modules.is_empty() {
        return;
    }
    let mut args = vec!["-a"];
    args.extend(&modules);
    match tool::run("modprobe", &args, None) {
        Ok(_) => tracing::info!(?modules, "loaded kernel modules"),
        Err(err) => tracing::warn!(?modules, error = %err.to_string(), "modprobe failed"),
    }
}

impl IpvsRunner for KernelRunner {
    fn read(&mut self, exclude: &[IpNet]) -> Result<IpvsTable, Error> {
        // Someone may have deleted the interface since: find or make it again.
        self.dummy = DummyInterface::ensure(DUMMY_INTERFACE)?;
        let mut table = IpvsTable { addresses: self.dummy.addresses()?, ..IpvsTable::default() };
        for service in self.ipvs.services()? {
            if exclude.iter().any(|cidr| cidr.contains(&service.key.address)) {
                continue;
            }
            let Ok(scheduler) = service.scheduler.parse::<Scheduler>() else {
                // Not one of ours: if we plan this key, adding it sets it to our settings.
                tracing::warn!(service = %service.key, scheduler = service.scheduler, "virtual server with a scheduler we do not use");
                continue;
            };
            let reals: BTreeMap<_, _> =
                self.ipvs.dests(&service.key)?.into_iter().map(|d| (d.real, d.weight)).collect();
            let server = VirtualServer::found(&service.key, scheduler, service.persistence, reals);
            table.virtual_servers.insert(service.key, server);
        }
        Ok(table)
    }

    fn apply(&mut self, ops: &[IpvsOp]) -> Result<(), Error> {
        // The plan binds addresses first and unbinds them last, around the IPVS operations.
        for op in ops {
            if let IpvsOp::BindAddress(address) = op {
                self.dummy.add_address(*address)?;
            }
        }
        self.ipvs.apply(ops)?;
        for op in ops {
            if let IpvsOp::UnbindAddress(address) = op {
                self.dummy.del_address(*address)?;
            }
        }
        Ok(())
    }

    fn connections(&mut self, key: &VirtualKey) -> Result<Vec<Connections>, Error> {
        let dests = self.ipvs.dests(key)?;
        Ok(dests
            .into_iter()
            .map(|d| Connections { real: d.real, active: d.active_connections, inactive: d.inactive_connections })
            .collect())
    }

    fn helpers(&mut self, script: &str) -> Result<(), Error> {
        tool::run("nft", &["-f", "-"], Some(script)).map(drop).map_err(|err| Error::Nft(err.to_string()))
    }

    fn elements(&mut self, added: &[HelperElement], removed: &[HelperElement]) -> Result<(), Error> {
        Ok(self.helpers.apply_elements(&elements::changes(added, removed))?)
    }

    fn in_place(&mut self, addresses: usize) -> Result<bool, Error> {
        // The helper table's last chain (listing it reads no set elements), and every address.
        match tool::run("nft", &["list", "chain", "ip", TABLE, "nat-postrouting"], None) {
            Ok(_) => {}
            Err(ToolError::Failed { .. }) => return Ok(false),
            Err(err) => return Err(Error::Nft(err.to_string())),
        }
        Ok(self.dummy.addresses().is_ok_and(|found| found.len() == addresses))
    }
}

/// `roadkeeper cleanup`'s part of IPVS mode: the helper tables, the virtual servers IPVS mode
/// makes (on `kube-ipvs0`'s addresses, and NodePorts of the default range on `node_addresses`:
/// [`cleanup_virtual_servers`]; other programs' stay) and `kube-ipvs0`. A kernel where IPVS is
/// not loaded has none of ours, and the module is not loaded to find out. Returns how many
/// virtual servers it deleted.
pub fn cleanup(node_addresses: &[IpAddr]) -> Result<usize, Error> {
    let mut script = String::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let ip = family_keyword(family);
        script.push_str(&format!("add table {ip} {TABLE}\ndelete table {ip} {TABLE}\n"));
    }
    tool::run("nft", &["-f", "-"], Some(&script)).map_err(|err| Error::Nft(err.to_string()))?;
    let mut deleted = 0;
    // The kernel's IPVS table of this network namespace exists once ip_vs is loaded.
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        let dummy: BTreeSet<IpAddr> = crate::node::interface_addresses(DUMMY_INTERFACE).into_iter().collect();
        let mut ipvs = IpvsKernel::open()?;
        let found: Vec<VirtualKey> = ipvs.services()?.into_iter().map(|s| s.key).collect();
        let ours = cleanup_virtual_servers(&found, &dummy, node_addresses, NodePortRange::DEFAULT);
        let ops: Vec<IpvsOp> = ours.into_iter().map(|key| IpvsOp::DelService(*key)).collect();
        ipvs.apply(&ops)?;
        deleted = ops.len();
    }
    DummyInterface::delete(DUMMY_INTERFACE)?;
    Ok(deleted)
}
