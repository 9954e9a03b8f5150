//! Lab states for unit tests.

use std::net::Ipv4Addr;

use crate::state::{Config, Container, Host, Phase, Pod, Role, State};

/// A lab of `nodes` nodes (and router, client, internet host), no pods.
pub fn state(nodes: u8) -> State {
    let mut hosts: Vec<Host> = (1..=nodes)
        .map(|n| Host {
            name: format!("node-{n}"),
            role: Role::Node,
            netns: format!("rkl-test-node-{n}"),
            address: roadkeeper_netlab::cluster::node_ip(n),
            pod_cidr: Some(roadkeeper_netlab::cluster::pod_cidr(n)),
            processes: Vec::new(),
        })
        .collect();
    hosts.push(Host {
        name: "client".into(),
        role: Role::Client,
        netns: "rkl-test-client".into(),
        address: roadkeeper_netlab::cluster::CLIENT_IP,
        pod_cidr: None,
        processes: Vec::new(),
    });
    State {
        id: "test".into(),
        prefix: "rkl-test-".into(),
        config: Config {
            manifests: "/m".into(),
            nodes,
            proxy_mode: "nftables".into(),
            binary: "/bin/roadkeeper".into(),
        },
        phase: Phase::Ready,
        controller: None,
        hosts,
        pods: Vec::new(),
        problems: Vec::new(),
        allocations: Default::default(),
        first_seen: Default::default(),
        next_serial: 0,
        scaled: Default::default(),
    }
}

/// A ready pod with one container `web`, created at 2025-01-01T00:00:00Z.
pub fn pod(name: &str, node: &str, ip: [u8; 4], labels: &[(&str, &str)]) -> Pod {
    let spec = serde_json::from_value(serde_json::json!({"containers": [{"name": "web", "image": "nginx",
        "ports": [{"containerPort": 80}]}]}))
    .unwrap();
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        serial: 0,
        node: node.into(),
        ip: Ipv4Addr::from(ip),
        netns: format!("rkl-test-pod-{name}"),
        veth: "veth0".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        manifest_labels: None,
        owner: None,
        spec,
        annotations: Default::default(),
        created: "2025-01-01T00:00:00Z".into(),
        ready: true,
        ready_since: "2025-01-01T00:00:00Z".into(),
        terminating: false,
        containers: vec![Container { name: "web".into(), process: None, restarts: 0, last_exit: None }],
        problems: Vec::new(),
    }
}
