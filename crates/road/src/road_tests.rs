//! Roads through a two-node cluster of manifests (no root, no kernel): the tracer over the plan
//! each node's proxy would program, in every backend.

use std::net::{IpAddr, SocketAddr};

use roadkeeper_cluster::{ManifestSource, NamespacedName};
use roadkeeper_ingress::routes::ClassConfig;
use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
use roadkeeper_rules::table::NodeInfo;

use crate::{Node, Observed, Origin, Request, Road, World, road, text};

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {addresses: [{type: InternalIP, address: 192.168.77.11}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
status: {addresses: [{type: InternalIP, address: 192.168.77.12}]}
---
apiVersion: v1
kind: Pod
metadata: {name: hello-a, namespace: default, labels: {app: hello}}
spec: {nodeName: node-1, containers: [{name: web, image: nginx}]}
status: {podIP: 10.244.1.2, podIPs: [{ip: 10.244.1.2}], phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: hello-b, namespace: default, labels: {app: hello}}
spec: {nodeName: node-2, containers: [{name: web, image: nginx}]}
status: {podIP: 10.244.2.2, podIPs: [{ip: 10.244.2.2}], phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: ingress-x, namespace: kube-system, labels: {app: ingress}}
spec: {nodeName: node-1, containers: [{name: ingress, image: roadkeeper}]}
status: {podIP: 10.244.1.4, podIPs: [{ip: 10.244.1.4}], phase: Running}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec: {clusterIP: 10.96.0.100, selector: {app: hello}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hello-1, namespace: default, labels: {kubernetes.io/service-name: hello}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-1, conditions: {ready: true}, targetRef: {kind: Pod, namespace: default, name: hello-a}}
- {addresses: [10.244.2.2], nodeName: node-2, conditions: {ready: true}, targetRef: {kind: Pod, namespace: default, name: hello-b}}
---
apiVersion: v1
kind: Service
metadata: {name: nobody, namespace: default}
spec: {clusterIP: 10.96.0.102, selector: {app: nobody}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.103
  externalTrafficPolicy: Local
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 192.168.77.201}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: default, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.2], nodeName: node-2, conditions: {ready: true}, targetRef: {kind: Pod, namespace: default, name: hello-b}}
---
apiVersion: v1
kind: Service
metadata: {name: roadkeeper-ingress, namespace: kube-system}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.101
  selector: {app: ingress}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30000}]
status: {loadBalancer: {ingress: [{ip: 192.168.77.200}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: roadkeeper-ingress-1, namespace: kube-system, labels: {kubernetes.io/service-name: roadkeeper-ingress}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.4], nodeName: node-1, conditions: {ready: true}, targetRef: {kind: Pod, namespace: kube-system, name: ingress-x}}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: roadkeeper}
spec: {controller: roadkeeper.dev/ingress}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: hello, namespace: default}
spec:
  ingressClassName: roadkeeper
  rules:
  - http:
      paths:
      - {path: /hello, pathType: Prefix, backend: {service: {name: hello, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default}
spec:
  ingressClassName: roadkeeper
  rules:
  - host: web.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: hello, port: {number: 80}}}}
status: {loadBalancer: {ingress: [{ip: 192.168.77.200}]}}
"#;

/// The cluster's nodes, their proxies in `mode`.
fn nodes(mode: ProxyMode) -> Vec<Node> {
    (1..=2)
        .map(|n| {
            let ip: IpAddr = format!("192.168.77.1{n}").parse().unwrap();
            let gateway: IpAddr = format!("10.244.{n}.1").parse().unwrap();
            let info = NodeInfo {
                name: format!("node-{n}"),
                primary_ips: vec![ip],
                local_addresses: vec![ip, gateway],
                zone: None,
            };
            let cfg = ProxyConfig {
                hostname: info.name.clone(),
                mode,
                cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
                ..ProxyConfig::default()
            };
            Node { info, cfg }
        })
        .collect()
}

/// How a landing ends: fate, DNAT target, pod, masqueraded.
type Fate = (&'static str, Option<SocketAddr>, Option<String>, bool);

/// The road of `url` from `origin` in every backend (which must agree on every landing).
fn walk(origin: Origin, url: &str, observed: Observed) -> Road {
    walk_request(origin, Request::parse(url).unwrap(), observed, false)
}

/// The road of `request` from `origin` in every backend; `ingress_dns`: as in the lab.
fn walk_request(origin: Origin, request: Request, observed: Observed, ingress_dns: bool) -> Road {
    let [nftables, ..] = roads(origin, request, observed, ingress_dns);
    nftables
}

/// The roads of `request` from `origin` in nftables, iptables and IPVS mode, checked to agree.
fn roads(origin: Origin, request: Request, observed: Observed, ingress_dns: bool) -> [Road; 3] {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), MANIFESTS).unwrap();
    let (source, errors) = ManifestSource::load(dir.path()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let roads: [Road; 3] = [ProxyMode::Nftables, ProxyMode::Iptables, ProxyMode::Ipvs]
        .map(|mode| road_in(&source, mode, &origin, &request, &observed, ingress_dns));
    let fates = |road: &Road| -> Vec<Vec<Fate>> {
        road.legs
            .iter()
            .map(|leg| {
                let mut l: Vec<_> =
                    leg.landings.iter().map(|l| (l.fate, l.dnat, l.pod.clone(), l.masquerade.is_some())).collect();
                l.sort();
                l
            })
            .collect()
    };
    assert_eq!(fates(&roads[0]), fates(&roads[1]), "nftables and iptables disagree");
    assert_eq!(fates(&roads[0]), fates(&roads[2]), "nftables and IPVS disagree");
    let text = text::render(&roads[0]);
    assert!(text.contains("node proxy  nftables rules of "), "{text}");
    roads
}

/// The road of `request` from `origin` through `source`'s cluster, its nodes in `mode`.
fn road_in(
    source: &ManifestSource,
    mode: ProxyMode,
    origin: &Origin,
    request: &Request,
    observed: &Observed,
    ingress_dns: bool,
) -> Road {
    let world = World {
        store: source.store(),
        nodes: nodes(mode),
        cluster_domain: "cluster.local".into(),
        ingress_service: NamespacedName::new("kube-system", "roadkeeper-ingress"),
        ingress_class: ClassConfig::default(),
        ingress_dns,
    };
    road(&world, origin, request, observed).unwrap()
}

fn pod(namespace: &str, name: &str) -> Origin {
    Origin::Pod(NamespacedName::new(namespace, name))
}

fn client() -> Origin {
    Origin::Outside { name: "client".into(), address: "198.51.100.10".parse().unwrap() }
}

#[test]
fn a_pod_resolves_a_service_name_through_its_search_path_and_lands_on_either_pod() {
    let road = walk(pod("default", "hello-a"), "http://hello/", Observed::default());
    let dns = road.dns.as_ref().unwrap();
    assert_eq!(dns.address, "10.96.0.100".parse::<IpAddr>().unwrap());
    assert_eq!(dns.asked[0].0, "hello.default.svc.cluster.local");
    let leg = &road.legs[0];
    assert_eq!(leg.node, "node-1");
    let service = leg.service.as_ref().unwrap();
    assert_eq!((service.service.as_str(), service.frontend.as_str()), ("default/hello", "ClusterIP 10.96.0.100:80"));
    assert!(service.endpoints.iter().all(|e| e.eligible));
    let mut pods: Vec<_> =
        leg.landings.iter().map(|l| (l.pod.clone().unwrap(), (l.probability * 100.0).round())).collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(pods, [("default/hello-a".to_string(), 50.0), ("default/hello-b".to_string(), 50.0)]);
    // A pod's own traffic to a ClusterIP keeps its source, but for the hairpin back to itself.
    for landing in &leg.landings {
        let hairpin = landing.pod.as_deref() == Some("default/hello-a");
        assert_eq!(landing.masquerade.is_some(), hairpin, "{landing:?}");
    }
    assert!(road.ingress.is_none());
}

#[test]
fn names_outside_the_zone_or_from_outside_hosts_are_not_resolved() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), MANIFESTS).unwrap();
    let (source, _) = ManifestSource::load(dir.path()).unwrap();
    let world = World {
        store: source.store(),
        nodes: nodes(ProxyMode::Nftables),
        cluster_domain: "cluster.local".into(),
        ingress_service: NamespacedName::new("kube-system", "roadkeeper-ingress"),
        ingress_class: ClassConfig::default(),
        ingress_dns: false,
    };
    let err =
        road(&world, &pod("default", "hello-a"), &Request::parse("http://missing/").unwrap(), &Observed::default())
            .unwrap_err();
    assert!(err.to_string().contains("missing.default.svc.cluster.local: NXDOMAIN"), "{err}");
    let err = road(&world, &client(), &Request::parse("http://hello/").unwrap(), &Observed::default()).unwrap_err();
    assert!(err.to_string().starts_with("client resolves names with its own resolver"), "{err}");
    let err = road(&world, &pod("default", "gone"), &Request::parse("http://hello/").unwrap(), &Observed::default())
        .unwrap_err();
    assert_eq!(err.to_string(), "--from pod default/gone: not in the cluster");
}

#[test]
fn the_client_reaches_the_ingress_by_its_load_balancer_address_then_the_backend() {
    let observed = Observed {
        entry_node: Some("node-2".into()),
        dnat: None,
        backend: Some("10.244.2.2".parse().unwrap()),
        resolved: None,
    };
    let road = walk(client(), "http://192.168.77.200/hello", observed);
    let first = &road.legs[0];
    assert_eq!(first.node, "node-2");
    assert_eq!(first.service.as_ref().unwrap().frontend, "LoadBalancer 192.168.77.200:80");
    let landing = &first.landings[first.followed.unwrap()];
    assert_eq!(landing.pod.as_deref(), Some("kube-system/ingress-x"));
    assert_eq!(landing.pod_node.as_deref(), Some("node-1"));
    // Crossing to another node for a Cluster policy: masqueraded.
    assert!(landing.masquerade.is_some());
    let ingress = road.ingress.as_ref().unwrap();
    assert_eq!(ingress.rule.as_deref(), Some("default/hello spec.rules[0].http.paths[0]"));
    assert_eq!(ingress.backend.as_deref(), Some("Service default/hello port 80"));
    let second = &road.legs[1];
    assert_eq!((second.node.as_str(), second.destination), ("node-1", "10.244.2.2:8080".parse().unwrap()));
    assert!(second.service.is_none());
    assert_eq!(second.landings.len(), 1);
    assert_eq!(second.landings[0].pod.as_deref(), Some("default/hello-b"));
    assert!(second.landings[0].masquerade.is_none());
    let text = text::render(&road);
    assert!(
        text.contains("matched default/hello spec.rules[0].http.paths[0] -> Service default/hello port 80"),
        "{text}"
    );

    let road = walk(client(), "http://192.168.77.200/other", Observed::default());
    assert!(road.ingress.as_ref().unwrap().failure.as_ref().unwrap().contains("404"));
    assert_eq!(road.legs.len(), 1);
}

#[test]
fn node_ports_lead_to_the_service_from_the_node_they_are_open_on() {
    let road = walk(client(), "http://192.168.77.12:30000/hello", Observed::default());
    let leg = &road.legs[0];
    assert_eq!(leg.node, "node-2");
    assert_eq!(leg.service.as_ref().unwrap().frontend, "NodePort 192.168.77.12:30000");
    assert_eq!(leg.landings[0].dnat, Some("10.244.1.4:8080".parse().unwrap()));
}

#[test]
fn external_traffic_policy_local_serves_only_on_nodes_with_a_local_endpoint() {
    let on = |node: &str| Observed { entry_node: Some(node.into()), ..Observed::default() };
    let road = walk(client(), "http://192.168.77.201/", on("node-2"));
    let leg = &road.legs[0];
    assert_eq!(leg.service.as_ref().unwrap().policy, "externalTrafficPolicy: Local");
    assert_eq!(leg.landings.len(), 1);
    assert_eq!(leg.landings[0].pod.as_deref(), Some("default/hello-b"));
    assert!(leg.landings[0].masquerade.is_none(), "Local policy keeps the client's address");

    let road = walk(client(), "http://192.168.77.201/", on("node-1"));
    let leg = &road.legs[0];
    let endpoints = &leg.service.as_ref().unwrap().endpoints;
    assert!(endpoints.iter().all(|e| !e.eligible));
    assert_eq!(endpoints[0].ineligible.as_deref(), Some("on another node, and the externalTrafficPolicy is Local"));
    assert_eq!(leg.landings.iter().map(|l| l.fate).collect::<Vec<_>>(), ["dropped"]);
}

#[test]
fn a_service_without_endpoints_is_rejected() {
    let road = walk(pod("default", "hello-b"), "http://nobody.default.svc.cluster.local/", Observed::default());
    let leg = &road.legs[0];
    assert!(leg.service.as_ref().unwrap().endpoints.is_empty());
    assert_eq!(leg.landings.iter().map(|l| l.fate).collect::<Vec<_>>(), ["rejected"]);
    assert!(leg.followed.is_none());
    let text = text::render(&road);
    assert!(text.contains("no endpoints in its EndpointSlices") && text.contains("rejected"), "{text}");
}

#[test]
fn in_ipvs_mode_the_node_proxy_names_the_virtual_server_and_each_real_server() {
    let request = Request::parse("http://hello/").unwrap();
    let [_, _, ipvs] = roads(pod("default", "hello-b"), request, Observed::default(), false);
    let text = text::render(&ipvs);
    let leg = &ipvs.legs[0];
    let followed = leg.landings[leg.followed.unwrap()].dnat.unwrap();
    for line in [
        "node proxy  ipvs rules of node-2, in the order the packet meets them:".to_string(),
        "    IPVS LOCAL_IN (ip_vs hook input priority 99)".into(),
        format!(
            "      #0 virtual server lookup (ipvsadm -Ln) [element TCP 10.96.0.100:80 rr, chance 0.500] => DNAT {followed}"
        ),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
    }
    let mut landings: Vec<(Option<String>, bool)> =
        ipvs.legs[0].landings.iter().map(|l| (l.pod.clone(), l.masquerade.is_some())).collect();
    landings.sort();
    let pod = |name: &str| Some(format!("default/{name}"));
    assert_eq!(landings, [(pod("hello-a"), false), (pod("hello-b"), true)], "the hairpin to itself is masqueraded");
    assert!(text.contains("roadkeeper-ipvs nat-postrouting"), "{text}");
}

#[test]
fn in_ebpf_mode_the_road_names_the_station_that_translated_the_address() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), MANIFESTS).unwrap();
    let (source, _) = ManifestSource::load(dir.path()).unwrap();
    let request = Request::parse("http://hello/").unwrap();
    let road = road_in(&source, ProxyMode::Ebpf, &pod("default", "hello-b"), &request, &Observed::default(), false);
    let mut landings: Vec<(Option<String>, bool)> =
        road.legs[0].landings.iter().map(|l| (l.pod.clone(), l.masquerade.is_some())).collect();
    landings.sort();
    let pod_named = |name: &str| Some(format!("default/{name}"));
    assert_eq!(landings, [(pod_named("hello-a"), false), (pod_named("hello-b"), false)], "no NAT, no masquerade");
    let text = text::render(&road);
    for line in [
        "node proxy  ebpf programs and maps of node-2, in the order the packet meets them:",
        "      RK_SERVICES[10.96.0.100:80/tcp slot 0] -> 2 backends (1) (0) [socket, random, reject when empty, masquerade from outside]",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
    }
    assert!(text.contains("  BPF program rk_connect4: cgroup connect4 of the node's cgroup"), "{text}");
    assert!(text.contains("translated to 10.244.1.2:8080 at the socket by rk_connect4 (no packet is NATed)"), "{text}");

    let request = Request::parse("http://192.168.77.12:30080/").unwrap();
    let road = road_in(&source, ProxyMode::Ebpf, &client(), &request, &Observed::default(), false);
    let text = text::render(&road);
    let landings: Vec<&str> = road.legs.iter().flat_map(|l| &l.landings).map(|l| l.outcome.as_str()).collect();
    assert!(landings.contains(&"DNAT to 10.244.2.2:8080 at the node's NIC by rk_from_outside, forwarded"), "{text}");
    assert!(text.contains("  BPF program rk_from_outside: tc ingress"), "{text}");
}

#[test]
fn a_pod_address_is_reached_directly_without_dnat() {
    let road = walk(pod("default", "hello-a"), "http://10.244.2.2:8080/", Observed::default());
    let leg = &road.legs[0];
    assert!(leg.service.is_none());
    assert_eq!(leg.landings.len(), 1);
    assert_eq!((leg.landings[0].dnat, leg.landings[0].pod.as_deref()), (None, Some("default/hello-b")));
}

/// The Ingress's rule for `host` and the backend pods its road can end on.
fn routed_to_web(road: &Road) {
    let ingress = road.ingress.as_ref().unwrap();
    assert_eq!(ingress.host, "web.example.com");
    assert_eq!(ingress.rule.as_deref(), Some("default/web spec.rules[0].http.paths[0]"));
    assert_eq!(road.legs.len(), 2);
    assert!(road.legs[1].landings[0].pod.as_deref().unwrap().starts_with("default/hello-"));
}

#[test]
fn a_host_header_routes_by_the_ingress_host_and_the_packet_goes_to_the_address() {
    let headers = ["Host: Web.Example.com".to_owned()];
    let request = Request::parse("http://192.168.77.200/").unwrap().with_headers(&headers).unwrap();
    let road = walk_request(client(), request, Observed::default(), false);
    assert!(road.dns.is_none());
    assert_eq!(road.legs[0].destination, "192.168.77.200:80".parse().unwrap());
    routed_to_web(&road);
    let text = text::render(&road);
    assert!(text.starts_with("visitor     http://192.168.77.200/ with Host Web.Example.com from client"), "{text}");
    assert!(text.contains("Ingress     kube-system/ingress-x routes Host web.example.com path /"), "{text}");
    // Without it, the address is the host: no rule for `/`.
    let road = walk(client(), "http://192.168.77.200/", Observed::default());
    assert!(road.ingress.as_ref().unwrap().failure.as_ref().unwrap().contains("404"));
}

#[test]
fn an_ingress_host_resolves_to_its_address_where_the_lab_stands_in_for_dns() {
    let request = || Request::parse("http://web.example.com/").unwrap();
    let road = walk_request(client(), request(), Observed::default(), true);
    let dns = road.dns.as_ref().unwrap();
    assert_eq!(dns.address, "192.168.77.200".parse::<IpAddr>().unwrap());
    assert_eq!(
        dns.asked,
        [("web.example.com".to_owned(), "Ingress default/web: status.loadBalancer 192.168.77.200".to_owned())]
    );
    assert_eq!(road.legs[0].destination, "192.168.77.200:80".parse().unwrap());
    routed_to_web(&road);
    let text = text::render(&road);
    assert!(
        text.contains("DNS         web.example.com -> 192.168.77.200 (the address of Ingress default/web"),
        "{text}"
    );

    // A node of the lab too; a name no Ingress has a rule for is not resolved.
    routed_to_web(&walk_request(Origin::Node("node-2".into()), request(), Observed::default(), true));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), MANIFESTS).unwrap();
    let (source, _) = ManifestSource::load(dir.path()).unwrap();
    let world = World {
        store: source.store(),
        nodes: nodes(ProxyMode::Nftables),
        cluster_domain: "cluster.local".into(),
        ingress_service: NamespacedName::new("kube-system", "roadkeeper-ingress"),
        ingress_class: ClassConfig::default(),
        ingress_dns: true,
    };
    let other = Request::parse("http://other.example.com/").unwrap();
    let err = crate::road(&world, &client(), &other, &Observed::default()).unwrap_err().to_string();
    assert!(err.starts_with("other.example.com: no Ingress with an address has a rule for this host"), "{err}");
    assert!(err.contains("-H 'Host: other.example.com'"), "{err}");
}

#[test]
fn a_name_the_shell_resolved_leads_to_its_address() {
    let observed = Observed { resolved: Some("192.168.77.200".parse().unwrap()), ..Observed::default() };
    let road = walk_request(
        Origin::Node("node-1".into()),
        Request::parse("http://web.example.com/").unwrap(),
        observed,
        false,
    );
    let dns = road.dns.as_ref().unwrap();
    assert_eq!((dns.resolver.as_str(), dns.address), ("this machine's resolver", "192.168.77.200".parse().unwrap()));
    routed_to_web(&road);
}
