//! kube-proxy's health and metrics endpoints of a watching proxy: `/healthz` and `/livez` on
//! `--healthz-bind-address`, Prometheus text at `/metrics` on `--metrics-bind-address`, queried
//! from inside the node's network namespace; a bad bind address fails at start. Health-check
//! node ports of `externalTrafficPolicy: Local` Services, queried from the external host.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::http::*;
use common::*;

per_backend!(
    health_and_metrics_are_served_after_the_first_sync,
    a_bad_bind_address_fails_at_start_naming_the_flag_and_touches_nothing,
    health_check_node_port_reports_local_endpoints_and_follows_them,
);

fn health_and_metrics_are_served_after_the_first_sync(backend: Backend) {
    let mut c = Cluster::new("rk-health", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 70, ""));
    c.start_fast_proxy();
    // The rules are in the kernel a moment before the sync is recorded as done.
    let recorded = eventually(settle(), || !get(&c, "127.0.0.1:10256", "/healthz").1.contains("\"0001-"));
    assert!(recorded, "the first sync was never recorded; proxy log:\n{}", c.proxy_log());

    for (path, node_field) in [("/healthz", true), ("/livez", false)] {
        let (code, body) = get(&c, "127.0.0.1:10256", path);
        assert_eq!(code, 200, "{path}: {body}; proxy log:\n{}", c.proxy_log());
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        for field in ["lastUpdated", "currentTime"] {
            let time = json[field].as_str().unwrap_or_else(|| panic!("{path}: no {field}: {body}"));
            assert!(time.len() == 20 && time.ends_with('Z') && !time.starts_with("0001"), "{path}: {field} {time:?}");
        }
        assert_eq!(json.get("nodeEligible").is_some(), node_field, "{path}: {body}");
        if node_field {
            assert_eq!(json["nodeEligible"], true);
        }
    }
    // The health server listens on every address, the node IP too.
    assert_eq!(get(&c, &SocketAddr::new(Family::V4.node_ip(), 10256).to_string(), "/healthz").0, 200);
    assert_eq!(get(&c, "127.0.0.1:10256", "/nope").0, 404);

    // Changes are synced and counted: an endpoint change and a Service change.
    c.add_pod("web-b", "app: web", NODE);
    c.write("other.yaml", &service_manifest("other", 72, ""));
    let synced_both = eventually(settle(), || {
        let (_, metrics) = get(&c, "127.0.0.1:10249", "/metrics");
        ["service", "endpoint"].iter().all(|kind| {
            let name = format!("kubeproxy_sync_proxy_rules_{kind}_changes_total");
            try_sample(&metrics, &name).is_some_and(|n| n >= 1.0)
        })
    });
    assert!(synced_both, "changes not counted; proxy log:\n{}", c.proxy_log());
    let (code, metrics) = get(&c, "127.0.0.1:10249", "/metrics");
    assert_eq!(code, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
        "roadkeeper_sync_kernel_seconds_count",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    ] {
        assert!(sample(&metrics, name) > 0.0, "{name} is zero:\n{metrics}");
    }
    assert!(sample(&metrics, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 2.0, "{metrics}");
    assert!(metrics.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram"), "{metrics}");
    assert!(metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"}"), "{metrics}");
    assert!(metrics.contains("kubeproxy_conntrack_reconciler_deleted_entries_total "), "{metrics}");
    for name in [
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"}",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"}",
    ] {
        assert_eq!(sample(&metrics, name), 0.0, "{name}:\n{metrics}");
    }
    assert!(metrics.contains("# TYPE kubeproxy_network_programming_duration_seconds histogram"), "{metrics}");
    assert!(sample(&metrics, "kubeproxy_proxy_healthz_total{code=\"200\"}") >= 2.0, "{metrics}");
    // As kube-proxy, the metrics server names the proxy mode at /proxyMode, as plain text
    // (upstream's e2e "should check kube-proxy urls").
    let raw = c.lab.node().run(|| try_http_get("127.0.0.1:10249".parse().unwrap(), "/proxyMode")).expect("GET");
    let (code, head, body) = parse_response(&raw);
    assert_eq!((code, body.as_str()), (200, backend.mode()), "{raw}");
    assert_eq!(header(&head, "content-type"), Some("text/plain; charset=utf-8"), "{raw}");
    // Metrics listen on loopback only, by default.
    let node_ip = SocketAddr::new(Family::V4.node_ip(), 10249);
    let refused = c.lab.node().run(|| TcpStream::connect_timeout(&node_ip, Duration::from_secs(1)).is_err());
    assert!(refused, "metrics answered on {node_ip}");
}

fn a_bad_bind_address_fails_at_start_naming_the_flag_and_touches_nothing(backend: Backend) {
    let c = Cluster::new("rk-bind", backend);
    c.write("web.yaml", &service_manifest("web", 71, ""));
    // A port already taken in the node, and an address that does not parse.
    let taken = c.lab.node().run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
    let taken_addr = taken.local_addr().expect("local address").to_string();
    for (flag, address, message) in [
        ("--metrics-bind-address", taken_addr.as_str(), "cannot listen on"),
        ("--healthz-bind-address", "0.0.0.0:notaport", "is not an IP:PORT address"),
    ] {
        let mut args =
            vec!["netns".to_string(), "exec".into(), c.lab.node().name().into(), binary().display().to_string()];
        args.extend(c.proxy_args_for("proxy", &[flag, address]));
        let mut child =
            Command::new("ip").args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("proxy with {flag} {address} did not fail");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
        assert!(!status.success());
        assert!(stderr.contains(flag) && stderr.contains(address) && stderr.contains(message), "{stderr}");
        assert!(!c.programmed(), "rules were programmed despite {flag} {address}");
    }
    drop(taken);
}

fn health_check_node_port_reports_local_endpoints_and_follows_them(backend: Backend) {
    const HC_PORT: u16 = 32000;
    let mut c = Cluster::new("rk-hcnp", backend);
    let local = c.add_pod("web-local", "app: web", NODE);
    c.add_pod("web-remote", "app: web", "node-b");
    let spec = format!("type: LoadBalancer, externalTrafficPolicy: Local, healthCheckNodePort: {HC_PORT}");
    c.write("web.yaml", &service_manifest("web", 72, &spec));
    c.start_fast_proxy();

    // `(code, weight header, body)` of `GET /` on the health-check port, from the external host;
    // `None` while nothing answers.
    let query = |c: &Cluster, family: Family| {
        let addr = SocketAddr::new(family.node_ip(), HC_PORT);
        let raw = match c.lab.external().run(|| try_http_get(addr, "/")) {
            Ok(raw) => raw,
            Err(err) => {
                eprintln!("GET / from {addr}: {err}");
                return None;
            }
        };
        let (code, head, body) = parse_response(&raw);
        let weight = header(&head, "X-Load-Balancing-Endpoint-Weight").map(str::to_string);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        Some((code, weight, json))
    };
    let expect = |count: u64, healthy_code: u16| {
        move |got: &Option<(u16, Option<String>, serde_json::Value)>| {
            got.as_ref().is_some_and(|(code, weight, json)| {
                *code == healthy_code
                    && weight.as_deref() == Some(count.to_string().as_str())
                    && json["localEndpoints"] == count
                    && json["service"] == serde_json::json!({"namespace": "default", "name": "web"})
                    && json["serviceProxyHealthy"] == true
            })
        }
    };
    // Waits, in both families, for the health check to report `count` local endpoints with
    // status `code`; `when` names the step.
    let settles = |c: &Cluster, count: u64, code: u16, when: &str| {
        for family in FAMILIES {
            let mut last = None;
            let settled = eventually(settle(), || {
                last = query(c, family);
                expect(count, code)(&last)
            });
            assert!(settled, "{family:?} ({when}): got {last:?}; proxy log:\n{}", c.proxy_log());
        }
    };
    settles(&c, 1, 200, "one local endpoint");

    // The local pod is terminating (still serving, so still the Local traffic's fallback): the
    // health check reports no local endpoint, as kube-proxy's, so a load balancer drains the node.
    c.update_pod(local, "app: web", NODE, PodState::Terminating);
    settles(&c, 0, 503, "only a terminating local endpoint");

    // The local pod goes away: no local endpoint left.
    c.remove("pod-web-local.yaml");
    settles(&c, 0, 503, "no local endpoint");

    // The Service goes away: so does its health-check server.
    c.remove("web.yaml");
    let closed = eventually(settle(), || query(&c, Family::V4).is_none());
    assert!(closed, "health-check port still answers; proxy log:\n{}", c.proxy_log());
}
