//! A node's whole plan, from the cluster state to each backend's rules: the one planning path of
//! the proxiers (`roadkeeper_proxy`), `roadkeeper rules` and the tracer ([`crate::trace`]).
//!
//! [`plan_ports`] turns Services into their service ports with the frontend claims applied (the
//! proxiers call it for the Services of each sync, with the claims they keep); [`NodePlan`] is
//! what a full sync programs: every Service planned from no claims, as nftables objects
//! ([`NftPlan`]), iptables restore input ([`IptablesPlan`]) or IPVS mode's plan ([`IpvsPlan`]).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::claims::{Claimant, Conflict, FrontendClaims, frontends_of};
use crate::config::{ProxyConfig, ProxyMode};
use crate::iptables::plan::{PlanContext, endpoint_count, jumps};
use crate::iptables::sync::{self as iptables_sync, ServicePlan};
use crate::ipvs::IpvsPlan;
use crate::nft::layout::Layout;
use crate::nft::node as nft_node;
use crate::nft::objects::Objects;
use crate::nft::rule::Op;
use crate::nft::transaction::{self, Existing};
use crate::table::{self, IpFamily, NodeInfo, ServicePort, service_ports};

/// The service CIDRs declared by ServiceCIDR objects, sorted and without duplicates.
pub fn service_cidrs(store: &Store) -> Vec<IpNet> {
    let mut cidrs: Vec<IpNet> = store
        .service_cidrs()
        .filter(|c| !table::ignored_by_kube_proxy(&c.metadata))
        .filter_map(|c| c.spec.as_ref()?.cidrs.clone())
        .flatten()
        .filter_map(|c| c.parse().ok())
        .collect();
    cidrs.sort();
    cidrs.dedup();
    cidrs
}

/// Service ports planned for some Services, and the frontend claims skipped on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlannedPorts {
    /// The service ports of each planned Service (empty: nothing to proxy).
    pub ports: BTreeMap<NamespacedName, Vec<ServicePort>>,
    /// Frontends the planned Services claim but an older Service owns (left out of `ports`).
    pub conflicts: Vec<Conflict>,
}

/// The service ports this node proxies for Service `key`, each frontend used once; none when the
/// Service is absent, headless, ExternalName or handled by another proxy.
fn ports_of(key: &NamespacedName, store: &Store, node: &NodeInfo, cfg: &ProxyConfig) -> Vec<ServicePort> {
    let Some(svc) = store.service(key) else { return Vec::new() };
    let slices = store.slices_for(key);
    // Every `Skip` reason means nothing to proxy.
    service_ports(key, svc, &slices, node, cfg).unwrap_or_default()
}

/// The service ports of the Services `keys` (the changed ones; every one for a full sync, which
/// starts from no claims), updating `claims`, plus those of every other Service that gained or
/// lost a frontend because of them. Frontends an older Service owns are left out and returned as
/// conflicts. Costs O(the Services planned).
pub fn plan_ports<'a>(
    claims: &mut FrontendClaims,
    keys: impl IntoIterator<Item = &'a NamespacedName>,
    store: &Store,
    node: &NodeInfo,
    cfg: &ProxyConfig,
) -> PlannedPorts {
    let mut planned = BTreeMap::new();
    let mut affected = BTreeSet::new();
    for key in keys {
        let mut ports = ports_of(key, store, node, cfg);
        let frontends = frontends_of(&mut ports);
        let created = store.service(key).and_then(|svc| svc.metadata.creation_timestamp.clone());
        affected.extend(claims.update(Claimant { created, service: key.clone() }, frontends));
        planned.insert(key.clone(), ports);
    }
    for key in affected {
        if let std::collections::btree_map::Entry::Vacant(entry) = planned.entry(key) {
            let mut ports = ports_of(entry.key(), store, node, cfg);
            frontends_of(&mut ports);
            entry.insert(ports);
        }
    }
    let mut conflicts = Vec::new();
    for (key, ports) in &mut planned {
        conflicts.extend(claims.keep_owned(key, ports));
    }
    PlannedPorts { ports: planned, conflicts }
}

/// Everything a full sync of this node programs, before it is turned into a backend's rules:
/// every Service of the store planned from no claims.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// The proxy's configuration (`mode` says which of [`NodePlan::nftables`],
    /// [`NodePlan::iptables`] and [`NodePlan::ipvs`] the proxy programs).
    pub cfg: ProxyConfig,
    /// This node.
    pub node: NodeInfo,
    /// The service CIDRs (unallocated addresses in them are dropped).
    pub service_cidrs: Vec<IpNet>,
    /// Who owns each frontend.
    pub claims: FrontendClaims,
    /// Every Service of the store with its service ports and the conflicts they met.
    pub ports: PlannedPorts,
}

impl NodePlan {
    /// Plans every Service of `store` for `node` under `cfg`, as a full sync does.
    pub fn new(store: &Store, cfg: &ProxyConfig, node: &NodeInfo, service_cidrs: &[IpNet]) -> NodePlan {
        let mut claims = FrontendClaims::default();
        let keys: Vec<NamespacedName> = store.services().map(|(key, _)| key.clone()).collect();
        let ports = plan_ports(&mut claims, &keys, store, node, cfg);
        NodePlan { cfg: cfg.clone(), node: node.clone(), service_cidrs: service_cidrs.to_vec(), claims, ports }
    }

    /// The nftables rules: both tables' layouts and every Service's objects.
    pub fn nftables(&self) -> NftPlan {
        let services = self
            .ports
            .ports
            .iter()
            .map(|(key, ports)| (key.clone(), nft_node::objects(&self.cfg, &self.node, ports)))
            .filter(|(_, objects)| !objects.is_empty())
            .collect();
        NftPlan { layouts: nft_node::layouts(&self.cfg, &self.node, &self.service_cidrs), services }
    }

    /// IPVS mode's plan: `kube-ipvs0`'s addresses, the virtual and real servers, the helper rules.
    pub fn ipvs(&self) -> IpvsPlan {
        IpvsPlan::new(&self.cfg, &self.node, self.ports.ports.values().flatten())
    }

    /// The iptables rules: every Service's rules in both families. Planned in iptables mode
    /// whatever `cfg.mode` says (its NodePort-address defaults apply), as the iptables proxier does.
    pub fn iptables(&self) -> IptablesPlan {
        let cfg = ProxyConfig { mode: ProxyMode::Iptables, ..self.cfg.clone() };
        let endpoints = self.ports.ports.values().map(|ports| endpoint_count(ports)).sum();
        let [v4, v6] = [IpFamily::V4, IpFamily::V6]
            .map(|family| iptables_sync::context(&cfg, &self.node, &self.service_cidrs, family, endpoints));
        let services = self
            .ports
            .ports
            .iter()
            .map(|(key, ports)| (key.clone(), ServicePlan::new(ports, &v4, &v6)))
            .filter(|(_, plan)| !plan.is_empty())
            .collect();
        IptablesPlan { contexts: vec![v4, v6], services }
    }
}

/// A node's nftables rules: what a full sync writes.
#[derive(Debug, Clone, PartialEq)]
pub struct NftPlan {
    /// The fixed layout of each family's table.
    pub layouts: Vec<Layout>,
    /// Every Service's objects (Services with none are left out).
    pub services: BTreeMap<NamespacedName, Objects>,
}

impl NftPlan {
    /// The full sync from empty tables, as one transaction (`roadkeeper rules` prints it).
    pub fn ops(&self) -> Vec<Op> {
        transaction::full_sync(&self.layouts, self.services.values(), &Existing::default()).0
    }
}

/// A node's iptables rules: what a full sync writes.
#[derive(Debug, Clone, PartialEq)]
pub struct IptablesPlan {
    /// The planning context of each family.
    pub contexts: Vec<PlanContext>,
    /// Every Service's rules (Services with none are left out).
    pub services: BTreeMap<NamespacedName, ServicePlan>,
}

impl IptablesPlan {
    /// The restore input of each family for a full sync onto a host without our chains (every
    /// jump from the builtin chains inserted): what `roadkeeper rules` prints.
    pub fn restore_inputs(&self) -> Vec<(IpFamily, String)> {
        let plans: Vec<&ServicePlan> = self.services.values().collect();
        let jumps = self.contexts.iter().map(|ctx| (ctx.family, jumps(ctx))).collect();
        iptables_sync::full_inputs(&self.contexts, &plans, &BTreeMap::new(), &jumps)
    }
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::Object;

    use super::*;

    fn object(yaml: &str) -> Object {
        let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        match value["kind"].as_str().unwrap() {
            "Service" => Object::Service(serde_json::from_value(value).unwrap()),
            "EndpointSlice" => Object::EndpointSlice(serde_json::from_value(value).unwrap()),
            "ServiceCIDR" => Object::ServiceCidr(serde_json::from_value(value).unwrap()),
            kind => panic!("{kind}"),
        }
    }

    /// Service `name` created at second `created` on ClusterIP 10.96.0.<n> with `external_ip`,
    /// port 80, one endpoint 10.244.0.<n>.
    fn service(name: &str, n: u8, created: i64, external_ip: &str) -> [Object; 2] {
        let time = roadkeeper_cluster::k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
        [
            object(&format!(
                "kind: Service\nmetadata: {{name: {name}, namespace: default, creationTimestamp: '{time}'}}\n\
                 spec: {{clusterIP: 10.96.0.{n}, externalIPs: [{external_ip}], ports: [{{port: 80}}]}}\n"
            )),
            object(&format!(
                "kind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
                 addressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{{addresses: [10.244.0.{n}]}}]\n"
            )),
        ]
    }

    fn key(name: &str) -> NamespacedName {
        NamespacedName::new("default", name)
    }

    #[test]
    fn a_contested_frontend_goes_to_the_oldest_service_and_moves_when_it_goes() {
        let objects = || service("new", 2, 200, "203.0.113.7").into_iter().chain(service("old", 1, 100, "203.0.113.7"));
        let store = Store::from_objects(objects());
        let (node, cfg) = (NodeInfo::default(), ProxyConfig::default());
        let plan = NodePlan::new(&store, &cfg, &node, &[]);
        assert_eq!(plan.ports.conflicts.len(), 1);
        assert_eq!(plan.ports.conflicts[0].skipped, key("new"));
        assert!(plan.ports.ports[&key("new")][0].external_ips.is_empty());
        assert_eq!(plan.ports.ports[&key("old")][0].external_ips.len(), 1);

        // The owner goes: planning it alone replans the other Service too, which takes over.
        let mut claims = plan.claims;
        let without_old = Store::from_objects(service("new", 2, 200, "203.0.113.7"));
        let planned = plan_ports(&mut claims, [&key("old")], &without_old, &node, &cfg);
        assert_eq!(planned.ports.keys().collect::<Vec<_>>(), [&key("new"), &key("old")]);
        assert!(planned.ports[&key("old")].is_empty());
        assert_eq!(planned.ports[&key("new")][0].external_ips.len(), 1);
        assert!(planned.conflicts.is_empty());
    }

    #[test]
    fn node_plans_leave_out_services_without_rules_and_read_service_cidrs() {
        let headless = object(
            "kind: Service\nmetadata: {name: h, namespace: default}\nspec: {clusterIP: None, ports: [{port: 80}]}\n",
        );
        let cidr = object(
            "kind: ServiceCIDR\nmetadata: {name: k}\nspec: {cidrs: [10.96.0.0/12, \"fd00:96::/108\", 10.96.0.0/12]}\n",
        );
        // kube-proxy's ServiceCIDR informer has the same label selector.
        let other_proxy = object(
            "kind: ServiceCIDR\nmetadata: {name: o, labels: {service.kubernetes.io/service-proxy-name: x}}\n\
             spec: {cidrs: [10.200.0.0/16]}\n",
        );
        let store =
            Store::from_objects(service("a", 1, 100, "203.0.113.7").into_iter().chain([headless, cidr, other_proxy]));
        let cidrs = service_cidrs(&store);
        assert_eq!(cidrs, ["10.96.0.0/12".parse::<IpNet>().unwrap(), "fd00:96::/108".parse().unwrap()]);
        let plan = NodePlan::new(&store, &ProxyConfig::default(), &NodeInfo::default(), &cidrs);
        assert_eq!(plan.ports.ports.len(), 2, "every Service is planned");
        let nft = plan.nftables();
        assert_eq!(nft.services.keys().collect::<Vec<_>>(), [&key("a")]);
        let script = transaction::script(&nft.ops());
        assert!(script.contains("add element ip roadkeeper service-cidrs { 10.96.0.0/12 }"), "{script}");
        let iptables = plan.iptables();
        assert_eq!(iptables.services.keys().collect::<Vec<_>>(), [&key("a")]);
        let inputs = iptables.restore_inputs();
        assert_eq!(inputs.iter().map(|(f, _)| *f).collect::<Vec<_>>(), [IpFamily::V4, IpFamily::V6]);
        assert!(inputs[0].1.contains("-A KUBE-SERVICES -d 10.96.0.0/12 "), "{}", inputs[0].1);
        assert!(inputs[0].1.contains("-I PREROUTING "), "every jump is inserted");
        assert!(!inputs[1].1.contains("default/a"), "an IPv4-only Service has no IPv6 rules");
    }
}
