//! The status rules of the module documentation, against a model of the API server that takes
//! the planned writes and reports them back as changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use roadkeeper_cluster::{Changes, NamespacedName, Object, Store};
use serde_json::{Value, json};

use super::*;
use crate::routes::ClassConfig;

fn ours() -> Vec<Address> {
    vec![Address::Ip("192.0.2.10".parse().unwrap()), Address::Hostname("lb.example.com".into())]
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

fn class(name: &str, controller: &str, default: bool) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": name, "annotations": {"ingressclass.kubernetes.io/is-default-class": default.to_string()}},
        "spec": {"controller": controller}})
}

fn our_class(default: bool) -> Value {
    class("roadkeeper", "roadkeeper.dev/ingress", default)
}

fn nginx_class() -> Value {
    class("nginx", "k8s.io/ingress-nginx", false)
}

/// An Ingress naming class `class` (none: no `ingressClassName`).
fn ingress(name: &str, class: Option<&str>) -> Value {
    let mut spec = json!({"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}});
    if let Some(class) = class {
        spec["ingressClassName"] = class.into();
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name, "namespace": "ns"},
        "spec": spec})
}

/// `ingress` carrying `entries` in `status.loadBalancer.ingress`.
fn with_status(mut ingress: Value, entries: Value) -> Value {
    ingress["status"] = json!({"loadBalancer": {"ingress": entries}});
    ingress
}

fn our_entries() -> Value {
    json!([{"ip": "192.0.2.10"}, {"hostname": "lb.example.com"}])
}

fn update(name: &str, addresses: Vec<Address>) -> StatusUpdate {
    StatusUpdate { ingress: nn(name), addresses }
}

/// The objects the API server holds, by kind and name.
#[derive(Clone, Default, PartialEq, Debug)]
struct Cluster(BTreeMap<(String, String), Value>);

impl Cluster {
    fn new(objects: Vec<Value>) -> Self {
        let mut cluster = Self::default();
        objects.into_iter().for_each(|object| cluster.put(object));
        cluster
    }

    fn put(&mut self, object: Value) {
        let key =
            (object["kind"].as_str().unwrap().to_owned(), object["metadata"]["name"].as_str().unwrap().to_owned());
        self.0.insert(key, object);
    }

    fn delete(&mut self, kind: &str, name: &str) {
        self.0.remove(&(kind.to_owned(), name.to_owned()));
    }

    fn ingress(&self, name: &str) -> &Value {
        &self.0[&("Ingress".to_owned(), name.to_owned())]
    }

    /// What `status.loadBalancer.ingress` of Ingress `name` holds (`null` when absent).
    fn status(&self, name: &str) -> Value {
        self.ingress(name)["status"]["loadBalancer"]["ingress"].clone()
    }

    fn store(&self) -> Store {
        Store::from_objects(self.0.values().map(|value| match value["kind"].as_str().unwrap() {
            "Ingress" => Object::Ingress(Arc::new(serde_json::from_value(value.clone()).unwrap())),
            _ => Object::IngressClass(Arc::new(serde_json::from_value(value.clone()).unwrap())),
        }))
    }

    /// Takes `updates` as the API server takes a status patch (a missing Ingress is a 404);
    /// the changes its watchers then report.
    fn write(&mut self, updates: &[StatusUpdate]) -> Changes {
        let mut changes = Changes::default();
        for update in updates {
            let key = ("Ingress".to_owned(), update.ingress.name.clone());
            if let Some(ingress) = self.0.get_mut(&key) {
                ingress["status"] = json!({"loadBalancer": {"ingress": update.entries()}});
                changes.ingresses.insert(update.ingress.clone());
            }
        }
        changes
    }

    /// What changed from `before` to `self`, as a watcher reports it.
    fn changes_since(&self, before: &Cluster) -> Changes {
        let mut changes = Changes::default();
        let keys = self.0.keys().chain(before.0.keys());
        for (kind, name) in keys.filter(|key| self.0.get(*key) != before.0.get(*key)) {
            match kind.as_str() {
                "Ingress" => changes.ingresses.insert(nn(name)),
                _ => changes.ingress_classes.insert(name.clone()),
            };
        }
        changes
    }
}

/// The controller's loop: a route table applied incrementally and a planner, over `cluster`.
struct Controller {
    table: RouteTable,
    planner: StatusPlanner,
    cluster: Cluster,
}

impl Controller {
    /// Starts on `cluster`; the writes of the first table.
    fn start(cluster: Cluster) -> (Self, Vec<StatusUpdate>) {
        let store = cluster.store();
        let table = RouteTable::build(&store, &ClassConfig::default()).0;
        let mut planner = StatusPlanner::new(ours());
        let updates = planner.plan_all(&store, &table);
        (Self { table, planner, cluster }, updates)
    }

    /// Moves to `cluster`; the writes its changes need.
    fn change(&mut self, cluster: Cluster) -> Vec<StatusUpdate> {
        let changes = cluster.changes_since(&self.cluster);
        self.cluster = cluster;
        self.react(&changes)
    }

    /// Applies the writes and feeds their echo back until nothing more is asked (at most one
    /// round more: a write coming back must not ask for another).
    fn settle(&mut self, mut updates: Vec<StatusUpdate>) {
        for _ in 0..2 {
            if updates.is_empty() {
                return;
            }
            let changes = self.cluster.write(&updates);
            updates = self.react(&changes);
        }
        assert!(updates.is_empty(), "our own writes keep asking for writes: {updates:?}");
    }

    fn react(&mut self, changes: &Changes) -> Vec<StatusUpdate> {
        let store = self.cluster.store();
        self.table.apply(&store, changes, &ClassConfig::default());
        self.planner.plan(&store, &self.table, changes)
    }
}

#[test]
fn ours_get_our_addresses_and_ingresses_of_other_classes_are_untouched() {
    let mut legacy = ingress("legacy", None);
    legacy["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": "roadkeeper"});
    let cluster = Cluster::new(vec![
        our_class(false),
        nginx_class(),
        ingress("web", Some("roadkeeper")),
        legacy,
        with_status(ingress("theirs", Some("nginx")), json!([{"ip": "198.51.100.1"}])),
        ingress("bare", Some("nginx")),
        // Another controller publishing the same addresses: never served by us, never cleared.
        with_status(ingress("same-address", Some("nginx")), our_entries()),
    ]);
    let (mut controller, updates) = Controller::start(cluster);
    assert_eq!(updates, [update("legacy", ours()), update("web", ours())]);
    controller.settle(updates);
    assert_eq!((controller.cluster.status("web"), controller.cluster.status("legacy")), (our_entries(), our_entries()));
    assert_eq!(controller.cluster.status("theirs"), json!([{"ip": "198.51.100.1"}]));
    assert_eq!(controller.cluster.status("bare"), Value::Null);
    assert_eq!(controller.cluster.status("same-address"), our_entries());
}

#[test]
fn an_ingress_already_carrying_our_addresses_is_not_written_again() {
    let cluster = Cluster::new(vec![our_class(false), with_status(ingress("web", Some("roadkeeper")), our_entries())]);
    // A restart: the status as watched is already right.
    let (mut controller, updates) = Controller::start(cluster.clone());
    assert_eq!(updates, []);
    // An edit of the Ingress that keeps its status asks for nothing either.
    let mut labelled = with_status(ingress("web", Some("roadkeeper")), our_entries());
    labelled["metadata"]["labels"] = json!({"a": "b"});
    let mut edited = cluster.clone();
    edited.put(labelled);
    assert_eq!(controller.change(edited), []);
    // The same addresses in another order, or only some of them, are rewritten.
    for entries in [json!([{"hostname": "lb.example.com"}, {"ip": "192.0.2.10"}]), json!([{"ip": "192.0.2.10"}])] {
        let mut other = cluster.clone();
        other.put(with_status(ingress("web", Some("roadkeeper")), entries));
        assert_eq!(controller.change(other), [update("web", ours())]);
    }
}

#[test]
fn an_ingress_leaving_our_class_is_cleared_once_unless_another_controller_wrote_its_own() {
    let cluster = Cluster::new(vec![
        our_class(false),
        nginx_class(),
        ingress("web", Some("roadkeeper")),
        ingress("api", Some("roadkeeper")),
    ]);
    let (mut controller, updates) = Controller::start(cluster);
    controller.settle(updates);

    let mut moved = controller.cluster.clone();
    moved.put(with_status(ingress("web", Some("nginx")), our_entries()));
    let updates = controller.change(moved);
    assert_eq!(updates, [update("web", vec![])]);
    controller.settle(updates);
    assert_eq!(controller.cluster.status("web"), json!([]));
    assert!(!controller.planner.claimed.contains(&nn("web")));

    // The new controller wrote its own address before we saw the class change: not ours to clear.
    let mut taken = controller.cluster.clone();
    taken.put(with_status(ingress("api", Some("nginx")), json!([{"ip": "198.51.100.1"}])));
    assert_eq!(controller.change(taken), []);
    // And should it later publish our very addresses, it is cleared once, then left alone.
    let mut same = controller.cluster.clone();
    same.put(with_status(ingress("api", Some("nginx")), our_entries()));
    assert_eq!(controller.change(same.clone()), [update("api", vec![])]);
    let mut again = same.clone();
    again.put(with_status(ingress("api", Some("nginx")), json!([])));
    controller.change(again);
    assert_eq!(controller.change(same), []);
}

#[test]
fn a_write_landing_after_its_ingress_left_our_class_is_cleared() {
    let cluster = Cluster::new(vec![our_class(false), nginx_class(), ingress("web", Some("roadkeeper"))]);
    let (mut controller, pending) = Controller::start(cluster);
    assert_eq!(pending, [update("web", ours())]);
    let mut moved = controller.cluster.clone();
    moved.put(ingress("web", Some("nginx")));
    assert_eq!(controller.change(moved), [], "nothing of ours to clear yet");
    let changes = controller.cluster.write(&pending);
    assert_eq!(controller.react(&changes), [update("web", vec![])]);
}

#[test]
fn our_class_losing_its_default_clears_the_ingresses_it_claimed() {
    let cluster = Cluster::new(vec![our_class(true), ingress("implicit", None), ingress("web", Some("roadkeeper"))]);
    let (mut controller, updates) = Controller::start(cluster);
    assert_eq!(updates, [update("implicit", ours()), update("web", ours())]);
    controller.settle(updates);
    let mut changed = controller.cluster.clone();
    changed.put(our_class(false));
    assert_eq!(controller.change(changed), [update("implicit", vec![])]);
}

#[test]
fn a_deleted_ingress_needs_no_write_and_is_forgotten() {
    let cluster = Cluster::new(vec![our_class(false), ingress("web", Some("roadkeeper"))]);
    let (mut controller, updates) = Controller::start(cluster);
    controller.settle(updates);
    let mut deleted = controller.cluster.clone();
    deleted.delete("Ingress", "web");
    assert_eq!(controller.change(deleted), []);
    assert!(controller.planner.claimed.is_empty());
}

#[test]
fn addresses_are_ips_or_dns_names() {
    let parse = |text: &str| text.parse::<Address>();
    assert_eq!(parse("192.0.2.10"), Ok(Address::Ip("192.0.2.10".parse().unwrap())));
    assert_eq!(parse("2001:db8::1"), Ok(Address::Ip("2001:db8::1".parse().unwrap())));
    assert_eq!(parse("lb.example.com"), Ok(Address::Hostname("lb.example.com".into())));
    assert_eq!(parse("lb-1.example"), Ok(Address::Hostname("lb-1.example".into())));
    assert_eq!(parse("localhost").map(|a| a.to_string()), Ok("localhost".into()));
    let long_label = "a".repeat(64);
    for bad in ["", "LB.example.com", "lb_1.example", "-lb.example", "lb-.example", "a..b", "192.0.2.300", "[::1]"]
        .into_iter()
        .chain([long_label.as_str()])
    {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
    let update = update("web", ours());
    assert_eq!(serde_json::to_value(update.entries()).unwrap(), our_entries());
    assert_eq!(StatusPlanner::new(ours()).addresses(), ours());
}

#[test]
fn incremental_planning_ends_where_a_fresh_start_does() {
    let start = Cluster::new(vec![
        our_class(false),
        nginx_class(),
        ingress("a", Some("roadkeeper")),
        ingress("b", Some("nginx")),
        ingress("c", None),
    ]);
    let steps: [fn(&mut Cluster); 7] = [
        |c| c.put(ingress("d", Some("roadkeeper"))),
        |c| c.put(with_status(ingress("a", Some("nginx")), c.status("a"))),
        |c| c.put(our_class(true)),
        |c| c.delete("Ingress", "d"),
        |c| c.put(ingress("b", Some("roadkeeper"))),
        |c| c.put(with_status(ingress("c", Some("unknown")), c.status("c"))),
        |c| c.put(our_class(false)),
    ];
    let (mut controller, updates) = Controller::start(start);
    controller.settle(updates);
    for (i, step) in steps.iter().enumerate() {
        let mut next = controller.cluster.clone();
        step(&mut next);
        let updates = controller.change(next);
        controller.settle(updates);

        // A fresh start on the same objects, statuses stripped, publishes the same statuses.
        let mut pristine = controller.cluster.clone();
        for ((kind, _), object) in &mut pristine.0 {
            if kind == "Ingress" {
                object.as_object_mut().unwrap().remove("status");
            }
        }
        let (mut fresh, updates) = Controller::start(pristine);
        fresh.settle(updates);
        let statuses = |c: &Cluster| -> Vec<bool> {
            c.0.keys().filter(|(kind, _)| kind == "Ingress").map(|(_, name)| c.status(name) == our_entries()).collect()
        };
        assert_eq!(statuses(&controller.cluster), statuses(&fresh.cluster), "step {i}");
        // And finds nothing to fix in what the incremental run left.
        let store = controller.cluster.store();
        let table = RouteTable::build(&store, &ClassConfig::default()).0;
        assert_eq!(StatusPlanner::new(ours()).plan_all(&store, &table), [], "step {i}");
    }
}

#[test]
fn a_published_service_gives_its_load_balancer_addresses_else_its_external_ips() {
    let service = |status: Value, external: Value| -> Service {
        serde_json::from_value(json!({"metadata": {"name": "lb", "namespace": "ns"},
            "spec": {"type": "LoadBalancer", "externalIPs": external}, "status": {"loadBalancer": status}}))
        .unwrap()
    };
    let pending = service(json!({}), json!(null));
    assert_eq!(service_addresses(&pending), []);
    let external = service(json!({}), json!(["192.0.2.7", "not-an-ip"]));
    assert_eq!(service_addresses(&external), [Address::Ip("192.0.2.7".parse().unwrap())]);
    // The load balancer's entries win, in order; an entry that is no address is left out.
    let published = json!({"ingress": [{"ip": "192.0.2.10"}, {"hostname": "lb.example.com"},
        {"hostname": "Bad_Name"}, {"ipMode": "VIP"}]});
    assert_eq!(service_addresses(&service(published, json!(["192.0.2.7"]))), ours());
}

#[test]
fn new_addresses_move_every_ingress_we_serve_and_none_but_ours() {
    let cluster = Cluster::new(vec![
        our_class(false),
        nginx_class(),
        ingress("web", Some("roadkeeper")),
        with_status(ingress("theirs", Some("nginx")), json!([{"ip": "198.51.100.1"}])),
    ]);
    let (mut controller, _) = Controller::start(cluster);
    // Our Service has no load balancer address yet: the Ingress carries none (and is not written).
    assert!(controller.planner.set_addresses(Vec::new()));
    let store = controller.cluster.store();
    assert_eq!(controller.planner.plan_all(&store, &controller.table), []);
    assert!(!controller.planner.set_addresses(Vec::new()), "the same addresses are no change");
    // It gets one: every Ingress we serve takes it.
    assert!(controller.planner.set_addresses(ours()));
    let updates = controller.planner.plan_all(&store, &controller.table);
    assert_eq!(updates, [update("web", ours())]);
    controller.settle(updates);
    assert_eq!(controller.cluster.status("web"), our_entries());
    assert_eq!(controller.cluster.status("theirs"), json!([{"ip": "198.51.100.1"}]));
    // And loses it again.
    assert!(controller.planner.set_addresses(Vec::new()));
    let store = controller.cluster.store();
    let updates = controller.planner.plan_all(&store, &controller.table);
    assert_eq!(updates, [update("web", Vec::new())]);
}
