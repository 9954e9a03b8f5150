//! `roadkeeper bench ingress`: `roadkeeper ingress` and nginx as reverse proxies for the same
//! route and backends, side by side in one run, loaded by wrk at several connection counts in a
//! scratch network namespace. Each proxy is pinned to one CPU; the backends (nginx answering a
//! fixed 200) and wrk share the other. Besides wrk's rate and latency, each row gives the proxy's
//! CPU time per request (user + system, from `/proc`), which does not depend on whether the proxy
//! or the client side was the bottleneck.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use roadkeeper_netlab::{Netns, Process};

use crate::cli::IngressBenchArgs;

/// Host the route is for.
const HOST: &str = "bench.example";
/// Backend ports (nginx answering `200 ok`).
const BACKENDS: [u16; 2] = [9001, 9002];
/// The backends' address: on the namespace's loopback device, but not a loopback address, which
/// an EndpointSlice may not hold.
const BACKEND_IP: &str = "10.244.0.1";

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: IngressBenchArgs) -> anyhow::Result<()> {
    crate::bench::require_tools(&["nginx", "wrk", "curl"], "apt-get install nginx-light wrk curl")?;
    let dir = tempfile::tempdir()?;
    let ns = Netns::new("rk-bench-ingress")?;
    ns.ip(["addr", "add", &format!("{BACKEND_IP}/32"), "dev", "lo"])?;
    let backend_cpu = args.client_cpu.to_string();
    let proxy_cpu = args.proxy_cpu.to_string();
    let _backends = nginx(&ns, dir.path(), "backends", &backend_cpu, &backends_conf())?;
    let nginx_proxy = nginx(&ns, dir.path(), "proxy", &proxy_cpu, &proxy_conf())?;
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    std::fs::write(manifests.join("bench.yaml"), cluster())?;
    let binary = std::env::current_exe()?.display().to_string();
    let manifests_arg = manifests.display().to_string();
    let log = dir.path().join("ingress.log");
    let roadkeeper = ns.spawn_logged(
        [
            "taskset",
            "-c",
            &proxy_cpu,
            &binary,
            "ingress",
            "--manifests",
            &manifests_arg,
            "--http",
            "127.0.0.1:8080",
            "--https",
            "",
            "--metrics-bind-address",
            "",
        ],
        &log,
    )?;
    for port in [8080, 8081] {
        wait_for_200(&ns, port)?;
    }

    println!(
        "reverse proxy on CPU {}, wrk (1 thread) and 2 nginx backends on CPU {}, {} s per run, keep-alive",
        args.proxy_cpu, args.client_cpu, args.seconds
    );
    println!();
    println!("| connections | proxy | requests/s | p50 | p99 | proxy CPU per request |");
    println!("|---|---|---|---|---|---|");
    let proxies = [("roadkeeper ingress", 8080, roadkeeper.id()), ("nginx 1.22", 8081, nginx_proxy.0.id())];
    for connections in &args.connections {
        for (name, port, pid) in proxies {
            let before = cpu_time(pid)?;
            let run = wrk(&ns, &backend_cpu, port, *connections, args.seconds)?;
            let per_request = (cpu_time(pid)? - before).as_secs_f64() * 1e6 / run.requests;
            println!(
                "| {connections} | {name} | {:.0} | {} | {} | {per_request:.1} µs |",
                run.requests / run.seconds,
                run.p50,
                run.p99
            );
        }
    }
    Ok(())
}

/// CPU time (user + system) of process `pid` and of its children (nginx's workers).
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let ticks = |pid: &str| -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces) in parentheses; utime and stime
        // are fields 14 and 15.
        let fields: Vec<&str> = stat.rsplit_once(')').context("malformed stat")?.1.split_whitespace().collect();
        Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
    };
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    let mut total = ticks(&pid.to_string())?;
    for child in children.split_whitespace() {
        total += ticks(child)?;
    }
    // /proc counts in USER_HZ ticks, which Linux fixes at 100 (sysconf's CLK_TCK) on x86 and ARM.
    Ok(Duration::from_millis(total * 10))
}

/// An nginx master process, stopped with SIGTERM on drop so that it stops its workers too (the
/// namespace's SIGKILL of the master alone would leave them running).
struct Nginx(Process);

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Err(err) = self.0.terminate(Duration::from_secs(5)) {
            eprintln!("stopping nginx: {err:#}");
        }
    }
}

/// Starts nginx in the foreground with `conf` (its prefix under `dir/<name>`), pinned to `cpu`.
fn nginx(ns: &Netns, dir: &Path, name: &str, cpu: &str, conf: &str) -> anyhow::Result<Nginx> {
    let prefix = dir.join(name);
    std::fs::create_dir_all(prefix.join("logs"))?;
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let (prefix, conf_path) = (prefix.display().to_string(), conf_path.display().to_string());
    let log = dir.join(format!("{name}.log"));
    let args = ["taskset", "-c", cpu, "nginx", "-p", &prefix, "-c", &conf_path, "-g", "daemon off;"];
    Ok(Nginx(ns.spawn_logged(args, &log)?))
}

/// Two backends answering every request with a short 200.
fn backends_conf() -> String {
    let servers: String = BACKENDS
        .iter()
        .map(|port| {
            format!("server {{ listen {BACKEND_IP}:{port}; access_log off; location / {{ return 200 \"ok\\n\"; }} }}\n")
        })
        .collect();
    format!(
        "worker_processes 1;\npid backends.pid;\nerror_log logs/error.log;\nevents {{ worker_connections 4096; }}\nhttp {{\n{servers}}}\n"
    )
}

/// nginx as the reverse proxy: the same route, round robin over the same backends, keep-alive
/// to them, the same forwarded headers, one worker (as roadkeeper gets one CPU).
fn proxy_conf() -> String {
    let upstreams: String = BACKENDS.iter().map(|port| format!("server {BACKEND_IP}:{port};")).collect();
    format!(
        "worker_processes 1;\npid proxy.pid;\nerror_log logs/error.log;\nevents {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n upstream web {{ {upstreams} keepalive 256; }}\n\
         server {{ listen 127.0.0.1:8081; server_name {HOST};\n  location / {{ proxy_pass http://web;\n\
         proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Real-IP $remote_addr;\n\
         proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $host; }} }}\n}}\n"
    )
}

/// Service `web` with the backends as its endpoints, and an Ingress routing `HOST` to it.
fn cluster() -> String {
    let endpoints: Vec<String> = BACKENDS.iter().map(|_| format!("{{addresses: [{BACKEND_IP}]}}")).collect();
    let slices: String = BACKENDS
        .iter()
        .zip(&endpoints)
        .enumerate()
        .map(|(i, (port, endpoint))| {
            format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: web-{i}, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n\
                 addressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints: [{endpoint}]\n"
            )
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\n\
         spec: {{clusterIP: None, ports: [{{name: http, port: 80}}]}}\n{slices}---\n\
         apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: web, namespace: default}}\n\
         spec: {{ingressClassName: roadkeeper, rules: [{{host: {HOST}, http: {{paths: [{{path: /, pathType: Prefix, \
         backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}}}]}}\n"
    )
}

fn wait_for_200(ns: &Netns, port: u16) -> anyhow::Result<()> {
    let url = format!("http://127.0.0.1:{port}/");
    for _ in 0..100 {
        let out =
            ns.exec(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", &format!("Host: {HOST}"), &url]);
        if out.is_ok_and(|o| o.stdout == b"200") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("no 200 from {url} within 10 s")
}

/// What one wrk run reported.
struct Run {
    requests: f64,
    seconds: f64,
    p50: String,
    p99: String,
}

fn wrk(ns: &Netns, cpu: &str, port: u16, connections: usize, seconds: u32) -> anyhow::Result<Run> {
    let (connections, duration) = (connections.to_string(), format!("{seconds}s"));
    let url = format!("http://127.0.0.1:{port}/");
    let host = format!("Host: {HOST}");
    let args =
        ["taskset", "-c", cpu, "wrk", "-t1", "-c", &connections, "-d", &duration, "--latency", "-H", &host, &url];
    let output = ns.exec(args)?;
    let text = String::from_utf8_lossy(&output.stdout);
    let value = |label: &str| {
        text.lines()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(label)
                    .map(|rest| rest.split_whitespace().next().unwrap_or_default().to_owned())
            })
            .with_context(|| format!("no {label:?} in wrk's output:\n{text}"))
    };
    if text.contains("Non-2xx or 3xx responses") {
        bail!("errors through port {port}:\n{text}");
    }
    // "N requests in 8.00s, ..."
    let (requests, seconds) = text
        .lines()
        .find_map(|l| {
            let (requests, rest) = l.trim().split_once(" requests in ")?;
            Some((requests.parse::<f64>().ok()?, rest.split_once('s')?.0.parse::<f64>().ok()?))
        })
        .with_context(|| format!("no request count in wrk's output:\n{text}"))?;
    Ok(Run { requests, seconds, p50: value("50%")?, p99: value("99%")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's cluster must load as it is: a manifest refused (an endpoint address the
    /// API server would refuse, say) leaves roadkeeper without the route, and the run fails.
    #[test]
    fn the_benchmark_cluster_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bench.yaml"), cluster()).unwrap();
        let (source, errors) = roadkeeper_cluster::ManifestSource::load(dir.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let web = roadkeeper_cluster::NamespacedName::new("default", "web");
        assert_eq!(source.store().slices_for(&web).len(), BACKENDS.len());
        assert_eq!(source.store().ingresses().count(), 1);
    }
}
