//! Route propagation of `roadkeeper gateway`, in the style of public Gateway API benchmarks:
//! HTTPRoutes added one at a time with `kubectl apply` against a real kube-apiserver (the test
//! control plane), each timed from the start of `kubectl apply` to the first `200` from its
//! hostname (`404` until then), once on a quiet gateway and once under load on a route that
//! exists throughout. Every load request must succeed, every route must keep answering once it
//! has, and at the end every route answers. Before that, the compiler alone (pure, in process):
//! one route change against a full build at the same number of routes.
//!
//! A benchmark, not a test: ignored unless asked for; `bench/gateway-propagation.sh` runs it
//! (`RK_BENCH_ROUTES`, default 3000; `RK_BENCH_OUT`: a folder for `gateway-propagation.md`).

mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::apiserver::ControlPlane;
use common::gateway::{ADDRESS, cluster, start};
use common::web::{exchange, request_head};
use roadkeeper_cluster::{Changes, NamespacedName, Object, Store};
use roadkeeper_ingress::gateway::{DEFAULT_CONTROLLER, GatewayConfig, GatewayTable};
use roadkeeper_netlab::Netns;

/// Threads sending requests to the steady route while routes are added under load.
const LOAD_THREADS: usize = 4;
/// How long a new route may take to answer before the benchmark fails.
const ROUTE_LIMIT: Duration = Duration::from_secs(30);

fn routes() -> usize {
    std::env::var("RK_BENCH_ROUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

/// HTTPRoute `name` on Gateway `bench` for host `<name>.bench.example`, to Service `web`.
fn route(name: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{name: {name}, namespace: default, labels: {{bench: route}}}}\n\
         spec: {{parentRefs: [{{name: bench}}], hostnames: [{name}.bench.example], \
         rules: [{{backendRefs: [{{name: web, port: 80}}]}}]}}\n"
    )
}

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
    metadata: {name: bench, namespace: default}\n\
    spec: {gatewayClassName: roadkeeper, listeners: [{name: http, port: 80, protocol: HTTP}]}\n";

fn to() -> SocketAddr {
    format!("{ADDRESS}:80").parse().unwrap()
}

/// What a GET of `/` for `<name>.bench.example` answers: the status, or 0 when it failed.
fn probe(ns: &Netns, name: &str) -> u16 {
    let head = request_head(&format!("{name}.bench.example"), "/", &[], "close");
    ns.run(|| exchange(to(), None, &head))
        .map_or(0, |reply| if reply.served_by() == "web" { 200 } else { reply.status })
}

/// The `q` quantile of `sorted`.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// One pass: per route, how long `kubectl apply` took and how long until the route answered.
struct Pass {
    name: &'static str,
    applied: Vec<Duration>,
    answered: Vec<Duration>,
    load: Option<(u64, u64, Duration)>,
}

impl Pass {
    fn row(&self) -> String {
        let mut answered = self.answered.clone();
        answered.sort();
        let mut applied = self.applied.clone();
        applied.sort();
        let mut after: Vec<Duration> = self
            .answered
            .iter()
            .zip(&self.applied)
            .map(|(answered, applied)| answered.saturating_sub(*applied))
            .collect();
        after.sort();
        let tenth = (self.answered.len() / 10).max(1);
        let median = |slice: &[Duration]| {
            let mut v = slice.to_vec();
            v.sort();
            ms(quantile(&v, 0.5))
        };
        let load = match self.load {
            None => "none".to_owned(),
            Some((requests, failed, took)) => {
                format!("{requests} requests ({:.0}/s), {failed} failed", requests as f64 / took.as_secs_f64())
            }
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} / {} | {load} |",
            self.name,
            self.answered.len(),
            ms(quantile(&answered, 0.5)),
            ms(quantile(&answered, 0.9)),
            ms(quantile(&answered, 0.99)),
            ms(*answered.last().unwrap()),
            median(&self.answered[..tenth]),
            median(&self.answered[self.answered.len() - tenth..]),
            ms(quantile(&applied, 0.5)),
            ms(quantile(&after, 0.5)),
            ms(quantile(&after, 0.99)),
        )
    }
}

/// Adds `count` routes one at a time, each timed until it answers; checks on the way that
/// earlier routes still answer.
fn add_routes(ns: &Netns, api: &ControlPlane, count: usize, name: &'static str) -> Pass {
    let mut pass = Pass { name, applied: Vec::with_capacity(count), answered: Vec::with_capacity(count), load: None };
    for i in 0..count {
        let route_name = format!("r{i}");
        assert_eq!(probe(ns, &route_name), 404, "{route_name} answers before it exists");
        let start = Instant::now();
        api.kubectl_stdin(&["apply", "-f", "-"], &route(&route_name));
        pass.applied.push(start.elapsed());
        loop {
            match probe(ns, &route_name) {
                200 => break,
                404 => assert!(start.elapsed() < ROUTE_LIMIT, "{route_name}: not answering after {ROUTE_LIMIT:?}"),
                other => panic!("{route_name}: answered {other} while being added"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        pass.answered.push(start.elapsed());
        // An earlier route, to see that adding one never disturbs the others.
        let earlier = format!("r{}", (i * 7919) % (i + 1));
        assert_eq!(probe(ns, &earlier), 200, "{earlier} stopped answering when {route_name} was added");
        if (i + 1) % 500 == 0 {
            eprintln!("{name}: {} routes", i + 1);
        }
    }
    for i in 0..count {
        assert_eq!(probe(ns, &format!("r{i}")), 200, "r{i} does not answer at the end");
    }
    pass
}

/// Deletes the benchmark's routes and waits until the gateway serves none of them.
fn delete_routes(ns: &Netns, api: &ControlPlane, count: usize) {
    api.kubectl(&["delete", "httproutes", "-l", "bench=route", "--wait=false"]);
    let start = Instant::now();
    for i in 0..count {
        while probe(ns, &format!("r{i}")) != 404 {
            assert!(start.elapsed() < Duration::from_secs(120), "r{i} still served after deleting it");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Requests to the steady route from `LOAD_THREADS` threads until `stop`: (sent, failed).
fn load(ns: &Netns, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<(u64, u64)>> {
    (0..LOAD_THREADS)
        .map(|_| {
            let (stop, ns_name) = (stop.clone(), ns.name().to_owned());
            std::thread::spawn(move || {
                Netns::open(&ns_name).run(|| {
                    let head = request_head("steady.bench.example", "/", &[], "close");
                    let (mut sent, mut failed) = (0, 0);
                    while !stop.load(Ordering::Relaxed) {
                        sent += 1;
                        if !exchange(to(), None, &head).is_ok_and(|reply| reply.served_by() == "web") {
                            failed += 1;
                        }
                    }
                    (sent, failed)
                })
            })
        })
        .collect()
}

/// The compiler alone at `count` routes: a full build, and one route's change applied to it.
fn compile_cost(count: usize) -> String {
    let parse = |yaml: &str| Object::HttpRoute(Arc::new(serde_saphyr::from_str(yaml).expect("route")));
    let fixed = [
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: roadkeeper}\n\
         spec: {controllerName: roadkeeper.dev/gateway}\n",
        GATEWAY,
    ];
    let mut objects: Vec<Object> = vec![
        Object::GatewayClass(Arc::new(serde_saphyr::from_str(fixed[0]).unwrap())),
        Object::Gateway(Arc::new(serde_saphyr::from_str(fixed[1]).unwrap())),
    ];
    objects.extend((0..count).map(|i| parse(&route(&format!("r{i}")))));
    let config = GatewayConfig { controller: DEFAULT_CONTROLLER.into(), pool: common::gateway::POOL.parse().unwrap() };
    let store = Store::from_objects(objects.clone());
    let mut builds = Vec::new();
    let mut table = GatewayTable::build(&store, &config);
    for _ in 0..5 {
        let start = Instant::now();
        table = GatewayTable::build(&store, &config);
        builds.push(start.elapsed());
    }
    // The same route changed (to another hostname) and back, in turn.
    objects.push(parse(&route("r0").replace("hostnames: [r0.", "hostnames: [moved.")));
    let changed = Store::from_objects(objects);
    let changes = Changes { http_routes: [NamespacedName::new("default", "r0")].into(), ..Changes::default() };
    let mut applies = Vec::new();
    for round in 0..200 {
        let store = if round % 2 == 0 { &changed } else { &store };
        let start = Instant::now();
        let touched = table.apply(store, &changes);
        applies.push(start.elapsed());
        assert_eq!(touched.routes.len(), 1);
    }
    builds.sort();
    applies.sort();
    let (build, apply) = (quantile(&builds, 0.5), quantile(&applies, 0.5));
    format!(
        "| {count} | {} | {:.1} | {:.0}x |",
        ms(build),
        apply.as_secs_f64() * 1e6,
        build.as_secs_f64() / apply.as_secs_f64()
    )
}

#[test]
#[ignore = "a benchmark: bench/gateway-propagation.sh"]
fn route_propagation() {
    let count = routes();
    let mut report = String::new();
    writeln!(report, "### The compiler alone (median of 5 builds and of 200 changes)\n").unwrap();
    writeln!(report, "| routes | full build (ms) | one route changed (us) | ratio |\n|---:|---:|---:|---:|").unwrap();
    writeln!(report, "{}", compile_cost(count)).unwrap();

    let (ns, api, kubeconfig) = cluster("rk-gwbench");
    api.kubectl_stdin(&["apply", "-f", "-"], GATEWAY);
    api.kubectl_stdin(&["apply", "-f", "-"], &route("steady").replace("bench: route", "bench: steady"));
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("gateway.log");
    let _gateway = start(&ns, &kubeconfig, &log, &[]);
    let start_wait = Instant::now();
    while probe(&ns, "steady") != 200 {
        assert!(start_wait.elapsed() < ROUTE_LIMIT, "the steady route does not answer");
        std::thread::sleep(Duration::from_millis(10));
    }

    let quiet = add_routes(&ns, &api, count, "quiet");
    delete_routes(&ns, &api, count);
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let threads = load(&ns, stop.clone());
    let mut loaded = add_routes(&ns, &api, count, "under load");
    stop.store(true, Ordering::Relaxed);
    let (sent, failed) =
        threads.into_iter().map(|t| t.join().expect("load thread")).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    loaded.load = Some((sent, failed, began.elapsed()));

    writeln!(report, "\n### From `kubectl apply` to the route answering (ms)\n").unwrap();
    writeln!(
        report,
        "| pass | routes | p50 | p90 | p99 | max | p50 first / last tenth | kubectl apply alone, p50 | \
         after kubectl returned, p50 / p99 | load on another route |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    .unwrap();
    writeln!(report, "{}\n{}", quiet.row(), loaded.row()).unwrap();
    println!("{report}");
    if let Ok(out) = std::env::var("RK_BENCH_OUT") {
        std::fs::create_dir_all(&out).expect("output folder");
        std::fs::write(std::path::Path::new(&out).join("gateway-propagation.md"), &report).expect("write report");
    }
    assert_eq!(failed, 0, "{failed} of {sent} load requests failed while routes were added");
}
