//! The lab's ReplicaSet controller and scheduler (pure): which pods must be created, deleted or
//! changed so that every Deployment has its replicas of its current template and every Pod of
//! the manifest folder runs, and on which node with which address each new pod runs.
//!
//! As Kubernetes does it: a Deployment owns the pods its selector matches (adopting orphans);
//! pods of an older template are replaced by pods of the current one; extra pods go, those not
//! ready first, then the newest; a pod relabelled out of its Deployment's selector is released
//! (it keeps running, unowned) and replaced. Pods are named `<deployment>-<template hash>-<5
//! characters>` (the part before the 5 cut to 58 characters, as `generateName` cuts it) and labelled `pod-template-hash`, the hash being FNV-1a of the template encoded
//! as Kubernetes encodes it. New pods go to the node with the fewest pods (the first of equals),
//! or the one `spec.nodeName` or a `kubernetes.io/hostname` node selector names; each node hands
//! out the lowest free address of its pod range.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use roadkeeper_cluster::k8s_openapi::api::apps::v1::Deployment;
use roadkeeper_cluster::k8s_openapi::api::core::v1::Pod as PodObject;
use roadkeeper_cluster::selector_matches;

use crate::state::{Container, Host, Owner, Pod};

/// The label carrying a pod's template hash.
pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// The characters of generated names (Kubernetes' `SafeEncodeString` alphabet).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// What to do to the lab's pods.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// New pods (not started yet).
    pub create: Vec<Pod>,
    /// Pods to delete, by namespace and name.
    pub delete: Vec<(String, String)>,
    /// Pods whose labels or owner change (their new record).
    pub update: Vec<Pod>,
    /// Why wanted pods cannot be made.
    pub problems: Vec<String>,
}

/// What the pods should be, given the Deployments and Pods of the manifests (and the lab's own).
pub struct Wanted<'a> {
    /// Deployments, by namespace and name order.
    pub deployments: Vec<&'a Arc<Deployment>>,
    /// Bare Pods of the manifests.
    pub pods: Vec<&'a Arc<PodObject>>,
}

/// The changes that make `current` (the lab's pods) what `wanted` asks for, on `nodes`.
/// `serial` is the number of the first pod created; `now` the creation time written (RFC 3339).
pub fn reconcile(wanted: &Wanted, current: &[Pod], nodes: &[Host], serial: u32, now: &str) -> Changes {
    let mut changes = Changes::default();
    let mut scheduler = Scheduler::new(nodes, current);
    let mut serial = serial;
    let live: Vec<&Pod> = current.iter().filter(|pod| !pod.terminating).collect();
    let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();

    let deployments: BTreeMap<(String, String), &Arc<Deployment>> =
        wanted.deployments.iter().map(|d| ((namespace(&d.metadata), name(&d.metadata)), *d)).collect();
    // Pods owned by a Deployment that went, or released by their selector.
    for pod in &live {
        let Some(owner) = &pod.owner else { continue };
        match deployments.get(&(pod.namespace.clone(), owner.deployment.clone())) {
            None => {
                deleted.insert(key(pod));
            }
            Some(deployment) if !selects(deployment, pod) => {
                changes.update.push(Pod { owner: None, ..(*pod).clone() });
            }
            Some(_) => {}
        }
    }
    for ((ns, deployment_name), deployment) in &deployments {
        let Some(spec) = &deployment.spec else { continue };
        let hash = template_hash(&spec.template);
        let mine: Vec<&Pod> = live
            .iter()
            .copied()
            .filter(|pod| &pod.namespace == ns && !deleted.contains(&key(pod)) && selects(deployment, pod))
            .filter(|pod| pod.owner.as_ref().is_none_or(|o| &o.deployment == deployment_name))
            .collect();
        let (mut current_template, old): (Vec<&Pod>, Vec<&Pod>) =
            mine.into_iter().partition(|pod| pod.labels.get(TEMPLATE_HASH_LABEL) == Some(&hash));
        deleted.extend(old.iter().map(|pod| key(pod)));
        let replicas = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
        // Adopted orphans become owned.
        for pod in current_template.iter().filter(|pod| pod.owner.is_none()) {
            let owner = Owner { deployment: deployment_name.clone(), template_hash: hash.clone() };
            changes.update.push(Pod { owner: Some(owner), ..(*pod).clone() });
        }
        if current_template.len() > replicas {
            current_template.sort_by_key(|pod| (pod.ready, std::cmp::Reverse(pod.serial)));
            deleted.extend(current_template[..current_template.len() - replicas].iter().map(|pod| key(pod)));
        }
        let template = &spec.template;
        let pod_spec = template.spec.clone().unwrap_or_default();
        for _ in current_template.len()..replicas {
            let name = generate_name(&format!("{deployment_name}-{hash}-"), &suffix(ns, deployment_name, serial));
            let mut labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
            labels.insert(TEMPLATE_HASH_LABEL.into(), hash.clone());
            let annotations = template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
            let owner = Owner { deployment: deployment_name.clone(), template_hash: hash.clone() };
            let new = NewPod { namespace: ns, name, labels, annotations, owner: Some(owner), spec: pod_spec.clone() };
            match scheduler.place(new, serial, now) {
                Ok(pod) => changes.create.push(pod),
                Err(problem) => changes.problems.push(problem),
            }
            serial += 1;
        }
    }

    // Bare pods of the manifests: created, relabelled when their labels there change,
    // recreated when their spec changes, deleted when they go.
    let mut manifest_pods = BTreeSet::new();
    for object in &wanted.pods {
        let (ns, pod_name) = (namespace(&object.metadata), name(&object.metadata));
        manifest_pods.insert((ns.clone(), pod_name.clone()));
        let labels = object.metadata.labels.clone().unwrap_or_default();
        let spec = object.spec.clone().unwrap_or_default();
        match live.iter().find(|pod| pod.namespace == ns && pod.name == pod_name) {
            Some(pod) if pod.spec != spec => {
                deleted.insert(key(pod));
            }
            Some(pod) if pod.manifest_labels.as_ref() != Some(&labels) => {
                changes.update.push(Pod { labels: labels.clone(), manifest_labels: Some(labels), ..(*pod).clone() });
                continue;
            }
            Some(_) => continue,
            None if current.iter().any(|pod| pod.namespace == ns && pod.name == pod_name) => continue,
            None => {}
        }
        if deleted.contains(&(ns.clone(), pod_name.clone())) {
            continue; // recreated once the old one is gone
        }
        let annotations = object.metadata.annotations.clone().unwrap_or_default();
        let new = NewPod { namespace: &ns, name: pod_name, labels, annotations, owner: None, spec };
        match scheduler.place(new, serial, now) {
            Ok(mut pod) => {
                pod.manifest_labels = Some(pod.labels.clone());
                changes.create.push(pod);
            }
            Err(problem) => changes.problems.push(problem),
        }
        serial += 1;
    }
    for pod in &live {
        let from_manifest = pod.manifest_labels.is_some() && pod.owner.is_none();
        if from_manifest && !manifest_pods.contains(&key(pod)) {
            deleted.insert(key(pod));
        }
    }
    changes.update.retain(|pod| !deleted.contains(&key(pod)));
    changes.delete = deleted.into_iter().collect();
    changes
}

/// What a new pod is, before it has a place.
struct NewPod<'a> {
    namespace: &'a str,
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner: Option<Owner>,
    spec: roadkeeper_cluster::k8s_openapi::api::core::v1::PodSpec,
}

/// Pods per node and addresses in use, as pods are placed.
struct Scheduler<'a> {
    nodes: &'a [Host],
    load: Vec<usize>,
    used: BTreeSet<Ipv4Addr>,
}

impl<'a> Scheduler<'a> {
    fn new(nodes: &'a [Host], pods: &[Pod]) -> Self {
        let load = nodes
            .iter()
            .map(|node| pods.iter().filter(|pod| pod.node == node.name && !pod.terminating).count())
            .collect();
        Self { nodes, load, used: pods.iter().map(|pod| pod.ip).collect() }
    }

    /// The new pod's record on its node, or why it has none.
    fn place(&mut self, new: NewPod, serial: u32, now: &str) -> Result<Pod, String> {
        let wanted = new.spec.node_name.clone().or_else(|| {
            new.spec.node_selector.as_ref().and_then(|selector| selector.get("kubernetes.io/hostname").cloned())
        });
        let index = match &wanted {
            Some(node) => self.nodes.iter().position(|host| &host.name == node).ok_or_else(|| {
                format!("Pod {}/{}: spec.nodeName: node {node:?} is not in the lab", new.namespace, new.name)
            })?,
            None => (0..self.nodes.len()).min_by_key(|&i| (self.load[i], i)).ok_or("the lab has no nodes")?,
        };
        let node = &self.nodes[index];
        let cidr = node.pod_cidr.ok_or_else(|| format!("node {} has no pod range", node.name))?;
        let ip =
            cidr.hosts().skip(1).find(|ip| !self.used.contains(ip)).ok_or_else(|| {
                format!("Pod {}/{}: node {} is out of pod addresses", new.namespace, new.name, node.name)
            })?;
        self.used.insert(ip);
        self.load[index] += 1;
        let containers = new
            .spec
            .containers
            .iter()
            .map(|c| Container { name: c.name.clone(), process: None, restarts: 0, last_exit: None })
            .collect();
        let uid = uid(new.namespace, &new.name, serial);
        Ok(Pod {
            namespace: new.namespace.to_owned(),
            name: new.name,
            uid,
            serial,
            node: node.name.clone(),
            ip,
            netns: String::new(),
            veth: format!("veth{serial}"),
            labels: new.labels,
            manifest_labels: None,
            owner: new.owner,
            spec: new.spec,
            annotations: new.annotations,
            created: now.to_owned(),
            ready: false,
            ready_since: now.to_owned(),
            terminating: false,
            containers,
            problems: Vec::new(),
        })
    }
}

fn key(pod: &Pod) -> (String, String) {
    (pod.namespace.clone(), pod.name.clone())
}

fn namespace(meta: &roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_else(|| "default".into())
}

fn name(meta: &roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn selects(deployment: &Deployment, pod: &Pod) -> bool {
    deployment.spec.as_ref().is_some_and(|spec| selector_matches(&spec.selector, &pod.labels))
}

/// The `pod-template-hash` of a template: FNV-1a of its JSON, its decimal digits encoded as
/// Kubernetes' `SafeEncodeString` does.
pub fn template_hash(template: &roadkeeper_cluster::k8s_openapi::api::core::v1::PodTemplateSpec) -> String {
    let json = serde_json::to_vec(template).unwrap_or_default();
    crate::state::fnv1a(&json)
        .to_string()
        .bytes()
        .map(|digit| ALPHABET[usize::from(digit) % ALPHABET.len()] as char)
        .collect()
}

/// The 5 random-looking characters ending a pod's name (from its Deployment and serial).
fn suffix(namespace: &str, deployment: &str, serial: u32) -> String {
    let mut n = crate::state::fnv1a(format!("{namespace}/{deployment}/{serial}").as_bytes());
    (0..5)
        .map(|_| {
            let c = ALPHABET[n as usize % ALPHABET.len()] as char;
            n /= ALPHABET.len() as u32;
            c
        })
        .collect()
}

/// Longest prefix the API server's `generateName` keeps (a name of at most 63 characters with its
/// 5 random ones).
const GENERATE_NAME_PREFIX_MAX: usize = 58;

/// A name generated from `prefix` and `random` as the API server's `generateName` makes it: the
/// prefix cut to [`GENERATE_NAME_PREFIX_MAX`] characters.
fn generate_name(prefix: &str, random: &str) -> String {
    let cut = prefix.char_indices().nth(GENERATE_NAME_PREFIX_MAX).map_or(prefix.len(), |(at, _)| at);
    format!("{}{random}", &prefix[..cut])
}

/// A uid in the form of the API server's (derived from the pod's identity and serial).
fn uid(namespace: &str, name: &str, serial: u32) -> String {
    let a = crate::state::fnv1a(format!("{namespace}/{name}").as_bytes());
    let b = crate::state::fnv1a(format!("{serial}/{name}").as_bytes());
    format!("{a:08x}-{:04x}-4{:03x}-8{:03x}-{serial:04x}{b:08x}", b >> 16, a & 0xfff, b & 0xfff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(name: &str, replicas: i32, labels: serde_json::Value) -> Arc<Deployment> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}))
            .unwrap(),
        )
    }

    fn nodes(n: u8) -> Vec<Host> {
        (1..=n)
            .map(|i| Host {
                name: format!("node-{i}"),
                role: crate::state::Role::Node,
                netns: String::new(),
                address: roadkeeper_netlab::cluster::node_ip(i),
                pod_cidr: Some(roadkeeper_netlab::cluster::pod_cidr(i)),
                processes: Vec::new(),
            })
            .collect()
    }

    /// Applies `changes` to `pods` as the controller would (every new pod ready at once).
    fn apply(pods: &mut Vec<Pod>, changes: Changes) {
        pods.retain(|pod| !changes.delete.contains(&key(pod)));
        for update in changes.update {
            let at = pods.iter().position(|pod| key(pod) == key(&update)).unwrap();
            pods[at] = update;
        }
        pods.extend(changes.create.into_iter().map(|pod| Pod { ready: true, ..pod }));
    }

    #[test]
    fn replicas_are_spread_over_nodes_and_scaled() {
        let hello = deployment("hello", 3, json!({"app": "hello"}));
        let nodes = nodes(2);
        let mut pods = Vec::new();
        let changes = reconcile(&Wanted { deployments: vec![&hello], pods: vec![] }, &pods, &nodes, 0, "t");
        let placed: Vec<(&str, String)> = changes.create.iter().map(|p| (p.node.as_str(), p.ip.to_string())).collect();
        assert_eq!(
            placed,
            [("node-1", "10.244.1.2".into()), ("node-2", "10.244.2.2".into()), ("node-1", "10.244.1.3".into())]
        );
        let hash = &changes.create[0].labels[TEMPLATE_HASH_LABEL];
        assert!(changes.create[0].name.starts_with(&format!("hello-{hash}-")), "{}", changes.create[0].name);
        assert_eq!(changes.create[0].name.len(), "hello-".len() + hash.len() + 6);
        apply(&mut pods, changes);
        assert_eq!(
            reconcile(&Wanted { deployments: vec![&hello], pods: vec![] }, &pods, &nodes, 3, "t"),
            Changes::default()
        );

        let five = deployment("hello", 5, json!({"app": "hello"}));
        let changes = reconcile(&Wanted { deployments: vec![&five], pods: vec![] }, &pods, &nodes, 3, "t");
        assert_eq!(changes.create.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["node-2", "node-1"]);
        apply(&mut pods, changes);
        let changes = reconcile(&Wanted { deployments: vec![&hello], pods: vec![] }, &pods, &nodes, 5, "t");
        // The newest go first.
        let newest: Vec<(String, String)> = pods[3..].iter().map(key).collect();
        assert_eq!(changes.delete, newest.into_iter().rev().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn pods_of_long_deployment_names_are_named_as_generate_name_names_them() {
        // `<deployment>-<hash>-` is cut to 58 characters before the 5 random ones, as the API
        // server's generateName does: the pod's name stays a valid name of at most 63.
        let name = "a".repeat(250);
        let long: Arc<Deployment> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "long"}},
                    "template": {"metadata": {"labels": {"app": "long"}}, "spec": {"containers": [{"name": "web"}]}}}}))
            .unwrap(),
        );
        let changes = reconcile(&Wanted { deployments: vec![&long], pods: vec![] }, &[], &nodes(1), 0, "t");
        let names: Vec<&str> = changes.create.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names.len(), 2);
        for pod in &names {
            assert_eq!(pod.len(), 63, "{pod}");
            assert!(pod.starts_with(&"a".repeat(58)), "{pod}");
        }
        assert_ne!(names[0], names[1]);
        assert_eq!(changes.create[0].owner.as_ref().unwrap().deployment, name);
    }

    #[test]
    fn a_relabelled_pod_is_released_and_replaced_and_a_new_template_replaces_all() {
        let hello = deployment("hello", 2, json!({"app": "hello"}));
        let nodes = nodes(1);
        let mut pods = Vec::new();
        let first = reconcile(&Wanted { deployments: vec![&hello], pods: vec![] }, &pods, &nodes, 0, "t");
        apply(&mut pods, first);
        pods[0].labels.insert("app".into(), "removed".into());
        let changes = reconcile(&Wanted { deployments: vec![&hello], pods: vec![] }, &pods, &nodes, 2, "t");
        assert_eq!(changes.update.len(), 1);
        assert_eq!(changes.update[0].owner, None);
        assert_eq!(changes.create.len(), 1);
        assert!(changes.delete.is_empty());
        apply(&mut pods, changes);
        let relabelled = deployment("hello", 2, json!({"app": "hello", "tier": "web"}));
        let changes = reconcile(&Wanted { deployments: vec![&relabelled], pods: vec![] }, &pods, &nodes, 3, "t");
        assert_eq!(changes.create.len(), 2);
        assert_eq!(changes.delete.len(), 2, "the two pods of the old template go; the released one stays");
        assert!(changes.create.iter().all(|p| p.labels["tier"] == "web"));
        let gone = reconcile(&Wanted { deployments: vec![], pods: vec![] }, &pods, &nodes, 5, "t");
        assert_eq!(gone.delete.len(), 2, "a deleted Deployment's pods go, the released one stays");
    }

    #[test]
    fn manifest_pods_follow_their_file_and_unknown_nodes_are_problems() {
        let nodes = nodes(2);
        let pod = |labels: serde_json::Value, node: Option<&str>| -> Arc<PodObject> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c"}]}}))
                .unwrap(),
            )
        };
        let mut pods = Vec::new();
        let first = pod(json!({"a": "1"}), Some("node-2"));
        let changes = reconcile(&Wanted { deployments: vec![], pods: vec![&first] }, &pods, &nodes, 0, "t");
        assert_eq!(changes.create[0].node, "node-2");
        apply(&mut pods, changes);
        let relabelled = pod(json!({"a": "2"}), Some("node-2"));
        let changes = reconcile(&Wanted { deployments: vec![], pods: vec![&relabelled] }, &pods, &nodes, 1, "t");
        assert_eq!(changes.update[0].labels["a"], "2");
        let elsewhere = pod(json!({"a": "1"}), Some("node-9"));
        let changes = reconcile(&Wanted { deployments: vec![], pods: vec![&elsewhere] }, &pods, &nodes, 1, "t");
        assert_eq!(changes.delete, [("default".to_owned(), "p".to_owned())]);
        assert!(changes.create.is_empty(), "recreated once the old one is gone");
        let changes = reconcile(&Wanted { deployments: vec![], pods: vec![&elsewhere] }, &[], &nodes, 1, "t");
        assert_eq!(changes.problems, ["Pod default/p: spec.nodeName: node \"node-9\" is not in the lab"]);
        assert_eq!(reconcile(&Wanted { deployments: vec![], pods: vec![] }, &pods, &nodes, 1, "t").delete.len(), 1);
    }
}
