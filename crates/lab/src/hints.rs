//! What `lab up` suggests trying (pure): the tutorial's commands, and the lab's, named after what
//! the lab runs of the manifest folder (its Ingresses, Services, and pods with their
//! Deployments), never after the tutorial's example.

use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::{NamespacedName, Store};

use crate::state::{LabDir, Pod, State};
use crate::system::{INGRESS_SERVICE, NAMESPACE};

/// `(the tutorial's command, the lab's)` pairs for the lab's generated state `store`.
pub fn hints(store: &Store, state: &State, lab: &LabDir) -> Vec<(String, String)> {
    let mut hints = vec![
        ("kubectl get pods -o wide".to_owned(), "roadkeeper lab get pods -A -o wide".to_owned()),
        ("kubectl get endpointslices".to_owned(), "roadkeeper lab get endpointslices -A".to_owned()),
    ];
    let lb = state.allocations.lb_ips.get(&format!("{NAMESPACE}/{INGRESS_SERVICE}"));
    // The first path of the first Ingress the lab's controller serves (it has an address).
    let route = store.ingresses().filter(|(k, i)| k.namespace != NAMESPACE && i.status.is_some()).find_map(|(_, i)| {
        i.spec.as_ref()?.rules.iter().flatten().find_map(|rule| {
            let path = rule.http.as_ref()?.paths.first()?;
            Some((rule.host.clone(), path.path.clone().unwrap_or_else(|| "/".into())))
        })
    });
    let user_services: Vec<(&NamespacedName, &Service)> =
        store.services().filter(|(k, _)| k.namespace != NAMESPACE).map(|(k, s)| (k, &**s)).collect();
    if let (Some((host, path)), Some(lb)) = (&route, lb) {
        let header = host.as_ref().map(|h| format!(" -H 'Host: {h}'")).unwrap_or_default();
        let domain = host.as_deref().unwrap_or("your-domain");
        hints.push((
            format!("curl http://{domain}{path}"),
            format!("roadkeeper lab exec client -- curl -si{header} http://{lb}{path}"),
        ));
    } else if let Some((key, ip, port)) = user_services.iter().find_map(|(k, s)| Some((k, lb_ip(s)?, port(s)?))) {
        hints.push((
            format!("curl http://EXTERNAL-IP:{port}/ ({key})"),
            format!("roadkeeper lab exec client -- curl -si http://{ip}:{port}/"),
        ));
    }
    let pod = example_pod(state);
    if let Some(pod) = pod {
        let target = in_namespace(&pod.name, &pod.namespace);
        let mount = pod.spec.containers.first().and_then(|c| c.volume_mounts.iter().flatten().next());
        let (tutorial, command) = match mount {
            Some(mount) => (format!("ls {}", mount.mount_path), format!("ls {}", mount.mount_path)),
            None => ("hostname".to_owned(), "hostname".to_owned()),
        };
        hints.push((format!("kubectl exec POD -- {tutorial}"), format!("roadkeeper lab exec {target} -- {command}")));
    }
    // (The generated state has the pods, not their Deployments: a pod names its owner.)
    let owned = state.pods.iter().filter(|p| p.namespace != NAMESPACE && !p.terminating);
    if let Some((namespace, deployment)) =
        owned.clone().find_map(|p| Some((&p.namespace, &p.owner.as_ref()?.deployment)))
    {
        let flag = namespace_flag(namespace);
        hints.push((
            format!("kubectl scale deployment/{deployment} --replicas=5"),
            format!("roadkeeper lab scale deployment/{deployment}{flag} --replicas=5"),
        ));
    }
    if let Some((pod, key)) =
        pod.and_then(|p| Some((p, p.labels.keys().find(|k| *k != crate::replicas::TEMPLATE_HASH_LABEL)?)))
    {
        let target = in_namespace(&pod.name, &pod.namespace);
        hints.push((
            format!("kubectl label pod POD {key}=removed --overwrite"),
            format!("roadkeeper lab label pod {target} {key}=removed --overwrite"),
        ));
    }
    // The Ingress's backend first, as the walk does.
    let backend = route.as_ref().and_then(|_| {
        store.ingresses().filter(|(k, _)| k.namespace != NAMESPACE).find_map(|(k, i)| {
            let rule = i.spec.as_ref()?.rules.as_ref()?.first()?;
            let service = rule.http.as_ref()?.paths.first()?.backend.service.as_ref()?;
            Some(NamespacedName::new(k.namespace.as_str(), service.name.as_str()))
        })
    });
    if let Some(service) = backend.or_else(|| user_services.first().map(|(k, _)| (*k).clone())) {
        let in_node = |hint: String| (hint.clone(), format!("roadkeeper lab exec node-1 -- {hint}"));
        let cluster_ip = || {
            let svc = store.service(&service)?;
            let ip = svc.spec.as_ref()?.cluster_ip.clone().filter(|ip| ip != "None")?;
            Some((ip, port(svc)?))
        };
        let hint = match state.config.proxy_mode.as_str() {
            "iptables" => Some(in_node(format!("iptables-save -t nat | grep {service}"))),
            // IPVS names no Service: its virtual server is its ClusterIP and port.
            "ipvs" => cluster_ip().map(|(ip, port)| in_node(format!("ipvsadm -Ln -t {ip}:{port}"))),
            // Nor do eBPF mode's maps: its ClusterIP, as `cilium bpf lb list` shows it, read from
            // the node's pinned maps.
            "ebpf" => cluster_ip().map(|(ip, _)| {
                let bpf_root = crate::node_cgroups::bpf_root(lab, "node-1");
                (
                    format!("cilium bpf lb list | grep {ip}"),
                    format!(
                        "roadkeeper rules --proxy-mode ebpf --from-kernel --bpf-root {} | grep {ip}",
                        bpf_root.display()
                    ),
                )
            }),
            _ => Some(in_node(format!("nft list ruleset | grep {service}"))),
        };
        hints.extend(hint);
    }
    match (&route, lb, pod) {
        (Some((host, path)), Some(lb), _) => {
            // A rule's host name resolves to the Ingress's address in the lab's `trace`.
            let authority = host.clone().unwrap_or_else(|| lb.to_string());
            hints.push((
                "(follow one request down the road)".into(),
                format!("roadkeeper trace http://{authority}{path}"),
            ))
        }
        (_, _, Some(pod)) => {
            if let Some((key, port)) = user_services.iter().find_map(|(k, s)| Some((k, port(s)?))) {
                let from = format!("{}/{}", pod.namespace, pod.name);
                let url = format!("http://{}.{}:{port}/", key.name, key.namespace);
                hints.push((
                    "(follow one request down the road)".into(),
                    format!("roadkeeper trace {url} --from {from}"),
                ));
            }
        }
        _ => {}
    }
    hints.push(("(remove everything)".into(), "roadkeeper lab down".into()));
    hints
}

/// The first running pod of the manifests (not the lab's own), ready ones first.
fn example_pod(state: &State) -> Option<&Pod> {
    let mut pods: Vec<&Pod> = state.pods.iter().filter(|p| p.namespace != NAMESPACE && !p.terminating).collect();
    pods.sort_by_key(|p| !p.ready);
    pods.first().copied()
}

fn in_namespace(name: &str, namespace: &str) -> String {
    format!("{name}{}", namespace_flag(namespace))
}

fn namespace_flag(namespace: &str) -> String {
    if namespace == "default" { String::new() } else { format!(" -n {namespace}") }
}

/// The first TCP port of a Service.
fn port(service: &Service) -> Option<i32> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    Some(ports.iter().find(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")?.port)
}

fn lb_ip(service: &Service) -> Option<&str> {
    service.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.as_deref()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use roadkeeper_cluster::Object;
    use serde_json::json;

    use super::*;

    fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn lab(ingress: bool) -> (Store, State) {
        let mut state = crate::testing::state(1);
        state.config.proxy_mode = "iptables".into();
        state.allocations.lb_ips.insert(format!("{NAMESPACE}/{INGRESS_SERVICE}"), Ipv4Addr::new(192, 168, 77, 200));
        let mut pod = crate::testing::pod(
            "shop-abc-x",
            "node-1",
            [10, 244, 1, 2],
            &[("tier", "front"), ("pod-template-hash", "abc")],
        );
        pod.namespace = "store".into();
        pod.owner = Some(crate::state::Owner { deployment: "shop".into(), template_hash: "abc".into() });
        pod.spec.containers[0].volume_mounts =
            Some(vec![serde_json::from_value(json!({"name": "site", "mountPath": "/srv/www"})).unwrap()]);
        state.pods.push(pod);
        let mut objects = vec![Object::Service(object(
            json!({"metadata": {"name": "storefront", "namespace": "store"},
                "spec": {"clusterIP": "10.96.0.120", "ports": [{"port": 8080}]}, "status": {"loadBalancer": {"ingress": [{"ip": "192.168.77.201"}]}}}),
        ))];
        if ingress {
            objects.push(Object::Ingress(object(json!({"metadata": {"name": "shop", "namespace": "store"},
                "spec": {"rules": [{"host": "shop.example", "http": {"paths": [{"path": "/store", "pathType": "Prefix",
                    "backend": {"service": {"name": "storefront", "port": {"number": 8080}}}}]}}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "192.168.77.200"}]}}}))));
        }
        (Store::from_objects(objects), state)
    }

    #[test]
    fn hints_name_what_the_folder_holds() {
        let (store, state) = lab(true);
        let lab_commands: Vec<String> = hints(&store, &state, &LabDir::resolve(Some(std::path::Path::new("/tmp/lab"))))
            .into_iter()
            .map(|(_, lab)| lab)
            .collect();
        assert_eq!(
            lab_commands,
            [
                "roadkeeper lab get pods -A -o wide",
                "roadkeeper lab get endpointslices -A",
                "roadkeeper lab exec client -- curl -si -H 'Host: shop.example' http://192.168.77.200/store",
                "roadkeeper lab exec shop-abc-x -n store -- ls /srv/www",
                "roadkeeper lab scale deployment/shop -n store --replicas=5",
                "roadkeeper lab label pod shop-abc-x -n store tier=removed --overwrite",
                "roadkeeper lab exec node-1 -- iptables-save -t nat | grep store/storefront",
                "roadkeeper trace http://shop.example/store",
                "roadkeeper lab down",
            ]
        );
        // Without an Ingress: the LoadBalancer Service from the client, a trace from the pod.
        let (store, state) = lab(false);
        let lab_commands: Vec<String> = hints(&store, &state, &LabDir::resolve(Some(std::path::Path::new("/tmp/lab"))))
            .into_iter()
            .map(|(_, lab)| lab)
            .collect();
        assert!(lab_commands.contains(&"roadkeeper lab exec client -- curl -si http://192.168.77.201:8080/".into()));
        assert!(
            lab_commands.contains(&"roadkeeper trace http://storefront.store:8080/ --from store/shop-abc-x".into())
        );
    }

    #[test]
    fn in_ebpf_mode_the_rules_hint_reads_the_first_nodes_pinned_maps() {
        let (store, mut state) = lab(true);
        state.config.proxy_mode = "ebpf".into();
        let hints = hints(&store, &state, &LabDir::resolve(Some(std::path::Path::new("/tmp/lab"))));
        let expected = (
            "cilium bpf lb list | grep 10.96.0.120".to_string(),
            "roadkeeper rules --proxy-mode ebpf --from-kernel --bpf-root /tmp/lab/bpf/node-1 | grep 10.96.0.120"
                .to_string(),
        );
        assert!(hints.contains(&expected), "{hints:?}");
    }

    #[test]
    fn in_ipvs_mode_the_rules_hint_lists_the_services_virtual_server() {
        let (store, mut state) = lab(true);
        state.config.proxy_mode = "ipvs".into();
        let hints = hints(&store, &state, &LabDir::resolve(Some(std::path::Path::new("/tmp/lab"))));
        assert!(
            hints.contains(&(
                "ipvsadm -Ln -t 10.96.0.120:8080".into(),
                "roadkeeper lab exec node-1 -- ipvsadm -Ln -t 10.96.0.120:8080".into()
            )),
            "{hints:?}"
        );
    }
}
