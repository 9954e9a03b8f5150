//! The walk `lab up` makes before it returns: a request from the client through the Ingress to a
//! pod, a name resolved and a Service reached from a pod, a pod reaching the internet host (which
//! sees its node's address), and each LoadBalancer Service reached from the client. Each check is
//! retried until it answers or the deadline passes.
//!
//! What counts: the Ingress's request must be answered by a pod with a success status (2xx or
//! 3xx, as the rule's path is the user's), else its `container` station fails; the ClusterIP and
//! LoadBalancer requests ask `/`, which no manifest promises, so any answer shows the road works
//! (an error status is shown as such).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::{ManifestSource, NamespacedName};
use roadkeeper_netlab::Netns;
use roadkeeper_netlab::web::{self, Response};

use crate::state::{LabDir, Pod, State};
use crate::system::{CLUSTER_DOMAIN, INGRESS_SERVICE, NAMESPACE};
use crate::{Error, Result};

/// Time one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// One station of the walk and what it showed.
#[derive(Debug)]
pub struct Station {
    /// Its name (`visitor`, `Ingress`, ...).
    pub name: &'static str,
    /// What was seen there.
    pub seen: String,
    /// Why it did not do its part (a container that answered the Ingress's path with an error
    /// status); `None`: it did.
    pub failure: Option<String>,
}

impl Station {
    /// A station that did its part.
    fn passed(name: &'static str, seen: String) -> Self {
        Station { name, seen, failure: None }
    }
}

/// Whether `status` is a success: 2xx, or a 3xx redirect (nginx sends one for a folder).
fn success(status: u16) -> bool {
    (200..400).contains(&status)
}

/// Walks the road within `within`; the stations seen, or the first check that did not answer.
pub fn walk(lab: &LabDir, state: &State, within: Duration) -> Result<Vec<Station>> {
    let deadline = Instant::now() + within;
    let (source, _) = ManifestSource::load(&lab.cluster_dir()).map_err(|err| Error::Invalid(err.to_string()))?;
    let store = source.store();
    let mut stations = Vec::new();
    let mut backend_service = None;
    let client = &state.host("client")?.netns;
    let ingress_ip = lb_ip(store.service(&NamespacedName::new(NAMESPACE, INGRESS_SERVICE)).map(|s| &**s));
    for (key, ingress) in store.ingresses() {
        let Some(ip) = ingress_ip.filter(|_| ingress.status.as_ref().and_then(|s| s.load_balancer.as_ref()).is_some())
        else {
            continue;
        };
        let spec = ingress.spec.clone().unwrap_or_default();
        let Some((host, path)) = spec.rules.iter().flatten().find_map(|rule| {
            let path = rule.http.as_ref()?.paths.first()?;
            Some((rule.host.clone(), path.clone()))
        }) else {
            continue;
        };
        let url_path = path.path.clone().unwrap_or_else(|| "/".into());
        let host_name = host.clone().unwrap_or_else(|| ip.to_string());
        let response = retry(deadline, &format!("the client's request to Ingress {key}"), || {
            let response = in_netns(client, SocketAddr::from((ip, 80)), &host_name, &url_path)?;
            response
                .header("x-pod-name")
                .is_some()
                .then_some(response.clone())
                .ok_or_else(|| format!("answered {} but not by a pod: {}", response.status, response.body.trim()))
        })?;
        let answered = response.header("x-pod-name").unwrap_or_default().to_owned();
        let host_header = host.as_deref().map(|h| format!(" -H 'Host: {h}'")).unwrap_or_default();
        let status = response.status;
        // The rule's path answered with an error status: the road does not serve it.
        let mut failure = (!success(status))
            .then(|| format!("pod {answered} answered {url_path}, the path of Ingress {key}'s rule, with {status}"));
        let visitor = stations.len();
        stations.push(Station::passed(
            "visitor",
            format!("client: curl{host_header} http://{ip}{url_path} -> {status} from pod {answered}"),
        ));
        let backend = path.backend.service.as_ref().map(|s| s.name.clone()).unwrap_or_default();
        stations.push(Station::passed(
            "Ingress",
            format!("{key} (class roadkeeper, at {ip}): {url_path} -> Service {backend}"),
        ));
        let service_key = NamespacedName::new(key.namespace.as_str(), backend.as_str());
        backend_service = Some(service_key.clone());
        if let Some(service) = store.service(&service_key) {
            let endpoints: Vec<String> = store
                .slices_for(&service_key)
                .iter()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
                .collect();
            let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap_or_default();
            stations.push(Station::passed(
                "Service",
                format!("{service_key}: ClusterIP {cluster_ip}, EndpointSlice {}", endpoints.join(", ")),
            ));
        }
        let seen = if state.config.proxy_mode == "ebpf" {
            format!(
                "roadkeeper proxy (ebpf) in every node: the client's packets to {ip}:80 are rewritten to a pod's \
                 address at the node's NIC (tc program rk_from_outside); a pod's connection to a ClusterIP at its \
                 socket, once, at connect() (cgroup program rk_connect4)"
            )
        } else {
            format!(
                "roadkeeper proxy ({}) in every node rewrites {ip}:80 and the ClusterIPs to pod addresses",
                state.config.proxy_mode
            )
        };
        stations.push(Station::passed("node proxy", seen));
        if let Some(pod) = state.pods.iter().find(|p| p.name == answered) {
            let node = state.host(&pod.node)?;
            stations.push(Station::passed("node", format!("{} ({}) holds pod {answered}", node.name, node.address)));
            stations.push(Station::passed("pod", format!("{answered} at {} (one address for its containers)", pod.ip)));
            let container = pod.spec.containers.first().map(|c| c.name.clone()).unwrap_or_default();
            let seen = match success(status) {
                true => format!("{container} answered {url_path} from its files"),
                false => format!("{container} answered {url_path} with {status}"),
            };
            stations.push(Station { name: "container", seen, failure: failure.take() });
        }
        stations[visitor].failure = failure;
    }
    let Some(pod) = state.pods.iter().find(|p| p.namespace != NAMESPACE && p.ready && !p.terminating) else {
        return Ok(stations);
    };
    // The Services of the user's manifests an HTTP request can walk to: a TCP port, endpoints.
    let services: Vec<(&NamespacedName, &Service, u16)> = store
        .services()
        .filter(|(k, _)| k.namespace != NAMESPACE)
        .filter(|(k, _)| store.slices_for(k).iter().any(|s| !s.endpoints.is_empty()))
        .filter_map(|(k, s)| Some((k, &**s, tcp_port(s)?)))
        .collect();
    // The Ingress's backend first, as the tutorial does.
    let mut by_name: Vec<_> = services.iter().filter(|(_, s, _)| cluster_ip(s).is_some()).collect();
    by_name.sort_by_key(|(k, _, _)| Some(*k) != backend_service.as_ref());
    if let Some(&&(key, service, port)) = by_name.first() {
        let ip = cluster_ip(service).unwrap_or(Ipv4Addr::UNSPECIFIED);
        let name = format!("{}.{}.svc.{CLUSTER_DOMAIN}", key.name, key.namespace);
        retry(deadline, &format!("resolving {name} in pod {}", pod.name), || {
            let output = state
                .target(&pod.name, Some(&pod.namespace), None)
                .and_then(|t| t.command(["getent", "hosts", name.as_str()]))
                .map_err(|e| e.to_string())?
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&output.stdout);
            text.split_whitespace()
                .next()
                .filter(|a| *a == ip.to_string())
                .map(drop)
                .ok_or_else(|| format!("getent said {:?}", text.trim()))
        })?;
        stations.push(Station::passed(
            "DNS",
            format!("pod {}: {name} -> {ip} (through kube-dns {})", pod.name, crate::system::DNS_IP),
        ));
        let response = retry(deadline, &format!("pod {} to Service {key}", pod.name), || {
            from_pod(state, pod, SocketAddr::from((ip, port)), &name, "/")
        })?;
        let by = response.header("x-pod-name").unwrap_or("?").to_owned();
        stations.push(Station::passed(
            "ClusterIP",
            format!(
                "pod {}: http://{name}:{port}/ -> {}{} from pod {by}",
                pod.name,
                response.status,
                error_status(&response)
            ),
        ));
    }
    let node_ip = state.host(&pod.node)?.address;
    let internet = SocketAddr::from((roadkeeper_netlab::cluster::INTERNET_IP, crate::controller::INTERNET_PORT));
    let seen = retry(deadline, &format!("pod {} to the internet host", pod.name), || {
        let response = in_netns(&pod.netns, internet, "internet", "/")?;
        let from = response.body.split(" from ").nth(1).unwrap_or_default().trim().to_owned();
        from.starts_with(&format!("{node_ip}:"))
            .then_some(from.clone())
            .ok_or_else(|| format!("it saw {from:?}, not the node {node_ip}"))
    })?;
    stations.push(Station::passed(
        "SNAT",
        format!("pod {} ({}) -> internet {}: seen as {seen} (its node {})", pod.name, pod.ip, internet.ip(), pod.node),
    ));
    for (key, service, port) in services {
        let Some(ip) = lb_ip(Some(service)) else {
            continue;
        };
        let response = retry(deadline, &format!("the client to LoadBalancer {key}"), || {
            in_netns(client, SocketAddr::from((ip, port)), &ip.to_string(), "/")
        })?;
        stations.push(Station::passed(
            "LoadBalancer",
            format!(
                "client: http://{ip}:{port}/ ({key}) -> {}{} from pod {}",
                response.status,
                error_status(&response),
                response.header("x-pod-name").unwrap_or("?")
            ),
        ));
    }
    Ok(stations)
}

/// For an answer to `/` with an error status, words saying so: the road reached the pod, and no
/// manifest promises `/`.
fn error_status(response: &Response) -> &'static str {
    match success(response.status) {
        true => "",
        false => " (an error status: the road reaches the pod; no manifest promises /)",
    }
}

/// The first TCP port of a Service, which the walk sends an HTTP request to.
fn tcp_port(service: &Service) -> Option<u16> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    let port = ports.iter().find(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")?;
    u16::try_from(port.port).ok()
}

fn cluster_ip(service: &Service) -> Option<Ipv4Addr> {
    service.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()
}

/// The load-balancer address of a Service.
pub fn lb_ip(service: Option<&Service>) -> Option<Ipv4Addr> {
    let status = service?.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?;
    status.first()?.ip.as_deref()?.parse().ok()
}

/// `in_netns` from `pod`, in eBPF mode from its node's cgroup too (its socket is the pod's).
fn from_pod(
    state: &State,
    pod: &Pod,
    address: SocketAddr,
    host: &str,
    path: &str,
) -> std::result::Result<Response, String> {
    let get = || in_netns(&pod.netns, address, host, path);
    match state.node_cgroup(&pod.node) {
        Some(cgroup) => crate::node_cgroups::within(&cgroup, get).map_err(|err| err.to_string())?,
        None => get(),
    }
}

fn in_netns(netns: &str, address: SocketAddr, host: &str, path: &str) -> std::result::Result<Response, String> {
    Netns::open(netns).run(|| web::get(address, host, path, REQUEST_TIMEOUT)).map_err(|err| format!("{address}: {err}"))
}

fn retry<T>(deadline: Instant, what: &str, mut check: impl FnMut() -> std::result::Result<T, String>) -> Result<T> {
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() > deadline => {
                return Err(Error::Controller(format!("{what} did not answer: {why}")));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
