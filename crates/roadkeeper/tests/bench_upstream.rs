//! Side by side with upstream: roadkeeper and kube-proxy of the pinned release, each fed by one
//! real kube-apiserver holding the same synthetic cluster, in nftables and iptables mode, one
//! after the other in one network namespace. Every change is timed from the API call to the
//! first connection through the kernel's rules that shows it.
//!
//! A benchmark, not a test: ignored unless asked for. `bench/vs-upstream.sh` builds kube-proxy
//! and runs it; see BENCHMARKS.md.

/// The binary's chart module (pure), shared rather than copied.
#[path = "../src/bench_plot.rs"]
mod bench_plot;
mod common;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::apiserver::ControlPlane;
use futures::StreamExt;
use roadkeeper_cluster::k8s_openapi::api::core::v1::{Namespace, Node, Service};
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::kube::Api;
use roadkeeper_cluster::kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use roadkeeper_netlab::{Netns, Process};
use serde_json::json;

/// The pod CIDR: endpoints and the probing client are in it (so the client is not masqueraded).
const CLUSTER_CIDR: &str = "10.128.0.0/9";
/// The probing client's address.
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 255, 255, 254);
/// Listeners standing for the endpoints of the probe Services: the old and new endpoint of the
/// changed Service, and the endpoint of the new Service.
const LISTENERS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(10, 255, 0, 1), Ipv4Addr::new(10, 255, 0, 2), Ipv4Addr::new(10, 255, 0, 3)];
/// The nodes endpoints are spread over; the proxies run as node-0.
const NODES: usize = 10;
/// Endpoints per synthetic Service.
const ENDPOINTS: usize = 10;
/// Requests to the API server in flight while the cluster is created.
const CREATE_CONCURRENCY: usize = 32;

/// One proxy as the benchmark runs it.
struct Proxy {
    name: &'static str,
    mode: &'static str,
    args: Vec<String>,
}

/// The proxies to compare, from `RK_BENCH_PROXIES` (default: all four).
fn proxies(kubeconfig: &Path) -> Vec<Proxy> {
    let kubeconfig = kubeconfig.display().to_string();
    let roadkeeper = env!("CARGO_BIN_EXE_roadkeeper").to_string();
    let kube_proxy = std::env::var("RK_KUBE_PROXY").unwrap_or_default();
    // The flags both take, with the same meaning.
    let common = |mode: &str| -> Vec<String> {
        ["--kubeconfig", &kubeconfig, "--hostname-override", "node-0", "--proxy-mode", mode]
            .into_iter()
            .chain(["--cluster-cidr", CLUSTER_CIDR, "--metrics-bind-address", "127.0.0.1:10249"])
            // Both leave the conntrack sysctls as they are (kube-proxy fails at start on
            // nf_conntrack_max, read-only outside the initial namespace; roadkeeper warns).
            .chain(["--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0"])
            .chain(["--conntrack-tcp-timeout-close-wait", "0"])
            .map(String::from)
            .collect()
    };
    let ours = |mode: &'static str| Proxy {
        name: "roadkeeper",
        mode,
        args: [roadkeeper.clone(), "proxy".into()].into_iter().chain(common(mode)).collect(),
    };
    let upstream = |mode: &'static str| Proxy {
        name: "kube-proxy",
        mode,
        args: [kube_proxy.clone()]
            .into_iter()
            .chain(common(mode))
            .chain(["--healthz-bind-address", "127.0.0.1:10256"].map(String::from))
            .collect(),
    };
    let wanted = std::env::var("RK_BENCH_PROXIES")
        .unwrap_or_else(|_| "roadkeeper-nftables,kube-proxy-nftables,roadkeeper-iptables,kube-proxy-iptables".into());
    wanted
        .split(',')
        .map(|p| match p {
            "roadkeeper-nftables" => ours("nftables"),
            "roadkeeper-iptables" => ours("iptables"),
            "kube-proxy-nftables" => upstream("nftables"),
            "kube-proxy-iptables" => upstream("iptables"),
            other => panic!("RK_BENCH_PROXIES: unknown proxy {other}"),
        })
        .inspect(|p| assert!(!p.args[0].is_empty(), "RK_KUBE_PROXY must name the kube-proxy binary"))
        .collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Synthetic Service `i`: 80% one TCP port, 15% two, 5% UDP; 4% NodePort (the NodePort range
/// holds 2,768 ports: 5% would not fit at 50,000 Services) and 2% LoadBalancer with source ranges
/// and no NodePorts, a quarter and a half of them `externalTrafficPolicy: Local` (2% in all: the
/// API allows it on those types only); 5% ClientIP affinity.
fn synthetic_service(i: usize) -> Service {
    let kind = i % 100;
    let ports = match kind {
        0..80 => json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]),
        80..95 => json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                         {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]),
        _ => json!([{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]),
    };
    let mut spec = json!({"ports": ports});
    match i % 50 {
        0 | 1 => {
            spec["type"] = json!("NodePort");
        }
        2 => {
            spec["type"] = json!("LoadBalancer");
            spec["allocateLoadBalancerNodePorts"] = json!(false);
            spec["loadBalancerSourceRanges"] = json!(["10.0.0.0/8", "192.168.0.0/16"]);
        }
        _ => {}
    }
    if i % 20 == 7 {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    if matches!(i % 50, 0 | 2) && i % 100 < 50 {
        spec["externalTrafficPolicy"] = json!("Local");
    }
    serde_json::from_value(json!({"metadata": {"name": format!("svc-{i}"), "namespace": "bench"}, "spec": spec}))
        .expect("synthetic Service")
}

/// The EndpointSlice of synthetic Service `i`: [`ENDPOINTS`] ready endpoints over [`NODES`]
/// nodes, addresses in the pod CIDR, the Service's ports.
fn synthetic_slice(i: usize, service: &Service) -> EndpointSlice {
    let ports: Vec<serde_json::Value> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .map(|p| json!({"name": p.name, "port": 8000 + p.port, "protocol": p.protocol}))
        .collect();
    let endpoints: Vec<serde_json::Value> = (0..ENDPOINTS)
        .map(|e| {
            let address = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * ENDPOINTS + e) as u32);
            json!({"addresses": [address.to_string()], "conditions": {"ready": true}, "nodeName": format!("node-{}", e % NODES)})
        })
        .collect();
    slice_of(&format!("svc-{i}"), ports, endpoints)
}

fn slice_of(service: &str, ports: Vec<serde_json::Value>, endpoints: Vec<serde_json::Value>) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-1"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }))
    .expect("EndpointSlice")
}

/// Probe Service `name`: one TCP port 80, no selector.
fn probe_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .expect("probe Service")
}

/// The EndpointSlice of probe Service `name`: its one endpoint at `endpoint:8080`.
fn probe_slice(name: &str, endpoint: Ipv4Addr) -> EndpointSlice {
    slice_of(
        name,
        vec![json!({"name": "http", "port": 8080, "protocol": "TCP"})],
        vec![json!({"addresses": [endpoint.to_string()], "conditions": {"ready": true}, "nodeName": "node-1"})],
    )
}

/// The API, from inside the namespace (the API server listens on its loopback).
struct Cluster {
    rt: tokio::runtime::Runtime,
    services: Api<Service>,
    slices: Api<EndpointSlice>,
}

impl Cluster {
    fn connect(ns: &Netns, kubeconfig: &Path) -> Cluster {
        ns.run(|| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            let client = rt.block_on(roadkeeper_cluster::client(Some(kubeconfig))).expect("API client");
            Cluster {
                services: Api::namespaced(client.clone(), "bench"),
                slices: Api::namespaced(client.clone(), "bench"),
                rt,
            }
        })
    }

    fn client(&self) -> roadkeeper_cluster::kube::Client {
        self.services.clone().into_client()
    }

    /// Creates the nodes, the namespace and `n` synthetic Services with their slices; the time
    /// it took.
    fn populate(&self, ns: &Netns, n: usize) -> Duration {
        let start = Instant::now();
        ns.run(|| {
            self.rt.block_on(async {
                let pp = PostParams::default();
                let nodes: Api<Node> = Api::all(self.client());
                for node in 0..NODES {
                    let ip = format!("192.168.0.{}", 2 + node);
                    let object = serde_json::from_value(json!({"metadata": {"name": format!("node-{node}")},
                        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}))
                    .unwrap();
                    nodes.create(&pp, &object).await.expect("create Node");
                }
                let namespaces: Api<Namespace> = Api::all(self.client());
                namespaces
                    .create(&pp, &serde_json::from_value(json!({"metadata": {"name": "bench"}})).unwrap())
                    .await
                    .expect("create namespace");
                futures::stream::iter(0..n)
                    .map(|i| async move {
                        let created = self.services.create(&PostParams::default(), &synthetic_service(i)).await;
                        let service = created.unwrap_or_else(|err| panic!("create svc-{i}: {err}"));
                        if service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer") {
                            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i as u32);
                            let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}});
                            let params = PatchParams::default();
                            self.services
                                .patch_status(&format!("svc-{i}"), &params, &Patch::Merge(status))
                                .await
                                .unwrap();
                        }
                        self.slices.create(&PostParams::default(), &synthetic_slice(i, &service)).await.unwrap();
                    })
                    .buffer_unordered(CREATE_CONCURRENCY)
                    .collect::<Vec<()>>()
                    .await;
            })
        });
        start.elapsed()
    }

    /// Creates probe Service `name` with its endpoint at `endpoint`; its ClusterIP.
    fn create_probe(&self, ns: &Netns, name: &str, endpoint: Ipv4Addr) -> Ipv4Addr {
        self.create_probe_slice(ns, name, endpoint);
        self.create_probe_service(ns, name)
    }

    fn create_probe_slice(&self, ns: &Netns, name: &str, endpoint: Ipv4Addr) {
        let slice = probe_slice(name, endpoint);
        ns.run(|| self.rt.block_on(self.slices.create(&PostParams::default(), &slice)).expect("create probe slice"));
    }

    /// Creates the Service of probe `name`; its ClusterIP.
    fn create_probe_service(&self, ns: &Netns, name: &str) -> Ipv4Addr {
        let service = probe_service(name);
        let created =
            ns.run(|| self.rt.block_on(self.services.create(&PostParams::default(), &service)).expect("create probe"));
        created.spec.and_then(|s| s.cluster_ip).and_then(|ip| ip.parse().ok()).expect("probe ClusterIP")
    }

    fn move_probe(&self, ns: &Netns, name: &str, endpoint: Ipv4Addr) {
        let slice = probe_slice(name, endpoint);
        ns.run(|| {
            self.rt.block_on(async {
                let params = PatchParams::apply("bench").force();
                self.slices.patch(&format!("{name}-1"), &params, &Patch::Apply(&slice)).await.expect("move probe");
            })
        })
    }

    fn delete_probe_service(&self, ns: &Netns, name: &str) {
        ns.run(|| self.rt.block_on(self.services.delete(name, &DeleteParams::default())).expect("delete probe"));
    }

    fn delete_probe_slice(&self, ns: &Netns, name: &str) {
        let slice = format!("{name}-1");
        ns.run(|| self.rt.block_on(self.slices.delete(&slice, &DeleteParams::default())).expect("delete probe slice"));
    }
}

/// The probe listeners: how many connections each accepted.
struct Listeners {
    accepted: Vec<Arc<AtomicU64>>,
}

impl Listeners {
    /// Listens on every [`LISTENERS`] address, port 8080, from threads that live as long as the
    /// benchmark process.
    fn start(ns: &Netns) -> Listeners {
        let accepted: Vec<Arc<AtomicU64>> = LISTENERS.iter().map(|_| Arc::default()).collect();
        ns.run(|| {
            for (ip, count) in LISTENERS.iter().zip(&accepted) {
                let listener = std::net::TcpListener::bind((*ip, 8080)).expect("probe listener");
                let count = count.clone();
                std::thread::spawn(move || {
                    for _ in listener.incoming() {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        Listeners { accepted }
    }

    /// Connects once to `to` from the client address; the index of the listener that accepted
    /// it (None: refused, unreachable or no answer within 10 ms; through local rules a
    /// connection takes well under a millisecond).
    fn reach(&self, ns: &Netns, to: SocketAddr) -> Option<usize> {
        let before: Vec<u64> = self.accepted.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let connected = ns.run(|| {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
            socket.bind(&SocketAddr::from((CLIENT, 0)).into()).ok()?;
            socket.set_linger(Some(Duration::ZERO)).ok()?;
            socket.connect_timeout(&to.into(), Duration::from_millis(10)).ok()
        });
        connected?;
        // The accepting thread counts just after accept returns.
        for _ in 0..100 {
            if let Some(i) = self.accepted.iter().zip(&before).position(|(c, b)| c.load(Ordering::Relaxed) > *b) {
                return Some(i);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        None
    }

    /// Polls [`reach`](Self::reach) every millisecond until `done` holds of its answer; the
    /// time from `since`, or None after `limit`.
    fn until(
        &self,
        ns: &Netns,
        to: SocketAddr,
        since: Instant,
        limit: Duration,
        done: impl Fn(Option<usize>) -> bool,
    ) -> Option<Duration> {
        loop {
            if done(self.reach(ns, to)) {
                return Some(since.elapsed());
            }
            if since.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A process's peak RSS (MiB) and CPU time so far, its waited-for children's included.
fn process_stats(pid: u32) -> (f64, Duration) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    // utime, stime, cutime and cstime are the 12th to 15th fields after the command name, in
    // clock ticks. The children's times count the `nft` and `iptables-restore` processes the
    // proxy ran and waited for.
    let rest = stat_fields(pid);
    let ticks: u64 = (11..15).filter_map(|i| rest.get(i)?.parse::<u64>().ok()).sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    (hwm_kib / 1024.0, Duration::from_millis(ticks * 1000 / hz))
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces); none when
/// the process is gone.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().map(String::from).collect()).unwrap_or_default()
}

/// The processes `pid` started and that still run (kube-proxy's `nft`), with their peak RSS in
/// MiB: found by their parent in `/proc/*/stat`.
fn children(pid: u32) -> Vec<(u32, f64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        // The parent is the 2nd field after the command name.
        .filter(|&child| stat_fields(child).get(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(pid))
        .map(|child| (child, process_stats(child).0))
        .collect()
}

/// A sample of the proxy's metrics endpoint (inside the namespace), summed over its label sets
/// (upstream labels its sync metrics by IP family).
fn metric(ns: &Netns, name: &str) -> Option<f64> {
    let body = ns.run(|| common::http::try_http_get(SocketAddr::from(([127, 0, 0, 1], 10249)), "/metrics").ok())?;
    let values: Vec<f64> = body
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = if rest.starts_with('{') { &rest[rest.find('}')? + 1..] } else { rest };
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Lines of the proxy's rules as the kernel lists them.
fn ruleset_lines(ns: &Netns, mode: &str) -> usize {
    let listing =
        |args: &[&str]| ns.exec(args).map(|o| String::from_utf8_lossy(&o.stdout).lines().count()).unwrap_or(0);
    match mode {
        "nftables" => listing(&["nft", "list", "ruleset"]),
        _ => listing(&["iptables-save"]) + listing(&["ip6tables-save"]),
    }
}

/// Median and max, as text.
fn median_max(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.sort();
    format!("{} / {}", short(v[v.len() / 2]), short(v[v.len() - 1]))
}

fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// What one proxy measured at one size.
struct Row {
    cold: Option<Duration>,
    cpu_at_synced: Duration,
    change: Vec<Duration>,
    added: Vec<Duration>,
    deleted: Vec<Duration>,
    sync_mean: Option<Duration>,
    rss: f64,
    cpu: Duration,
    lines: usize,
}

/// The namespace with its control plane, listeners and probe Service, as each proxy finds it.
struct Setup<'a> {
    ns: &'a Netns,
    cluster: &'a Cluster,
    listeners: &'a Listeners,
    /// The probe Service's ClusterIP and port; its endpoint is the first listener.
    probe: SocketAddr,
}

/// Starts `proxy`, times its cold start, `runs` endpoint changes, new and deleted Services, and
/// leaves the namespace without rules.
fn measure(setup: &Setup, proxy: &Proxy, runs: usize, log: &Path) -> Row {
    let Setup { ns, cluster, listeners, probe } = *setup;
    let mut at = 0;
    let cold_limit = Duration::from_secs(env_or("RK_BENCH_COLD_LIMIT", 900));
    let change_limit = Duration::from_secs(env_or("RK_BENCH_CHANGE_LIMIT", 120));
    // Both proxies sync at most once a second by default (minSyncPeriod): each change waits
    // that long after the previous one, so that it measures a sync, not the rate limit.
    let pause = || std::thread::sleep(Duration::from_millis(env_or("RK_BENCH_PAUSE_MS", 1100)));
    let start = Instant::now();
    let process: Process = ns.spawn_logged(&proxy.args, log).expect("start the proxy");
    let pid = process.id();
    let synced =
        |_: Option<usize>| metric(ns, "kubeproxy_sync_proxy_rules_last_timestamp_seconds").unwrap_or(0.0) > 0.0;
    let cold = listeners.until(ns, probe, start, cold_limit, |reached| reached == Some(at) && synced(reached));
    let cpu_at_synced = process_stats(pid).1;
    let mut row = Row {
        cold,
        cpu_at_synced,
        change: Vec::new(),
        added: Vec::new(),
        deleted: Vec::new(),
        sync_mean: None,
        rss: 0.0,
        cpu: Duration::ZERO,
        lines: 0,
    };
    if cold.is_some() {
        let sum = |ns: &Netns| metric(ns, "kubeproxy_sync_proxy_rules_duration_seconds_sum").unwrap_or(0.0);
        let count = |ns: &Netns| metric(ns, "kubeproxy_sync_proxy_rules_duration_seconds_count").unwrap_or(0.0);
        let (sum0, count0) = (sum(ns), count(ns));
        for _ in 0..runs {
            at = 1 - at;
            pause();
            let since = Instant::now();
            cluster.move_probe(ns, "probe", LISTENERS[at]);
            match listeners.until(ns, probe, since, change_limit, |r| r == Some(at)) {
                Some(took) => row.change.push(took),
                None => panic!("{} {}: the probe never moved; log {}", proxy.name, proxy.mode, log.display()),
            }
        }
        // A new Service whose EndpointSlice is already there (else the slice arriving just
        // after the Service would wait out minSyncPeriod), and its deletion.
        for _ in 0..runs {
            cluster.create_probe_slice(ns, "probe-new", LISTENERS[2]);
            // The slice's own sync may wait out one minSyncPeriod; then one more passes.
            pause();
            pause();
            let since = Instant::now();
            let ip = cluster.create_probe_service(ns, "probe-new");
            let to = SocketAddr::from((ip, 80));
            row.added.extend(listeners.until(ns, to, since, change_limit, |r| r == Some(2)));
            pause();
            let since = Instant::now();
            cluster.delete_probe_service(ns, "probe-new");
            row.deleted.extend(listeners.until(ns, to, since, change_limit, |r| r.is_none()));
            cluster.delete_probe_slice(ns, "probe-new");
        }
        let (sum1, count1) = (sum(ns), count(ns));
        if count1 > count0 {
            row.sync_mean = Some(Duration::from_secs_f64((sum1 - sum0) / (count1 - count0)));
        }
        row.lines = ruleset_lines(ns, proxy.mode);
    }
    (row.rss, row.cpu) = process_stats(pid);
    // A child still at work (kube-proxy's `nft` at 50,000 Services, 7.5 GiB after 16 minutes)
    // would hold the nf_tables lock past the proxy's end, and the next proxy would wait for it.
    let orphans = children(pid);
    let _ = process.terminate(Duration::from_secs(10));
    for (child, rss) in orphans {
        eprintln!("{} {}: its child {child} still ran ({rss:.0} MiB peak); killed", proxy.name, proxy.mode);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), nix::sys::signal::Signal::SIGKILL);
    }
    // Leave the namespace as the next proxy should find it: no rules of anyone.
    let _ = ns.exec(["nft", "flush", "ruleset"]);
    row
}

#[test]
#[ignore = "a benchmark: bench/vs-upstream.sh runs it"]
fn roadkeeper_and_kube_proxy_side_by_side() {
    let sizes: Vec<usize> = std::env::var("RK_BENCH_SERVICES")
        .unwrap_or_else(|_| "1000".into())
        .split(',')
        .map(|s| s.parse().expect("RK_BENCH_SERVICES: numbers"))
        .collect();
    if let Some(table) = std::env::var_os("RK_BENCH_REPLOT").map(PathBuf::from) {
        let text = std::fs::read_to_string(&table).expect("RK_BENCH_REPLOT: a vs-upstream.md");
        plot_table(table.parent().unwrap_or(Path::new(".")), &text);
        return;
    }
    let runs: usize = env_or("RK_BENCH_RUNS", 20);
    let out: Option<PathBuf> = std::env::var_os("RK_BENCH_OUT").map(PathBuf::from);
    if let Some(out) = &out {
        std::fs::create_dir_all(out).unwrap();
    }
    let mut table = format!(
        "{runs} runs of each change, {ENDPOINTS} endpoints per Service, measured in one run of `bench/vs-upstream.sh`\n\n\
         | Services | proxy | mode | cold start to synced | its CPU | endpoint change (median / max) | new Service | deleted Service | mean sync (own metric) | peak RSS | CPU in all | ruleset lines |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for &n in &sizes {
        let ns = Netns::new("rk-bup").expect("namespace");
        ns.ip(["link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"]).unwrap();
        ns.ip(["link", "set", "node0-peer", "up"]).unwrap();
        ns.ip(["link", "set", "node0", "up"]).unwrap();
        ns.ip(["addr", "add", "192.168.0.2/24", "dev", "node0"]).unwrap();
        ns.ip(["route", "add", "10.96.0.0/12", "dev", "node0"]).unwrap();
        for ip in LISTENERS.iter().chain([&CLIENT]) {
            ns.ip(["addr", "add", &format!("{ip}/32"), "dev", "lo"]).unwrap();
        }
        let control_plane = ControlPlane::start(Some(ns.name()));
        let cluster = Cluster::connect(&ns, control_plane.admin_kubeconfig());
        let listeners = Listeners::start(&ns);
        let created = cluster.populate(&ns, n);
        let probe_ip = cluster.create_probe(&ns, "probe", LISTENERS[0]);
        eprintln!("{n} Services: created in {created:?}");
        // iptables mode stops at RK_BENCH_IPTABLES_MAX Services: upstream's first sync with the
        // nft flavour of iptables-restore grows with the square of the chains (hours at 50,000).
        let iptables_max: usize = env_or("RK_BENCH_IPTABLES_MAX", 10_000);
        for proxy in
            proxies(control_plane.admin_kubeconfig()).into_iter().filter(|p| p.mode != "iptables" || n <= iptables_max)
        {
            let log = std::env::temp_dir().join(format!("bench-{}-{}-{n}.log", proxy.name, proxy.mode));
            let _ = std::fs::remove_file(&log);
            // The probe is where the previous proxy left it: back to the first listener.
            cluster.move_probe(&ns, "probe", LISTENERS[0]);
            let setup =
                Setup { ns: &ns, cluster: &cluster, listeners: &listeners, probe: SocketAddr::from((probe_ip, 80)) };
            let row = measure(&setup, &proxy, runs, &log);
            let line = format!(
                "| {n} | {} | {} | {} | {:.1} s | {} | {} | {} | {} | {:.0} MiB | {:.1} s | {} |\n",
                proxy.name,
                proxy.mode,
                row.cold.map_or(format!("> {}", env_or("RK_BENCH_COLD_LIMIT", 900)), |d| format!(
                    "{:.2} s",
                    d.as_secs_f64()
                )),
                row.cpu_at_synced.as_secs_f64(),
                median_max(row.change.clone()),
                median_max(row.added.clone()),
                median_max(row.deleted.clone()),
                row.sync_mean.map_or("-".into(), short),
                row.rss,
                row.cpu.as_secs_f64(),
                row.lines,
            );
            eprint!("{line}");
            table.push_str(&line);
            // Written after every row: a run stopped early keeps what it measured.
            if let Some(out) = &out {
                std::fs::write(out.join("vs-upstream.md"), &table).unwrap();
                plot_table(out, &table);
            }
        }
    }
    println!("{table}");
}

/// A duration as the table writes it (`12.3 ms`, `4.56 s`; the first of `median / max`), in
/// milliseconds; NaN for anything else (`> 900`, `-`).
fn millis(cell: &str) -> f64 {
    let first = cell.split(" / ").next().unwrap_or_default().trim();
    match first.split_once(' ') {
        Some((value, "ms")) => value.parse().unwrap_or(f64::NAN),
        Some((value, "s")) => value.parse::<f64>().map_or(f64::NAN, |s| s * 1e3),
        _ => f64::NAN,
    }
}

/// SVG plots, into `out`, of the figures of a results table against the number of Services, a
/// line per proxy and mode.
fn plot_table(out: &Path, table: &str) {
    // Columns: Services, proxy, mode, cold start, its CPU, change, new, deleted, sync, RSS, ...
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("| ") && l.as_bytes().get(2).is_some_and(u8::is_ascii_digit))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .filter(|cells: &Vec<&str>| cells.len() >= 10)
        .collect();
    type Figure = fn(&[&str]) -> f64;
    let figures: [(&str, &str, &str, Figure); 4] = [
        ("vs-upstream-change.svg", "Endpoint change visible in the kernel (median)", "ms", |r| millis(r[5])),
        ("vs-upstream-cold-start.svg", "Cold start to synced", "s", |r| millis(r[3]) / 1e3),
        ("vs-upstream-rss.svg", "Peak RSS", "MiB", |r| r[9].trim_end_matches(" MiB").parse().unwrap_or(f64::NAN)),
        ("vs-upstream-new-service.svg", "New Service visible in the kernel (median)", "ms", |r| millis(r[6])),
    ];
    let names: BTreeSet<String> = rows.iter().map(|r| format!("{} {}", r[1], r[2])).collect();
    for (file, title, unit, figure) in figures {
        let series: Vec<bench_plot::Series> = names
            .iter()
            .map(|name| bench_plot::Series {
                name: name.clone(),
                points: rows
                    .iter()
                    .filter(|r| format!("{} {}", r[1], r[2]) == *name)
                    .filter_map(|r| Some((r[0].parse::<f64>().ok()?, figure(r))))
                    .collect(),
            })
            .collect();
        let svg = bench_plot::line_chart(title, "Services (10 endpoints each)", unit, &series);
        std::fs::write(out.join(file), svg).unwrap();
    }
}

#[test]
fn a_results_table_plots_a_line_per_proxy_and_mode() {
    assert_eq!(millis("7.9 ms / 11.3 ms"), 7.9);
    assert!((millis("2.03 s") - 2030.0).abs() < 1e-6);
    assert!(millis("> 900").is_nan() && millis("-").is_nan());
    let table = "| Services | proxy | mode | cold start to synced | its CPU | endpoint change (median / max) | new Service | deleted Service | mean sync (own metric) | peak RSS | CPU in all | ruleset lines |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|---|\n\
                 | 1000 | roadkeeper | nftables | 0.25 s | 0.2 s | 7.9 ms / 11.3 ms | 17.0 ms / 28.3 ms | 26.4 ms / 33.3 ms | 0.3 ms | 84 MiB | 1.2 s | 33126 |\n\
                 | 1000 | kube-proxy | nftables | 2.03 s | 0.3 s | 369.2 ms / 500.7 ms | 433.1 ms / 591.2 ms | 294.5 ms / 436.2 ms | 348.3 ms | 136 MiB | 6.0 s | 71129 |\n\
                 | 10000 | roadkeeper | nftables | 5.91 s | 5.5 s | 11.5 ms / 70.5 ms | 41.8 ms / 60.1 ms | 53.7 ms / 90.9 ms | 0.9 ms | 391 MiB | 6.9 s | 326976 |\n";
    let out = tempfile::tempdir().unwrap();
    plot_table(out.path(), table);
    let change = std::fs::read_to_string(out.path().join("vs-upstream-change.svg")).unwrap();
    let lines: Vec<&str> = change.lines().filter(|l| l.starts_with("<polyline")).collect();
    assert_eq!(lines.len(), 2, "{change}");
    // kube-proxy (sorted first) has one point, roadkeeper two.
    assert_eq!(lines.iter().map(|l| l.matches(',').count()).collect::<Vec<_>>(), [1, 2]);
    assert!(change.contains(">kube-proxy nftables<") && change.contains(">roadkeeper nftables<"));
}
