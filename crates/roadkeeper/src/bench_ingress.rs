//! `roadkeeper bench ingress`: `roadkeeper ingress` and nginx as reverse proxies for the same
//! route and backends, side by side in one run, in a scratch network namespace: HTTP/1.1 and
//! HTTPS (TLS termination, keep-alive, the same self-signed certificate for both) loaded by wrk
//! at several connection counts, and HTTP/2 over TLS loaded by h2load. Each proxy is pinned to
//! one CPU; the backends (nginx answering a fixed 200) and the load tool share the other. Besides
//! the rate and latency, each row gives the proxy's CPU time per request (user + system, from
//! `/proc`), which does not depend on whether the proxy or the client side was the bottleneck.

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
    crate::bench::require_tools(
        &["nginx", "wrk", "curl", "h2load"],
        "apt-get install nginx-light wrk curl nghttp2-client",
    )?;
    let dir = tempfile::tempdir()?;
    let certificate = rcgen::generate_simple_self_signed(vec![HOST.to_owned()])?;
    let (cert_pem, key_pem) = (certificate.cert.pem(), certificate.signing_key.serialize_pem());
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, &cert_pem)?;
    std::fs::write(&key_path, &key_pem)?;
    let ns = Netns::new("rk-bench-ingress")?;
    ns.ip(["addr", "add", &format!("{BACKEND_IP}/32"), "dev", "lo"])?;
    let backend_cpu = args.client_cpu.to_string();
    let proxy_cpu = args.proxy_cpu.to_string();
    let _backends = nginx(&ns, dir.path(), "backends", &backend_cpu, &backends_conf())?;
    let nginx_proxy = nginx(&ns, dir.path(), "proxy", &proxy_cpu, &proxy_conf(&cert_path, &key_path))?;
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    std::fs::write(manifests.join("bench.yaml"), cluster())?;
    std::fs::write(manifests.join("tls.yaml"), secret(&cert_pem, &key_pem))?;
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
            "127.0.0.1:8443",
            "--default-ssl-certificate",
            "default/web-tls",
            "--metrics-bind-address",
            "",
        ],
        &log,
    )?;
    for url in
        ["http://127.0.0.1:8080/", "http://127.0.0.1:8081/", "https://127.0.0.1:8443/", "https://127.0.0.1:8444/"]
    {
        wait_for_200(&ns, url)?;
    }

    println!(
        "reverse proxy on CPU {}, wrk (1 thread), h2load (1 thread) and 2 nginx backends on CPU {}, {} s per run, \
         keep-alive; HTTP/2 with {} streams per connection; median of {} run(s) per proxy and row, in turns",
        args.proxy_cpu, args.client_cpu, args.seconds, args.h2_streams, args.rounds
    );
    println!();
    println!("| protocol | connections | proxy | requests/s | p50 | p99 | proxy CPU per request |");
    println!("|---|---|---|---|---|---|---|");
    let proxies =
        [("roadkeeper ingress", [8080, 8443], roadkeeper.id()), ("nginx 1.22", [8081, 8444], nginx_proxy.0.id())];
    let mut rows: Vec<(Load, usize)> = Vec::new();
    for load in [Load::Http, Load::Https] {
        rows.extend(args.connections.iter().map(|&connections| (load, connections)));
    }
    if args.h2_connections > 0 {
        rows.push((Load::H2 { streams: args.h2_streams }, args.h2_connections));
    }
    for (load, connections) in rows {
        let mut measured: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        for round in 0..args.rounds {
            // ABBA...: whichever proxy went second goes first next time.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for index in order {
                let (_, [http, https], pid) = proxies[index];
                let before = cpu_time(pid)?;
                let run = match load {
                    Load::Http => {
                        wrk(&ns, &backend_cpu, &format!("http://127.0.0.1:{http}/"), connections, args.seconds)?
                    }
                    Load::Https => {
                        wrk(&ns, &backend_cpu, &format!("https://127.0.0.1:{https}/"), connections, args.seconds)?
                    }
                    Load::H2 { streams } => {
                        h2load(&ns, &backend_cpu, https, connections, streams, args.seconds, dir.path())?
                    }
                };
                let cpu_us = (cpu_time(pid)? - before).as_secs_f64() * 1e6 / run.requests;
                measured[index].push(Measured { rate: run.requests / run.seconds, p50: run.p50, p99: run.p99, cpu_us });
            }
        }
        for ((name, ..), runs) in proxies.iter().zip(measured) {
            let median = |figure: fn(&Measured) -> f64| {
                let mut values: Vec<f64> = runs.iter().map(figure).collect();
                values.sort_by(f64::total_cmp);
                values[values.len() / 2]
            };
            println!(
                "| {} | {connections} | {name} | {:.0} | {:.2}ms | {:.2}ms | {:.1} µs |",
                load.label(),
                median(|m| m.rate),
                median(|m| m.p50.as_secs_f64() * 1e3),
                median(|m| m.p99.as_secs_f64() * 1e3),
                median(|m| m.cpu_us),
            );
        }
    }
    Ok(())
}

/// One proxy's figures from one run of a row.
struct Measured {
    /// Requests per second.
    rate: f64,
    p50: Duration,
    p99: Duration,
    /// The proxy's CPU time per request, in µs.
    cpu_us: f64,
}

/// What loads a row.
#[derive(Clone, Copy)]
enum Load {
    /// HTTP/1.1 by wrk.
    Http,
    /// HTTP/1.1 over TLS by wrk.
    Https,
    /// HTTP/2 over TLS by h2load, with this many concurrent streams per connection.
    H2 { streams: usize },
}

impl Load {
    fn label(self) -> &'static str {
        match self {
            Load::Http => "HTTP/1.1",
            Load::Https => "HTTPS (HTTP/1.1)",
            Load::H2 { .. } => "HTTP/2 (TLS)",
        }
    }
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
        "worker_processes 1;\npid backends.pid;\nerror_log logs/error.log;\nevents {{ worker_connections 4096; }}\n\
         http {{\n keepalive_requests 100000000;\n{servers}}}\n"
    )
}

/// nginx as the reverse proxy: the same route, round robin over the same backends, keep-alive
/// to them, the same forwarded headers, one worker (as roadkeeper gets one CPU); HTTPS with
/// HTTP/2 by ALPN on 8444 with the certificate at `cert` and `key`. Keep-alive connections are
/// not closed after 1,000 requests (nginx's default), on either side, as roadkeeper does not
/// close them: h2load does not reconnect.
fn proxy_conf(cert: &Path, key: &Path) -> String {
    let upstreams: String = BACKENDS.iter().map(|port| format!("server {BACKEND_IP}:{port};")).collect();
    let (cert, key) = (cert.display(), key.display());
    format!(
        "worker_processes 1;\npid proxy.pid;\nerror_log logs/error.log;\nevents {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n keepalive_requests 100000000;\n\
         upstream web {{ {upstreams} keepalive 256; keepalive_requests 100000000; }}\n\
         server {{ listen 127.0.0.1:8081; listen 127.0.0.1:8444 ssl http2; server_name {HOST};\n\
         ssl_certificate {cert}; ssl_certificate_key {key};\n\
         location / {{ proxy_pass http://web;\n\
         proxy_http_version 1.1; proxy_set_header Connection \"\";\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Real-IP $remote_addr;\n\
         proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $host; }} }}\n}}\n"
    )
}

/// The `kubernetes.io/tls` Secret `default/web-tls` with `cert` and `key` (PEM), roadkeeper's
/// default certificate in the run.
fn secret(cert: &str, key: &str) -> String {
    let encode = |pem: &str| data_encoding::BASE64.encode(pem.as_bytes());
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "web-tls", "namespace": "default"},
        "data": {"tls.crt": encode(cert), "tls.key": encode(key)},
    });
    // JSON is YAML.
    secret.to_string()
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

fn wait_for_200(ns: &Netns, url: &str) -> anyhow::Result<()> {
    for _ in 0..100 {
        let out =
            ns.exec(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "-H", &format!("Host: {HOST}"), url]);
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
    p50: Duration,
    p99: Duration,
}

/// A latency as wrk prints it: `137.00us`, `3.22ms`, `1.02s`, `1.50m`.
fn wrk_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "us" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        "m" => number * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

fn wrk(ns: &Netns, cpu: &str, url: &str, connections: usize, seconds: u32) -> anyhow::Result<Run> {
    let (connections, duration) = (connections.to_string(), format!("{seconds}s"));
    let host = format!("Host: {HOST}");
    let args = ["taskset", "-c", cpu, "wrk", "-t1", "-c", &connections, "-d", &duration, "--latency", "-H", &host, url];
    let output = ns.exec(args)?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "    50%  137.00us" (wrk prints us, ms, s or m).
    let value = |label: &str| {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(label)?.split_whitespace().next().and_then(wrk_duration))
            .with_context(|| format!("no {label:?} in wrk's output:\n{text}"))
    };
    if text.contains("Non-2xx or 3xx responses") {
        bail!("errors through {url}:\n{text}");
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

/// HTTP/2 over TLS to `port` by h2load for `seconds`, with `connections` connections of
/// `streams` concurrent streams; the percentiles come from its per-request log in `dir`.
fn h2load(
    ns: &Netns,
    cpu: &str,
    port: u16,
    connections: usize,
    streams: usize,
    seconds: u32,
    dir: &Path,
) -> anyhow::Result<Run> {
    let log = dir.join(format!("h2load-{port}-{connections}.log"));
    let (connections, streams, duration) = (connections.to_string(), streams.to_string(), seconds.to_string());
    let (url, authority, log_arg) =
        (format!("https://127.0.0.1:{port}/"), format!(":authority: {HOST}"), log.display().to_string());
    let args = [
        "taskset",
        "-c",
        cpu,
        "h2load",
        "-t1",
        "-c",
        &connections,
        "-m",
        &streams,
        "-D",
        &duration,
        "-H",
        &authority,
        "--log-file",
        &log_arg,
        &url,
    ];
    let output = ns.exec(args)?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "status codes: N 2xx, ...", "finished in 5.00s, ..."
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(str::to_owned))
            .with_context(|| format!("no {prefix:?} in h2load's output:\n{text}"))
    };
    let codes = field("status codes: ")?;
    let ok: f64 = codes.split_whitespace().next().and_then(|n| n.parse().ok()).context("no 2xx count")?;
    if !codes.contains(" 0 3xx, 0 4xx, 0 5xx") {
        bail!("errors through {url}: {codes}");
    }
    let seconds: f64 =
        field("finished in ")?.split_once('s').and_then(|(s, _)| s.parse().ok()).context("no duration")?;
    // Each line: start time (µs since the epoch), status, duration (µs).
    let mut durations: Vec<u64> = std::fs::read_to_string(&log)?
        .lines()
        .filter_map(|line| line.split('\t').nth(2)?.trim().parse().ok())
        .collect();
    durations.sort_unstable();
    let percentile = |p: f64| {
        let at = ((durations.len() as f64 * p) as usize).min(durations.len().saturating_sub(1));
        durations.get(at).map(|&us| Duration::from_micros(us)).context("no request in h2load's log")
    };
    Ok(Run { requests: ok, seconds, p50: percentile(0.50)?, p99: percentile(0.99)? })
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
        let certificate = rcgen::generate_simple_self_signed(vec![HOST.to_owned()]).unwrap();
        let tls = secret(&certificate.cert.pem(), &certificate.signing_key.serialize_pem());
        std::fs::write(dir.path().join("tls.yaml"), tls).unwrap();
        let (source, errors) = roadkeeper_cluster::ManifestSource::load(dir.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let web = roadkeeper_cluster::NamespacedName::new("default", "web");
        assert_eq!(source.store().slices_for(&web).len(), BACKENDS.len());
        assert_eq!(source.store().ingresses().count(), 1);
        assert!(source.store().secret(&roadkeeper_cluster::NamespacedName::new("default", "web-tls")).is_some());
    }

    #[test]
    fn wrk_latencies_read_in_every_unit() {
        assert_eq!(wrk_duration("137.00us"), Some(Duration::from_micros(137)));
        assert_eq!(wrk_duration("3.22ms"), Some(Duration::from_micros(3220)));
        assert_eq!(wrk_duration("1.50s"), Some(Duration::from_millis(1500)));
        assert_eq!(wrk_duration("2.00m"), Some(Duration::from_secs(120)));
        for bad in ["", "ms", "3.22", "3.22h", "-1.00ms", "NaNms"] {
            assert_eq!(wrk_duration(bad), None, "{bad}");
        }
    }
}
