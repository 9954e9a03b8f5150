//! `roadkeeper bench dns`: the real `roadkeeper dns` binary over a synthetic cluster, loaded by
//! dnsperf on loopback in a scratch network namespace, the server pinned to one CPU and dnsperf
//! to another. Reports the highest rate it sustains and latency percentiles at a fixed rate.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use roadkeeper_netlab::Netns;

use crate::cli::DnsBenchArgs;

/// CoreDNS's published figure (coredns/deployment Scaling_CoreDNS.md): internal names, 2 vCPU.
const COREDNS_QPS_2_VCPU: f64 = 33_700.0;
/// Queries in the query file (dnsperf cycles through it).
const QUERIES: usize = 50_000;

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: DnsBenchArgs) -> anyhow::Result<()> {
    crate::bench::require_tools(&["dnsperf", "dig"], "apt-get install dnsperf bind9-dnsutils")?;
    let dir = tempfile::tempdir()?;
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    std::fs::write(manifests.join("cluster.yaml"), cluster(args.services))?;
    let queries = dir.path().join("queries.txt");
    std::fs::write(&queries, query_mix(args.services))?;

    let ns = Netns::new("rk-bench-dns")?;
    let binary = std::env::current_exe()?;
    let server_cpu = args.server_cpu.to_string();
    let manifests_arg = manifests.display().to_string();
    let log = dir.path().join("dns.log");
    let server = ns.spawn_logged(
        [
            "taskset",
            "-c",
            &server_cpu,
            &binary.display().to_string(),
            "dns",
            "--manifests",
            &manifests_arg,
            "--listen",
            "127.0.0.1:53",
            "--upstream",
            "127.0.0.1:9",
        ],
        &log,
    )?;
    wait_until_answering(&ns)?;

    let peak = dnsperf(&ns, &args, &queries, &["-c", "16", "-q", "256"])?;
    // Latency percentiles, from every query's own latency, at fixed rates: CoreDNS's published
    // peak on 2 vCPU, and 80% of ours.
    let mut fixed = Vec::new();
    for rate in [COREDNS_QPS_2_VCPU, peak.qps * 0.8] {
        let rate = (rate as u64).to_string();
        fixed.push((rate.clone(), dnsperf(&ns, &args, &queries, &["-c", "16", "-q", "256", "-Q", &rate, "-v"])?));
    }
    server.terminate(Duration::from_secs(5))?;

    println!(
        "`roadkeeper dns`, {} Services, server on CPU {}, dnsperf on CPU {}, {} s per run",
        args.services, args.server_cpu, args.client_cpu, args.seconds
    );
    println!();
    println!("| load | queries/s | lost | avg latency | p50 | p99 | p99.9 |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| as fast as it answers (256 in flight) | {:.0} | {:.2}% | {:.3} ms | | | |",
        peak.qps, peak.lost_percent, peak.avg_ms
    );
    for (rate, mut run) in fixed {
        let [p50, p99, p999] = run.percentiles_ms([0.5, 0.99, 0.999]);
        println!(
            "| fixed at {rate} queries/s | {:.0} | {:.2}% | {:.3} ms | {p50:.3} ms | {p99:.3} ms | {p999:.3} ms |",
            run.qps, run.lost_percent, run.avg_ms
        );
    }
    println!();
    println!(
        "one core: {:.0} queries/s, {:.1}x CoreDNS's published {:.0} on 2 vCPU ({:.0} per vCPU)",
        peak.qps,
        peak.qps / (COREDNS_QPS_2_VCPU / 2.0),
        COREDNS_QPS_2_VCPU,
        COREDNS_QPS_2_VCPU / 2.0
    );
    Ok(())
}

/// What one dnsperf run reported.
struct Run {
    qps: f64,
    avg_ms: f64,
    lost_percent: f64,
    /// Per-query latencies in seconds (with `-v`).
    latencies: Vec<f64>,
}

impl Run {
    /// Latency percentiles (0-1) in milliseconds.
    fn percentiles_ms<const N: usize>(&mut self, at: [f64; N]) -> [f64; N] {
        self.latencies.sort_by(f64::total_cmp);
        let last = self.latencies.len().saturating_sub(1) as f64;
        at.map(|p| self.latencies.get((last * p) as usize).map_or(f64::NAN, |s| s * 1e3))
    }
}

fn dnsperf(ns: &Netns, args: &DnsBenchArgs, queries: &Path, extra: &[&str]) -> anyhow::Result<Run> {
    let client_cpu = args.client_cpu.to_string();
    let seconds = args.seconds.to_string();
    let queries = queries.display().to_string();
    let mut command = vec!["taskset", "-c", &client_cpu, "dnsperf", "-s", "127.0.0.1", "-d", &queries, "-l", &seconds];
    command.extend(extra);
    let output = ns.exec(&command)?;
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |label: &str| -> anyhow::Result<f64> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .with_context(|| format!("no {label:?} in dnsperf's output:\n{text}"))?;
        let value = line.split(':').nth(1).and_then(|v| v.split_whitespace().next()).unwrap_or_default();
        value.parse().with_context(|| format!("{label}: {value:?}"))
    };
    let lost_line = text.lines().find(|l| l.trim_start().starts_with("Queries lost")).unwrap_or_default();
    let lost_percent = lost_line.split('(').nth(1).and_then(|p| p.trim_end_matches("%)").parse().ok()).unwrap_or(0.0);
    let latencies =
        text.lines().filter(|l| l.starts_with("> ")).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
    Ok(Run { qps: field("Queries per second")?, avg_ms: field("Average Latency (s)")? * 1e3, lost_percent, latencies })
}

/// Waits until the server answers a query (it loads the manifests first).
fn wait_until_answering(ns: &Netns) -> anyhow::Result<()> {
    for _ in 0..100 {
        let out = ns.exec(["dig", "+short", "+time=1", "+tries=1", "@127.0.0.1", "dns-version.cluster.local", "TXT"]);
        if out.is_ok_and(|o| !o.stdout.is_empty()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("roadkeeper dns did not answer within 10 s")
}

/// The i-th Service's ClusterIP.
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + 1 + i as u32)
}

/// `services` Services in 20 namespaces: every tenth headless with 3 endpoints, the others
/// ClusterIP with a named port.
fn cluster(services: usize) -> String {
    let mut yaml = String::new();
    for i in 0..services {
        let ns = i % 20;
        if i % 10 == 9 {
            let _ = write!(
                yaml,
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{i}, namespace: ns{ns}}}\n\
                 spec: {{clusterIP: None, ports: [{{name: http, port: 80}}]}}\n\
                 ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: svc{i}-1, namespace: ns{ns}, labels: {{kubernetes.io/service-name: svc{i}}}}}\n\
                 addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
            );
            for e in 0..3 {
                let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 0)) + (i * 3 + e) as u32);
                let _ = writeln!(yaml, "- {{addresses: [{ip}], hostname: pod-{e}}}");
            }
        } else {
            let _ = write!(
                yaml,
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{i}, namespace: ns{ns}}}\n\
                 spec: {{clusterIP: {}, ports: [{{name: http, port: 80}}]}}\n",
                cluster_ip(i)
            );
        }
    }
    yaml
}

/// A pod-like mix over the Services (deterministic): A 50%, AAAA 20% (no IPv6 here: NODATA),
/// search-path misses 15% (NXDOMAIN), SRV 10%, PTR 5%.
fn query_mix(services: usize) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut text = String::new();
    for _ in 0..QUERIES {
        let i = next(services);
        let (name, ns) = (format!("svc{i}"), format!("ns{}", i % 20));
        let _ = match next(100) {
            0..50 => writeln!(text, "{name}.{ns}.svc.cluster.local A"),
            50..70 => writeln!(text, "{name}.{ns}.svc.cluster.local AAAA"),
            70..85 => writeln!(text, "{name}.{ns}.svc.cluster.local.{ns}.svc.cluster.local A"),
            85..95 => writeln!(text, "_http._tcp.{name}.{ns}.svc.cluster.local SRV"),
            _ => {
                let [a, b, c, d] = cluster_ip(i).octets();
                writeln!(text, "{d}.{c}.{b}.{a}.in-addr.arpa PTR")
            }
        };
    }
    text
}
