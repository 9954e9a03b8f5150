//! The kernel operations from the IPVS table applied to a planned one: what a sync sends, so
//! that one endpoint change is one real-server operation.
//!
//! Graceful termination, as upstream: a real server that leaves the plan of a TCP virtual server
//! is not deleted but set to weight 0 (no new connections, its open ones go on); it stays in the applied table, and the
//! applier deletes it ([`IpvsOp::DelDest`]) once the kernel counts no connections on it or a
//! bound has passed. If its endpoint comes back meanwhile, its weight is restored.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::plan::{IpvsTable, RealServer, VirtualKey, VirtualServer};
use crate::table::Protocol;

/// One kernel operation of IPVS mode (the generic-netlink command, or the address change on
/// `kube-ipvs0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    /// Add an address to `kube-ipvs0`.
    BindAddress(IpAddr),
    /// Remove an address from `kube-ipvs0`.
    UnbindAddress(IpAddr),
    /// `IPVS_CMD_NEW_SERVICE`.
    AddService(VirtualKey, VirtualServer),
    /// `IPVS_CMD_SET_SERVICE`: scheduler or persistence changed.
    EditService(VirtualKey, VirtualServer),
    /// `IPVS_CMD_DEL_SERVICE` (its real servers go with it).
    DelService(VirtualKey),
    /// `IPVS_CMD_NEW_DEST`.
    AddDest(VirtualKey, RealServer, u32),
    /// `IPVS_CMD_SET_DEST`: a new weight (0: drained).
    EditDest(VirtualKey, RealServer, u32),
    /// `IPVS_CMD_DEL_DEST`.
    DelDest(VirtualKey, RealServer),
}

impl IpvsTable {
    /// The operations that take the kernel from `self` (what was applied, drained real servers
    /// included) to `planned`: addresses bound first, services added or edited, real servers
    /// added, reweighted or drained, services deleted, addresses unbound last.
    pub fn diff(&self, planned: &IpvsTable) -> Vec<IpvsOp> {
        let keys: BTreeSet<&VirtualKey> = self.virtual_servers.keys().chain(planned.virtual_servers.keys()).collect();
        let addresses: BTreeSet<&IpAddr> = self.addresses.iter().chain(&planned.addresses).collect();
        self.diff_scoped(
            keys.into_iter().map(|key| (*key, planned.virtual_servers.get(key))),
            addresses.into_iter().map(|address| (*address, planned.addresses.contains(address))),
        )
    }

    /// [`diff`](Self::diff) over some virtual servers and addresses only (those a partial sync
    /// touched), each given with what is planned for it (`None`, `false`: nothing). Costs
    /// O(what is given), whatever the size of the table.
    pub fn diff_scoped<'a>(
        &self,
        servers: impl IntoIterator<Item = (VirtualKey, Option<&'a VirtualServer>)>,
        addresses: impl IntoIterator<Item = (IpAddr, bool)>,
    ) -> Vec<IpvsOp> {
        let (mut bind, mut unbind) = (Vec::new(), Vec::new());
        for (address, planned) in addresses {
            match (self.addresses.contains(&address), planned) {
                (false, true) => bind.push(IpvsOp::BindAddress(address)),
                (true, false) => unbind.push(IpvsOp::UnbindAddress(address)),
                _ => {}
            }
        }
        let (mut ops, mut deleted) = (bind, Vec::new());
        for (key, planned) in servers {
            match (self.virtual_servers.get(&key), planned) {
                (None, Some(server)) => {
                    ops.push(IpvsOp::AddService(key, server.clone()));
                    ops.extend(server.real_servers.iter().map(|(real, weight)| IpvsOp::AddDest(key, *real, *weight)));
                }
                (Some(applied), Some(server)) => server_ops(key, applied, server, &mut ops),
                (Some(_), None) => deleted.push(IpvsOp::DelService(key)),
                (None, None) => {}
            }
        }
        ops.extend(deleted);
        ops.extend(unbind);
        ops
    }

    /// Records `ops` as applied (the kernel accepted them).
    pub fn apply(&mut self, ops: &[IpvsOp]) {
        for op in ops {
            match op {
                IpvsOp::BindAddress(address) => {
                    self.addresses.insert(*address);
                }
                IpvsOp::UnbindAddress(address) => {
                    self.addresses.remove(address);
                }
                IpvsOp::AddService(key, server) => {
                    let server = VirtualServer { real_servers: Default::default(), ..server.clone() };
                    self.virtual_servers.insert(*key, server);
                }
                IpvsOp::EditService(key, server) => {
                    if let Some(applied) = self.virtual_servers.get_mut(key) {
                        applied.scheduler = server.scheduler;
                        applied.persistence = server.persistence;
                    }
                }
                IpvsOp::DelService(key) => {
                    self.virtual_servers.remove(key);
                }
                IpvsOp::AddDest(key, real, weight) | IpvsOp::EditDest(key, real, weight) => {
                    if let Some(applied) = self.virtual_servers.get_mut(key) {
                        applied.real_servers.insert(*real, *weight);
                    }
                }
                IpvsOp::DelDest(key, real) => {
                    if let Some(applied) = self.virtual_servers.get_mut(key) {
                        applied.real_servers.remove(real);
                    }
                }
            }
        }
    }

    /// The drained real servers (weight 0): the applier deletes each when its connections are
    /// gone.
    pub fn drained(&self) -> impl Iterator<Item = (&VirtualKey, &RealServer)> {
        self.virtual_servers
            .iter()
            .flat_map(|(key, server)| server.real_servers.iter().filter(|(_, w)| **w == 0).map(move |(r, _)| (key, r)))
    }
}

/// The operations that take one virtual server from `applied` to `planned`. A real server that
/// leaves a TCP virtual server is drained (weight 0, see the module documentation); one of UDP or
/// SCTP is deleted at once, as upstream (no connection to finish: `expire_nodest_conn` ends its
/// flows).
fn server_ops(key: VirtualKey, applied: &VirtualServer, planned: &VirtualServer, ops: &mut Vec<IpvsOp>) {
    if applied.attributes_differ(planned) {
        ops.push(IpvsOp::EditService(key, planned.clone()));
    }
    for (real, weight) in &planned.real_servers {
        match applied.real_servers.get(real) {
            None => ops.push(IpvsOp::AddDest(key, *real, *weight)),
            Some(old) if old != weight => ops.push(IpvsOp::EditDest(key, *real, *weight)),
            Some(_) => {}
        }
    }
    for (real, weight) in &applied.real_servers {
        if planned.real_servers.contains_key(real) {
            continue;
        }
        if key.protocol != Protocol::Tcp {
            ops.push(IpvsOp::DelDest(key, *real));
        } else if *weight != 0 {
            ops.push(IpvsOp::EditDest(key, *real, 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::plan::IpvsPlan;
    use crate::ipvs::plan::tests::{ep, ipvs_cfg, node, port};
    use crate::ipvs::{Scheduler, VirtualKey};
    use crate::table::Protocol;

    fn key(address: &str, port: u16) -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: address.parse().unwrap(), port }
    }

    fn real(address: &str, port: u16) -> RealServer {
        RealServer { address: address.parse().unwrap(), port }
    }

    fn table(endpoints: &[&str]) -> IpvsTable {
        let p = port("a", "10.96.0.10", endpoints.iter().map(|ip| ep(ip, 8080, false)).collect());
        IpvsPlan::new(&ipvs_cfg(), &node(), [&p]).table
    }

    #[test]
    fn from_nothing_every_object_is_added_and_back_to_nothing_removed() {
        let planned = table(&["10.244.0.11"]);
        let ops = IpvsTable::default().diff(&planned);
        let vs = key("10.96.0.10", 80);
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert_eq!(ops[0], IpvsOp::BindAddress("10.96.0.10".parse().unwrap()));
        assert!(matches!(&ops[1], IpvsOp::AddService(k, _) if *k == vs));
        assert_eq!(ops[2], IpvsOp::AddDest(vs, real("10.244.0.11", 8080), 1));
        let mut applied = IpvsTable::default();
        applied.apply(&ops);
        assert_eq!(applied, planned);
        assert!(applied.diff(&planned).is_empty(), "nothing changed, nothing sent");
        let ops = applied.diff(&IpvsTable::default());
        assert_eq!(ops, [IpvsOp::DelService(vs), IpvsOp::UnbindAddress("10.96.0.10".parse().unwrap())]);
    }

    #[test]
    fn one_endpoint_change_is_one_real_server_operation() {
        let applied = table(&["10.244.0.11", "10.244.0.12"]);
        let vs = key("10.96.0.10", 80);
        let added = applied.diff(&table(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]));
        assert_eq!(added, [IpvsOp::AddDest(vs, real("10.244.0.13", 8080), 1)]);
        let removed = applied.diff(&table(&["10.244.0.11"]));
        assert_eq!(removed, [IpvsOp::EditDest(vs, real("10.244.0.12", 8080), 0)], "drained, not deleted");
    }

    #[test]
    fn drained_real_servers_stay_until_deleted_and_come_back_with_their_endpoint() {
        let mut applied = table(&["10.244.0.11", "10.244.0.12"]);
        let one = table(&["10.244.0.11"]);
        let ops = applied.diff(&one);
        applied.apply(&ops);
        let vs = key("10.96.0.10", 80);
        assert_eq!(applied.drained().collect::<Vec<_>>(), [(&vs, &real("10.244.0.12", 8080))]);
        assert!(applied.diff(&one).is_empty(), "a drained real server is left to the applier");
        let back = applied.diff(&table(&["10.244.0.11", "10.244.0.12"]));
        assert_eq!(back, [IpvsOp::EditDest(vs, real("10.244.0.12", 8080), 1)]);
        applied.apply(&[IpvsOp::DelDest(vs, real("10.244.0.12", 8080))]);
        assert_eq!(applied, one);
    }

    #[test]
    fn a_scheduler_or_affinity_change_edits_the_service_in_place() {
        let applied = table(&["10.244.0.11"]);
        let mut planned = applied.clone();
        let vs = key("10.96.0.10", 80);
        let server = planned.virtual_servers.get_mut(&vs).unwrap();
        server.scheduler = Scheduler::LeastConnection;
        server.persistence = Some(10800);
        let ops = applied.diff(&planned);
        assert_eq!(ops.len(), 1);
        assert!(matches!(&ops[0], IpvsOp::EditService(k, s) if *k == vs && s.persistence == Some(10800)));
        let mut after = applied.clone();
        after.apply(&ops);
        assert_eq!(after, planned);
    }

    #[test]
    fn a_udp_real_server_that_leaves_is_deleted_at_once() {
        let mut p = port("dns", "10.96.0.10", vec![ep("10.244.0.11", 53, false), ep("10.244.0.12", 53, false)]);
        p.name.protocol = Protocol::Udp;
        let applied = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]).table;
        p.cluster_endpoints.pop();
        let planned = IpvsPlan::new(&ipvs_cfg(), &node(), [&p]).table;
        let vs = VirtualKey { protocol: Protocol::Udp, address: "10.96.0.10".parse().unwrap(), port: 80 };
        assert_eq!(applied.diff(&planned), [IpvsOp::DelDest(vs, real("10.244.0.12", 53))]);
    }
}
