//! End-to-end harness: a lab node with pods running echo servers, a manifest folder, and the real
//! `roadkeeper` binary programming the node's kernel. Everything is torn down on drop, also when
//! a test fails.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roadkeeper_netlab::addressing::{
    EXTERNAL_HOST_IPV4, EXTERNAL_HOST_IPV6, NODE_IPV4, NODE_IPV6, POD_GATEWAY_V4, POD_GATEWAY_V6,
};
use roadkeeper_netlab::cgroup::NodeCgroup;
use roadkeeper_netlab::{EchoServer, Lab, Netns, Pod, ProbeResult, Process, echo, manifests, probe};

pub mod apiserver;
pub mod gateway;
#[allow(unused_imports)] // as dead_code above: not every test binary polls
pub use apiserver::{eventually, slowdown};
pub mod http;
pub mod replay;
pub mod web;

/// The node's name in the manifests.
pub const NODE: &str = "node-a";
/// Port of every test Service made by [`service_manifest`], for TCP (`http`) and UDP (`dns`).
pub const SERVICE_PORT: u16 = 80;
/// The lab's pod CIDRs, the `--cluster-cidr` of every proxy run unless a test clears
/// [`Cluster::cluster_cidr`].
pub const LAB_CLUSTER_CIDR: &str = "10.244.0.0/16,fd00:244::/48";
/// How long a watching proxy may take to apply a manifest change: 5 s, times [`slowdown`]
/// under emulation.
pub fn settle() -> Duration {
    Duration::from_secs(5) * slowdown()
}

/// Probe timeout: a DROP shows up as a timeout of this length (700 ms, times [`slowdown`] under
/// emulation, where the path to a pod that just joined, ARP included, can take longer).
pub fn probe_timeout() -> Duration {
    Duration::from_millis(700) * slowdown()
}

/// A pod running an echo server on its IPv4 and IPv6 address.
pub struct EchoPod {
    /// The echo server (dropped before the pod's namespace).
    _server: EchoServer,
    /// The pod.
    pub pod: Pod,
}

/// IP family of a probe, with the lab's addresses in that family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Both families, for tests that prove a feature in each.
pub const FAMILIES: [Family; 2] = [Family::V4, Family::V6];
/// Both probe protocols.
pub const PROTOS: [Proto; 2] = [Proto::Tcp, Proto::Udp];

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The ClusterIP `10.96.0.<n>` / `fd00:96::<n>`.
    pub fn cluster_ip(self, n: u8) -> IpAddr {
        self.parse(format!("10.96.0.{n}"), format!("fd00:96::{n}"))
    }

    /// The external (or load-balancer) IP `203.0.113.<n>` / `2001:db8::<n>`.
    pub fn external_ip(self, n: u8) -> IpAddr {
        self.parse(format!("203.0.113.{n}"), format!("2001:db8::{n}"))
    }

    /// The node IP on the uplink (where NodePorts listen).
    pub fn node_ip(self) -> IpAddr {
        self.pick(NODE_IPV4, NODE_IPV6)
    }

    /// The external host's IP.
    pub fn external_host_ip(self) -> IpAddr {
        self.pick(EXTERNAL_HOST_IPV4, EXTERNAL_HOST_IPV6)
    }

    /// The node's bridge address: the source of traffic masqueraded towards pods.
    pub fn bridge_ip(self) -> IpAddr {
        self.pick(POD_GATEWAY_V4, POD_GATEWAY_V6)
    }

    /// `nft` table family keyword.
    pub fn nft(self) -> &'static str {
        self.pick_str("ip", "ip6")
    }

    /// Kubernetes spelling (`IPv4`, `IPv6`).
    pub fn k8s(self) -> &'static str {
        self.pick_str("IPv4", "IPv6")
    }

    fn pick(self, v4: Ipv4Addr, v6: Ipv6Addr) -> IpAddr {
        if self == Family::V4 { v4.into() } else { v6.into() }
    }

    /// Parses the address of this family (written with the same host digits in both).
    fn parse(self, v4: String, v6: String) -> IpAddr {
        let text = if self == Family::V4 { v4 } else { v6 };
        text.parse().expect("lab address")
    }

    fn pick_str(self, v4: &'static str, v6: &'static str) -> &'static str {
        if self == Family::V4 { v4 } else { v6 }
    }
}

pub use roadkeeper_netlab::manifests::{ECHO_PORT, PodState};

/// Transport protocol of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// The proxy backend a test runs against. Every behaviour case runs once per backend (see
/// [`per_backend!`]): a case that passes on one and fails on the other is a bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `--proxy-mode nftables`.
    Nftables,
    /// `--proxy-mode iptables`.
    Iptables,
    /// `--proxy-mode ipvs` (needs a kernel with IPVS: its cases are ignored elsewhere, and
    /// `tests/vm/run.sh --backend ipvs` runs them in a VM).
    Ipvs,
    /// `--proxy-mode ebpf`: the node, its pods and the client are placed in a node cgroup of
    /// their own ([`NodeCgroup`]), to which the socket programs attach.
    Ebpf,
}

impl Backend {
    /// The `--proxy-mode` value.
    pub fn mode(self) -> &'static str {
        match self {
            Backend::Nftables => "nftables",
            Backend::Iptables => "iptables",
            Backend::Ipvs => "ipvs",
            Backend::Ebpf => "ebpf",
        }
    }

    /// Whether the node's own connections to a Service (its pods' and host processes') are
    /// translated per packet, so that masquerading applies to them: every mode but eBPF, whose
    /// socket programs translate `connect()` itself, so that the endpoint sees the client's own
    /// address (a difference the README names).
    pub fn nats_local_clients(self) -> bool {
        self != Backend::Ebpf
    }
}

/// Declares `#[test]`s running each listed case `fn case(backend: Backend)` once per backend, as
/// `nftables::case`, `iptables::case`, `ipvs::case` and `ebpf::case`. The IPVS cases are ignored (this
/// machine's kernel has no IPVS): `tests/vm/run.sh --backend ipvs` runs them on a kernel that
/// has. Cases IPVS mode cannot pass as written come after `; not_ipvs:`, each with the reason
/// in a comment there (and in the README's IPVS gaps), so that no case is silently left out.
#[macro_export]
macro_rules! per_backend {
    ($($case:ident),* $(,)?) => {
        $crate::per_backend!($($case),* ; not_ipvs: []);
    };
    ($($case:ident),* $(,)? ; not_ipvs: [$($other:ident),* $(,)?]) => {
        mod nftables {
            $( #[test] fn $case() { super::$case(super::common::Backend::Nftables) } )*
            $( #[test] fn $other() { super::$other(super::common::Backend::Nftables) } )*
        }
        mod iptables {
            $( #[test] fn $case() { super::$case(super::common::Backend::Iptables) } )*
            $( #[test] fn $other() { super::$other(super::common::Backend::Iptables) } )*
        }
        mod ipvs {
            $(
                #[test]
                #[ignore = "needs a kernel with IPVS: tests/vm/run.sh --backend ipvs"]
                fn $case() { super::$case(super::common::Backend::Ipvs) }
            )*
        }
        mod ebpf {
            $( #[test] fn $case() { super::$case(super::common::Backend::Ebpf) } )*
            $( #[test] fn $other() { super::$other(super::common::Backend::Ebpf) } )*
        }
    };
}

/// One lab cluster, its state in a manifest folder or (see [`Cluster::with_api`]) in a real API
/// server. Field order is drop order: proxy, control plane, pods, then the lab's namespaces.
pub struct Cluster {
    /// The backend every proxy run of this cluster uses.
    pub backend: Backend,
    /// The `--cluster-cidr` every proxy run gets ([`LAB_CLUSTER_CIDR`]); `None` runs the proxy
    /// without one (no local-traffic detector).
    pub cluster_cidr: Option<&'static str>,
    proxy: Option<Process>,
    /// The control plane running in the node, when the cluster state lives in an API server.
    pub api: Option<apiserver::ControlPlane>,
    /// The kubeconfig the proxy uses with an API server.
    pub kubeconfig: Option<PathBuf>,
    /// What [`Cluster::write`] applied to the API server, by file name (for [`Cluster::remove`]).
    applied: RefCell<BTreeMap<String, String>>,
    pub pods: Vec<EchoPod>,
    pub client: Pod,
    pub lab: Lab,
    pub manifests: tempfile::TempDir,
    /// Files next to the manifests (proxy log, config files), outside the watched folder.
    pub scratch: tempfile::TempDir,
    /// The tracer's replay of this cluster's probes (see [`replay`]).
    replay: replay::Handle,
    /// eBPF mode: the node's cgroup and bpffs, which the node, client and pods are placed in.
    pub node_cgroup: Option<Arc<NodeCgroup>>,
}

impl Cluster {
    /// A lab with a client pod and no workload yet, proxied by `backend`.
    pub fn new(prefix: &str, backend: Backend) -> Cluster {
        let lab = Lab::new(prefix).expect("lab");
        let client = lab.add_pod("client").expect("client pod");
        let manifests = tempfile::tempdir().expect("tempdir");
        let scratch = tempfile::tempdir().expect("tempdir");
        let cluster = Cluster {
            backend,
            cluster_cidr: Some(LAB_CLUSTER_CIDR),
            proxy: None,
            api: None,
            kubeconfig: None,
            applied: RefCell::default(),
            pods: Vec::new(),
            client,
            lab,
            manifests,
            scratch,
            replay: replay::new(&format!("{prefix} ({})", backend.mode())),
            node_cgroup: None,
        }
        .place_node();
        cluster.register_namespaces();
        cluster.write("node.yaml", &manifests::node(NODE, "zone-a"));
        cluster
    }

    /// Like [`Cluster::new`], but the cluster state lives in a real control plane (etcd,
    /// kube-apiserver, kube-controller-manager) started in the node: [`Cluster::write`] and
    /// [`Cluster::remove`] go through kubectl, EndpointSlices come from the real controller, and
    /// the proxy reads the API server with the admin kubeconfig unless `kubeconfig` is changed.
    pub fn with_api(prefix: &str, backend: Backend) -> Cluster {
        let lab = Lab::new(prefix).expect("lab");
        let api = apiserver::ControlPlane::start(Some(lab.node().name()));
        let kubeconfig = Some(api.admin_kubeconfig().to_owned());
        let client = lab.add_pod("client").expect("client pod");
        let cluster = Cluster {
            backend,
            cluster_cidr: Some(LAB_CLUSTER_CIDR),
            proxy: None,
            api: Some(api),
            kubeconfig,
            applied: RefCell::default(),
            pods: Vec::new(),
            client,
            lab,
            manifests: tempfile::tempdir().expect("tempdir"),
            scratch: tempfile::tempdir().expect("tempdir"),
            replay: replay::new(&format!("{prefix} ({})", backend.mode())),
            node_cgroup: None,
        }
        .place_node();
        cluster.register_namespaces();
        cluster.write("node.yaml", &manifests::node(NODE, "zone-a"));
        cluster
    }

    /// eBPF mode: makes the node's cgroup and places the node and the client in it.
    fn place_node(mut self) -> Self {
        if self.backend == Backend::Ebpf {
            let name = self.lab.node().name().to_owned();
            let cgroup = Arc::new(NodeCgroup::new(&name).expect("the node's cgroup"));
            self.lab.node().place_in(cgroup.clone());
            self.client.ns.place_in(cgroup.clone());
            self.node_cgroup = Some(cgroup);
        }
        self
    }

    /// Makes probes from the client, the node and the external host replayable.
    fn register_namespaces(&self) {
        let pod = replay::Origin::Pod(self.client.ipv4.into(), self.client.ipv6.into());
        replay::register(&self.replay, &self.client.ns, pod);
        replay::register(&self.replay, self.lab.node(), replay::Origin::Node);
        let external = replay::Origin::External(EXTERNAL_HOST_IPV4.into(), EXTERNAL_HOST_IPV6.into());
        replay::register(&self.replay, self.lab.external(), external);
    }

    /// The control plane of a cluster made by [`Cluster::with_api`].
    pub fn api(&self) -> &apiserver::ControlPlane {
        self.api.as_ref().expect("a cluster made with Cluster::with_api")
    }

    /// Adds a pod running an echo server on port 8080 (TCP and UDP, both families) and writes its
    /// Pod manifest with `labels` (YAML flow map body, e.g. `app: hello`) on `node`.
    pub fn add_pod(&mut self, name: &str, labels: &str, node: &str) -> usize {
        let pod = self.lab.add_pod(name).expect("pod");
        if let Some(cgroup) = &self.node_cgroup {
            pod.ns.place_in(cgroup.clone());
        }
        let listen =
            [SocketAddr::new(IpAddr::V4(pod.ipv4), ECHO_PORT), SocketAddr::new(IpAddr::V6(pod.ipv6), ECHO_PORT)];
        let server = pod.ns.run(|| echo::serve(&listen, name)).expect("echo server");
        self.write(&format!("pod-{name}.yaml"), &manifests::pod(&pod, labels, node, PodState::Ready));
        replay::register(&self.replay, &pod.ns, replay::Origin::Pod(pod.ipv4.into(), pod.ipv6.into()));
        self.pods.push(EchoPod { _server: server, pod });
        self.pods.len() - 1
    }

    /// Rewrites the manifest of pod `i` (labels, node, lifecycle state).
    pub fn update_pod(&self, i: usize, labels: &str, node: &str, state: PodState) {
        let pod = &self.pods[i].pod;
        self.write(&format!("pod-{}.yaml", pod.name), &manifests::pod(pod, labels, node, state));
    }

    /// Writes (or replaces) a manifest file atomically (rename), so the watcher never sees half a
    /// file. With an API server, applies it instead (its `status` too, through the subresource, as
    /// a kubelet or a load-balancer controller would write it).
    pub fn write(&self, file: &str, yaml: &str) {
        replay::Replay::manifests_changed(&self.replay);
        if let Some(api) = &self.api {
            api.kubectl_stdin(&["apply", "-f", "-"], yaml);
            if yaml.contains("\nstatus:") {
                api.kubectl_stdin(&["replace", "--subresource=status", "-f", "-"], yaml);
            }
            self.applied.borrow_mut().insert(file.to_owned(), yaml.to_owned());
            return;
        }
        let path = self.manifests.path().join(file);
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, &path).expect("rename manifest");
    }

    /// Deletes a manifest file, or with an API server the objects it applied.
    pub fn remove(&self, file: &str) {
        replay::Replay::manifests_changed(&self.replay);
        if let Some(api) = &self.api {
            let yaml = self.applied.borrow_mut().remove(file).expect("a file written before");
            api.kubectl_stdin(&["delete", "--wait=false", "-f", "-"], &yaml);
            return;
        }
        std::fs::remove_file(self.manifests.path().join(file)).expect("remove manifest");
    }

    /// Writes a file outside the manifest folder and returns its path.
    pub fn scratch_file(&self, file: &str, contents: &str) -> String {
        let path = self.scratch.path().join(file);
        std::fs::write(&path, contents).expect("write scratch file");
        path.display().to_string()
    }

    /// Runs the roadkeeper binary with `args` in the node and returns its output.
    pub fn roadkeeper(&self, args: &[&str]) -> Output {
        if args.first() == Some(&"cleanup") {
            replay::Replay::invalidate(&self.replay, "our rules were removed by `roadkeeper cleanup`");
        }
        std::process::Command::new("ip")
            .args(["netns", "exec", self.lab.node().name()])
            .arg(binary())
            .args(args)
            .output()
            .expect("run roadkeeper")
    }

    /// The arguments of `roadkeeper <command>` (`proxy` or `rules`) for this lab.
    pub fn proxy_args_for(&self, command: &str, extra: &[&str]) -> Vec<String> {
        let source = match &self.kubeconfig {
            Some(kubeconfig) => ["--kubeconfig".into(), kubeconfig.display().to_string()],
            None => ["--manifests".into(), self.manifests.path().display().to_string()],
        };
        let mut args: Vec<String> = vec![
            command.into(),
            source[0].clone(),
            source[1].clone(),
            "--hostname-override".into(),
            NODE.into(),
            "--proxy-mode".into(),
            self.backend.mode().into(),
        ];
        if let Some(cidr) = self.cluster_cidr {
            args.extend(["--cluster-cidr".into(), cidr.into()]);
        }
        if let Some(cgroup) = &self.node_cgroup {
            args.extend(["--cgroup-root".into(), cgroup.path().display().to_string()]);
            args.extend(["--bpf-root".into(), cgroup.bpf_root().display().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// The arguments of `roadkeeper proxy` for this lab.
    fn proxy_args(&self, extra: &[&str]) -> Vec<String> {
        self.proxy_args_for("proxy", extra)
    }

    /// Runs `roadkeeper proxy --once` in the node and returns its output (not asserting success).
    pub fn try_proxy_once(&self, extra: &[&str]) -> Output {
        let mut args = self.proxy_args(extra);
        args.push("--once".into());
        let out = self.roadkeeper(&args.iter().map(String::as_str).collect::<Vec<_>>());
        if out.status.success() {
            replay::Replay::programmed(&self.replay, self, &args, false);
        } else {
            replay::Replay::invalidate(&self.replay, "the last proxy run failed");
        }
        out
    }

    /// Runs `roadkeeper proxy --once` in the node and asserts it succeeded.
    pub fn proxy_once(&self, extra: &[&str]) {
        let out = self.try_proxy_once(extra);
        assert!(out.status.success(), "roadkeeper proxy --once failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts `roadkeeper proxy` in watch mode in the node (stopped on drop), logging to
    /// [`proxy_log`](Self::proxy_log), and waits for its first sync.
    pub fn start_proxy(&mut self, extra: &[&str]) {
        let proxy_args = self.proxy_args(extra);
        let mut args = vec![binary().display().to_string()];
        args.extend(proxy_args.iter().cloned());
        args.push("-v".into());
        let log = self.scratch.path().join("proxy.log");
        let process = self.lab.node().spawn_logged(&args, &log).expect("spawn roadkeeper");
        self.proxy = Some(process);
        let patience = Duration::from_secs(10) * slowdown();
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if self.programmed() {
                replay::Replay::programmed(&self.replay, self, &proxy_args, true);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("roadkeeper did not program the kernel within {patience:?}:\n{}", self.proxy_log());
    }

    /// [`start_proxy`](Self::start_proxy) with a KubeProxyConfiguration file that makes it react
    /// fast: 100 ms minimum between syncs, table health checks every 2 s.
    pub fn start_fast_proxy(&mut self) {
        let mode_periods = match self.backend {
            // KubeProxyConfiguration has no section of eBPF mode: the top-level periods.
            Backend::Ebpf => "syncPeriod: 2s\nminSyncPeriod: 100ms\n".to_string(),
            backend => format!("{}: {{syncPeriod: 2s, minSyncPeriod: 100ms}}\n", backend.mode()),
        };
        let yaml =
            format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{mode_periods}");
        let config = self.scratch_file("kube-proxy.yaml", &yaml);
        self.start_proxy(&["--config", &config]);
    }

    /// The proxy process started by [`start_proxy`](Self::start_proxy).
    pub fn proxy(&self) -> &Process {
        self.proxy.as_ref().expect("proxy running")
    }

    /// What the proxy started by [`start_proxy`](Self::start_proxy) logged so far (stdout and
    /// stderr).
    pub fn proxy_log(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("proxy.log")).unwrap_or_default()
    }

    /// Runs nft in the node.
    pub fn nft(&self, args: &[&str]) -> Output {
        std::process::Command::new("ip")
            .args(["netns", "exec", self.lab.node().name(), "nft"])
            .args(args)
            .output()
            .expect("run nft")
    }

    /// The node's whole nftables ruleset as text.
    pub fn ruleset(&self) -> String {
        String::from_utf8_lossy(&self.nft(&["list", "ruleset"]).stdout).into_owned()
    }

    /// Runs a command in the node and returns its stdout (panics if it cannot start).
    pub fn node_output(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", self.lab.node().name()])
            .args(args)
            .output()
            .expect("run command in the node");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the backend installed, as its own listing: the nftables ruleset, or `iptables-save`
    /// followed by `ip6tables-save`.
    pub fn kernel_rules(&self) -> String {
        match self.backend {
            Backend::Nftables => self.ruleset(),
            Backend::Iptables => self.node_output(&["iptables-save"]) + &self.node_output(&["ip6tables-save"]),
            Backend::Ipvs => {
                self.node_output(&["ipvsadm", "-Ln"])
                    + &self.node_output(&["ip", "addr", "show", "kube-ipvs0"])
                    + &self.ruleset()
            }
            // What is pinned, then the maps as `roadkeeper rules --from-kernel` reads them.
            Backend::Ebpf => {
                let pins = self.ebpf_links().parent().expect("the pin directory").to_path_buf();
                let mut names: Vec<String> = ["maps", "links"]
                    .iter()
                    .flat_map(|sub| std::fs::read_dir(pins.join(sub)).into_iter().flatten().flatten())
                    .map(|entry| entry.path().display().to_string())
                    .collect();
                names.sort();
                let bpf_root = pins.parent().expect("the bpffs").display().to_string();
                let out = self.roadkeeper(&["rules", "--proxy-mode", "ebpf", "--from-kernel", "--bpf-root", &bpf_root]);
                names.join("\n") + "\n" + &String::from_utf8_lossy(&out.stdout) + &String::from_utf8_lossy(&out.stderr)
            }
        }
    }

    /// True once the backend's dispatch rules are in place.
    pub fn programmed(&self) -> bool {
        match self.backend {
            Backend::Nftables => self.nft(&["list", "chain", "ip", "roadkeeper", "services"]).status.success(),
            Backend::Iptables => self.node_output(&["iptables-save", "-t", "nat"]).contains(":KUBE-SERVICES"),
            Backend::Ipvs => self.nft(&["list", "chain", "ip", "roadkeeper-ipvs", "nat-postrouting"]).status.success(),
            // The programs are attached before the first sync fills the maps: a running proxy
            // is programmed once it logged a sync.
            Backend::Ebpf => {
                self.ebpf_links().join("rk_connect4").exists()
                    && (self.proxy.is_none() || self.proxy_log().contains("synced rules"))
            }
        }
    }

    /// eBPF mode: where the proxy pins its programs' links.
    pub fn ebpf_links(&self) -> PathBuf {
        let cgroup = self.node_cgroup.as_ref().expect("an eBPF mode cluster");
        cgroup.bpf_root().join("roadkeeper/links")
    }

    /// Plays someone else wiping our rules: deletes the nftables table, or flushes the iptables
    /// tables and the canary chain.
    pub fn wipe_rules(&self) {
        replay::Replay::invalidate(&self.replay, "our rules were wiped");
        let commands: &[&[&str]] = match self.backend {
            Backend::Nftables => &[&["nft", "delete", "table", "ip", "roadkeeper"]],
            Backend::Ipvs => &[&["nft", "delete", "table", "ip", "roadkeeper-ipvs"], &["ipvsadm", "-C"]],
            // Unpinned, the links detach their programs.
            Backend::Ebpf => {
                for link in std::fs::read_dir(self.ebpf_links()).expect("the links").flatten() {
                    std::fs::remove_file(link.path()).expect("unpin a link");
                }
                return;
            }
            Backend::Iptables => &[
                &["iptables", "-t", "nat", "-F"],
                &["iptables", "-t", "filter", "-F"],
                &["iptables", "-t", "mangle", "-F"],
                &["iptables", "-t", "mangle", "-X", "KUBE-PROXY-CANARY"],
            ],
        };
        for args in commands {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", self.lab.node().name()])
                .args(*args)
                .output()
                .expect("run command in the node");
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// Pod `i`'s IP in `family`.
    pub fn pod_ip(&self, i: usize, family: Family) -> IpAddr {
        let pod = &self.pods[i].pod;
        family.pick(pod.ipv4, pod.ipv6)
    }

    /// The client pod's IP in `family`.
    pub fn client_ip(&self, family: Family) -> IpAddr {
        family.pick(self.client.ipv4, self.client.ipv6)
    }
}

/// A dual-stack Service `name` with ClusterIPs [`Family::cluster_ip`]`(n)`, selecting `app: <name>`,
/// with port 80 over TCP (`http`) and UDP (`dns`) to the echo port. `extra` holds more `spec`
/// entries in YAML flow style (e.g. `type: NodePort, externalTrafficPolicy: Local`); NodePort and
/// LoadBalancer Services get nodePort [`node_port`]`(n)` for both protocols.
pub fn service_manifest(name: &str, n: u8, extra: &str) -> String {
    service_yaml(name, n, &[&format!("selector: {{app: {name}}}"), extra])
}

/// A manifest of [`service_manifest`] with `labels` (a YAML flow map body, e.g.
/// `service.kubernetes.io/headless: ""`) on the Service.
pub fn with_labels(manifest: &str, labels: &str) -> String {
    manifest.replacen("namespace: default}", &format!("namespace: default, labels: {{{labels}}}}}"), 1)
}

/// Like [`service_manifest`] but without a selector: its endpoints come from hand-written
/// EndpointSlices (see [`endpoint_slice`]).
pub fn selectorless_service_manifest(name: &str, n: u8) -> String {
    service_yaml(name, n, &[])
}

fn service_yaml(name: &str, n: u8, extra: &[&str]) -> String {
    let extra: Vec<&str> = extra.iter().copied().filter(|e| !e.is_empty()).collect();
    let has_node_port = extra.iter().any(|e| e.contains("type: NodePort") || e.contains("type: LoadBalancer"));
    let node_port = if has_node_port { format!(", nodePort: {}", node_port(n)) } else { String::new() };
    let port = |name: &str, protocol: &str| {
        format!("{{name: {name}, port: {SERVICE_PORT}, targetPort: {ECHO_PORT}, protocol: {protocol}{node_port}}}")
    };
    let mut spec = vec![
        format!("clusterIP: {}", Family::V4.cluster_ip(n)),
        format!("clusterIPs: [{}, \"{}\"]", Family::V4.cluster_ip(n), Family::V6.cluster_ip(n)),
        "ipFamilies: [IPv4, IPv6]".into(),
        "ipFamilyPolicy: RequireDualStack".into(),
        format!("ports: [{}, {}]", port("http", "TCP"), port("dns", "UDP")),
    ];
    spec.extend(extra.iter().map(|e| e.to_string()));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{{}}}\n",
        spec.join(", ")
    )
}

/// The nodePort of NodePort / LoadBalancer Services made by [`service_manifest`] with number `n`.
pub fn node_port(n: u8) -> u16 {
    30000 + u16::from(n)
}

/// A hand-written EndpointSlice of Service `service` in `family`, matching the ports of
/// [`service_manifest`]; `endpoints` are YAML flow maps such as
/// `{addresses: [10.244.0.10], nodeName: node-a}`.
pub fn endpoint_slice(service: &str, family: Family, endpoints: &[String]) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {service}-{}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: {}\nports: [{{name: http, port: {ECHO_PORT}, protocol: TCP}}, {{name: dns, port: {ECHO_PORT}, protocol: UDP}}]\n\
         endpoints: [{}]\n",
        family.nft(),
        family.k8s(),
        endpoints.join(", ")
    )
}

/// The service address `ip:80`.
pub fn at(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, SERVICE_PORT)
}

/// Sends one probe from `ns`; the tracer replays it (see [`replay`]).
pub fn probe(ns: &Netns, proto: Proto, target: SocketAddr) -> ProbeResult {
    let result = ns.run(|| match proto {
        Proto::Tcp => probe::tcp(target, probe_timeout()),
        Proto::Udp => probe::udp(target, probe_timeout()),
    });
    replay::check(ns, proto, target, &result);
    result
}

/// Probes every `(proto, target)` of `cases` from `ns` at the same time (so timeouts overlap) and
/// panics, listing the offenders, unless each ends as `expected` (compared by kind: any reply
/// matches [`ProbeResult::Reply`]).
pub fn assert_outcome(ns: &Netns, cases: &[(Proto, SocketAddr)], expected: &ProbeResult) {
    let results: Vec<ProbeResult> = std::thread::scope(|scope| {
        let running: Vec<_> =
            cases.iter().map(|&(proto, target)| scope.spawn(move || probe(ns, proto, target))).collect();
        running.into_iter().map(|t| t.join().expect("probe thread")).collect()
    });
    let wrong: Vec<String> = cases
        .iter()
        .zip(&results)
        .filter(|(_, got)| std::mem::discriminant(*got) != std::mem::discriminant(expected))
        .map(|((proto, target), got)| format!("{proto:?} {target}: {got:?}"))
        .collect();
    assert!(wrong.is_empty(), "from {}, expected {expected:?}, got:\n{}", ns.name(), wrong.join("\n"));
}

/// Every protocol paired with every target, for [`assert_outcome`].
pub fn cases(targets: &[SocketAddr]) -> Vec<(Proto, SocketAddr)> {
    targets.iter().flat_map(|&t| PROTOS.map(|p| (p, t))).collect()
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

/// The distinct pod names that answered `n` probes (see [`answers`]).
pub fn reached(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> BTreeSet<String> {
    answers(ns, proto, target, n).0.into_iter().collect()
}

/// A set of pod names, for comparing with [`reached`].
pub fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Opens up to `n` TCP connections to `addr` from `ns` (10 at a time) that never send a byte;
/// those the server's backlog has no room for fail.
pub fn idle_connections(ns: &Netns, addr: SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    ns.run(|| {
        std::thread::scope(|scope| {
            let openers: Vec<_> = (0..10)
                .map(|_| {
                    scope.spawn(move || {
                        let connect = || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok();
                        (0..n / 10).filter_map(|_| connect()).collect::<Vec<_>>()
                    })
                })
                .collect();
            openers.into_iter().flat_map(|o| o.join().expect("opener")).collect()
        })
    })
}

/// Path of the roadkeeper binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_roadkeeper"))
}
