//! The generated cluster state (pure): what an API server would hold for the lab, as one JSON
//! file per object (`<kind>_<namespace>_<name>.json`, all in one folder: a file created in a
//! new subfolder could be missed by a watcher that has not yet seen the subfolder), which every
//! component reads with `--manifests`.
//!
//! Nodes with their addresses and pod ranges; Pods as the lab runs them (node, address, Ready
//! condition, container statuses, owner); Services with what [`crate::alloc`] handed out;
//! Ingresses with the Ingress controller's load-balancer address in their status when it serves
//! them; the manifests' EndpointSlices, IngressClasses and Secrets as they are; a Namespace for
//! every namespace used and the lab's ServiceCIDR.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::k8s_openapi::api::networking::v1::IngressClass;
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use roadkeeper_cluster::{NamespacedName, Object, Store};
use roadkeeper_ingress::routes::{ClassConfig, RouteTable};
use roadkeeper_netlab::cluster::SERVICE_CIDR;
use serde::Serialize;
use serde_json::{Value, json};

use crate::state::{Pod, State};

/// What the nodes report of their system (`kubectl get nodes -o wide`).
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    /// `PRETTY_NAME` of the host's os-release.
    pub os_image: String,
    /// The kernel release.
    pub kernel: String,
    /// The machine architecture as Go names it (`amd64`, `arm64`).
    pub architecture: String,
}

/// What the generated state is made of.
pub struct Inputs<'a> {
    /// The lab: nodes, pods, allocations, first-seen times.
    pub state: &'a State,
    /// Every accepted Service, allocations written in.
    pub services: &'a [Service],
    /// The manifests (EndpointSlices, Ingresses, IngressClasses, Secrets, Namespaces).
    pub manifests: &'a Store,
    /// The lab's own IngressClasses.
    pub ingress_classes: &'a [Arc<IngressClass>],
    /// What nodes report of their system.
    pub node_info: &'a NodeInfo,
}

/// The files of the generated cluster state, by path relative to its folder.
pub fn render(inputs: &Inputs) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = Files::default();
    let state = inputs.state;
    let mut namespaces: BTreeSet<String> = ["default", "kube-system"].map(String::from).into();
    for node in state.nodes() {
        files.add("node", "", &node.name, &node_object(state, node, inputs.node_info));
    }
    for pod in &state.pods {
        namespaces.insert(pod.namespace.clone());
        files.add("pod", &pod.namespace, &pod.name, &pod_object(state, pod));
    }
    for service in inputs.services {
        let mut service = service.clone();
        let key = stamp(state, "Service", &mut service.metadata);
        namespaces.insert(key.namespace.clone());
        files.add("service", &key.namespace, &key.name, &typed("v1", "Service", &service));
    }
    let manifests = inputs.manifests;
    for slice in manifests.endpoint_slices() {
        let mut slice = (**slice).clone();
        let key = stamp(state, "EndpointSlice", &mut slice.metadata);
        files.add("endpointslice", &key.namespace, &key.name, &typed("discovery.k8s.io/v1", "EndpointSlice", &slice));
    }
    for secret in manifests.secrets() {
        let key = identity(&secret.metadata);
        files.add("secret", &key.namespace, &key.name, &typed("v1", "Secret", &**secret));
    }
    let classes: Vec<&Arc<IngressClass>> = manifests.ingress_classes().chain(inputs.ingress_classes).collect();
    for class in &classes {
        let mut class = (***class).clone();
        let key = stamp(state, "IngressClass", &mut class.metadata);
        files.add("ingressclass", "", &key.name, &typed("networking.k8s.io/v1", "IngressClass", &class));
    }
    let served = served_ingresses(manifests, &classes, inputs.services);
    let ingress_ip =
        state.allocations.lb_ips.get(&format!("{}/{}", crate::system::NAMESPACE, crate::system::INGRESS_SERVICE));
    for (key, ingress) in manifests.ingresses() {
        let mut ingress = (**ingress).clone();
        stamp(state, "Ingress", &mut ingress.metadata);
        namespaces.insert(key.namespace.clone());
        if let Some(ip) = ingress_ip.filter(|_| served.contains(key)) {
            ingress.status =
                serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}})).ok();
        }
        files.add("ingress", &key.namespace, &key.name, &typed("networking.k8s.io/v1", "Ingress", &ingress));
    }
    namespaces.extend(manifests.namespaces().cloned());
    for namespace in namespaces {
        let mut meta = ObjectMeta { name: Some(namespace.clone()), ..Default::default() };
        stamp(state, "Namespace", &mut meta);
        let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "status": {"phase": "Active"}});
        files.add("namespace", "", &namespace, &object);
    }
    let cidr = json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": [SERVICE_CIDR.to_string()]}});
    files.add("servicecidr", "", "kubernetes", &cidr);
    files.0
}

#[derive(Default)]
struct Files(BTreeMap<PathBuf, Vec<u8>>);

impl Files {
    /// Adds the object `namespace/name` (`namespace` empty for cluster-scoped kinds) of `kind`.
    fn add(&mut self, kind: &str, namespace: &str, name: &str, object: &Value) {
        let path = if namespace.is_empty() {
            format!("{kind}_{name}.json")
        } else {
            format!("{kind}_{namespace}_{name}.json")
        };
        let text = serde_json::to_vec_pretty(object).unwrap_or_default();
        self.0.insert(path.into(), text);
    }
}

/// An object as JSON with its `apiVersion` and `kind`.
fn typed(api_version: &str, kind: &str, object: &impl Serialize) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    value
}

fn identity(meta: &ObjectMeta) -> NamespacedName {
    NamespacedName::new(meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

/// Gives the object its first-seen time as `creationTimestamp` unless it has one; its identity.
fn stamp(state: &State, kind: &str, meta: &mut ObjectMeta) -> NamespacedName {
    let key = identity(meta);
    if meta.creation_timestamp.is_none() {
        let seen = state.first_seen.get(&first_seen_key(kind, &key));
        meta.creation_timestamp = seen.and_then(|time| serde_json::from_value(json!(time)).ok());
    }
    key
}

/// The key of [`State::first_seen`] for an object.
pub fn first_seen_key(kind: &str, key: &NamespacedName) -> String {
    format!("{kind} {key}")
}

/// Every object whose first-seen time the lab keeps, by [`first_seen_key`].
pub fn first_seen_keys(services: &[Service], manifests: &Store, classes: &[Arc<IngressClass>]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    keys.extend(services.iter().map(|s| first_seen_key("Service", &identity(&s.metadata))));
    keys.extend(manifests.endpoint_slices().map(|s| first_seen_key("EndpointSlice", &identity(&s.metadata))));
    keys.extend(manifests.ingresses().map(|(k, _)| first_seen_key("Ingress", k)));
    let classes = manifests.ingress_classes().chain(classes);
    keys.extend(classes.map(|c| first_seen_key("IngressClass", &identity(&c.metadata))));
    keys
}

/// The Ingresses the lab's Ingress controller serves (its class's), as it decides.
fn served_ingresses(
    manifests: &Store,
    classes: &[&Arc<IngressClass>],
    services: &[Service],
) -> BTreeSet<NamespacedName> {
    let ingresses = manifests.ingresses().map(|(_, i)| Object::Ingress(i.clone()));
    let classes = classes.iter().map(|c| Object::IngressClass((*c).clone()));
    let services = services.iter().map(|s| Object::Service(Arc::new(s.clone())));
    let store = Store::from_objects(ingresses.chain(classes).chain(services));
    let (table, _) = RouteTable::build(&store, &ClassConfig::default());
    manifests.ingresses().map(|(k, _)| k.clone()).filter(|k| table.serves(k)).collect()
}

fn node_object(state: &State, node: &crate::state::Host, info: &NodeInfo) -> Value {
    let created = state.first_seen.get(&first_seen_key("Node", &NamespacedName::new("", node.name.as_str())));
    let cidr = node.pod_cidr.map(|c| c.to_string());
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "creationTimestamp": created,
            "labels": {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": info.architecture}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": node.address.to_string()}, {"type": "Hostname", "address": node.name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": created}],
            "nodeInfo": {"architecture": info.architecture, "bootID": "", "containerRuntimeVersion": concat!("roadkeeper-lab://", env!("CARGO_PKG_VERSION")),
                "kernelVersion": info.kernel, "kubeProxyVersion": "", "kubeletVersion": concat!("v", env!("CARGO_PKG_VERSION"), "-roadkeeper-lab"),
                "machineID": "", "operatingSystem": "linux", "osImage": info.os_image, "systemUUID": ""}}})
}

/// The Pod object of a lab pod.
fn pod_object(state: &State, pod: &Pod) -> Value {
    let ready = if pod.ready { "True" } else { "False" };
    let host_ip = state.host(&pod.node).map(|host| host.address).unwrap_or(Ipv4Addr::UNSPECIFIED).to_string();
    let mut spec = serde_json::to_value(&pod.spec).unwrap_or_default();
    spec["nodeName"] = pod.node.clone().into();
    let images: BTreeMap<&str, &str> =
        pod.spec.containers.iter().map(|c| (c.name.as_str(), c.image.as_deref().unwrap_or_default())).collect();
    // A pod whose namespace could not be made: Pending, without an address, as a pod whose
    // containers cannot be created is.
    let created = !pod.netns.is_empty();
    let statuses: Vec<Value> = pod
        .containers
        .iter()
        .map(|c| {
            let running = c.process.is_some();
            let state = if running {
                json!({"running": {"startedAt": pod.ready_since}})
            } else if created {
                json!({"waiting": {"reason": "CrashLoopBackOff"}})
            } else {
                json!({"waiting": {"reason": "CreateContainerError", "message": pod.problems.join("; ")}})
            };
            let last = c.last_exit.as_ref().map(|at| json!({"terminated": {"exitCode": 1, "finishedAt": at}}));
            json!({"name": c.name, "image": images.get(c.name.as_str()), "imageID": "", "ready": running && pod.ready,
                "started": running, "restartCount": c.restarts, "state": state, "lastState": last.unwrap_or(json!({}))})
        })
        .collect();
    let owner = pod.owner.as_ref().map(|owner| {
        vec![json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{}-{}", owner.deployment, owner.template_hash),
            "uid": format!("{}-{}", pod.namespace, owner.deployment), "controller": true, "blockOwnerDeletion": true})]
    });
    let deleting = pod.terminating.then_some(&pod.ready_since);
    let condition =
        |kind: &str, status: &str| json!({"type": kind, "status": status, "lastTransitionTime": pod.ready_since});
    let mut status = json!({"phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod.ip.to_string(), "podIPs": [{"ip": pod.ip.to_string()}], "startTime": pod.created,
        "conditions": [condition("PodScheduled", "True"), condition("Initialized", "True"),
            condition("ContainersReady", ready), condition("Ready", ready)],
        "containerStatuses": statuses});
    if !created {
        status["phase"] = "Pending".into();
        for field in ["podIP", "podIPs"] {
            status.as_object_mut().map(|s| s.remove(field));
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": pod.labels,
            "annotations": pod.annotations, "creationTimestamp": pod.created, "ownerReferences": owner,
            "deletionTimestamp": deleting},
        "spec": spec,
        "status": status})
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_cluster::ManifestSource;
    use roadkeeper_cluster::k8s_openapi::api::networking::v1::Ingress;

    fn ingress(value: Value) -> Arc<Ingress> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn generated_state_reads_back_as_a_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = crate::testing::state(2);
        state.pods.push(crate::testing::pod("hello-abc", "node-2", [10, 244, 2, 2], &[("app", "hello")]));
        // A pod that could not be started: Pending, no address, no endpoint.
        let mut failed = crate::testing::pod("hello-def", "node-1", [10, 244, 1, 2], &[("app", "hello")]);
        (failed.netns, failed.ready, failed.problems) = (String::new(), false, vec!["cannot start: no room".into()]);
        state.pods.push(failed);
        state.allocations.lb_ips.insert("kube-system/roadkeeper-ingress".into(), Ipv4Addr::new(192, 168, 77, 200));
        let hello: Service = serde_json::from_value(json!({"metadata": {"name": "hello", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.100", "selector": {"app": "hello"}, "ports": [{"port": 80}]}}))
        .unwrap();
        let manifests = Store::from_objects([Object::Ingress(ingress(
            json!({"metadata": {"name": "hello", "namespace": "default"},
            "spec": {"rules": [{"http": {"paths": [{"path": "/hello", "pathType": "Prefix",
                "backend": {"service": {"name": "hello", "port": {"number": 80}}}}]}}]}}),
        ))]);
        let classes = crate::system::objects(dir.path(), Ipv4Addr::LOCALHOST)
            .into_iter()
            .filter_map(|o| if let Object::IngressClass(c) = o { Some(c) } else { None })
            .collect::<Vec<_>>();
        let files = render(&Inputs {
            state: &state,
            services: &[hello],
            manifests: &manifests,
            ingress_classes: &classes,
            node_info: &NodeInfo::default(),
        });
        for (path, contents) in &files {
            let full = dir.path().join("cluster").join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, contents).unwrap();
        }
        let (source, errors) = ManifestSource::load(&dir.path().join("cluster")).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let store = source.store();
        assert_eq!(store.nodes().count(), 2);
        let slices = store.slices_for(&NamespacedName::new("default", "hello"));
        assert_eq!(slices.iter().map(|s| s.endpoints.len()).sum::<usize>(), 1);
        assert_eq!(slices[0].endpoints[0].addresses, ["10.244.2.2"]);
        let options = crate::table::Options {
            namespace: Some("default".into()),
            wide: true,
            selector: Default::default(),
            show_labels: false,
            now: std::time::SystemTime::now(),
        };
        let pods = crate::table::table(store, crate::table::Resource::Pods, &options).unwrap();
        let failed = pods.lines().find(|l| l.starts_with("hello-def ")).unwrap();
        let mut columns: Vec<&str> = failed.split_whitespace().collect();
        columns.remove(4); // AGE
        assert_eq!(columns, ["hello-def", "0/1", "CreateContainerError", "0", "<none>", "node-1", "<none>", "<none>"]);
        assert_eq!(slices[0].endpoints[0].node_name.as_deref(), Some("node-2"));
        let ingress = store.ingress(&NamespacedName::new("default", "hello")).unwrap();
        let status = serde_json::to_value(&ingress.status).unwrap();
        assert_eq!(status["loadBalancer"]["ingress"][0]["ip"], "192.168.77.200");
        assert!(store.has_namespace("kube-system"));
    }
}
