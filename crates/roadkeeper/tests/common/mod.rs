//! End-to-end harness: a lab node with pods running echo servers, a manifest folder, and the real
//! `roadkeeper` binary programming the node's kernel. Everything is torn down on drop, also when
//! a test fails.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use roadkeeper_netlab::addressing::{NODE_IPV4, NODE_IPV6};
use roadkeeper_netlab::{EchoServer, Lab, Netns, Pod, ProbeResult, Process, echo, probe};

/// The node's name in the manifests.
pub const NODE: &str = "node-a";
/// Port every echo server listens on.
pub const ECHO_PORT: u16 = 8080;
/// Probe timeout: a DROP shows up as a timeout of this length.
pub const TIMEOUT: Duration = Duration::from_millis(700);

/// A pod running an echo server on its IPv4 and IPv6 address.
pub struct EchoPod {
    /// The echo server (dropped before the pod's namespace).
    _server: EchoServer,
    /// The pod.
    pub pod: Pod,
}

/// Transport protocol of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// One lab cluster. Field order is drop order: proxy, pods, then the lab's namespaces.
pub struct Cluster {
    proxy: Option<Process>,
    pub pods: Vec<EchoPod>,
    pub client: Pod,
    pub lab: Lab,
    pub manifests: tempfile::TempDir,
}

/// The manifest of this node, with fixed InternalIPs so NodePort addresses are known.
fn node_manifest(zone: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels: {{topology.kubernetes.io/zone: {zone}}}\n\
         status:\n  addresses:\n  - {{type: InternalIP, address: {NODE_IPV4}}}\n  - {{type: InternalIP, address: \"{NODE_IPV6}\"}}\n"
    )
}

impl Cluster {
    /// A lab with a client pod and no workload yet.
    pub fn new(prefix: &str) -> Cluster {
        let lab = Lab::new(prefix).expect("lab");
        let client = lab.add_pod("client").expect("client pod");
        let manifests = tempfile::tempdir().expect("tempdir");
        let cluster = Cluster { proxy: None, pods: Vec::new(), client, lab, manifests };
        cluster.write("node.yaml", &node_manifest("zone-a"));
        cluster
    }

    /// Adds a pod running an echo server on port 8080 (TCP and UDP, both families) and writes its
    /// Pod manifest with `labels` (YAML flow map body, e.g. `app: hello`) on `node`.
    pub fn add_pod(&mut self, name: &str, labels: &str, node: &str) -> usize {
        let pod = self.lab.add_pod(name).expect("pod");
        let listen = [
            SocketAddr::new(IpAddr::V4(pod.ipv4), ECHO_PORT),
            SocketAddr::new(IpAddr::V6(pod.ipv6), ECHO_PORT),
        ];
        let server = pod.ns.run(|| echo::serve(&listen, name)).expect("echo server");
        self.write(&format!("pod-{name}.yaml"), &pod_manifest(name, labels, node, &pod, true));
        self.pods.push(EchoPod { _server: server, pod });
        self.pods.len() - 1
    }

    /// Rewrites the manifest of pod `i` (labels, readiness).
    pub fn update_pod(&self, i: usize, labels: &str, node: &str, ready: bool) {
        let pod = &self.pods[i].pod;
        self.write(&format!("pod-{}.yaml", pod.name), &pod_manifest(&pod.name, labels, node, pod, ready));
    }

    /// Writes (or replaces) a manifest file atomically (rename), so the watcher never sees half a file.
    pub fn write(&self, file: &str, yaml: &str) {
        let path = self.manifests.path().join(file);
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, &path).expect("rename manifest");
    }

    /// Deletes a manifest file.
    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.path().join(file)).expect("remove manifest");
    }

    /// The arguments of `roadkeeper proxy` for this lab.
    fn proxy_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            env!("CARGO_BIN_EXE_roadkeeper").into(),
            "proxy".into(),
            "--manifests".into(),
            self.manifests.path().display().to_string(),
            "--hostname-override".into(),
            NODE.into(),
            "--cluster-cidr".into(),
            "10.244.0.0/16,fd00:244::/48".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Runs `roadkeeper proxy --once` in the node and returns its output (not asserting success).
    pub fn try_proxy_once(&self, extra: &[&str]) -> Output {
        let mut args = self.proxy_args(extra);
        args.push("--once".into());
        std::process::Command::new("ip")
            .args(["netns", "exec", self.lab.node().name()])
            .args(&args)
            .output()
            .expect("run roadkeeper")
    }

    /// Runs `roadkeeper proxy --once` in the node and asserts it succeeded.
    pub fn proxy_once(&self, extra: &[&str]) {
        let out = self.try_proxy_once(extra);
        assert!(out.status.success(), "roadkeeper proxy --once failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts `roadkeeper proxy` in watch mode in the node (stopped on drop) and waits for its
    /// first sync.
    pub fn start_proxy(&mut self, extra: &[&str]) {
        let mut args = self.proxy_args(extra);
        args.push("-v".into());
        let process = self.lab.node().spawn(&args).expect("spawn roadkeeper");
        self.proxy = Some(process);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.nft(&["list", "chain", "ip", "roadkeeper", "services"]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("roadkeeper did not program the kernel within 10s");
    }

    /// The proxy process started by [`start_proxy`](Self::start_proxy).
    pub fn proxy(&self) -> &Process {
        self.proxy.as_ref().expect("proxy running")
    }

    /// Runs nft in the node.
    pub fn nft(&self, args: &[&str]) -> Output {
        std::process::Command::new("ip")
            .args(["netns", "exec", self.lab.node().name(), "nft"])
            .args(args)
            .output()
            .expect("run nft")
    }

    /// Our IPv4 table as text.
    pub fn ruleset(&self) -> String {
        String::from_utf8_lossy(&self.nft(&["list", "ruleset"]).stdout).into_owned()
    }

    /// Pod `i`'s IP of the family of `like`.
    pub fn pod_ip(&self, i: usize, like: IpAddr) -> IpAddr {
        let pod = &self.pods[i].pod;
        if like.is_ipv4() { IpAddr::V4(pod.ipv4) } else { IpAddr::V6(pod.ipv6) }
    }

    /// The client pod's IP of the family of `like`.
    pub fn client_ip(&self, like: IpAddr) -> IpAddr {
        if like.is_ipv4() { IpAddr::V4(self.client.ipv4) } else { IpAddr::V6(self.client.ipv6) }
    }
}

/// A Pod manifest for a lab pod.
pub fn pod_manifest(name: &str, labels: &str, node: &str, pod: &Pod, ready: bool) -> String {
    let ready = if ready { "True" } else { "False" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n\
         spec: {{nodeName: {node}, containers: [{{name: echo, image: roadkeeper, ports: [{{name: http, containerPort: {ECHO_PORT}}}, {{name: dns, containerPort: {ECHO_PORT}, protocol: UDP}}]}}]}}\n\
         status:\n  phase: Running\n  podIP: {}\n  podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]\n  conditions: [{{type: Ready, status: \"{ready}\"}}]\n",
        pod.ipv4, pod.ipv4, pod.ipv6
    )
}

/// Sends one probe from `ns`.
pub fn probe(ns: &Netns, proto: Proto, target: SocketAddr) -> ProbeResult {
    ns.run(|| match proto {
        Proto::Tcp => probe::tcp(target, TIMEOUT),
        Proto::Udp => probe::udp(target, TIMEOUT),
    })
}

/// Sends `n` probes from `ns` and returns the names of the pods that answered (panics on a
/// non-reply), with the peer address the last one saw.
pub fn answers(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> (Vec<String>, IpAddr) {
    let mut names = Vec::new();
    let mut peer = None;
    for _ in 0..n {
        match probe(ns, proto, target) {
            ProbeResult::Reply(reply) => {
                names.push(reply.name);
                peer = Some(reply.peer.ip());
            }
            other => panic!("probe {proto:?} {target} from {}: {other:?}", ns.name()),
        }
    }
    (names, peer.expect("at least one probe"))
}

/// Polls `probe` until `ok` holds for its result, for at most `within`.
pub fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Path of the roadkeeper binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_roadkeeper"))
}
