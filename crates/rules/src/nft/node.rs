//! The nftables backend's node-level planning: each family's layout and planning context from the
//! config and this node, and one Service's objects in both families.

use std::net::IpAddr;

use ipnet::IpNet;

use super::layout::Layout;
use super::objects::Objects;
use super::service::{PlanContext, plan_service};
use crate::config::ProxyConfig;
use crate::table::{IpFamily, NodeInfo, ServicePort};

/// The pod CIDRs of one family.
fn family_cidrs(cfg: &ProxyConfig, family: IpFamily) -> Vec<IpNet> {
    cfg.cluster_cidrs.iter().filter(|c| IpFamily::of(&c.addr()) == family).copied().collect()
}

/// The fixed layout of each family's table.
pub fn layouts(cfg: &ProxyConfig, node: &NodeInfo, service_cidrs: &[IpNet]) -> Vec<Layout> {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|family| Layout {
            family,
            cluster_cidrs: family_cidrs(cfg, family),
            masquerade_mark: cfg.masquerade_mark(),
            masquerade_all: cfg.masquerade_all,
            nodeport_ips: node.nodeport_ips(family, cfg),
            nodeport_all_local: cfg.nodeport_addresses.covers_all(family),
            service_cidrs: service_cidrs.iter().filter(|c| IpFamily::of(&c.addr()) == family).copied().collect(),
        })
        .collect()
}

/// The planning context of one family.
fn context(cfg: &ProxyConfig, node: &NodeInfo, family: IpFamily) -> PlanContext {
    PlanContext {
        cluster_cidrs: family_cidrs(cfg, family),
        node_ips: node.primary_ips.iter().filter(|ip| IpFamily::of(ip) == family).copied().collect::<Vec<IpAddr>>(),
    }
}

/// The nft objects of one Service's ports, both families (none: nothing to proxy).
pub fn objects(cfg: &ProxyConfig, node: &NodeInfo, ports: &[ServicePort]) -> Objects {
    let mut objects = Objects::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let of_family: Vec<ServicePort> = ports.iter().filter(|p| p.family == family).cloned().collect();
        if !of_family.is_empty() {
            objects.extend(plan_service(&of_family, &context(cfg, node, family)));
        }
    }
    objects
}
