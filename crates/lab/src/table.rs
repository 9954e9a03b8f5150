//! `lab get` (pure): the columns `kubectl get` 1.34 prints for pods, services, endpointslices,
//! ingresses and nodes (with `-o wide`), aligned as kubectl aligns them, read from the lab's
//! generated cluster state.

use std::time::{Duration, SystemTime};

use roadkeeper_cluster::Store;
use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::selector::Selector;

/// What `lab get` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `pods`.
    Pods,
    /// `services`.
    Services,
    /// `endpointslices`.
    EndpointSlices,
    /// `ingress`.
    Ingresses,
    /// `nodes`.
    Nodes,
}

impl Resource {
    /// The resource a `kubectl get` argument names (with kubectl's short names).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pods" | "pod" | "po" => Self::Pods,
            "services" | "service" | "svc" => Self::Services,
            "endpointslices" | "endpointslice" => Self::EndpointSlices,
            "ingresses" | "ingress" | "ing" => Self::Ingresses,
            "nodes" | "node" | "no" => Self::Nodes,
            _ => return None,
        })
    }
}

/// How to list.
#[derive(Clone, Debug)]
pub struct Options {
    /// The namespace listed; `None`: all of them (a NAMESPACE column first).
    pub namespace: Option<String>,
    /// `-o wide`.
    pub wide: bool,
    /// `-l`.
    pub selector: Selector,
    /// `--show-labels`: a LABELS column last.
    pub show_labels: bool,
    /// The time ages are counted to.
    pub now: SystemTime,
}

/// The table, or `None` when nothing matched (kubectl then says "No resources found").
pub fn table(store: &Store, resource: Resource, options: &Options) -> Option<String> {
    let namespaced = resource != Resource::Nodes;
    let all_namespaces = namespaced && options.namespace.is_none();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let wanted = |meta: &ObjectMeta| {
        let in_namespace = !namespaced
            || options.namespace.as_deref().is_none_or(|ns| meta.namespace.as_deref().unwrap_or("default") == ns);
        in_namespace && options.selector.matches(meta.labels.as_ref())
    };
    let mut push = |meta: &ObjectMeta, cells: Vec<String>| {
        if wanted(meta) {
            let namespace = all_namespaces.then(|| meta.namespace.clone().unwrap_or_default());
            let labels = options.show_labels.then(|| labels(meta));
            rows.push(namespace.into_iter().chain(cells).chain(labels).collect());
        }
    };
    let age = |meta: &ObjectMeta| age_of(meta.creation_timestamp.as_ref(), options.now);
    let header: &[&str] = match resource {
        Resource::Pods => {
            for (_, pod) in store.pods() {
                push(&pod.metadata, pod_row(pod, options, age(&pod.metadata)));
            }
            if options.wide {
                &["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
            } else {
                &["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
            }
        }
        Resource::Services => {
            for (_, service) in store.services() {
                push(&service.metadata, service_row(service, options.wide, age(&service.metadata)));
            }
            if options.wide {
                &["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
            } else {
                &["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
            }
        }
        Resource::EndpointSlices => {
            for (key, service) in store.services() {
                for slice in store.slices_for(key) {
                    // Derived slices have no time of their own: they are as old as their Service.
                    let created =
                        slice.metadata.creation_timestamp.as_ref().or(service.metadata.creation_timestamp.as_ref());
                    let ports = list(slice.ports.iter().flatten().map(|p| match (p.port, &p.name) {
                        (Some(port), _) => port.to_string(),
                        (None, Some(name)) => name.clone(),
                        (None, None) => "*".into(),
                    }));
                    let endpoints = list(slice.endpoints.iter().flat_map(|e| e.addresses.iter().cloned()));
                    let cells = vec![
                        name(&slice.metadata),
                        slice.address_type.clone(),
                        ports,
                        endpoints,
                        age_of(created, options.now),
                    ];
                    push(&slice.metadata, cells);
                }
            }
            &["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
        }
        Resource::Ingresses => {
            for (_, ingress) in store.ingresses() {
                let spec = ingress.spec.clone().unwrap_or_default();
                let class = spec.ingress_class_name.clone().unwrap_or_else(|| "<none>".into());
                let rules = spec.rules.unwrap_or_default();
                let hosts = hosts(rules.iter().map(|r| r.host.clone().unwrap_or_default()).collect());
                let status =
                    ingress.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.clone());
                let addresses: Vec<String> = status.into_iter().flatten().filter_map(|i| i.ip.or(i.hostname)).collect();
                let ports = if spec.tls.is_some_and(|tls| !tls.is_empty()) { "80, 443" } else { "80" };
                let cells = vec![
                    name(&ingress.metadata),
                    class,
                    hosts,
                    load_balancer(&addresses, options.wide),
                    ports.into(),
                    age(&ingress.metadata),
                ];
                push(&ingress.metadata, cells);
            }
            &["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
        }
        Resource::Nodes => {
            for node in store.nodes() {
                push(&node.metadata, node_row(node, options.wide, age(&node.metadata)));
            }
            if options.wide {
                &[
                    "NAME",
                    "STATUS",
                    "ROLES",
                    "AGE",
                    "VERSION",
                    "INTERNAL-IP",
                    "EXTERNAL-IP",
                    "OS-IMAGE",
                    "KERNEL-VERSION",
                    "CONTAINER-RUNTIME",
                ]
            } else {
                &["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
            }
        }
    };
    if rows.is_empty() {
        return None;
    }
    let header: Vec<String> = all_namespaces
        .then_some("NAMESPACE")
        .into_iter()
        .chain(header.iter().copied())
        .chain(options.show_labels.then_some("LABELS"))
        .map(String::from)
        .collect();
    Some(align(std::iter::once(header).chain(rows).collect()))
}

/// kubectl's LABELS cell: `k=v,k2=v2` in key order, `<none>` without labels.
fn labels(meta: &ObjectMeta) -> String {
    let pairs: Vec<String> = meta.labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    if pairs.is_empty() { "<none>".to_owned() } else { pairs.join(",") }
}

fn name(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn pod_row(pod: &roadkeeper_cluster::k8s_openapi::api::core::v1::Pod, options: &Options, age: String) -> Vec<String> {
    let status = pod.status.clone().unwrap_or_default();
    let statuses = status.container_statuses.unwrap_or_default();
    let total = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let ready = statuses.iter().filter(|s| s.ready).count();
    let waiting = statuses.iter().find_map(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone());
    let reason = if pod.metadata.deletion_timestamp.is_some() {
        "Terminating".to_owned()
    } else {
        waiting.or(status.phase).unwrap_or_else(|| "Unknown".into())
    };
    let restarts: i32 = statuses.iter().map(|s| s.restart_count).sum();
    let last = statuses
        .iter()
        .filter_map(|s| s.last_state.as_ref()?.terminated.as_ref()?.finished_at.clone())
        .max_by_key(|t| t.0);
    let restarts = match last {
        Some(at) if restarts > 0 => format!("{restarts} ({} ago)", age_of(Some(&at), options.now)),
        _ => restarts.to_string(),
    };
    let mut row = vec![name(&pod.metadata), format!("{ready}/{total}"), reason, restarts, age];
    if options.wide {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        row.extend([
            status.pod_ip.unwrap_or_else(|| "<none>".into()),
            node.unwrap_or_else(|| "<none>".into()),
            "<none>".into(),
            "<none>".into(),
        ]);
    }
    row
}

fn service_row(
    service: &roadkeeper_cluster::k8s_openapi::api::core::v1::Service,
    wide: bool,
    age: String,
) -> Vec<String> {
    let spec = service.spec.clone().unwrap_or_default();
    let kind = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let cluster_ip = spec.cluster_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "<none>".into());
    let mut external: Vec<String> = Vec::new();
    if kind == "LoadBalancer" {
        let status = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.clone());
        external.extend(status.into_iter().flatten().filter_map(|i| i.ip.or(i.hostname)));
    }
    external.extend(spec.external_ips.iter().flatten().cloned());
    let external = match kind.as_str() {
        "ExternalName" => spec.external_name.clone().unwrap_or_default(),
        "LoadBalancer" if external.is_empty() => "<pending>".into(),
        _ if external.is_empty() => "<none>".into(),
        _ => external.join(","),
    };
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            match p.node_port {
                Some(node_port) if node_port != 0 => format!("{}:{node_port}/{protocol}", p.port),
                _ => format!("{}/{protocol}", p.port),
            }
        })
        .collect();
    let ports = if ports.is_empty() { "<none>".into() } else { ports.join(",") };
    let mut row = vec![name(&service.metadata), kind, cluster_ip, external, ports, age];
    if wide {
        let selector: Vec<String> = spec.selector.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
        row.push(if selector.is_empty() { "<none>".into() } else { selector.join(",") });
    }
    row
}

fn node_row(node: &roadkeeper_cluster::k8s_openapi::api::core::v1::Node, wide: bool, age: String) -> Vec<String> {
    let status = node.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").map(|c| c.status == "True");
    let mut state = match ready {
        Some(true) => "Ready".to_owned(),
        Some(false) => "NotReady".to_owned(),
        None => "Unknown".to_owned(),
    };
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        state.push_str(",SchedulingDisabled");
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let mut roles: Vec<&str> = labels.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/")).collect();
    roles.extend(labels.get("kubernetes.io/role").map(String::as_str));
    roles.sort();
    let roles = if roles.is_empty() { "<none>".into() } else { roles.join(",") };
    let info = status.node_info.clone().unwrap_or_default();
    let mut row = vec![name(&node.metadata), state, roles, age, info.kubelet_version.clone()];
    if wide {
        let address = |kind: &str| {
            let found = status.addresses.iter().flatten().find(|a| a.type_ == kind);
            found.map_or_else(|| "<none>".into(), |a| a.address.clone())
        };
        let unknown = |text: String| if text.is_empty() { "<unknown>".to_owned() } else { text };
        row.extend([
            address("InternalIP"),
            address("ExternalIP"),
            unknown(info.os_image),
            unknown(info.kernel_version),
            unknown(info.container_runtime_version),
        ]);
    }
    row
}

/// Up to 3 items joined by commas, with `+ N more...` (kubectl's `listWithMoreString`); `<unset>`
/// when there are none.
fn list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    match items.len() {
        0 => "<unset>".into(),
        n if n > 3 => format!("{} + {} more...", items[..3].join(","), n - 3),
        _ => items.join(","),
    }
}

/// An Ingress's hosts (kubectl's `formatHosts`): `*` when no rule names one.
fn hosts(hosts: Vec<String>) -> String {
    let named: Vec<&String> = hosts.iter().filter(|h| !h.is_empty()).take(3).collect();
    if named.is_empty() {
        return "*".into();
    }
    let joined = named.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(",");
    if hosts.len() > 3 { format!("{joined} + {} more...", hosts.len() - 3) } else { joined }
}

/// Load-balancer addresses, cut to 16 characters unless wide (kubectl's `loadBalancerStatusStringer`).
fn load_balancer(addresses: &[String], wide: bool) -> String {
    let text = addresses.join(",");
    if !wide && text.len() > 16 { format!("{}...", &text[..13]) } else { text }
}

fn age_of(created: Option<&Time>, now: SystemTime) -> String {
    let Some(created) = created else { return "<unknown>".into() };
    let created: SystemTime = created.0.into();
    match now.duration_since(created) {
        Ok(elapsed) => human_duration(elapsed),
        Err(ahead) if ahead.duration() < Duration::from_secs(2) => "0s".into(),
        Err(_) => "<invalid>".into(),
    }
}

/// kubectl's `HumanDuration`.
pub fn human_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    let (minutes, hours) = (seconds / 60, seconds / 3600);
    let days = hours / 24;
    match () {
        _ if seconds < 120 => format!("{seconds}s"),
        _ if minutes < 10 && seconds.is_multiple_of(60) => format!("{minutes}m"),
        _ if minutes < 10 => format!("{minutes}m{}s", seconds % 60),
        _ if minutes < 180 => format!("{minutes}m"),
        _ if hours < 8 && minutes % 60 == 0 => format!("{hours}h"),
        _ if hours < 8 => format!("{hours}h{}m", minutes % 60),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 192 && hours % 24 == 0 => format!("{days}d"),
        _ if hours < 192 => format!("{days}d{}h", hours % 24),
        _ if days < 730 => format!("{days}d"),
        _ if days < 2920 && days % 365 == 0 => format!("{}y", days / 365),
        _ if days < 2920 => format!("{}y{}d", days / 365, days % 365),
        _ => format!("{}y", days / 365),
    }
}

/// Aligns rows as kubectl's tab writer does: every column but the last as wide as its widest
/// cell plus 3 spaces (at least 6).
pub fn align(rows: Vec<Vec<String>>) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count() + 3).max().unwrap_or(0).max(6))
        .collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (c, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if c < last {
                out.extend(std::iter::repeat_n(' ', widths[c] - cell.chars().count()));
            }
        }
        out.push('\n');
    }
    out
}

/// The message kubectl prints when nothing matched.
pub fn nothing_found(resource: Resource, namespace: Option<&str>) -> String {
    match (resource, namespace) {
        (Resource::Nodes, _) | (_, None) => "No resources found".into(),
        (_, Some(namespace)) => format!("No resources found in {namespace} namespace."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_cluster::Object;
    use serde_json::json;
    use std::sync::Arc;

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2025-01-01T00:05:03Z").unwrap()
    }

    fn options(wide: bool) -> Options {
        Options {
            namespace: Some("default".into()),
            wide,
            selector: Selector::default(),
            show_labels: false,
            now: now(),
        }
    }

    fn store() -> Store {
        let state = crate::testing::state(2);
        let mut pod = crate::testing::pod("hello-abc", "node-2", [10, 244, 2, 2], &[("app", "hello")]);
        pod.containers[0].process =
            Some(crate::state::ProcessRef { name: "web".into(), pid: 1, start_time: 1, log: "/l".into() });
        let mut state = state;
        state.pods.push(pod);
        let hello: roadkeeper_cluster::k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "metadata": {"name": "hello", "namespace": "default", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.100", "selector": {"app": "hello"},
                "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.168.77.200"}]}}}))
        .unwrap();
        let files = crate::render::render(&crate::render::Inputs {
            state: &state,
            services: &[hello],
            manifests: &Store::default(),
            ingress_classes: &[],
            node_info: &crate::render::NodeInfo {
                os_image: "Debian".into(),
                kernel: "6.1".into(),
                architecture: "amd64".into(),
            },
        });
        let objects = files.values().filter_map(|text| {
            let value: serde_json::Value = serde_json::from_slice(text).unwrap();
            Some(match value["kind"].as_str()? {
                "Pod" => Object::Pod(Arc::new(serde_json::from_value(value).unwrap())),
                "Service" => Object::Service(Arc::new(serde_json::from_value(value).unwrap())),
                "Node" => Object::Node(Arc::new(serde_json::from_value(value).unwrap())),
                _ => return None,
            })
        });
        Store::from_objects(objects)
    }

    #[test]
    fn pods_as_kubectl_prints_them() {
        let store = store();
        assert_eq!(
            table(&store, Resource::Pods, &options(false)).unwrap(),
            "NAME        READY   STATUS    RESTARTS   AGE\nhello-abc   1/1     Running   0          5m3s\n"
        );
        let wide = table(&store, Resource::Pods, &options(true)).unwrap();
        assert_eq!(
            wide.lines().nth(1).unwrap(),
            "hello-abc   1/1     Running   0          5m3s   10.244.2.2   node-2   <none>           <none>"
        );
        let mut removed = options(false);
        removed.selector = Selector::parse("app=removed").unwrap();
        assert_eq!(table(&store, Resource::Pods, &removed), None);
        let labelled = Options { show_labels: true, ..options(false) };
        assert_eq!(
            table(&store, Resource::Pods, &labelled).unwrap().lines().nth(1).unwrap(),
            "hello-abc   1/1     Running   0          5m3s   app=hello"
        );
    }

    #[test]
    fn services_slices_and_nodes() {
        let store = store();
        assert_eq!(
            table(&store, Resource::Services, &options(true)).unwrap(),
            "NAME    TYPE           CLUSTER-IP    EXTERNAL-IP      PORT(S)        AGE    SELECTOR\n\
             hello   LoadBalancer   10.96.0.100   192.168.77.200   80:30080/TCP   5m3s   app=hello\n"
        );
        let slices = table(&store, Resource::EndpointSlices, &options(false)).unwrap();
        let row: Vec<&str> = slices.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[1..], ["IPv4", "80", "10.244.2.2", "5m3s"]);
        let nodes = table(&store, Resource::Nodes, &Options { namespace: None, ..options(true) }).unwrap();
        let row: Vec<&str> = nodes.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[..3], ["node-1", "Ready", "<none>"]);
        assert_eq!(row[5..], ["192.168.77.11", "<none>", "Debian", "6.1", "roadkeeper-lab://0.1.0"]);
    }

    #[test]
    fn kubectl_durations_and_lists() {
        let d = |s: u64| human_duration(Duration::from_secs(s));
        assert_eq!(
            [
                d(59),
                d(119),
                d(120),
                d(303),
                d(600),
                d(7260),
                d(3 * 3600 + 60),
                d(30 * 3600),
                d(50 * 3600),
                d(800 * 86400)
            ],
            ["59s", "119s", "2m", "5m3s", "10m", "121m", "3h1m", "30h", "2d2h", "2y70d"]
        );
        assert_eq!(list(["a", "b", "c", "d", "e"].map(String::from).into_iter()), "a,b,c + 2 more...");
        assert_eq!(list(std::iter::empty()), "<unset>");
        assert_eq!(hosts(vec!["".into()]), "*");
        assert_eq!(load_balancer(&["192.168.77.200".into(), "192.168.77.201".into()], false), "192.168.77.20...");
    }
}
