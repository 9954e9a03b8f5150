//! What the cluster zone holds: an immutable snapshot of per-Service records, reverse entries and
//! pod addresses, updated per changed object (pure).
//!
//! The maps are persistent (`imbl`): cloning a snapshot is O(1) and updating one Service costs
//! O(that Service · log n), so each batch of changes publishes a new snapshot without copying the
//! cluster, and readers keep answering from the old one meanwhile.

use std::net::IpAddr;
use std::sync::Arc;

use imbl::{HashMap, HashSet};
use roadkeeper_cluster::k8s_openapi::api::core::v1::Service;
use roadkeeper_cluster::k8s_openapi::api::discovery::v1::EndpointSlice;
use roadkeeper_cluster::{Changes, NamespacedName, Store};

/// How Pod records (`a-b-c-d.<ns>.pod.<zone>`) are answered, as CoreDNS's `pods` option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodMode {
    /// Never (NXDOMAIN); CoreDNS's default.
    #[default]
    Disabled,
    /// Any well-formed name answers with the address it spells.
    Insecure,
    /// Only addresses of Pods that exist in that namespace.
    Verified,
}

/// Options that shape the records (CoreDNS's kubernetes plugin options of the same names).
#[derive(Clone, Debug, Default)]
pub struct ZoneOptions {
    /// `endpoint_pod_names`: an endpoint without a hostname is named after its Pod.
    pub endpoint_pod_names: bool,
    /// How Pod records are answered (Pods are only indexed in `Verified` mode).
    pub pods: PodMode,
}

/// A Service port: `_<name>._<protocol>` in SRV names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRecord {
    /// The port's name, lowercase (empty when unnamed).
    pub name: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The port number (the Service port, or the endpoint's port for headless Services).
    pub port: u16,
}

/// One ready endpoint of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRecord {
    /// Its address.
    pub ip: IpAddr,
    /// Its DNS label: the endpoint's hostname, else (with `endpoint_pod_names`) its Pod's name,
    /// else the dashed address (`10-244-0-5`, the specification's system-assigned identifier).
    pub label: String,
    /// The ports of its EndpointSlice.
    pub ports: Arc<[PortRecord]>,
}

/// What a Service name answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// A ClusterIP Service: its cluster IPs, and its ready endpoints (named and with PTR records as
    /// CoreDNS does, and for `ignore empty_service`).
    ClusterIp { ips: Vec<IpAddr>, endpoints: Vec<EndpointRecord> },
    /// A headless Service: its ready endpoints.
    Headless(Vec<EndpointRecord>),
    /// An ExternalName Service: the CNAME target, lowercase, without the trailing dot.
    ExternalName(String),
}

/// The records of one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRecord {
    /// What its name answers.
    pub kind: ServiceKind,
    /// Its ports.
    pub ports: Vec<PortRecord>,
}

/// The owner of a PTR record: the Service, and the endpoint label (`None` for a cluster IP).
pub type PtrOwner = (NamespacedName, Option<String>);

/// A snapshot of the cluster zone's data. Names are lowercase.
#[derive(Clone, Debug, Default)]
pub struct ZoneData {
    services: HashMap<NamespacedName, Arc<ServiceRecord>>,
    /// Namespaces with a Namespace object.
    namespaces: HashSet<String>,
    /// Number of Services per namespace (a namespace with Services exists even without its
    /// Namespace object, as in a manifest folder).
    service_namespaces: HashMap<String, usize>,
    /// Address to PTR owners.
    reverse: HashMap<IpAddr, Arc<Vec<PtrOwner>>>,
    /// Pod addresses per namespace (`Verified` mode), with the Pods holding them.
    pod_ips: HashMap<(String, IpAddr), usize>,
    /// Addresses of each Pod, to undo on change.
    pods: HashMap<NamespacedName, Arc<Vec<IpAddr>>>,
    /// Changes applied so far, for the SOA serial.
    version: u32,
}

impl ZoneData {
    /// The snapshot of everything in `store`.
    pub fn build(store: &Store, options: &ZoneOptions) -> Self {
        let mut data = Self::default();
        let changes = Changes {
            services: store.services().map(|(k, _)| k.clone()).collect(),
            pods: match options.pods {
                PodMode::Verified => store.pods().map(|(k, _)| k.clone()).collect(),
                _ => Default::default(),
            },
            namespaces: store.namespaces().cloned().collect(),
            ..Changes::default()
        };
        data.apply(store, &changes, options);
        data
    }

    /// Applies `changes` (read from `store`), in O(changed objects).
    pub fn apply(&mut self, store: &Store, changes: &Changes, options: &ZoneOptions) {
        for key in &changes.services {
            let record = store.service(key).and_then(|svc| service_record(svc, &store.slices_for(key), options));
            self.set_service(key, record.map(Arc::new));
        }
        for name in &changes.namespaces {
            if store.has_namespace(name) {
                self.namespaces.insert(name.clone());
            } else {
                self.namespaces.remove(name);
            }
        }
        if options.pods == PodMode::Verified {
            for key in &changes.pods {
                let ips = store.pod(key).map(|pod| pod_ips(pod)).unwrap_or_default();
                self.set_pod(key, ips);
            }
        }
        self.version = self.version.wrapping_add(1);
    }

    /// The records of Service `key` (lowercase names).
    pub fn service(&self, key: &NamespacedName) -> Option<&Arc<ServiceRecord>> {
        self.services.get(key)
    }

    /// Whether namespace `name` exists (a Namespace object or any Service in it).
    pub fn has_namespace(&self, name: &str) -> bool {
        self.namespaces.contains(name) || self.service_namespaces.contains_key(name)
    }

    /// The PTR owners of `ip`.
    pub fn reverse(&self, ip: &IpAddr) -> &[PtrOwner] {
        self.reverse.get(ip).map_or(&[], |owners| owners.as_slice())
    }

    /// Whether a Pod in `namespace` has address `ip` (`Verified` mode).
    pub fn has_pod_ip(&self, namespace: &str, ip: IpAddr) -> bool {
        self.pod_ips.contains_key(&(namespace.to_owned(), ip))
    }

    /// Changes applied so far (the SOA serial).
    pub fn version(&self) -> u32 {
        self.version
    }

    fn set_service(&mut self, key: &NamespacedName, new: Option<Arc<ServiceRecord>>) {
        let old = match &new {
            Some(record) => self.services.insert(key.clone(), record.clone()),
            None => self.services.remove(key),
        };
        if old.as_ref() == new.as_ref() {
            return;
        }
        if let Some(old) = &old {
            for (ip, owner) in ptr_entries(key, old) {
                self.remove_reverse(ip, &owner);
            }
        } else {
            *self.service_namespaces.entry(key.namespace.clone()).or_default() += 1;
        }
        if let Some(new) = &new {
            for (ip, owner) in ptr_entries(key, new) {
                let mut owners = self.reverse.get(&ip).map(|o| o.as_ref().clone()).unwrap_or_default();
                owners.push(owner);
                owners.sort();
                self.reverse.insert(ip, Arc::new(owners));
            }
        } else if let Some(count) = self.service_namespaces.get_mut(&key.namespace) {
            *count -= 1;
            if *count == 0 {
                self.service_namespaces.remove(&key.namespace);
            }
        }
    }

    fn remove_reverse(&mut self, ip: IpAddr, owner: &PtrOwner) {
        let Some(owners) = self.reverse.get(&ip) else { return };
        let remaining: Vec<PtrOwner> = owners.iter().filter(|o| *o != owner).cloned().collect();
        if remaining.is_empty() {
            self.reverse.remove(&ip);
        } else {
            self.reverse.insert(ip, Arc::new(remaining));
        }
    }

    fn set_pod(&mut self, key: &NamespacedName, ips: Vec<IpAddr>) {
        let old = self.pods.remove(key);
        for ip in old.iter().flat_map(|ips| ips.iter()) {
            let slot = (key.namespace.clone(), *ip);
            if let Some(count) = self.pod_ips.get_mut(&slot) {
                *count -= 1;
                if *count == 0 {
                    self.pod_ips.remove(&slot);
                }
            }
        }
        for ip in &ips {
            *self.pod_ips.entry((key.namespace.clone(), *ip)).or_default() += 1;
        }
        if !ips.is_empty() {
            self.pods.insert(key.clone(), Arc::new(ips));
        }
    }
}

/// The PTR entries a Service owns: its cluster IPs, and every ready endpoint (by its label, with
/// or without a hostname, as CoreDNS).
fn ptr_entries(key: &NamespacedName, record: &ServiceRecord) -> Vec<(IpAddr, PtrOwner)> {
    let (ips, endpoints) = match &record.kind {
        ServiceKind::ClusterIp { ips, endpoints } => (&ips[..], &endpoints[..]),
        ServiceKind::Headless(endpoints) => (&[][..], &endpoints[..]),
        ServiceKind::ExternalName(_) => (&[][..], &[][..]),
    };
    let services = ips.iter().map(|ip| (*ip, (key.clone(), None)));
    services.chain(endpoints.iter().map(|e| (e.ip, (key.clone(), Some(e.label.clone()))))).collect()
}

/// A Service's records, lowercase; `None` for a Service without a usable type.
fn service_record(svc: &Service, slices: &[Arc<EndpointSlice>], options: &ZoneOptions) -> Option<ServiceRecord> {
    let spec = svc.spec.as_ref()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| port_record(p.name.as_deref(), p.protocol.as_deref(), p.port))
        .collect();
    let endpoints = ready_endpoints(slices, options);
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let target = spec.external_name.as_deref()?.trim_end_matches('.').to_lowercase();
        ServiceKind::ExternalName(target)
    } else if spec.cluster_ip.as_deref() == Some("None") {
        ServiceKind::Headless(endpoints)
    } else {
        let ips = spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.as_ref());
        let mut ips: Vec<IpAddr> = ips.filter_map(|ip| ip.parse().ok()).collect();
        ips.sort();
        ips.dedup();
        ServiceKind::ClusterIp { ips, endpoints }
    };
    Some(ServiceRecord { kind, ports })
}

/// The ready endpoints of `slices` (a missing `ready` condition means ready), deduplicated by
/// address and label, sorted.
fn ready_endpoints(slices: &[Arc<EndpointSlice>], options: &ZoneOptions) -> Vec<EndpointRecord> {
    let mut endpoints = Vec::new();
    for slice in slices {
        let ports: Arc<[PortRecord]> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| port_record(p.name.as_deref(), p.protocol.as_deref(), p.port?))
            .collect();
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            let pod_name = endpoint
                .target_ref
                .as_ref()
                .filter(|r| options.endpoint_pod_names && r.kind.as_deref() == Some("Pod"))
                .and_then(|r| r.name.as_deref());
            for ip in endpoint.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                let hostname = endpoint.hostname.as_deref().filter(|h| !h.is_empty());
                let label = hostname.or(pod_name).map_or_else(|| dashed(ip), str::to_lowercase);
                endpoints.push(EndpointRecord { ip, label, ports: ports.clone() });
            }
        }
    }
    endpoints.sort_by(|a, b| (a.ip, &a.label).cmp(&(b.ip, &b.label)));
    endpoints.dedup_by(|a, b| a.ip == b.ip && a.label == b.label);
    endpoints
}

/// A Service or EndpointSlice port (TCP when no protocol is given); `None` out of range.
fn port_record(name: Option<&str>, protocol: Option<&str>, port: i32) -> Option<PortRecord> {
    Some(PortRecord {
        name: name.unwrap_or_default().to_lowercase(),
        protocol: protocol.unwrap_or("TCP").to_lowercase(),
        port: u16::try_from(port).ok()?,
    })
}

/// `10.244.0.5` as `10-244-0-5`, `fd00::5` as `fd00--5`.
pub fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// The addresses of a Pod (`status.podIPs`, else `status.podIP`).
fn pod_ips(pod: &roadkeeper_cluster::k8s_openapi::api::core::v1::Pod) -> Vec<IpAddr> {
    let Some(status) = &pod.status else { return Vec::new() };
    let listed = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
    let mut ips: Vec<IpAddr> = listed.chain(status.pod_ip.as_deref()).filter_map(|ip| ip.parse().ok()).collect();
    ips.sort();
    ips.dedup();
    ips
}
