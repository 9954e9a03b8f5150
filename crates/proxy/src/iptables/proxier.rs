//! The iptables proxier: keeps what it last applied per Service, plans changed Services, and
//! applies full or partial syncs with one `iptables-restore --noflush` per family. As upstream
//! (KEP-3453), every sync rewrites the top-level chains, but only changed Services' own chains
//! are written. A restore the kernel refuses is narrowed down (`--test`) to the offending
//! Services, which keep their last good rules.

use std::collections::{BTreeMap, BTreeSet};

use roadkeeper_cluster::{NamespacedName, Store};

use super::restore::IptablesRunner;
use crate::Error;
use crate::proxier::{Backend, Stopwatch, SyncReport, SyncState, bisect};
use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
use roadkeeper_rules::iptables::plan::{
    FamilyPlan, Jump, PlanContext, RestoreInput, endpoint_count, is_large_cluster, jumps, restore_input,
};
use roadkeeper_rules::iptables::sync::{self, ServicePlan, context};
use roadkeeper_rules::table::{IpFamily, NodeInfo, ServicePort};

/// Plans and programs one node's iptables rules.
pub struct IptablesProxier<R: IptablesRunner> {
    cfg: ProxyConfig,
    state: SyncState,
    runner: R,
    /// Rules in the kernel, per Service.
    applied: BTreeMap<NamespacedName, ServicePlan>,
    /// The endpoints of the service table ([`endpoint_count`]): they decide large cluster mode.
    endpoints: usize,
}

/// Plans keyed by Service, with the Services to consider for one restore.
type Plans = BTreeMap<NamespacedName, (Vec<ServicePort>, ServicePlan)>;

impl<R: IptablesRunner> IptablesProxier<R> {
    /// A proxier that will start with a full sync. `cfg.mode` is taken as iptables (its
    /// NodePort-address defaults apply).
    pub fn new(mut cfg: ProxyConfig, node: NodeInfo, runner: R) -> Self {
        cfg.mode = ProxyMode::Iptables;
        IptablesProxier { cfg, state: SyncState::new(node), runner, applied: BTreeMap::new(), endpoints: 0 }
    }

    /// The runner.
    pub fn runner(&mut self) -> &mut R {
        &mut self.runner
    }

    /// The planning context of one family, for a service table of `endpoints` endpoints.
    fn context_for(&self, family: IpFamily, endpoints: usize) -> PlanContext {
        context(&self.cfg, &self.state.node, &self.state.service_cidrs, family, endpoints)
    }

    /// The planning context of one family.
    pub fn context(&self, family: IpFamily) -> PlanContext {
        self.context_for(family, self.endpoints)
    }

    /// Plans the service ports `ports` for a service table of `endpoints` endpoints.
    fn plan(&self, ports: BTreeMap<NamespacedName, Vec<ServicePort>>, endpoints: usize) -> Plans {
        let (v4, v6) = (self.context_for(IpFamily::V4, endpoints), self.context_for(IpFamily::V6, endpoints));
        ports
            .into_iter()
            .map(|(key, ports)| {
                let plan = ServicePlan::new(&ports, &v4, &v6);
                (key, (ports, plan))
            })
            .collect()
    }

    /// Records one Service's ports in the service table, keeping the endpoint count.
    fn set_table(&mut self, key: &NamespacedName, ports: Vec<ServicePort>) {
        let old = self.state.table.get(key).map_or(0, |old| endpoint_count(old));
        self.endpoints = self.endpoints - old + endpoint_count(&ports);
        self.state.set_table(key, ports);
    }
}

/// The restore inputs of a full sync of the Services in `plans` (all, or `only`), deleting the
/// `existing` service chains that no included Service uses.
fn full_inputs(
    contexts: &[PlanContext],
    plans: &Plans,
    only: Option<&[NamespacedName]>,
    existing: &BTreeMap<IpFamily, BTreeSet<String>>,
    jumps: &BTreeMap<IpFamily, Vec<Jump>>,
) -> Vec<(IpFamily, String)> {
    let only: Option<BTreeSet<&NamespacedName>> = only.map(|keys| keys.iter().collect());
    let included = |key: &NamespacedName| only.as_ref().is_none_or(|keys| keys.contains(key));
    let services: Vec<&ServicePlan> = plans.iter().filter(|(k, _)| included(k)).map(|(_, (_, p))| p).collect();
    sync::full_inputs(contexts, &services, existing, jumps)
}

/// One family's restore input of a partial sync applying the `candidates` in `subset` on top of
/// `base` (what the kernel holds): the chains of the subset's Services whose rules in this family
/// changed, the chains they no longer use deleted, and the top-level chains of a table (every
/// Service's shared rules) only when some of those Services' shared rules changed. Empty when the
/// family has nothing to change.
fn partial_input(
    ctx: &PlanContext,
    base: &BTreeMap<NamespacedName, ServicePlan>,
    candidates: &Plans,
    subset: &[NamespacedName],
) -> String {
    let family = ctx.family;
    let empty = FamilyPlan::default();
    let mut written = Vec::new();
    let mut deleted = BTreeSet::new();
    let (mut filter_unchanged, mut nat_top_level_unchanged) = (true, true);
    for key in subset {
        let new = candidates[key].1.family(family);
        let old = base.get(key).map_or(&empty, |old| old.family(family));
        if old == new {
            continue;
        }
        written.push(new);
        deleted.extend(old.chains.keys().filter(|c| !new.chains.contains_key(*c)).cloned());
        filter_unchanged &= old.filter_shared == new.filter_shared;
        nat_top_level_unchanged &= old.nat_shared == new.nat_shared;
    }
    if written.is_empty() {
        return String::new();
    }
    // Every Service's plan, for the top-level chains (O(Services): only when they change).
    let mut services = Vec::new();
    if !(filter_unchanged && nat_top_level_unchanged) {
        let mut state: BTreeMap<&NamespacedName, &ServicePlan> = base.iter().collect();
        for key in subset {
            state.insert(key, &candidates[key].1);
        }
        services = state.values().map(|p| p.family(family)).collect();
    }
    let input = RestoreInput {
        services,
        written,
        deleted,
        filter_unchanged,
        nat_top_level_unchanged,
        ..RestoreInput::default()
    };
    restore_input(ctx, &input)
}

/// Restores every family's input, in order, timing the runner with `kernel`.
fn apply_all<R: IptablesRunner>(
    runner: &mut R,
    kernel: &mut Stopwatch,
    inputs: &[(IpFamily, String)],
) -> Result<(), Error> {
    for (family, input) in inputs.iter().filter(|(_, input)| !input.is_empty()) {
        kernel.time(|| runner.restore(*family, input))?;
    }
    Ok(())
}

/// The keys whose inputs fail, by bisection with `try_subset`, each with its error.
fn bisect_errors(
    keys: &[NamespacedName],
    try_subset: &mut dyn FnMut(&[NamespacedName]) -> Result<(), Error>,
) -> Vec<(NamespacedName, String)> {
    bisect(keys, try_subset).into_iter().map(|(key, err)| (key, err.to_string())).collect()
}

/// Checks every family's input (`--test`), timing the runner with `kernel`.
fn check_all<R: IptablesRunner>(
    runner: &mut R,
    kernel: &mut Stopwatch,
    inputs: &[(IpFamily, String)],
) -> Result<(), Error> {
    for (family, input) in inputs {
        kernel.time(|| runner.check(*family, input))?;
    }
    Ok(())
}

impl<R: IptablesRunner> Backend for IptablesProxier<R> {
    fn state(&self) -> &SyncState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut SyncState {
        &mut self.state
    }

    /// Rewrites everything we own.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error> {
        self.state.claims.clear();
        let keys: Vec<NamespacedName> = store.services().map(|(k, _)| k.clone()).collect();
        let ports = self.state.plan_ports(&keys, store, &self.cfg);
        let endpoints = ports.values().map(|ports| endpoint_count(ports)).sum();
        let mut planned = self.plan(ports, endpoints);
        self.state.table.clear();
        self.endpoints = 0;
        let families = self.runner.families();
        let contexts: Vec<PlanContext> = families.iter().map(|f| self.context(*f)).collect();
        if self.context(IpFamily::V4).localhost_nodeports_active()
            && let Err(err) = self.state.kernel.time(|| self.runner.enable_route_localnet())
        {
            tracing::warn!(error = %err, "cannot enable route_localnet; NodePorts on 127.0.0.1 will not work");
        }
        let mut existing = BTreeMap::new();
        for &family in &families {
            existing.insert(family, self.state.kernel.time(|| self.runner.service_chains(family))?);
        }
        let mut refused = Vec::new();
        let mut missing = BTreeMap::new();
        for ctx in &contexts {
            let wanted = jumps(ctx);
            missing.insert(ctx.family, self.state.kernel.time(|| self.runner.missing_jumps(ctx.family, &wanted))?);
        }
        let mut inputs = if self.runner.splits_full_syncs() {
            let services: Vec<&ServicePlan> = planned.values().map(|(_, p)| p).collect();
            sync::split_full_inputs(&contexts, &services, &existing, &missing)
        } else {
            full_inputs(&contexts, &planned, None, &existing, &missing)
        };
        if let Err(err) = apply_all(&mut self.runner, &mut self.state.kernel, &inputs) {
            if !err.is_refusal() {
                return Err(err);
            }
            tracing::warn!(error = %err, "full sync refused by the kernel; looking for the offending Services");
            let (runner, kernel) = (&mut self.runner, &mut self.state.kernel);
            // Without jumps: a subset applied for real must not insert them (the final input does).
            let no_jumps = BTreeMap::new();
            let inputs_for =
                |subset: &[NamespacedName]| full_inputs(&contexts, &planned, Some(subset), &existing, &no_jumps);
            if runner.check_is_reliable() {
                refused = bisect_errors(&keys, &mut |subset| check_all(runner, kernel, &inputs_for(subset)));
            }
            if refused.is_empty() {
                // Each subset's input is a whole, consistent ruleset: applying it is safe, and the
                // final input below rewrites everything anyway.
                refused = bisect_errors(&keys, &mut |subset| apply_all(runner, kernel, &inputs_for(subset)));
            }
            if refused.is_empty() {
                return Err(err);
            }
            for (key, why) in &refused {
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
                let last_good = self.applied.get(key).cloned().unwrap_or_default();
                planned.insert(key.clone(), (Vec::new(), last_good));
            }
            inputs = full_inputs(&contexts, &planned, None, &existing, &missing);
            apply_all(&mut self.runner, &mut self.state.kernel, &inputs)?;
        }
        self.state.needs_full = false;
        self.applied.clear();
        let changed = planned.len();
        let refused_keys: BTreeSet<&NamespacedName> = refused.iter().map(|(k, _)| k).collect();
        for (key, (ports, plan)) in planned {
            if !plan.is_empty() {
                self.applied.insert(key.clone(), plan);
            }
            if !refused_keys.contains(&key) {
                self.set_table(&key, ports);
            }
        }
        let ops = inputs.iter().map(|(_, i)| i.lines().count()).sum();
        Ok(SyncReport { full: true, services_changed: changed, ops, refused, ..SyncReport::default() })
    }

    /// Rewrites the top-level chains and the chains of the `changed` Services whose rules differ
    /// from what is applied.
    /// A change that moves the service table across the large-cluster threshold is a full sync.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        let ports = self.state.plan_ports(changed, store, &self.cfg);
        let mut endpoints = self.endpoints;
        for (key, ports) in &ports {
            endpoints =
                endpoints - self.state.table.get(key).map_or(0, |old| endpoint_count(old)) + endpoint_count(ports);
        }
        if is_large_cluster(endpoints) != is_large_cluster(self.endpoints) {
            return self.full_sync(store);
        }
        let mut candidates: Plans = BTreeMap::new();
        for (key, (ports, plan)) in self.plan(ports, self.endpoints) {
            let empty = ServicePlan::default();
            if self.applied.get(&key).unwrap_or(&empty) == &plan {
                self.set_table(&key, ports);
                continue;
            }
            candidates.insert(key, (ports, plan));
        }
        if candidates.is_empty() {
            return Ok(SyncReport::default());
        }
        let families = self.runner.families();
        let contexts: Vec<PlanContext> = families.iter().map(|f| self.context(*f)).collect();
        let keys: Vec<NamespacedName> = candidates.keys().cloned().collect();
        let inputs: Vec<(IpFamily, String)> =
            contexts.iter().map(|ctx| (ctx.family, partial_input(ctx, &self.applied, &candidates, &keys))).collect();
        let mut ops: usize = inputs.iter().map(|(_, i)| i.lines().count()).sum();
        let mut refused = Vec::new();
        // Families are restored one after the other: the ones before a failure hold all candidates.
        let mut failed = None;
        for (i, (family, input)) in inputs.iter().enumerate().filter(|(_, (_, input))| !input.is_empty()) {
            if let Err(err) = self.state.kernel.time(|| self.runner.restore(*family, input)) {
                failed = Some((i, err));
                break;
            }
        }
        if let Some((failed_at, err)) = failed {
            if !err.is_refusal() {
                return Err(err);
            }
            tracing::warn!(error = %err, "partial sync refused by the kernel; looking for the offending Services");
            // What each family's kernel tables hold, updated with every successful restore, so
            // that every input below is consistent with the kernel.
            let mut bases: Vec<BTreeMap<NamespacedName, ServicePlan>> =
                contexts.iter().map(|_| self.applied.clone()).collect();
            for base in &mut bases[..failed_at] {
                for (key, (_, plan)) in &candidates {
                    base.insert(key.clone(), plan.clone());
                }
            }
            let (runner, kernel) = (&mut self.runner, &mut self.state.kernel);
            if runner.check_is_reliable() {
                refused = bisect_errors(&keys, &mut |subset| {
                    for (ctx, base) in contexts.iter().zip(&bases) {
                        let input = partial_input(ctx, base, &candidates, subset);
                        if !input.is_empty() {
                            kernel.time(|| runner.check(ctx.family, &input))?;
                        }
                    }
                    Ok(())
                });
            }
            let mut apply_subset = |subset: &[NamespacedName]| -> Result<(), Error> {
                for (ctx, base) in contexts.iter().zip(bases.iter_mut()) {
                    let input = partial_input(ctx, base, &candidates, subset);
                    if !input.is_empty() {
                        kernel.time(|| runner.restore(ctx.family, &input))?;
                    }
                    for key in subset {
                        base.insert(key.clone(), candidates[key].1.clone());
                    }
                }
                Ok(())
            };
            if refused.is_empty() {
                refused = bisect_errors(&keys, &mut apply_subset);
            }
            if refused.is_empty() {
                return Err(err);
            }
            for (key, why) in &refused {
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
            }
            let good: Vec<NamespacedName> =
                keys.iter().filter(|k| !refused.iter().any(|(b, _)| b == *k)).cloned().collect();
            apply_subset(&good)?;
            ops += good.len();
        }
        let refused_keys: BTreeSet<NamespacedName> = refused.iter().map(|(k, _)| k.clone()).collect();
        let mut services_changed = 0;
        for (key, (ports, plan)) in candidates {
            if refused_keys.contains(&key) {
                continue;
            }
            services_changed += 1;
            if plan.is_empty() {
                self.applied.remove(&key)
            } else {
                self.applied.insert(key.clone(), plan)
            };
            self.set_table(&key, ports);
        }
        Ok(SyncReport { full: false, services_changed, ops, refused, ..SyncReport::default() })
    }

    /// The mangle canary chains exist (not timed: not part of a sync).
    fn rules_in_place(&mut self) -> Result<bool, Error> {
        self.runner.healthy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::restore::Recorder;
    use crate::proxier::Proxier;
    use crate::proxier::testing::cluster;
    use roadkeeper_rules::config::NodePortAddresses;
    use roadkeeper_rules::iptables::plan::NodePortDestinations;

    fn proxier() -> IptablesProxier<Recorder> {
        let cfg = ProxyConfig { cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()], ..ProxyConfig::default() };
        IptablesProxier::new(cfg, NodeInfo::default(), Recorder::default())
    }

    fn v4_inputs(p: &mut IptablesProxier<Recorder>) -> Vec<String> {
        p.runner().inputs.iter().filter(|(f, _)| *f == IpFamily::V4).map(|(_, i)| i.clone()).collect()
    }

    #[test]
    fn a_partial_sync_writes_only_the_changed_services_chains() {
        let mut p = proxier();
        let report = p.sync(&cluster(20, 0), &BTreeSet::new()).unwrap();
        assert!(report.full);
        let full = v4_inputs(&mut p).pop().unwrap();
        assert!(full.contains(":KUBE-PROXY-CANARY - [0:0]"));
        assert_eq!(full.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count(), 60);
        assert!(!p.runner().jumps.is_empty());
        assert!(
            full.contains("\n-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"),
            "{full}"
        );

        let changed = BTreeSet::from([NamespacedName::new("default", "svc-1")]);
        let report = p.sync(&cluster(20, 1), &changed).unwrap();
        assert!(!report.full && report.services_changed == 1, "{report:?}");
        let partial = v4_inputs(&mut p).pop().unwrap();
        let declared: Vec<&str> =
            partial.lines().filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SEP-")).collect();
        // svc-1's chain, its 3 endpoints and the replaced endpoint's chain (deleted).
        assert_eq!(declared.len(), 1 + 3 + 1, "{partial}");
        assert_eq!(partial.lines().filter(|l| l.starts_with("-X ")).count(), 1, "{partial}");
        assert!(
            partial
                .lines()
                .filter(|l| l.starts_with("-A KUBE-SEP-") || l.starts_with("-A KUBE-SVC-"))
                .all(|l| l.contains("default/svc-1"))
        );
        // An endpoint change leaves the top-level chains and the filter table as they are.
        assert!(!partial.contains("KUBE-SERVICES") && !partial.contains("*filter"), "{partial}");

        // Nothing changed: no restore at all.
        let before = p.runner().inputs.len();
        let report = p.sync(&cluster(20, 1), &changed).unwrap();
        assert_eq!((report.services_changed, p.runner().inputs.len()), (0, before));

        // A deleted Service's chains are deleted.
        let gone = BTreeSet::from([NamespacedName::new("default", "svc-20")]);
        p.sync(&cluster(19, 1), &gone).unwrap();
        let partial = v4_inputs(&mut p).pop().unwrap();
        assert_eq!(partial.lines().filter(|l| l.starts_with("-X ")).count(), 4, "{partial}");
        assert!(!partial.contains("default/svc-20"));
        // ... and its KUBE-SERVICES rule goes: the top-level chains are rewritten with every
        // other Service's rules, and so is the filter table.
        let cluster_ips = partial.lines().filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains("cluster IP"));
        assert_eq!(cluster_ips.count(), 19, "{partial}");
        assert!(partial.contains("*filter\n"), "{partial}");
    }

    /// 200 Services of `eps` endpoints, svc-1 with `first` endpoints.
    fn endpoints_cluster(first: u8, eps: u8) -> Store {
        let objects = (1..=200u8).flat_map(|n| {
            crate::proxier::testing::service(&format!("svc-{n}"), n, if n == 1 { first } else { eps }, 0)
        });
        Store::from_objects(objects)
    }

    #[test]
    fn crossing_a_thousand_endpoints_switches_large_cluster_mode_with_a_full_sync() {
        let mut p = proxier();
        p.sync(&endpoints_cluster(5, 5), &BTreeSet::new()).unwrap();
        let full = v4_inputs(&mut p).pop().unwrap();
        assert!(full.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).all(|l| l.contains("--comment")));
        let svc1 = BTreeSet::from([NamespacedName::new("default", "svc-1")]);
        // 1,001 endpoints: every Service's chains lose their comments.
        let report = p.sync(&endpoints_cluster(6, 5), &svc1).unwrap();
        assert!(report.full, "{report:?}");
        let full = v4_inputs(&mut p).pop().unwrap();
        let sep_rules: Vec<&str> = full.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).collect();
        assert_eq!(sep_rules.len(), 2 * 1001);
        assert!(sep_rules.iter().all(|l| !l.contains("comment")), "{full}");
        let nat = full.split("*nat\n").nth(1).unwrap();
        let cluster_ips: Vec<&str> = nat.lines().filter(|l| l.starts_with("-A KUBE-SERVICES -d 10.96")).collect();
        assert!(cluster_ips.len() == 200 && cluster_ips.iter().all(|l| l.contains("cluster IP")), "{nat}");
        // Staying above: partial syncs, still without comments.
        let report = p.sync(&endpoints_cluster(7, 5), &svc1).unwrap();
        assert!(!report.full);
        let partial = v4_inputs(&mut p).pop().unwrap();
        let commented = partial.lines().filter(|l| l.contains("comment"));
        assert!(commented.clone().count() == 1 && commented.clone().all(|l| l.contains("cluster IP")), "{partial}");
        // Back to 1,000: comments again, everywhere.
        let report = p.sync(&endpoints_cluster(5, 5), &svc1).unwrap();
        assert!(report.full);
        let full = v4_inputs(&mut p).pop().unwrap();
        assert!(full.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).all(|l| l.contains("--comment")));
    }

    #[test]
    fn a_split_full_sync_writes_what_one_restore_would() {
        let store = cluster(30, 0);
        let mut p = proxier();
        p.runner().split = true;
        p.sync(&store, &BTreeSet::new()).unwrap();
        let plan = roadkeeper_rules::plan::NodePlan::new(&store, &p.cfg, &NodeInfo::default(), &[]);
        let lines = |inputs: &[(IpFamily, String)]| -> BTreeSet<String> {
            inputs.iter().flat_map(|(_, i)| i.lines().filter(|l| l.starts_with(['-', ':'])).map(String::from)).collect()
        };
        let (split, whole) = (p.runner().inputs.clone(), plan.iptables().restore_inputs());
        // v4: KUBE-MARK-MASQ, the Services' chains (120 chains: one piece), the rest; v6: the rest.
        assert_eq!(split.len(), 3 + 1);
        assert_eq!(lines(&split), lines(&whole));
    }

    #[test]
    fn a_full_sync_restores_the_node_plan() {
        let store = cluster(3, 0);
        let mut p = proxier();
        p.sync(&store, &BTreeSet::new()).unwrap();
        let plan = roadkeeper_rules::plan::NodePlan::new(&store, &p.cfg, &NodeInfo::default(), &[]);
        assert_eq!(p.runner().inputs, plan.iptables().restore_inputs());
    }

    #[test]
    fn iptables_mode_defaults_nodeports_to_every_local_address() {
        let mut p = proxier();
        assert_eq!(p.context(IpFamily::V4).nodeports, NodePortDestinations::AllLocal);
        p.cfg.nodeport_addresses = NodePortAddresses::Primary;
        p.state.node.primary_ips = vec!["192.168.77.2".parse().unwrap()];
        assert_eq!(p.context(IpFamily::V4).nodeports, NodePortDestinations::Ips(vec!["192.168.77.2".parse().unwrap()]));
        p.cfg.nodeport_addresses = NodePortAddresses::Cidrs(vec!["0.0.0.0/0".parse().unwrap()]);
        assert_eq!(p.context(IpFamily::V4).nodeports, NodePortDestinations::AllLocal);
    }
}
