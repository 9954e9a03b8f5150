//! The lab's own objects (pure), run like any others: the cluster DNS (`roadkeeper dns` behind
//! `kube-system/kube-dns` at 10.96.0.10, as kubeadm's CoreDNS), the Ingress controller
//! (`roadkeeper ingress` behind the LoadBalancer Service `kube-system/roadkeeper-ingress`) and
//! its default IngressClass `roadkeeper`. Their containers run the `roadkeeper` image, which the
//! lab runs as its own binary with the container's arguments.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use roadkeeper_cluster::Object;
use serde_json::{Value, json};

/// kube-dns's ClusterIP: the nameserver of every pod's `resolv.conf`.
pub const DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The namespace of the lab's components.
pub const NAMESPACE: &str = "kube-system";
/// The Ingress controller's Service (LoadBalancer) in [`NAMESPACE`].
pub const INGRESS_SERVICE: &str = "roadkeeper-ingress";
/// The cluster domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The image whose containers run the roadkeeper binary itself.
pub const ROADKEEPER_IMAGE: &str = "roadkeeper";

/// The lab's objects; the components read the cluster state from `cluster_dir` and the DNS
/// server forwards other names to `upstream`.
pub fn objects(cluster_dir: &Path, upstream: Ipv4Addr) -> Vec<Object> {
    let manifests = cluster_dir.display().to_string();
    let dns_args = json!([
        "dns",
        "--manifests",
        manifests,
        "--listen",
        "0.0.0.0:53",
        "--upstream",
        upstream.to_string(),
        "--health-bind-address",
        "0.0.0.0:8080",
        "--metrics-bind-address",
        "0.0.0.0:9153"
    ]);
    let ingress_args = json!([
        "ingress",
        "--manifests",
        manifests,
        "--http",
        "0.0.0.0:8080",
        "--https",
        "0.0.0.0:8443",
        "--metrics-bind-address",
        "0.0.0.0:10254"
    ]);
    let dns_ports = json!([{"name": "dns", "containerPort": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "containerPort": 53}, {"name": "metrics", "containerPort": 9153}]);
    let ingress_ports = json!([{"name": "http", "containerPort": 8080}, {"name": "https", "containerPort": 8443},
        {"name": "metrics", "containerPort": 10254}]);
    let values = [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": NAMESPACE,
            "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": DNS_IP.to_string(), "selector": {"k8s-app": "kube-dns"}, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}]}}),
        deployment("roadkeeper-dns", json!({"k8s-app": "kube-dns"}), "dns", dns_args, dns_ports),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "roadkeeper",
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
            "spec": {"controller": "roadkeeper.dev/ingress"}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": INGRESS_SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "LoadBalancer", "selector": {"app.kubernetes.io/name": INGRESS_SERVICE}, "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "https", "port": 443, "targetPort": "https"}]}}),
        deployment(
            INGRESS_SERVICE,
            json!({"app.kubernetes.io/name": INGRESS_SERVICE}),
            "ingress",
            ingress_args,
            ingress_ports,
        ),
    ];
    values.into_iter().map(object).collect()
}

fn deployment(name: &str, labels: Value, container: &str, args: Value, ports: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"dnsPolicy": "Default",
                "containers": [{"name": container, "image": ROADKEEPER_IMAGE, "args": args, "ports": ports}]}}}})
}

fn object(value: Value) -> Object {
    let kind = value["kind"].as_str().unwrap_or_default().to_owned();
    let parsed = match kind.as_str() {
        "Service" => serde_json::from_value(value).map(|o| Object::Service(Arc::new(o))),
        "Deployment" => serde_json::from_value(value).map(|o| Object::Deployment(Arc::new(o))),
        _ => serde_json::from_value(value).map(|o| Object::IngressClass(Arc::new(o))),
    };
    parsed.unwrap_or_else(|err| panic!("the lab's own {kind} does not parse: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_objects_parse() {
        let objects = objects(Path::new("/lab/cluster"), Ipv4Addr::new(203, 0, 113, 10));
        assert_eq!(objects.len(), 5);
        let Object::Deployment(dns) = &objects[1] else { panic!() };
        let args = dns.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
        assert_eq!(args[..3], ["dns", "--manifests", "/lab/cluster"]);
    }
}
