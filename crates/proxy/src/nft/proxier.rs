//! The nftables proxier: plans changed Services, and applies full or partial syncs as
//! transactions. What is in the kernel for a Service is planned again from its service ports in
//! the service table (the ports last applied), rather than kept: the objects are a pure function
//! of them, and keeping them cost more memory than anything else at 50,000 Services. A
//! transaction the kernel refuses is narrowed down to the offending Services, which keep their
//! last good rules.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use roadkeeper_cluster::{NamespacedName, Store};

use crate::Error;
use crate::nft::apply::NftRunner;
use crate::proxier::{Backend, Stopwatch, SyncReport, SyncState, bisect};
use roadkeeper_rules::config::ProxyConfig;
use roadkeeper_rules::nft::node::{layouts, objects};
use roadkeeper_rules::nft::objects::Objects;
use roadkeeper_rules::nft::rule::Op;
use roadkeeper_rules::nft::transaction::{self, PartialOps, Shared};
use roadkeeper_rules::table::{NodeInfo, ServicePort};

/// Plans and programs one node's nftables rules.
pub struct NftProxier<R: NftRunner> {
    cfg: ProxyConfig,
    state: SyncState,
    runner: R,
    /// What the Services share in the kernel (count sets, shared elements).
    shared: Shared,
}

impl<R: NftRunner> NftProxier<R> {
    /// A proxier that will start with a full sync.
    pub fn new(cfg: ProxyConfig, node: NodeInfo, runner: R) -> Self {
        NftProxier { cfg, state: SyncState::new(node), runner, shared: Shared::default() }
    }

    /// The runner (for health checks of the kernel state).
    pub fn runner(&mut self) -> &mut R {
        &mut self.runner
    }

    /// The objects in the kernel for Service `key`: those of its last applied ports.
    fn applied(&self, key: &NamespacedName) -> Objects {
        objects(&self.cfg, &self.state.node, self.state.table.get(key).map_or(&[][..], Vec::as_slice))
    }

    /// Plans the Services `keys` and those whose frontends changed owner because of them: their
    /// table entries and nft objects.
    fn plan<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a NamespacedName>,
        store: &Store,
    ) -> BTreeMap<NamespacedName, (Vec<ServicePort>, Objects)> {
        let ports = self.state.plan_ports(keys, store, &self.cfg);
        ports
            .into_iter()
            .map(|(key, ports)| {
                let objects = objects(&self.cfg, &self.state.node, &ports);
                (key, (ports, objects))
            })
            .collect()
    }
}

impl<R: NftRunner> Backend for NftProxier<R> {
    fn state(&self) -> &SyncState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut SyncState {
        &mut self.state
    }

    /// Rewrites everything we own, the layout and every Service's objects, in one netlink
    /// transaction. Each Service's objects are built only while its ops are encoded: the encoded
    /// batch is the one copy of the plan held while the kernel commits.
    fn full_sync(&mut self, store: &Store) -> Result<SyncReport, Error> {
        self.state.claims.clear();
        let keys: Vec<NamespacedName> = store.services().map(|(k, _)| k.clone()).collect();
        let mut planned = self.state.plan_ports(&keys, store, &self.cfg);
        let existing = self.state.kernel.time(|| self.runner.existing())?;
        let layouts = layouts(&self.cfg, &self.state.node, &self.state.service_cidrs);
        let (cfg, node) = (&self.cfg, &self.state.node);
        // Emits the ops of a full sync of the Services in `only` (all: None); returns what they
        // share and how many ops there were.
        let stream = |planned: &BTreeMap<NamespacedName, Vec<ServicePort>>,
                      only: Option<&[NamespacedName]>,
                      emit: &mut dyn FnMut(&Op)| {
            let only: Option<BTreeSet<&NamespacedName>> = only.map(|keys| keys.iter().collect());
            let services = planned
                .iter()
                .filter(|(k, _)| only.as_ref().is_none_or(|keys| keys.contains(k)))
                .map(|(_, ports)| objects(cfg, node, ports));
            let mut count = 0;
            let shared = transaction::stream_full_sync(&layouts, services, &existing, &mut |op| {
                count += 1;
                emit(op);
            });
            (shared, count)
        };
        // What the last stream of all Services shared, and its ops.
        let outcome = RefCell::new((Shared::default(), 0));
        let apply_all =
            |runner: &mut R, kernel: &mut Stopwatch, planned: &BTreeMap<NamespacedName, Vec<ServicePort>>| {
                kernel.time(|| runner.apply_stream(&|emit| *outcome.borrow_mut() = stream(planned, None, emit)))
            };
        let mut refused = Vec::new();
        if let Err(err) = apply_all(&mut self.runner, &mut self.state.kernel, &planned) {
            if !err.is_refusal() {
                return Err(err);
            }
            tracing::warn!(error = %err, "full sync refused by the kernel; looking for the offending Services");
            let (runner, kernel) = (&mut self.runner, &mut self.state.kernel);
            let bad = bisect(&keys, &mut |subset| {
                let mut ops = Vec::new();
                stream(&planned, Some(subset), &mut |op| ops.push(op.clone()));
                kernel.time(|| runner.check_ops(&ops))
            });
            if bad.is_empty() {
                return Err(err);
            }
            for (key, why) in bad {
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
                // Keep the last good ports of a refused Service, if it had any.
                planned.insert(key.clone(), self.state.table.get(&key).cloned().unwrap_or_default());
                refused.push((key, why.to_string()));
            }
            apply_all(&mut self.runner, &mut self.state.kernel, &planned)?;
        }
        let (shared, ops) = outcome.into_inner();
        self.state.needs_full = false;
        self.state.table.clear();
        self.shared = shared;
        let changed = planned.len();
        for (key, ports) in planned {
            self.state.set_table(&key, ports);
        }
        Ok(SyncReport { full: true, services_changed: changed, ops, refused, ..SyncReport::default() })
    }

    /// Applies only the differences of the `changed` Services, as one transaction of ops.
    fn partial_sync(&mut self, store: &Store, changed: &BTreeSet<NamespacedName>) -> Result<SyncReport, Error> {
        // Each changed Service: its new ports and objects, its old objects, the ops between them.
        let mut plans: BTreeMap<NamespacedName, (Vec<ServicePort>, Objects, Objects, PartialOps)> = BTreeMap::new();
        for (key, (ports, objects)) in self.plan(changed, store) {
            let old = self.applied(&key);
            // (Shared elements are not in the ops: compare the objects.)
            if old == objects {
                self.state.set_table(&key, ports);
                continue;
            }
            let ops = transaction::partial_sync(&old, &objects);
            plans.insert(key, (ports, objects, old, ops));
        }
        let shared = &self.shared;
        // The ops of some of the planned Services, with what they share, and the change of the
        // shared state they make.
        let join = |keys: &[&NamespacedName]| {
            let changes: Vec<(&Objects, &Objects)> = keys.iter().map(|k| (&plans[*k].2, &plans[*k].1)).collect();
            let (extra, next) = shared.partial(&changes);
            (transaction::join_partial(std::iter::once(&extra).chain(keys.iter().map(|k| &plans[*k].3))), next)
        };
        let keys: Vec<&NamespacedName> = plans.keys().collect();
        let (mut ops, mut shared_change) = join(&keys);
        let mut refused = Vec::new();
        if !ops.is_empty()
            && let Err(err) = self.state.kernel.time(|| self.runner.apply_ops(&ops))
        {
            if !err.is_refusal() {
                return Err(err);
            }
            tracing::warn!(error = %err, "partial sync refused by the kernel; looking for the offending Services");
            let (runner, kernel) = (&mut self.runner, &mut self.state.kernel);
            let bad = bisect(&keys, &mut |subset| {
                let (ops, _) = join(subset);
                kernel.time(|| runner.check_ops(&ops))
            });
            if bad.is_empty() {
                return Err(err);
            }
            for (key, why) in &bad {
                tracing::error!(service = %key, error = %why, "kernel refused the rules of this Service; keeping its last good rules");
                refused.push(((*key).clone(), why.to_string()));
            }
            let good: Vec<&NamespacedName> =
                keys.iter().filter(|k| !bad.iter().any(|(b, _)| b == *k)).copied().collect();
            (ops, shared_change) = join(&good);
            if !ops.is_empty() {
                self.state.kernel.time(|| self.runner.apply_ops(&ops))?;
            }
        }
        self.shared.apply(shared_change);
        let refused_keys: BTreeSet<NamespacedName> = refused.iter().map(|(k, _)| k.clone()).collect();
        let mut services_changed = 0;
        for (key, (ports, ..)) in plans {
            if refused_keys.contains(&key) {
                continue;
            }
            services_changed += 1;
            self.state.set_table(&key, ports);
        }
        Ok(SyncReport { full: false, services_changed, ops: ops.len(), refused, ..SyncReport::default() })
    }

    /// Our tables exist and the dispatch rule is in place (not timed: not part of a sync).
    fn rules_in_place(&mut self) -> Result<bool, Error> {
        self.runner.healthy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::answer::{KernelError, NetlinkError};
    use crate::nft::apply::Recorder;
    use crate::proxier::Proxier;
    use crate::proxier::testing::{cluster, service};
    use roadkeeper_rules::nft::rule::Op;
    use roadkeeper_rules::nft::transaction::{Existing, script};

    fn proxier<R: NftRunner>(runner: R) -> NftProxier<R> {
        NftProxier::new(ProxyConfig::default(), NodeInfo::default(), runner)
    }

    fn changed(name: &str) -> BTreeSet<NamespacedName> {
        BTreeSet::from([NamespacedName::new("default", name)])
    }

    #[test]
    fn a_full_sync_sends_the_node_plan() {
        let store = cluster(3, 0);
        let mut p = proxier(Recorder::default());
        p.set_service_cidrs(vec!["10.96.0.0/12".parse().unwrap()]);
        p.sync(&store, &BTreeSet::new()).unwrap();
        let cidrs = ["10.96.0.0/12".parse().unwrap()];
        let plan = roadkeeper_rules::plan::NodePlan::new(&store, &ProxyConfig::default(), &NodeInfo::default(), &cidrs);
        assert_eq!(p.runner().scripts, [script(&plan.nftables().ops())]);
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
        // Every op is svc-1's (deletions name its ClusterIP, additions it), or an element of the
        // hairpin set its endpoints share with others.
        let ours = |l: &str| l.contains("default/svc-1") || l.contains("{ 10.96.0.1 . ") || l.contains(" hairpin { ");
        assert!(ops_per_size[0].lines().all(ours), "{}", ops_per_size[0]);
    }

    /// Refuses every batch that touches Services whose name contains `poison`, or both halves
    /// of `clash`; or every batch as a whole with `errno` (no capability, say); or cannot list
    /// the tables.
    #[derive(Default)]
    struct Refuser {
        poison: Option<String>,
        clash: Option<(String, String)>,
        errno: Option<i32>,
        unreadable: bool,
        applied: Vec<String>,
        checks: usize,
    }

    impl Refuser {
        fn judge(&self, ops: &[Op]) -> Result<(), Error> {
            let text = script(ops);
            let refused = |op: &str| {
                let error = KernelError { errno: libc::EINVAL, message: None };
                Err(Error::Netlink(NetlinkError::Refused { index: 0, op: op.into(), error }))
            };
            if let Some(errno) = self.errno {
                let error = KernelError { errno, message: None };
                return Err(Error::Netlink(NetlinkError::Batch { ops: ops.len(), error }));
            }
            match (&self.poison, &self.clash) {
                (Some(p), _) if text.contains(p.as_str()) => refused(p),
                (_, Some((a, b))) if text.contains(a.as_str()) && text.contains(b.as_str()) => refused(b),
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
            self.checks += 1;
            self.judge(ops)
        }
        fn existing(&mut self) -> Result<Existing, Error> {
            Ok(Existing::default())
        }
        fn healthy(&mut self) -> Result<bool, Error> {
            if self.unreadable {
                let error = KernelError { errno: libc::ENOBUFS, message: None };
                return Err(Error::Netlink(NetlinkError::Dump { what: "rules", error }));
            }
            Ok(true)
        }
    }

    fn two_services() -> Store {
        Store::from_objects(service("a", 1, 2, 0).into_iter().chain(service("b", 2, 2, 0)))
    }

    #[test]
    fn a_refusal_caused_by_two_services_together_blames_one_and_applies_the_other() {
        let runner = Refuser { clash: Some(("default/a".into(), "default/b".into())), ..Refuser::default() };
        let mut p = proxier(runner);
        let report = p.sync(&two_services(), &BTreeSet::new()).unwrap();
        assert_eq!(report.refused.iter().map(|(k, _)| k.name.as_str()).collect::<Vec<_>>(), ["b"]);
        let last = p.runner().applied.last().unwrap().clone();
        assert!(last.contains("default/a") && !last.contains("default/b"), "{last}");
    }

    #[test]
    fn a_batch_refused_as_a_whole_is_an_error_and_is_not_bisected() {
        let mut p = proxier(Refuser { errno: Some(libc::EPERM), ..Refuser::default() });
        let err = p.sync(&two_services(), &BTreeSet::new()).unwrap_err();
        assert!(err.to_string().contains("Operation not permitted"), "{err}");
        assert_eq!(p.runner().checks, 0, "permission errors are not narrowed down to Services");
        assert!(p.runner().applied.is_empty());
    }

    #[test]
    fn tables_that_cannot_be_read_are_unknown_not_missing() {
        let mut p = proxier(Refuser { unreadable: true, ..Refuser::default() });
        assert!(matches!(p.check_rules(), crate::proxier::RulesCheck::Unknown(_)));
        p.runner().unreadable = false;
        assert!(matches!(p.check_rules(), crate::proxier::RulesCheck::InPlace));
    }

    #[test]
    fn a_refused_service_keeps_its_last_good_rules_and_the_others_apply() {
        let before = Store::from_objects(service("good", 1, 2, 0).into_iter().chain(service("bad", 2, 2, 0)));
        let after = Store::from_objects(service("good", 1, 2, 1).into_iter().chain(service("bad", 2, 2, 1)));
        let mut p = proxier(Refuser::default());
        p.sync(&before, &BTreeSet::new()).unwrap();
        let bad = NamespacedName::new("default", "bad");
        let bad_before = p.applied(&bad);
        p.runner().poison = Some("default/bad".into());
        let both = changed("good").into_iter().chain(changed("bad")).collect();
        let report = p.sync(&after, &both).unwrap();
        assert_eq!(report.refused.len(), 1);
        assert_eq!(report.refused[0].0, NamespacedName::new("default", "bad"));
        assert!(report.refused[0].1.contains("Invalid argument"), "{:?}", report.refused);
        assert_eq!(report.services_changed, 1);
        let last = p.runner().applied.last().unwrap().clone();
        assert!(last.contains("default/good") && !last.contains("default/bad"), "{last}");
        assert_eq!(p.applied(&bad), bad_before, "last good objects are kept");
        // Once the kernel accepts it again, the next sync retries `bad` without being asked.
        assert!(p.wants_retry());
        p.runner().poison = None;
        let report = p.sync(&after, &BTreeSet::new()).unwrap();
        assert_eq!(report.services_changed, 1);
        assert_ne!(p.applied(&bad), bad_before);
    }
}
