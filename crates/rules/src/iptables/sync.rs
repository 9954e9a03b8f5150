//! The iptables backend's node-level planning: each family's planning context from the config and
//! this node, one Service's rules in both families ([`ServicePlan`]), and the restore inputs of a
//! full sync.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{FamilyPlan, Jump, NodePortDestinations, PlanContext, RestoreInput, plan_ports, restore_input};
use crate::config::{NodePortAddresses, ProxyConfig};
use crate::table::{IpFamily, NodeInfo, ServicePort};
use ipnet::IpNet;

/// The planning context of one family. NodePorts go to every local address unless
/// `--nodeport-addresses` says otherwise (iptables mode's default, as kube-proxy).
pub fn context(cfg: &ProxyConfig, node: &NodeInfo, service_cidrs: &[IpNet], family: IpFamily) -> PlanContext {
    let all_local =
        matches!(cfg.nodeport_addresses, NodePortAddresses::Unset) || cfg.nodeport_addresses.covers_all(family);
    PlanContext {
        family,
        cluster_cidr: cfg.cluster_cidrs.iter().find(|c| IpFamily::of(&c.addr()) == family).copied(),
        masquerade_all: cfg.masquerade_all,
        masquerade_mark: cfg.masquerade_mark(),
        node_ips: node.primary_ips.iter().filter(|ip| IpFamily::of(ip) == family).copied().collect(),
        nodeports: if all_local {
            NodePortDestinations::AllLocal
        } else {
            NodePortDestinations::Ips(node.nodeport_ips(family, cfg))
        },
        localhost_nodeports: cfg.localhost_nodeports,
        service_cidrs: service_cidrs.iter().filter(|c| IpFamily::of(&c.addr()) == family).copied().collect(),
    }
}

/// One Service's rules in both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicePlan {
    /// IPv4 (iptables).
    pub v4: FamilyPlan,
    /// IPv6 (ip6tables).
    pub v6: FamilyPlan,
}

impl ServicePlan {
    /// Plans one Service's ports in each family's context.
    pub fn new(ports: &[ServicePort], v4: &PlanContext, v6: &PlanContext) -> ServicePlan {
        ServicePlan { v4: plan_ports(ports, v4), v6: plan_ports(ports, v6) }
    }

    /// The plan of one family.
    pub fn family(&self, family: IpFamily) -> &FamilyPlan {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }

    /// True when the Service has no rules at all.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// The restore inputs of a full sync of `services`, one per context's family, deleting the
/// `existing` service chains that none of them uses and inserting the `jumps` (those missing
/// from the builtin chains).
pub fn full_inputs(
    contexts: &[PlanContext],
    services: &[&ServicePlan],
    existing: &BTreeMap<IpFamily, BTreeSet<String>>,
    jumps: &BTreeMap<IpFamily, Vec<Jump>>,
) -> Vec<(IpFamily, String)> {
    contexts
        .iter()
        .map(|ctx| {
            let services: Vec<&FamilyPlan> = services.iter().map(|p| p.family(ctx.family)).collect();
            let active: BTreeSet<&String> = services.iter().flat_map(|p| p.chains.keys()).collect();
            let deleted =
                existing.get(&ctx.family).into_iter().flatten().filter(|c| !active.contains(c)).cloned().collect();
            let jumps = jumps.get(&ctx.family).cloned().unwrap_or_default();
            let input = RestoreInput { written: services.clone(), services, deleted, canary: true, jumps };
            (ctx.family, restore_input(ctx, &input))
        })
        .collect()
}
