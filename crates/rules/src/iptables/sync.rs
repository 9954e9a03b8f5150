//! The iptables backend's node-level planning: each family's planning context from the config and
//! this node, one Service's rules in both families ([`ServicePlan`]), and the restore inputs of a
//! full sync.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{
    FamilyPlan, Jump, NodePortDestinations, PlanContext, RestoreInput, is_large_cluster, mark_masq_input, plan_ports,
    restore_input,
};
use crate::config::{NodePortAddresses, ProxyConfig};
use crate::table::{IpFamily, NodeInfo, ServicePort};
use ipnet::IpNet;

/// The planning context of one family, in large cluster mode when the service table holds
/// `endpoints` endpoints beyond the threshold ([`is_large_cluster`]). NodePorts go to every local
/// address unless `--nodeport-addresses` says otherwise (iptables mode's default, as kube-proxy).
pub fn context(
    cfg: &ProxyConfig,
    node: &NodeInfo,
    service_cidrs: &[IpNet],
    family: IpFamily,
    endpoints: usize,
) -> PlanContext {
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
        large_cluster: is_large_cluster(endpoints),
        drop_invalid: !cfg.conntrack.tcp_be_liberal,
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
    contexts.iter().map(|ctx| (ctx.family, family_full_input(ctx, services, existing, jumps, true))).collect()
}

/// One family's full-sync input; the Services' own chains only when `write_chains`.
fn family_full_input(
    ctx: &PlanContext,
    services: &[&ServicePlan],
    existing: &BTreeMap<IpFamily, BTreeSet<String>>,
    jumps: &BTreeMap<IpFamily, Vec<Jump>>,
    write_chains: bool,
) -> String {
    let services: Vec<&FamilyPlan> = services.iter().map(|p| p.family(ctx.family)).collect();
    let active: BTreeSet<&String> = services.iter().flat_map(|p| p.chains.keys()).collect();
    let deleted = existing.get(&ctx.family).into_iter().flatten().filter(|c| !active.contains(c)).cloned().collect();
    let jumps = jumps.get(&ctx.family).cloned().unwrap_or_default();
    let written = if write_chains { services.clone() } else { Vec::new() };
    let input = RestoreInput { written, services, deleted, canary: true, jumps, ..RestoreInput::default() };
    restore_input(ctx, &input)
}

/// Chains per restore input of a split full sync.
pub const CHAINS_PER_RESTORE: usize = 2500;

/// The same full sync as [`full_inputs`], split for `iptables-nft-restore`, whose time grows with
/// the square of the chains one input declares (measured, 1.8.9: 10,000 Services of 10 endpoints
/// took 162 s as one input, 14 s split): per family, `KUBE-MARK-MASQ`, then the Services' own
/// chains about [`CHAINS_PER_RESTORE`] at a time (each Service's chains within one input, so that
/// each Service changes at once; nothing jumps to a new chain yet), then the full input without
/// them: the top-level chains that jump to them, the filter table, the deletions and the jumps.
pub fn split_full_inputs(
    contexts: &[PlanContext],
    services: &[&ServicePlan],
    existing: &BTreeMap<IpFamily, BTreeSet<String>>,
    jumps: &BTreeMap<IpFamily, Vec<Jump>>,
) -> Vec<(IpFamily, String)> {
    let mut inputs = Vec::new();
    for ctx in contexts {
        let family = ctx.family;
        let plans: Vec<&FamilyPlan> =
            services.iter().map(|p| p.family(family)).filter(|p| !p.chains.is_empty()).collect();
        if !plans.is_empty() {
            inputs.push((family, mark_masq_input(ctx)));
        }
        let mut chunk: Vec<&FamilyPlan> = Vec::new();
        let mut chains = 0;
        for plan in plans {
            chunk.push(plan);
            chains += plan.chains.len();
            if chains >= CHAINS_PER_RESTORE {
                inputs.push((family, chains_input(ctx, std::mem::take(&mut chunk))));
                chains = 0;
            }
        }
        if !chunk.is_empty() {
            inputs.push((family, chains_input(ctx, chunk)));
        }
        inputs.push((family, family_full_input(ctx, services, existing, jumps, false)));
    }
    inputs
}

/// A restore input writing only these Services' own chains.
fn chains_input(ctx: &PlanContext, written: Vec<&FamilyPlan>) -> String {
    let input =
        RestoreInput { written, filter_unchanged: true, nat_top_level_unchanged: true, ..RestoreInput::default() };
    restore_input(ctx, &input)
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;

    use super::*;
    use crate::table::{Endpoint, Protocol};

    fn plans(n: u8) -> Vec<ServicePlan> {
        let ctx = PlanContext { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..PlanContext::default() };
        (1..=n)
            .map(|i| {
                let endpoints = (1..=9)
                    .map(|e| Endpoint { ip: format!("10.244.{i}.{e}").parse().unwrap(), port: 8080, is_local: false })
                    .collect();
                let sp = ServicePort::for_test(
                    NamespacedName::new("default", format!("svc-{i}")),
                    Protocol::Tcp,
                    format!("10.96.0.{i}").parse().unwrap(),
                    80,
                    endpoints,
                );
                ServicePlan::new(&[sp], &ctx, &PlanContext { family: IpFamily::V6, ..ctx.clone() })
            })
            .collect()
    }

    /// Chains declared and rules appended by a list of inputs, each table's lines apart.
    fn lines(inputs: &[(IpFamily, String)]) -> BTreeSet<String> {
        inputs.iter().flat_map(|(_, i)| i.lines().filter(|l| l.starts_with(['-', ':'])).map(String::from)).collect()
    }

    #[test]
    fn a_split_full_sync_writes_the_same_rules_in_pieces_top_level_last() {
        // 10 chains per Service: a piece every 250 Services, 600 Services in 3 pieces.
        let plans = plans(250);
        let plans: Vec<&ServicePlan> = plans.iter().chain(plans.iter()).chain(plans.iter().take(100)).collect();
        let contexts = [PlanContext::default()];
        let existing = BTreeMap::from([(IpFamily::V4, BTreeSet::from(["KUBE-SEP-STALE".to_string()]))]);
        let whole = full_inputs(&contexts, &plans, &existing, &BTreeMap::new());
        let split = split_full_inputs(&contexts, &plans, &existing, &BTreeMap::new());
        assert_eq!(split.len(), 1 + 3 + 1);
        assert_eq!(lines(&whole), lines(&split));
        assert!(split[0].1.starts_with("*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n"));
        for (_, piece) in &split[1..4] {
            assert!(
                piece.starts_with("*nat\n") && !piece.contains("KUBE-SERVICES") && !piece.contains("-X "),
                "{piece}"
            );
            assert!(piece.lines().filter(|l| l.starts_with(":KUBE-")).count() <= CHAINS_PER_RESTORE);
        }
        let last = &split[4].1;
        assert!(!last.lines().any(|l| l.starts_with(":KUBE-SVC-") || l.starts_with("-A KUBE-SEP-")), "{last}");
        assert!(last.contains(":KUBE-SERVICES - [0:0]") && last.contains("-X KUBE-SEP-STALE\n"));
        // A family without Services gets its top-level input only.
        let v6 = split_full_inputs(
            &[PlanContext { family: IpFamily::V6, ..PlanContext::default() }],
            &plans,
            &existing,
            &BTreeMap::new(),
        );
        assert_eq!(v6.len(), 1);
    }
}
