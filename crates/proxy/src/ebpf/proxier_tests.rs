use std::collections::BTreeSet;
use std::net::SocketAddr;

use roadkeeper_cluster::NamespacedName;
use roadkeeper_rules::ebpf::{FrontendKey, MapOp, Scope, SlotValue};
use roadkeeper_rules::table::{NodeInfo, Protocol};

use super::*;
use crate::proxier::Proxier;
use crate::proxier::testing::cluster;

fn proxier(runner: FakeMaps) -> EbpfProxier<FakeMaps> {
    EbpfProxier::new(ProxyConfig::default(), NodeInfo::default(), runner)
}

fn changed(name: &str) -> BTreeSet<NamespacedName> {
    BTreeSet::from([NamespacedName::new("default", name)])
}

fn svc(n: u8) -> FrontendKey {
    FrontendKey {
        address: format!("10.96.0.{n}").parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
        scope: Scope::Internal,
    }
}

/// The endpoints the maps send a frontend to.
fn backends(maps: &Maps, frontend: &FrontendKey) -> BTreeSet<SocketAddr> {
    maps.slots(frontend).iter().map(|id| maps.backends[id]).collect()
}

fn endpoints(n: u8, hosts: &[u8]) -> BTreeSet<SocketAddr> {
    hosts.iter().map(|h| format!("10.244.{n}.{h}:8080").parse().unwrap()).collect()
}

#[test]
fn a_full_sync_lays_out_every_service_and_one_endpoint_change_is_a_few_updates() {
    let mut p = proxier(FakeMaps::default());
    let report = p.sync(&cluster(3, 0), &BTreeSet::new()).unwrap();
    assert!(report.full && report.refused.is_empty());
    for n in 1..=3 {
        assert_eq!(backends(&p.runner().maps, &svc(n)), endpoints(n, &[1, 2, 3]));
    }
    let laid_out = p.maps().clone();
    assert_eq!(p.runner().maps, laid_out, "the kernel holds what the proxier laid out");

    p.runner().applied.clear();
    let report = p.sync(&cluster(3, 1), &changed("svc-1")).unwrap();
    assert!(!report.full);
    assert_eq!(backends(&p.runner().maps, &svc(1)), endpoints(1, &[11, 2, 3]));
    let applied = &p.runner().applied;
    // The new backend, its slot, and the old backend's removal: no other frontend is touched.
    assert_eq!(applied.len(), 3, "{applied:?}");
    assert!(matches!(applied[0], MapOp::SetBackend(..)), "the backend exists before a slot names it: {applied:?}");
    assert!(matches!(applied[2], MapOp::DeleteBackend(..)), "{applied:?}");
}

#[test]
fn a_restarted_proxy_adopts_the_maps_and_deletes_only_what_is_stale() {
    let mut first = proxier(FakeMaps::default());
    first.sync(&cluster(3, 0), &BTreeSet::new()).unwrap();
    let kernel = std::mem::take(first.runner());

    // svc-3 was deleted while no proxy ran.
    let mut second = proxier(FakeMaps { maps: kernel.maps.clone(), applied: Vec::new() });
    second.sync(&cluster(2, 0), &BTreeSet::new()).unwrap();
    let applied = &second.runner().applied;
    assert!(
        applied.iter().all(|op| matches!(op, MapOp::DeleteSlot(_) | MapOp::DeleteBackend(_) | MapOp::DeleteRevNat(_))),
        "an unchanged Service costs no update: {applied:?}"
    );
    assert!(second.runner().maps.master(&svc(3)).is_none());
    for n in 1..=2 {
        assert_eq!(second.runner().maps.master(&svc(n)), kernel.maps.master(&svc(n)), "identifiers kept");
    }
}

#[test]
fn a_deleted_service_leaves_the_maps() {
    let mut p = proxier(FakeMaps::default());
    p.sync(&cluster(2, 0), &BTreeSet::new()).unwrap();
    p.sync(&cluster(1, 0), &changed("svc-2")).unwrap();
    let maps = &p.runner().maps;
    assert!(maps.master(&svc(2)).is_none());
    assert!(maps.services.keys().all(|k| k.frontend != svc(2)));
    assert_eq!(maps.backends.len(), 3, "only svc-1's backends are left: {:?}", maps.backends);
    assert!(p.table().get(&NamespacedName::new("default", "svc-2")).is_none());
}

#[test]
fn a_service_without_endpoints_keeps_a_master_entry_that_refuses() {
    let mut p = proxier(FakeMaps::default());
    let store = roadkeeper_cluster::Store::from_objects(crate::proxier::testing::service("svc-1", 1, 0, 0));
    p.sync(&store, &BTreeSet::new()).unwrap();
    let master = p.runner().maps.master(&svc(1)).copied().expect("a master entry");
    assert_eq!((master.count, master.empty), (0, roadkeeper_rules::ebpf::Empty::Reject));
    assert!(p.runner().maps.services.values().all(|v| matches!(v, SlotValue::Master(_))));
}

#[test]
fn a_refused_service_is_reported_once_with_the_reason_of_each_port() {
    let svc = "metadata: {name: dns, namespace: default}\n\
               spec: {clusterIP: 10.96.0.53, ports: [{name: tcp, port: 53}, {name: udp, port: 53, protocol: UDP}]}\n";
    let slice = "metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}\n\
                 addressType: IPv4\nports: [{name: tcp, port: 5353}, {name: udp, port: 5353, protocol: UDP}]\n\
                 endpoints: [{addresses: [10.244.0.5]}]\n";
    let store = roadkeeper_cluster::Store::from_objects([
        roadkeeper_cluster::Object::Service(serde_saphyr::from_str(svc).unwrap()),
        roadkeeper_cluster::Object::EndpointSlice(serde_saphyr::from_str(slice).unwrap()),
    ]);
    let mut cfg = ProxyConfig::default();
    cfg.ebpf.limits.services = 1;
    let mut p = EbpfProxier::new(cfg, NodeInfo::default(), FakeMaps::default());
    let report = p.sync(&store, &BTreeSet::new()).unwrap();
    assert_eq!(report.refused.len(), 1, "{:?}", report.refused);
    let (service, reasons) = &report.refused[0];
    assert_eq!(service, &NamespacedName::new("default", "dns"));
    assert!(
        reasons.contains("dns:tcp") && reasons.contains("dns:udp") && reasons.contains("services map"),
        "{reasons}"
    );
}
