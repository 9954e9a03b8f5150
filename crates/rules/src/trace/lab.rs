//! A pure copy of the end-to-end lab for the tracer's tests: node `node-a` (uplink 192.168.77.2 /
//! fd00:77::2, pod bridge 10.244.0.1 / fd00:244::1), pods, an external host (192.168.77.1 /
//! fd00:77::1) and the manifests of `crates/roadkeeper/tests/common`, planned and traced instead
//! of programmed and probed.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use roadkeeper_cluster::{Object, Store};

use super::{Entry, Environment, Fate, Packet, Ruleset, Trace};
use crate::config::{ProxyConfig, ProxyMode};
use crate::plan::{NodePlan, service_cidrs};
use crate::table::{IpFamily, NodeInfo, Protocol};

/// The node's name.
pub const NODE: &str = "node-a";
/// Port of every Service made by [`Lab::service`], TCP and UDP.
pub const PORT: u16 = 80;
/// Port of every pod's echo server.
pub const ECHO: u16 = 8080;
/// Every backend.
pub const BACKENDS: [ProxyMode; 4] = [ProxyMode::Nftables, ProxyMode::Iptables, ProxyMode::Ipvs, ProxyMode::Ebpf];
/// Both families.
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];
/// Both probe protocols.
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];

/// `v4` or `v6`, parsed.
fn pick(family: IpFamily, v4: &str, v6: &str) -> IpAddr {
    match family {
        IpFamily::V4 => v4.parse().expect("address"),
        IpFamily::V6 => v6.parse().expect("address"),
    }
}

/// ClusterIP `10.96.0.<n>` / `fd00:96::<n>`.
pub fn cluster_ip(family: IpFamily, n: u8) -> IpAddr {
    pick(family, &format!("10.96.0.{n}"), &format!("fd00:96::{n}"))
}

/// External or load-balancer IP `203.0.113.<n>` / `2001:db8::<n>`.
pub fn external_ip(family: IpFamily, n: u8) -> IpAddr {
    pick(family, &format!("203.0.113.{n}"), &format!("2001:db8::{n}"))
}

/// The node's uplink address.
pub fn node_ip(family: IpFamily) -> IpAddr {
    pick(family, "192.168.77.2", "fd00:77::2")
}

/// The external host's address.
pub fn external_host(family: IpFamily) -> IpAddr {
    pick(family, "192.168.77.1", "fd00:77::1")
}

/// The nodePort of Service number `n`.
pub fn node_port(n: u8) -> u16 {
    30000 + u16::from(n)
}

/// `ip:80`.
pub fn at(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, PORT)
}

/// Where a traced packet comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// Pod number `i` of the lab (0 is the client).
    Pod(usize),
    /// A process of the node.
    Host,
    /// The external host.
    External,
}

/// A pod's lifecycle in its manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Ready.
    Ready,
    /// Being deleted, still serving.
    Terminating,
}

/// The lab's cluster state and the proxy's flags.
pub struct Lab {
    objects: Vec<Object>,
    pods: Vec<String>,
    /// The proxy's configuration (`--cluster-cidr` of the lab by default).
    pub cfg: ProxyConfig,
    /// Extra addresses of the node's uplink.
    pub extra_addresses: Vec<IpAddr>,
}

fn object(yaml: &str) -> Object {
    let value: serde_json::Value = serde_saphyr::from_str(yaml).expect("manifest");
    let kind = value["kind"].as_str().expect("kind").to_string();
    let parsed = match kind.as_str() {
        "Service" => serde_json::from_value(value).map(Object::Service),
        "EndpointSlice" => serde_json::from_value(value).map(Object::EndpointSlice),
        "Pod" => serde_json::from_value(value).map(Object::Pod),
        "ServiceCIDR" => serde_json::from_value(value).map(Object::ServiceCidr),
        _ => panic!("kind {kind}"),
    };
    parsed.expect("object")
}

impl Lab {
    /// A lab with the client pod and no workload.
    pub fn new() -> Lab {
        let cfg = ProxyConfig {
            hostname: NODE.into(),
            cluster_cidrs: vec!["10.244.0.0/16".parse().expect("cidr"), "fd00:244::/48".parse().expect("cidr")],
            ..ProxyConfig::default()
        };
        let mut lab = Lab { objects: Vec::new(), pods: Vec::new(), cfg, extra_addresses: Vec::new() };
        lab.pod("client", "role: client", NODE, PodState::Ready);
        lab
    }

    /// Adds an object from its manifest.
    pub fn write(&mut self, yaml: &str) {
        self.objects.push(object(yaml));
    }

    /// Pod `i`'s address (10.244.0.<10+i>, fd00:244::<10+i>).
    pub fn pod_ip(&self, i: usize, family: IpFamily) -> IpAddr {
        let host = 10 + i;
        pick(family, &format!("10.244.0.{host}"), &format!("fd00:244::{host}"))
    }

    /// How many pods the lab has (the client too).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Adds pod `name` with `labels` (YAML flow map body) on `node`, serving on [`ECHO`].
    pub fn pod(&mut self, name: &str, labels: &str, node: &str, state: PodState) -> usize {
        self.pods.push(name.to_string());
        let i = self.pods.len() - 1;
        let (v4, v6) = (self.pod_ip(i, IpFamily::V4), self.pod_ip(i, IpFamily::V6));
        let deleting =
            if state == PodState::Terminating { ", deletionTimestamp: \"2025-01-01T00:00:00Z\"" } else { "" };
        self.write(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, labels: {{{labels}}}{deleting}}}\n\
             spec: {{nodeName: {node}, containers: [{{name: echo, image: roadkeeper, ports: [{{name: http, containerPort: {ECHO}}}, {{name: dns, containerPort: {ECHO}, protocol: UDP}}]}}]}}\n\
             status: {{phase: Running, podIP: {v4}, podIPs: [{{ip: {v4}}}, {{ip: \"{v6}\"}}], conditions: [{{type: Ready, status: \"True\"}}]}}\n"
        ));
        i
    }

    /// Adds the Service of [`service_yaml`]`(name, n, extra)` selecting `app: <name>`.
    pub fn service(&mut self, name: &str, n: u8, extra: &str) {
        self.write(&service_yaml(name, n, &format!("selector: {{app: {name}}}, {extra}")));
    }

    /// A hand-written EndpointSlice of Service `service` in `family` with `endpoints` (YAML flow
    /// maps), for the ports of [`Lab::service`].
    pub fn slice(&mut self, service: &str, family: IpFamily, endpoints: &[String]) {
        let kind = if family == IpFamily::V4 { "IPv4" } else { "IPv6" };
        self.write(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {service}-{kind}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\n\
             addressType: {kind}\nports: [{{name: http, port: {ECHO}, protocol: TCP}}, {{name: dns, port: {ECHO}, protocol: UDP}}]\n\
             endpoints: [{}]\n",
            endpoints.join(", ")
        ));
    }

    /// This node as the proxy sees it.
    pub fn node(&self) -> NodeInfo {
        let mut local_addresses = vec![
            "127.0.0.1".parse().expect("address"),
            "::1".parse().expect("address"),
            "10.244.0.1".parse().expect("address"),
            "fd00:244::1".parse().expect("address"),
        ];
        local_addresses.extend(FAMILIES.map(node_ip));
        local_addresses.extend(&self.extra_addresses);
        NodeInfo {
            name: NODE.into(),
            primary_ips: FAMILIES.map(node_ip).to_vec(),
            local_addresses,
            zone: Some("zone-a".into()),
        }
    }

    /// What a full sync of `mode` plans.
    pub fn plan(&self, mode: ProxyMode) -> NodePlan {
        let store = Store::from_objects(self.objects.iter().cloned());
        let cfg = ProxyConfig { mode, ..self.cfg.clone() };
        NodePlan::new(&store, &cfg, &self.node(), &service_cidrs(&store))
    }

    /// The rules a full sync of `mode` programs.
    pub fn ruleset(&self, mode: ProxyMode) -> Ruleset {
        Ruleset::of(&self.plan(mode)).expect("the rules of a full sync")
    }

    /// The packet `protocol` from `from` to `to`.
    pub fn packet(&self, from: From, to: SocketAddr, protocol: Protocol) -> Packet {
        let family = IpFamily::of(&to.ip());
        let (entry, source) = match from {
            From::Pod(i) => (Entry::LocalPod, self.pod_ip(i, family)),
            From::Host => (Entry::Host, node_ip(family)),
            From::External => (Entry::Received, external_host(family)),
        };
        Packet { entry, source, destination: to, protocol }
    }

    /// What the kernel knows of the node: its addresses, and the affinity entries holding the source.
    pub fn environment(&self, affinity: BTreeSet<String>) -> Environment {
        Environment { local_addresses: self.node().local_addresses, affinity }
    }

    /// Traces a packet through the rules of `mode`, without affinity entries.
    pub fn trace(&self, mode: ProxyMode, from: From, to: SocketAddr, protocol: Protocol) -> Trace {
        let packet = self.packet(from, to, protocol);
        self.ruleset(mode).trace(&packet, &self.environment(BTreeSet::new())).expect("a trace")
    }

    /// The pods a traced packet may reach (panics unless every path delivers it to a pod), and
    /// whether it is masqueraded (panics unless every path agrees).
    pub fn reaches(&self, trace: &Trace) -> (BTreeSet<String>, bool) {
        let mut pods = BTreeSet::new();
        let mut masqueraded = BTreeSet::new();
        for path in &trace.paths {
            let Fate::Delivered { dnat: Some(to), masqueraded: masq, .. } = path.fate() else {
                panic!("{:?}: not delivered to a pod: {:?}", trace.packet, path.fate());
            };
            let pod = (0..self.pods.len()).find(|&i| self.pod_ip(i, IpFamily::of(&to.ip())) == to.ip());
            assert_eq!(to.port(), ECHO, "{:?}", trace.packet);
            pods.insert(self.pods[pod.expect("DNAT to a pod")].clone());
            masqueraded.insert(masq);
        }
        assert_eq!(masqueraded.len(), 1, "{:?}: masqueraded on some paths only", trace.packet);
        (pods, masqueraded.into_iter().next().expect("a path"))
    }
}

/// A dual-stack Service `name` with ClusterIPs `n`, ports 80 over TCP (`http`) and UDP (`dns`)
/// to the echo port, with `extra` spec entries (YAML flow style); NodePort and LoadBalancer
/// Services get nodePort [`node_port`]`(n)`.
pub fn service_yaml(name: &str, n: u8, extra: &str) -> String {
    let node_port = if extra.contains("type: NodePort") || extra.contains("type: LoadBalancer") {
        format!(", nodePort: {}", node_port(n))
    } else {
        String::new()
    };
    let port = |port_name: &str, protocol: &str| {
        format!("{{name: {port_name}, port: {PORT}, targetPort: {ECHO}, protocol: {protocol}{node_port}}}")
    };
    let (v4, v6) = (cluster_ip(IpFamily::V4, n), cluster_ip(IpFamily::V6, n));
    let ports = format!("ports: [{}, {}]", port("http", "TCP"), port("dns", "UDP"));
    let mut spec = vec![format!("clusterIP: {v4}, clusterIPs: [{v4}, \"{v6}\"], ipFamilies: [IPv4, IPv6], {ports}")];
    spec.extend(Some(extra.trim().trim_end_matches(',').trim()).filter(|e| !e.is_empty()).map(String::from));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{{}}}\n",
        spec.join(", ")
    )
}

/// The names of `pods`, for comparing with [`Lab::reaches`].
pub fn names(pods: &[&str]) -> BTreeSet<String> {
    pods.iter().map(|p| p.to_string()).collect()
}

/// The one fate of every path of `trace` (panics if they differ).
pub fn only_fate(trace: &Trace) -> Fate {
    let fates = trace.fates();
    assert_eq!(fates.len(), 1, "{:?}: {fates:?}", trace.packet);
    fates[0].0.clone()
}
