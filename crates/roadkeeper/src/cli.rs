//! Command-line interface: kube-proxy's flag names and meanings.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use roadkeeper_cluster::{ManifestFolder, NamespacedName, NodePortRange, SourceSpec};
use roadkeeper_dns::forward::ForwardConfig;
use roadkeeper_ingress::status::Address;

/// roadkeeper: Kubernetes Service networking, written in Rust.
#[derive(Debug, Parser)]
#[command(name = "roadkeeper", version, about, long_about = None)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// The lab directory, for `lab` and `trace` (as their own --lab-dir, which may also follow
    /// them: `roadkeeper --lab-dir DIR lab up` is `roadkeeper lab up --lab-dir DIR`).
    // An id of its own: sharing `lab`'s global argument's id would let clap merge the two.
    #[arg(long = "lab-dir", id = "cli_lab_dir", value_name = "DIR")]
    pub lab_dir: Option<PathBuf>,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command, with a --lab-dir given before it handed to it: only `lab` and `trace` take
    /// one, and given twice it must name the same directory.
    pub fn into_command(self) -> anyhow::Result<Command> {
        let Some(dir) = self.lab_dir else { return Ok(self.command) };
        let mut command = self.command;
        let slot = match &mut command {
            Command::Lab(args) => &mut args.lab_dir,
            Command::Trace(args) => &mut args.lab_dir,
            _ => anyhow::bail!("--lab-dir applies only to `lab` and `trace`"),
        };
        match slot {
            Some(other) if *other != dir => {
                anyhow::bail!("--lab-dir given twice, as {} and {}", dir.display(), other.display())
            }
            _ => *slot = Some(dir),
        }
        Ok(command)
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node proxy: program Services into kernel rules and keep them up to date.
    Proxy(ProxyArgs),
    /// Print what a full sync would apply (the nft script; the iptables-restore input with
    /// `--proxy-mode iptables`; with `--proxy-mode ipvs` the virtual servers as `ipvsadm -Ln`
    /// lists them, the `kube-ipvs0` addresses and the helper table `roadkeeper-ipvs` as an nft
    /// script; with `--proxy-mode ebpf` the maps' frontends and backends as `cilium bpf lb list`
    /// prints them), touching nothing.
    Rules(RulesArgs),
    /// Remove the rules roadkeeper installed in the kernel, and nothing of the kubelet's or
    /// other programs'.
    ///
    /// Removed: the nftables tables `ip roadkeeper` and `ip6 roadkeeper`; in both iptables
    /// flavours and both families, the chains of the iptables mode, which are kube-proxy's under
    /// the same names (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ,
    /// KUBE-EXTERNAL-SERVICES, KUBE-FORWARD, KUBE-PROXY-FIREWALL, KUBE-PROXY-CANARY, the
    /// per-Service KUBE-SVC-, KUBE-SVL-, KUBE-EXT-, KUBE-FW-, KUBE-SEP- chains and kube-proxy's
    /// older KUBE-XLB- ones), with the rules of other chains that jump to them. Left: the
    /// kubelet's chains and their jumps (KUBE-FIREWALL, which the iptables mode ensures as
    /// kube-proxy does, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-MARK-DROP), every other
    /// KUBE-* chain, kube-proxy's nftables tables and its IPVS rules. eBPF mode: every map and
    /// program link pinned in `--bpf-root`'s `roadkeeper/` (unpinned, the programs detach).
    Cleanup(CleanupArgs),
    /// Run the lab echo server: answers TCP and UDP with the address it was reached at and the
    /// peer address it saw.
    Echo(EchoArgs),
    /// Benchmarks, each measured side by side in one run (needs root; works in scratch network
    /// namespaces).
    #[command(subcommand)]
    Bench(Bench),
    /// The lab: a whole cluster out of network namespaces on this machine (nodes, pods, a client
    /// and an internet host), run by every roadkeeper component from the manifests of a folder
    /// (needs root). `lab up` builds it and walks a request through it; `lab get`, `scale`,
    /// `label` and `exec` work as their kubectl namesakes; `lab down` removes everything.
    Lab(LabArgs),
    /// Follow a request down the road, one station at a time, computed by the code that builds
    /// the rules: the DNS answer for a name, the Service and port, the EndpointSlices and the
    /// endpoints eligible on the node the packet enters, the node's nftables or iptables rules
    /// it passes (in order, with their verdicts; in IPVS mode, --proxy-mode ipvs, the helper
    /// rules and the IPVS virtual server with its scheduler's choices), the DNAT target, the pod
    /// and node it lands on, whether its source is masqueraded and why, and for the Ingress
    /// controller's Service the Ingress rule that matched and the leg to the backend.
    ///
    /// In the lab (the default: no --from-node) it also sends the real request from --from and
    /// shows the answer, the pod that gave it and the connection's conntrack entry. With
    /// --from-node it reads a cluster (--kubeconfig or --manifests, read-only), sends nothing,
    /// and plans every node with the proxy flags given here (as `roadkeeper proxy` would run).
    ///
    /// A host name: from a pod, the cluster DNS resolves it (its search path); from the lab's
    /// client, internet host or a node, the host of an Ingress rule resolves to that Ingress's
    /// address (as a DNS record for it would); with --from-node, this machine's resolver
    /// resolves it. `-H 'Host: NAME'` sends the request to the URL's address with that Host, and
    /// the Ingress rules are matched by it: `trace -H 'Host: web.example.com'
    /// http://192.168.77.200/` is `trace http://web.example.com/` in the lab.
    Trace(TraceArgs),
    /// Run the cluster DNS server: the Kubernetes DNS specification for the cluster zone,
    /// everything else forwarded upstream (options named as CoreDNS's kubernetes plugin).
    Dns(DnsArgs),
    /// Run the Ingress controller: an HTTP/HTTPS reverse proxy routing by the Ingress v1 rules of
    /// its class to ready endpoints of the backend Services.
    ///
    /// The access log (one line per request with client, method, host, path, status, Ingress,
    /// Service, endpoint and duration, on stderr) is off by default, as its cost shows at high
    /// rates: turn it on with `RUST_LOG=warn,roadkeeper=info,access=info` (or `-v`).
    Ingress(IngressArgs),
    /// Run the Gateway API implementation: the Gateways of the GatewayClasses whose
    /// `controllerName` is ours (default roadkeeper.dev/gateway), each on an address of
    /// --address-pool, their HTTP and HTTPS listeners routing by the HTTPRoutes attached to them,
    /// on the same reverse proxy as `ingress`; the classes', Gateways' and routes' status is
    /// written back. The access log is turned on as for `ingress`.
    Gateway(GatewayArgs),
}

/// Where the cluster state comes from, for every command that reads it.
#[derive(Debug, Args, Clone)]
pub struct SourceArgs {
    /// Read the cluster from a folder of Kubernetes manifests, watched for changes, instead of
    /// from a Kubernetes API server.
    #[arg(long, value_name = "DIR", conflicts_with = "kubeconfig")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig file of the Kubernetes API server to watch. Without it and without
    /// `--manifests`: `KUBECONFIG`, else `~/.kube/config`, else the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With `--manifests`: the ports a Service may take as `nodePort` or `healthCheckNodePort`,
    /// as kube-apiserver's flag of this name (`MIN-MAX`, `BASE+OFFSET` or one port; default
    /// 30000-32767). A Service asking for another port is refused, naming its file and field. An
    /// API server checks its own range.
    #[arg(long, value_name = "RANGE", requires = "manifests", conflicts_with = "kubeconfig")]
    pub service_node_port_range: Option<NodePortRange>,
}

impl SourceArgs {
    /// `--manifests`, else the API server of `--kubeconfig`, else of `fallback` (a config file's
    /// kubeconfig), else the default one.
    pub fn spec(&self, fallback: Option<&std::path::Path>) -> SourceSpec {
        match &self.manifests {
            Some(dir) => SourceSpec::Manifests(ManifestFolder {
                dir: dir.clone(),
                node_ports: self.service_node_port_range.unwrap_or_default(),
            }),
            None => SourceSpec::Kubernetes(self.kubeconfig.clone().or_else(|| fallback.map(Into::into))),
        }
    }
}

/// Flags of `rules`: those of `proxy`, and where to read from.
#[derive(Debug, Args, Clone)]
pub struct RulesArgs {
    /// The proxy's flags: what it would program.
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// eBPF mode: print what the node's pinned maps hold now (under `--bpf-root`), read from
    /// the kernel, instead of what a full sync would write.
    #[arg(long)]
    pub from_kernel: bool,
}

/// Flags of `proxy` and `rules`, named as kube-proxy's.
#[derive(Debug, Args, Clone)]
pub struct ProxyArgs {
    /// Where the cluster state comes from.
    #[command(flatten)]
    pub source: SourceArgs,
    /// What decides the rules.
    #[command(flatten)]
    pub rules: RuleArgs,
    /// This node's name (default: the host name).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// iptables mode: minimum time between syncs, as a Go duration (default 1s).
    #[arg(long, value_name = "DURATION")]
    pub iptables_min_sync_period: Option<String>,
    /// iptables mode: period of the rule health check and of retries (default 30s).
    #[arg(long, value_name = "DURATION")]
    pub iptables_sync_period: Option<String>,
    /// Address and port of the health server (`/healthz`, `/livez`), default `0.0.0.0:10256`;
    /// empty disables it. Watch mode only.
    #[arg(long, value_name = "IP:PORT")]
    pub healthz_bind_address: Option<String>,
    /// Address and port of the metrics server (Prometheus text at `/metrics`, the proxy mode at
    /// `/proxyMode`), default `127.0.0.1:10249`; empty disables it. Watch mode only.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_bind_address: Option<String>,
    /// The node's conntrack settings.
    #[command(flatten)]
    pub conntrack: ConntrackArgs,
    /// Program the kernel once and exit: 0 when the rules are in place (serves no health or
    /// metrics endpoint).
    #[arg(long)]
    pub once: bool,
    /// Write the node's conntrack settings and exit, as kube-proxy's `--init-only`: for a
    /// privileged init container, so that the proxy itself runs with `NET_ADMIN` alone (its
    /// `/proc/sys` read-only). In IPVS mode also load IPVS's modules and write its settings.
    /// Fails if a setting cannot be written (or, in IPVS mode, the kernel has no IPVS).
    #[arg(long, conflicts_with = "once")]
    pub init_only: bool,
}

/// kube-proxy's `--conntrack-*` flags: netfilter sysctls `proxy` writes at start, when the node
/// holds other values (a setting the kernel or the container does not let it write is logged and
/// left). Durations are Go durations in whole seconds; 0 leaves a setting as it is.
#[derive(Debug, Args, Clone, Default)]
pub struct ConntrackArgs {
    /// `nf_conntrack_max` per CPU (default 32768); 0 leaves the limit and --conntrack-min alone.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=i64::from(i32::MAX)))]
    pub conntrack_max_per_core: Option<u32>,
    /// The least `nf_conntrack_max`, whatever the CPU count (default 131072).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=i64::from(i32::MAX)))]
    pub conntrack_min: Option<u32>,
    /// Idle timeout of established TCP flows (default 24h).
    #[arg(long, value_name = "DURATION")]
    pub conntrack_tcp_timeout_established: Option<String>,
    /// Timeout of TCP flows in CLOSE_WAIT (default 1h).
    #[arg(long, value_name = "DURATION")]
    pub conntrack_tcp_timeout_close_wait: Option<String>,
    /// Timeout of unreplied UDP flows (default 0: left as it is).
    #[arg(long, value_name = "DURATION")]
    pub conntrack_udp_timeout: Option<String>,
    /// Timeout of assured UDP flows (default 0: left as it is).
    #[arg(long, value_name = "DURATION")]
    pub conntrack_udp_timeout_stream: Option<String>,
}

/// The flags of `proxy` that decide a node's rules (also those of `trace`), named as
/// kube-proxy's.
#[derive(Debug, Args, Clone, Default)]
pub struct RuleArgs {
    /// A kube-proxy KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1); flags
    /// override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Pod CIDR(s) of the cluster, comma-separated (one per family): traffic from outside them is
    /// masqueraded when it goes to a ClusterIP.
    #[arg(long, value_name = "CIDR[,CIDR6]")]
    pub cluster_cidr: Option<String>,
    /// Masquerade all traffic sent to ClusterIPs.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Addresses that accept NodePort traffic: comma-separated CIDRs, or `primary` (default: the
    /// node's primary IPs in nftables and eBPF mode, every local address in iptables and IPVS
    /// mode, as kube-proxy).
    #[arg(long, value_name = "CIDRS", value_delimiter = ',')]
    pub nodeport_addresses: Option<Vec<String>>,
    /// Kernel backend: `nftables` (default), `iptables`, `ipvs` (`proxy` needs a kernel with
    /// IPVS for it) or `ebpf` (BPF socket programs on a cgroup v2 hierarchy, kernel 5.18+).
    /// `rules` prints any of them; `trace` follows a packet through any of them (in eBPF mode
    /// through the programs and the maps a full sync writes).
    #[arg(long, value_name = "MODE")]
    pub proxy_mode: Option<String>,
    /// iptables mode: the packet-mark bit flagging traffic for masquerading (0-31, default 14).
    #[arg(long, value_name = "BIT")]
    pub iptables_masquerade_bit: Option<u8>,
    /// iptables mode: NodePorts also answer on 127.0.0.1 (default true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub iptables_localhost_nodeports: Option<bool>,
    /// Liberal TCP tracking: `proxy` sets `nf_conntrack_tcp_be_liberal=1`, so that conntrack does
    /// not call out-of-window packets INVALID (they would leave a pod un-NATed). The iptables mode
    /// drops INVALID packets unless the node's tracking is liberal; the nftables mode never does,
    /// as kube-proxy's (default false: the sysctl is left as it is).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// IPVS mode's settings.
    #[command(flatten)]
    pub ipvs: IpvsArgs,
    /// eBPF mode's settings.
    #[command(flatten)]
    pub ebpf: EbpfArgs,
}

/// Flags of `cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The bpffs mount where eBPF mode pinned its maps and links (default /sys/fs/bpf).
    #[arg(long, value_name = "PATH", default_value = "/sys/fs/bpf")]
    pub bpf_root: PathBuf,
}

/// eBPF mode's flags (named as Cilium's where it has one).
#[derive(Debug, Args, Clone, Default)]
pub struct EbpfArgs {
    /// eBPF mode: the cgroup v2 directory whose processes' connections are translated (pods
    /// and host processes below it). Default: the root of the node's cgroup v2 hierarchy
    /// (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host). A host with only cgroup
    /// v1 needs one mounted: `mkdir -p /run/roadkeeper/cgroupv2 && mount -t cgroup2 none
    /// /run/roadkeeper/cgroupv2`, and the pods' processes placed in it.
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<PathBuf>,
    /// eBPF mode: the bpffs mount where the maps and program links are pinned (in its
    /// `roadkeeper/`, which `cleanup` removes; default /sys/fs/bpf).
    #[arg(long, value_name = "PATH")]
    pub bpf_root: Option<PathBuf>,
    /// eBPF mode: entries of the services and backends maps (default 65536, 1024-16777216).
    #[arg(long, value_name = "N")]
    pub bpf_lb_map_max: Option<usize>,
    /// eBPF mode: slots of each Maglev table (a prime: 251, 509, 1021, 2039, 4093, 8191, 16381
    /// (default), 32749, 65521); a frontend balanced by Maglev holds at most a hundredth as many
    /// backends.
    #[arg(long, value_name = "N")]
    pub bpf_lb_maglev_table_size: Option<u32>,
    /// eBPF mode: comma-separated interfaces whose external traffic (NodePorts, externalIPs, LB
    /// IPs from outside the node) the tc programs translate. Default: the interfaces that hold
    /// the node's addresses.
    #[arg(long, value_name = "IFACES")]
    pub bpf_devices: Option<String>,
}

/// kube-proxy's `--ipvs-*` flags (IPVS mode; they override the file's `ipvs:` section). Durations
/// are Go durations; the IPVS timeouts are whole seconds, 0 leaving them as they are.
#[derive(Debug, Args, Clone, Default)]
pub struct IpvsArgs {
    /// The virtual servers' scheduler: rr (default), wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh.
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,
    /// Strict ARP: `arp_ignore=1`, `arp_announce=2`, so that the node does not answer ARP for the
    /// addresses of `kube-ipvs0`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub ipvs_strict_arp: Option<bool>,
    /// Comma-separated CIDRs whose virtual servers belong to other programs and are never deleted.
    #[arg(long, value_name = "CIDRS")]
    pub ipvs_exclude_cidrs: Option<String>,
    /// IPVS mode: period of the rule health check and of retries (default 30s).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_sync_period: Option<String>,
    /// IPVS mode: minimum time between syncs (default 1s).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_min_sync_period: Option<String>,
    /// IPVS's idle timeout of TCP connections (default 0: left as it is).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_tcp_timeout: Option<String>,
    /// IPVS's timeout of TCP connections after a FIN (default 0: left as it is).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_tcpfin_timeout: Option<String>,
    /// IPVS's timeout of UDP flows (default 0: left as it is).
    #[arg(long, value_name = "DURATION")]
    pub ipvs_udp_timeout: Option<String>,
}

/// Flags of `echo`.
#[derive(Debug, Args)]
pub struct EchoArgs {
    /// Address to listen on (TCP and UDP), repeatable.
    #[arg(long, required = true)]
    pub listen: Vec<SocketAddr>,
    /// Name to answer with (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
}

/// What `bench` measures.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Full-sync and one-endpoint-change times of each proxy backend at several cluster sizes.
    Proxy(BenchArgs),
    /// `roadkeeper dns` under dnsperf (Debian package `dnsperf`) on loopback: queries per second
    /// and latency percentiles, the server pinned to one core and dnsperf to another.
    Dns(DnsBenchArgs),
    /// `roadkeeper ingress` and nginx as reverse proxies for the same route and backends, under
    /// wrk (Debian packages `nginx-light` or `nginx`, and `wrk`), side by side.
    Ingress(IngressBenchArgs),
    /// Packets per second through a NodePort from outside the node, each proxy mode side by
    /// side: UDP datagrams blasted from a sender namespace, translated and masqueraded by the
    /// node, counted by the pod's interface.
    Nodeport(NodePortBenchArgs),
}

/// Flags of `bench nodeport`.
#[derive(Debug, Args)]
pub struct NodePortBenchArgs {
    /// Modes to measure side by side, comma-separated (nftables, iptables, ebpf); ratios are to
    /// the first.
    #[arg(long, value_delimiter = ',', default_value = "nftables,iptables,ebpf")]
    pub proxy_mode: Vec<String>,
    /// Services the node holds (one of them the NodePort measured).
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// Sender threads (each over its own flows).
    #[arg(long, default_value_t = 2)]
    pub senders: usize,
    /// Seconds measured per mode (after one of warm-up).
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// The NodePort's `externalTrafficPolicy: Local` (no masquerading) instead of Cluster.
    #[arg(long)]
    pub local: bool,
    /// Also write the table into this folder (`nodeport.md`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// Flags of `bench ingress`.
#[derive(Debug, Args)]
pub struct IngressBenchArgs {
    /// Connection counts to load with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub connections: Vec<usize>,
    /// Seconds of each wrk run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u32,
    /// CPU each proxy is pinned to.
    #[arg(long, default_value_t = 1)]
    pub proxy_cpu: usize,
    /// CPU wrk and the backends are pinned to.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// Connections of the HTTP/2 row (h2load, over TLS); 0 leaves the row out.
    #[arg(long, default_value_t = 16)]
    pub h2_connections: usize,
    /// Concurrent streams per connection of the HTTP/2 row.
    #[arg(long, default_value_t = 10)]
    pub h2_streams: usize,
    /// Runs of each row per proxy, the two proxies taking turns to go first (ABBA...); each
    /// figure is then the median of the runs, so that a drift of the machine's speed weighs on
    /// both alike.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub rounds: u32,
}

/// Flags of `bench dns`.
#[derive(Debug, Args)]
pub struct DnsBenchArgs {
    /// Number of Services in the cluster (a tenth of them headless, with 3 endpoints each).
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// Seconds of each dnsperf run.
    #[arg(long, default_value_t = 15)]
    pub seconds: u32,
    /// CPU the server is pinned to.
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// CPU dnsperf is pinned to.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
}

/// Flags of `bench proxy`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Numbers of Services to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub services: Vec<usize>,
    /// Endpoints per Service.
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Backends to measure side by side, comma-separated: nftables, iptables (the flavour this
    /// host would get), iptables-legacy (the legacy flavour, as on a host whose kubelet uses it),
    /// ipvs (on a kernel with IPVS: `tests/vm/run.sh --exec` runs it on Debian 12's), ebpf (its
    /// programs on a cgroup and bpffs of the bench's own; the maps sized to the cluster).
    #[arg(long, value_delimiter = ',', default_value = "nftables,iptables,iptables-legacy")]
    pub proxy_mode: Vec<String>,
    /// Also write the table (`results.md`) and SVG plots of each figure against the number of
    /// Services, a line per backend (`change.svg`, `new-service.svg`, `full-sync.svg`,
    /// `connect.svg`, `rss.svg`), into this folder (created if needed).
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// Flags of `trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The request: `http://ADDRESS-OR-NAME[:PORT]/PATH` (or https://).
    pub url: String,
    /// A header, as curl's: `Host: NAME[:PORT]`, the host the Ingress routes the request by (the
    /// packet goes to the URL's address). Only Host is taken (no station matches on others).
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub headers: Vec<String>,
    /// In the lab: where the request starts, `client` (default), `internet`, a node (`node-1`)
    /// or a pod (`NAME` in namespace default, or `NAMESPACE/NAME`).
    #[arg(long, value_name = "HOST", conflicts_with = "from_node")]
    pub from: Option<String>,
    /// The lab directory (as `lab --lab-dir`; default $ROADKEEPER_LAB_DIR, else
    /// /run/roadkeeper/lab).
    #[arg(long, value_name = "DIR", conflicts_with = "from_node")]
    pub lab_dir: Option<PathBuf>,
    /// Outside the lab: the node the request starts on (its host network), traced read-only
    /// from the cluster of --kubeconfig (or --manifests); nothing is sent.
    #[arg(long, value_name = "NODE")]
    pub from_node: Option<String>,
    /// `text`, or `json` for tools.
    #[arg(long, short = 'o', value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// The Service in front of the Ingress controller, `NAMESPACE/NAME`: a request reaching it
    /// is routed by the Ingress rules of --ingress-class.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "kube-system/roadkeeper-ingress")]
    pub ingress_service: String,
    /// The Ingress controller's IngressClass name.
    #[arg(long, value_name = "NAME", default_value = "roadkeeper")]
    pub ingress_class: String,
    /// The cluster domain.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Where the cluster state comes from (outside the lab).
    #[command(flatten)]
    pub source: SourceArgs,
    /// The flags the nodes' proxies run with (outside the lab; the lab's own are used in it).
    #[command(flatten)]
    pub rules: RuleArgs,
}

/// Flags of `lab`.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// The lab directory, holding the lab's state, generated cluster state and logs (default:
    /// $ROADKEEPER_LAB_DIR, else /run/roadkeeper/lab). Labs in different directories are
    /// independent.
    #[arg(long, value_name = "DIR", global = true)]
    pub lab_dir: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: LabCommand,
}

/// Subcommands of `lab`.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Build the lab from the manifests of DIR and return once every part answers: N nodes
    /// joined by a router, a pod network per node, a client and an internet host, the
    /// Deployments' and Pods' pods, `roadkeeper proxy` in every node, `roadkeeper dns` and
    /// `roadkeeper ingress` in pods behind their Services. DIR stays watched. Containers run as
    /// root on this machine: image `roadkeeper` only `proxy`, `rules`, `dns`, `ingress`, `gateway`
    /// or `echo`; any other image is served from its volumes by the lab's web server.
    ///
    /// A folder with an object an API server would refuse (YAML that does not parse, a field
    /// that is not valid, an address the lab cannot give) builds nothing: every problem is named
    /// (file, object, field) and the command fails at once, leaving nothing behind. Objects of
    /// kinds the lab does not run (StatefulSets, DaemonSets, Jobs, Gateways...) and what it
    /// refuses to let a container do are named too, and the lab runs the rest.
    Up {
        /// The manifest folder (Deployments, ConfigMaps, Services, Ingresses, IngressClasses,
        /// Pods, EndpointSlices, Secrets, Namespaces).
        #[arg(default_value = "examples/hello")]
        dir: PathBuf,
        /// Number of nodes (1-50).
        #[arg(long, default_value_t = 2)]
        nodes: u8,
        /// The proxy's kernel backend in every node: nftables, iptables, ipvs (needs a kernel
        /// with IPVS, refused where there is none) or ebpf (kernel 5.18+ and a cgroup v2
        /// hierarchy: each node's programs on a cgroup of its own that its pods join).
        #[arg(long, value_name = "MODE", default_value = "nftables")]
        proxy_mode: String,
    },
    /// Remove every namespace, process, file and mount of the lab (also after a crash).
    Down,
    /// Show the lab's hosts, pods, processes and the problems found in its manifests.
    Status,
    /// List pods, services, endpointslices, ingress or nodes with the columns of `kubectl get`.
    Get {
        /// pods, services, endpointslices, ingress or nodes (or kubectl's short names).
        resource: String,
        /// `wide` adds kubectl's wide columns.
        #[arg(short, long, value_name = "FORMAT")]
        output: Option<String>,
        /// Only objects whose labels match (`app=hello`, `app!=x`, `app in (a,b)`, `key`, `!key`).
        #[arg(short = 'l', long, value_name = "SELECTOR")]
        selector: Option<String>,
        /// The namespace listed.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// List every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Add a LABELS column (as kubectl's `--show-labels`).
        #[arg(long)]
        show_labels: bool,
    },
    /// Run a Deployment with N replicas, as `kubectl scale` changes the live object (the
    /// manifest folder is not written; an edit of `replicas` there wins again), and wait until
    /// the lab and every node's proxy follow.
    Scale {
        /// `deployment/NAME`.
        target: String,
        /// The new number of replicas.
        #[arg(long)]
        replicas: i32,
        /// The Deployment's namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
    /// Change a pod's labels (KEY=VALUE sets, KEY- removes), as `kubectl label pod` does; keys
    /// and values kubectl or the API server refuse are refused.
    Label {
        /// `pod` (or `pods`, `po`).
        resource: String,
        /// The pod.
        name: String,
        /// Changes: KEY=VALUE or KEY-.
        #[arg(required = true)]
        labels: Vec<String>,
        /// Allow changing labels that have a value.
        #[arg(long)]
        overwrite: bool,
        /// The pod's namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
    /// Run a command in a host (node-N, client, internet, router) or a pod's container (its
    /// network, mounts and host name).
    Exec {
        /// A host or a pod.
        name: String,
        /// The pod's namespace.
        #[arg(short, long)]
        namespace: Option<String>,
        /// The pod's container (default: its first).
        #[arg(short, long)]
        container: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The lab controller (started by `lab up`).
    #[command(hide = true)]
    Controller,
    /// Runs one container from its spec file (started by the lab controller).
    #[command(hide = true)]
    Container {
        /// The container's spec (JSON).
        spec: PathBuf,
    },
    /// The lab's web server (TCP) and echo server (UDP), as a container or host runs them.
    #[command(hide = true)]
    Serve {
        /// The name answered.
        #[arg(long)]
        name: String,
        /// The folder served (without: a line naming server and client).
        #[arg(long)]
        root: Option<PathBuf>,
        /// TCP port served over HTTP, repeatable.
        #[arg(long)]
        tcp: Vec<u16>,
        /// UDP port echoed, repeatable.
        #[arg(long)]
        udp: Vec<u16>,
    },
}

/// Flags of `dns`.
#[derive(Debug, Args, Clone)]
pub struct DnsArgs {
    /// Where the cluster state comes from.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Address to serve DNS on, over UDP and TCP; repeatable.
    #[arg(long, value_name = "ADDR:PORT", default_values = ["0.0.0.0:53"])]
    pub listen: Vec<SocketAddr>,
    /// Zones answered from the cluster, repeatable: the first is the cluster domain; reverse
    /// zones (`in-addr.arpa`, `ip6.arpa`) answer PTR for Service and endpoint addresses.
    #[arg(long, value_name = "ZONE", default_values = ["cluster.local", "in-addr.arpa", "ip6.arpa"])]
    pub zone: Vec<String>,
    /// Zones whose names unknown to the cluster are forwarded upstream instead of NXDOMAIN;
    /// repeatable.
    #[arg(long, value_name = "ZONE", default_values = ["in-addr.arpa", "ip6.arpa"], conflicts_with = "no_fallthrough")]
    pub fallthrough: Vec<String>,
    /// Never forward names of our zones: unknown ones are NXDOMAIN.
    #[arg(long)]
    pub no_fallthrough: bool,
    /// Upstream resolver (IP or IP:PORT), repeatable (default: the nameservers of
    /// /etc/resolv.conf).
    #[arg(long, value_name = "ADDR")]
    pub upstream: Vec<String>,
    /// Most questions waiting on the upstreams at once, identical ones included (CoreDNS forward's
    /// `max_concurrent`); beyond it a question is answered SERVFAIL at once. 1-65535 (message IDs
    /// per upstream socket).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent: u16,
    /// Most client TCP connections open at once, all workers together (each holds its share),
    /// and never more than the file descriptors RLIMIT_NOFILE leaves after those kept for the
    /// listeners, the upstream sockets and the health and metrics servers. At the bound a new
    /// connection takes the place of the one idle the longest (or is closed at once when all are
    /// being answered); above 3/4 of it idle connections close after 2 s instead of 10 s. CoreDNS
    /// has no such bound (only its descriptor limit and idle timeout): at that limit its upstream
    /// sockets fail; 4096 is room for far more TCP clients than a cluster's resolvers open.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tcp_connections: u32,
    /// Most bytes the cache of upstream answers holds (each entry: its response in wire format,
    /// its name and 256 bytes of bookkeeping); 0 caches nothing.
    #[arg(long, value_name = "BYTES", default_value_t = ForwardConfig::default().cache_max_bytes)]
    pub cache_max_bytes: u64,
    /// TTL of the cluster zone's answers, in seconds (0-3600).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub ttl: u32,
    /// Pod records `a-b-c-d.<ns>.pod.<zone>`: disabled, insecure (any address) or verified (only
    /// addresses of existing Pods in that namespace).
    #[arg(long, value_name = "MODE", default_value = "disabled")]
    pub pods: String,
    /// Name endpoints without a hostname after their Pod instead of their dashed address.
    #[arg(long)]
    pub endpoint_pod_names: bool,
    /// A ClusterIP Service without ready endpoints is NXDOMAIN.
    #[arg(long)]
    pub ignore_empty_service: bool,
    /// Address of the health server (`/health`: alive; `/ready`: the cluster state is loaded);
    /// empty disables it.
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:8080")]
    pub health_bind_address: String,
    /// Address of the Prometheus metrics server (`/metrics`); empty disables it.
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:9153")]
    pub metrics_bind_address: String,
    /// After SIGTERM or SIGINT, go on answering (and following the cluster, `/ready` still 200)
    /// for this long before exiting: the time the endpoint takes to leave the Service's rules
    /// (CoreDNS's `health { lameduck }`). A second signal exits at once; 0s exits at the first.
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub lameduck: humantime::Duration,
}

/// Flags of `ingress`.
#[derive(Debug, Args, Clone)]
pub struct IngressArgs {
    /// Where the cluster state comes from.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Address for plain HTTP; empty disables it.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:80")]
    pub http: String,
    /// Address for HTTPS (certificates from the Ingresses' `kubernetes.io/tls` Secrets, by SNI);
    /// empty disables it.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:443")]
    pub https: String,
    /// The IngressClass served (controller `roadkeeper.dev/ingress`).
    #[arg(long, value_name = "NAME", default_value = "roadkeeper")]
    pub class: String,
    /// A `kubernetes.io/tls` Secret whose certificate answers HTTPS handshakes without SNI or for
    /// hosts without a certificate of their own (without it, those handshakes fail).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_namespaced_name)]
    pub default_ssl_certificate: Option<NamespacedName>,
    /// Addresses written to `status.loadBalancer.ingress` of every Ingress served, comma-separated:
    /// IPs (as `ip`) or DNS names (as `hostname`), e.g. those of the load balancer in front of
    /// this controller. Default: the IP of `--http` if it names one (not 0.0.0.0 or ::), else
    /// that of `--https`, else no status is published.
    #[arg(long, value_name = "ADDRESSES", value_delimiter = ',', conflicts_with = "publish_service")]
    pub publish_status_address: Vec<Address>,
    /// The Service clients reach this controller through: its load balancer's addresses
    /// (`status.loadBalancer.ingress`), else its `externalIPs`, are written to every Ingress
    /// served, and follow it when they change (none while it has neither), as ingress-nginx's
    /// `--publish-service`.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_namespaced_name)]
    pub publish_service: Option<NamespacedName>,
    /// Address of the Prometheus metrics server (`/metrics`); empty disables it.
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:10254")]
    pub metrics_bind_address: String,
    /// Limits and timeouts of the reverse proxy.
    #[command(flatten)]
    pub proxy: HttpProxyArgs,
}

/// Flags of `gateway`.
#[derive(Debug, Args, Clone)]
pub struct GatewayArgs {
    /// Where the cluster state comes from.
    #[command(flatten)]
    pub source: SourceArgs,
    /// GatewayClasses whose `spec.controllerName` is this are served.
    #[arg(long, value_name = "NAME", default_value = roadkeeper_ingress::gateway::DEFAULT_CONTROLLER)]
    pub controller_name: String,
    /// Addresses for the Gateways (a CIDR): each Gateway of ours gets one (the one its
    /// `spec.addresses` asks for, if any), written to its `status.addresses`. This host must
    /// receive the range's traffic and treat it as local (`ip route add local CIDR dev lo`, with
    /// the network routing the range to this node), since listeners are told apart by the address
    /// a client reached.
    #[arg(long, value_name = "CIDR")]
    pub address_pool: ipnet::IpNet,
    /// Address of the Prometheus metrics server (`/metrics`); empty disables it.
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:10254")]
    pub metrics_bind_address: String,
    /// Limits and timeouts of the reverse proxy.
    #[command(flatten)]
    pub proxy: HttpProxyArgs,
}

/// The reverse proxy's flags, shared by `ingress` and `gateway`.
#[derive(Debug, Args, Clone)]
pub struct HttpProxyArgs {
    /// On SIGTERM or SIGINT: stop accepting, let requests in flight finish (idle keep-alive
    /// connections close, HTTP/2 gets GOAWAY) for at most this long, then exit.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub shutdown_timeout: humantime::Duration,
    /// Time to open a connection to an endpoint; on failure the request goes to another endpoint
    /// (bodiless requests), else 502.
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    pub upstream_connect_timeout: humantime::Duration,
    /// Time from sending a request to an endpoint until its response head; then 504.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub upstream_response_timeout: humantime::Duration,
    /// Time a client has for the TLS handshake, for its first request (a connection that sends
    /// none is closed), and for each HTTP/1 request head (counted from the connection's start or
    /// its previous response, so it also closes idle keep-alive connections).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub client_header_timeout: humantime::Duration,
    /// A client connection, upgraded tunnel or pooled backend connection on which nothing moved
    /// for this long is closed.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub idle_timeout: humantime::Duration,
    /// Largest request body in bytes (413 beyond it); 0: unlimited.
    #[arg(long, value_name = "BYTES", default_value_t = 10 << 20)]
    pub max_request_body: usize,
    /// Most request header fields (431 beyond it).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub max_request_headers: usize,
    /// Largest request head in bytes, request line and header fields (431 beyond it; at least
    /// 8192). On HTTP/2 the header list size, as SETTINGS_MAX_HEADER_LIST_SIZE counts it.
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 10, value_parser = parse_request_head)]
    pub max_request_head: usize,
    /// Concurrent HTTP/2 streams per client connection (more are refused with REFUSED_STREAM).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,
    /// Open connections to one endpoint, busy or idle, per worker thread (one per CPU). A request
    /// that finds them all busy waits for one up to --upstream-connect-timeout, then tries another
    /// endpoint, else 503.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_max_connections: u64,
    /// Clients whose X-Forwarded-For, X-Forwarded-Proto and X-Forwarded-Host are believed
    /// (proxies or load balancers in front), comma-separated CIDRs, as ingress-nginx's
    /// `use-forwarded-headers` with `proxy-real-ip-cidr`: their X-Forwarded-For is appended to
    /// and X-Real-IP is the last address in it outside these CIDRs. From other clients those
    /// fields are replaced with what this proxy saw (the default: no client is trusted).
    #[arg(long, value_name = "CIDRS", value_delimiter = ',')]
    pub trusted_proxy_cidrs: Vec<ipnet::IpNet>,
}

impl DnsArgs {
    /// The forwarder's bounds from the flags (its timeouts and TTL caps are the defaults).
    pub fn forward_config(&self) -> ForwardConfig {
        ForwardConfig {
            max_concurrent: self.max_concurrent.into(),
            cache_max_bytes: self.cache_max_bytes,
            ..ForwardConfig::default()
        }
    }
}

impl IngressArgs {
    /// `roadkeeper ingress <flags>` parsed, or clap's error message.
    #[cfg(test)]
    pub fn parse_for_test(flags: &[&str]) -> Result<Self, String> {
        let argv = ["roadkeeper", "ingress"].iter().chain(flags);
        match Cli::try_parse_from(argv).map_err(|e| e.to_string())?.command {
            Command::Ingress(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }
}

impl HttpProxyArgs {
    /// The proxy's limits and timeouts from the flags.
    pub fn proxy_config(&self) -> roadkeeper_ingress::proxy::ProxyConfig {
        roadkeeper_ingress::proxy::ProxyConfig {
            connect_timeout: *self.upstream_connect_timeout,
            response_timeout: *self.upstream_response_timeout,
            client_header_timeout: *self.client_header_timeout,
            idle_timeout: *self.idle_timeout,
            max_request_body: (self.max_request_body > 0).then_some(self.max_request_body),
            max_headers: self.max_request_headers,
            max_request_head: self.max_request_head,
            max_concurrent_streams: self.http2_max_concurrent_streams,
            max_upstream_connections: usize::try_from(self.upstream_max_connections).unwrap_or(usize::MAX),
            trusted_proxies: self.trusted_proxy_cidrs.clone(),
            ..Default::default()
        }
    }
}

/// A request head limit: bytes, at least hyper's minimum buffer.
fn parse_request_head(text: &str) -> Result<usize, String> {
    let bytes: usize = text.parse().map_err(|err| format!("{text:?}: {err}"))?;
    let min = roadkeeper_ingress::proxy::MIN_REQUEST_HEAD;
    if bytes < min {
        return Err(format!("{bytes} is less than {min}"));
    }
    Ok(bytes)
}

/// `NAMESPACE/NAME`, both parts non-empty.
fn parse_namespaced_name(text: &str) -> Result<NamespacedName, String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(NamespacedName::new(namespace, name))
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(argv: &[&str]) -> anyhow::Result<Command> {
        Cli::try_parse_from(argv)?.into_command()
    }

    fn lab_dir(argv: &[&str]) -> Option<PathBuf> {
        match command(argv).unwrap() {
            Command::Lab(args) => args.lab_dir,
            Command::Trace(args) => args.lab_dir,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lab_dir_goes_before_or_after_the_subcommand() {
        let dir = Some(PathBuf::from("/tmp/lab-a"));
        for argv in [
            &["roadkeeper", "--lab-dir", "/tmp/lab-a", "lab", "up"][..],
            &["roadkeeper", "lab", "--lab-dir", "/tmp/lab-a", "up"],
            &["roadkeeper", "lab", "up", "--lab-dir", "/tmp/lab-a"],
            &["roadkeeper", "--lab-dir", "/tmp/lab-a", "lab", "up", "--lab-dir", "/tmp/lab-a"],
            &["roadkeeper", "--lab-dir", "/tmp/lab-a", "trace", "http://10.96.0.1/"],
            &["roadkeeper", "trace", "--lab-dir", "/tmp/lab-a", "http://10.96.0.1/"],
        ] {
            assert_eq!(lab_dir(argv), dir, "{argv:?}");
        }
        assert_eq!(lab_dir(&["roadkeeper", "lab", "status"]), None);
    }

    #[test]
    fn lab_dir_is_refused_where_it_means_nothing_or_twice_differently() {
        let err = command(&["roadkeeper", "--lab-dir", "/tmp/a", "cleanup"]).unwrap_err();
        assert!(err.to_string().contains("only to `lab` and `trace`"), "{err}");
        let err = command(&["roadkeeper", "--lab-dir", "/tmp/a", "lab", "up", "--lab-dir", "/tmp/b"]).unwrap_err();
        assert!(err.to_string().contains("/tmp/a and /tmp/b"), "{err}");
    }
}
