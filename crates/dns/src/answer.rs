//! What the cluster zones answer (pure): the Kubernetes DNS specification over a [`ZoneData`]
//! snapshot, with CoreDNS's NXDOMAIN/NODATA behaviour.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use roadkeeper_cluster::NamespacedName;

use crate::zone::{EndpointRecord, PodMode, PortRecord, ServiceKind, ServiceRecord, ZoneData};

/// The schema version answered at `dns-version.<zone>`.
const SCHEMA_VERSION: &str = "1.1.0";

/// The zones served and how negative answers are treated.
#[derive(Clone, Debug)]
pub struct Zones {
    /// Zones answered from the cluster's Services (lowercase, fully qualified); the first is the
    /// cluster domain, used in SRV targets and PTR answers.
    pub cluster: Vec<Name>,
    /// Reverse zones (`in-addr.arpa.`, `ip6.arpa.` or below) answering PTR for Service and
    /// endpoint addresses.
    pub reverse: Vec<Name>,
    /// Zones whose NXDOMAIN answers are forwarded upstream instead (CoreDNS's `fallthrough`).
    pub fallthrough: Vec<Name>,
    /// TTL of every answer, and the SOA's minimum.
    pub ttl: u32,
    /// How Pod records are answered.
    pub pods: PodMode,
    /// `ignore empty_service`: a ClusterIP Service without ready endpoints is NXDOMAIN.
    pub ignore_empty_service: bool,
    /// This server's own addresses (those it listens on), from which `ns.dns.<zone>`, the name
    /// its NS and SOA records give, is answered.
    pub servers: Vec<IpAddr>,
}

/// An authoritative answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// NOERROR (with or without records) or NXDOMAIN.
    pub rcode: ResponseCode,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The authority section: the zone's SOA on negative answers.
    pub authority: Vec<Record>,
    /// The additional section: addresses of SRV targets.
    pub additionals: Vec<Record>,
}

/// What to do with a question.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Answer it from the zone.
    Answer(Answer),
    /// Outside our zones, or a fallthrough miss: ask the upstream resolvers.
    Forward,
}

/// A positive or negative result inside one zone, before it becomes an [`Answer`].
enum Found {
    Records(Vec<Record>, Vec<Record>),
    NoData,
    NxDomain,
}

/// Most CNAMEs followed inside the zones for one answer (CoreDNS's limit).
const MAX_CNAMES: usize = 8;

impl Zones {
    /// The answer to `name` (as asked: its case is echoed) of type `qtype`. A CNAME (an
    /// ExternalName Service) whose target lies in a cluster zone is followed there, up to
    /// [`MAX_CNAMES`] and until a name repeats: the answer holds the CNAMEs and the target's
    /// records, as CoreDNS's; where the target has none, the CNAMEs and the target's negative
    /// answer (RFC 2308; CoreDNS leaves the CNAME out then).
    pub fn answer(&self, data: &ZoneData, name: &Name, qtype: RecordType) -> Outcome {
        let lower = name.to_lowercase();
        let Some((mut zone, mut found)) = self.find(data, name, &lower, qtype) else { return Outcome::Forward };
        let mut chain: Vec<Record> = Vec::new();
        while let Some((owner, target)) = cname(&found).filter(|_| qtype != RecordType::CNAME) {
            let repeated = target == lower || target == owner || chain.iter().any(|r| r.name.to_lowercase() == target);
            let outside = !self.cluster.iter().any(|z| z.zone_of(&target));
            if outside || repeated || chain.len() + 1 >= MAX_CNAMES {
                break;
            }
            let Some((next, followed)) = self.find(data, &target, &target, qtype) else { break };
            if let Found::Records(cname, _) = std::mem::replace(&mut found, followed) {
                chain.extend(cname);
            }
            zone = next;
        }
        let (rcode, answers, additionals) = match found {
            Found::Records(answers, additionals) if !answers.is_empty() => {
                (ResponseCode::NoError, answers, additionals)
            }
            Found::Records(..) | Found::NoData => (ResponseCode::NoError, Vec::new(), Vec::new()),
            Found::NxDomain if chain.is_empty() && self.fallthrough.iter().any(|z| z.zone_of(&lower)) => {
                return Outcome::Forward;
            }
            Found::NxDomain => (ResponseCode::NXDomain, Vec::new(), Vec::new()),
        };
        let authority = if answers.is_empty() { vec![self.soa(data, zone)] } else { Vec::new() };
        chain.extend(answers);
        Outcome::Answer(Answer { rcode, answers: chain, authority, additionals })
    }

    /// The zone of ours holding `lower` (`name` lowercase) and what it holds there; `None` outside
    /// our zones. Every zone has its apex (SOA, NS) and `ns.dns.<zone>`, the server's name.
    fn find<'z>(&'z self, data: &ZoneData, name: &Name, lower: &Name, qtype: RecordType) -> Option<(&'z Name, Found)> {
        let (zone, cluster) = match self.cluster.iter().find(|z| z.zone_of(lower)) {
            Some(zone) => (zone, true),
            None => (self.reverse.iter().find(|z| z.zone_of(lower))?, false),
        };
        let record = |rdata: RData| Record::from_rdata(name.clone(), self.ttl, rdata);
        let found = if lower == zone {
            match qtype {
                RecordType::SOA => Found::Records(vec![self.soa(data, zone)], Vec::new()),
                RecordType::NS => {
                    let server = server_name(zone);
                    let glue = [RecordType::A, RecordType::AAAA].into_iter();
                    let glue = glue.flat_map(|t| addresses(&server, self.ttl, self.server_addresses(data), t));
                    Found::Records(vec![record(RData::NS(NS(server.clone())))], glue.collect())
                }
                _ => Found::NoData,
            }
        } else if is_server_name(lower, zone) {
            Found::Records(addresses(name, self.ttl, self.server_addresses(data), qtype), Vec::new())
        } else if cluster {
            self.cluster_lookup(data, zone, name, lower, qtype)
        } else {
            self.reverse_lookup(data, name, lower, qtype)
        };
        Some((zone, found))
    }

    /// The addresses `ns.dns.<zone>` answers, as CoreDNS finds them: the cluster IPs of the
    /// Services that have one of this server's addresses as a ready endpoint (all their endpoints'
    /// addresses for a headless Service), else this server's addresses.
    fn server_addresses(&self, data: &ZoneData) -> Vec<IpAddr> {
        let mut found = Vec::new();
        for own in &self.servers {
            for (key, endpoint) in data.reverse(own) {
                match data.service(key).map(|svc| &svc.kind) {
                    Some(ServiceKind::ClusterIp { ips, .. }) if endpoint.is_some() => found.extend(ips),
                    Some(ServiceKind::Headless(endpoints)) => found.extend(endpoints.iter().map(|e| e.ip)),
                    _ => {}
                }
            }
        }
        if found.is_empty() {
            found.clone_from(&self.servers);
        }
        found.sort();
        found.dedup();
        found
    }

    /// The zone's SOA record, as CoreDNS writes it.
    pub fn soa(&self, data: &ZoneData, zone: &Name) -> Record {
        let hostmaster = Name::from_ascii("hostmaster").and_then(|l| l.append_domain(zone)).expect("valid name");
        let soa = SOA::new(server_name(zone), hostmaster, data.version(), 7200, 1800, 86400, self.ttl);
        Record::from_rdata(zone.clone(), self.ttl, RData::SOA(soa))
    }

    fn cluster_lookup(&self, data: &ZoneData, zone: &Name, name: &Name, lower: &Name, qtype: RecordType) -> Found {
        let labels: Vec<String> = lower
            .iter()
            .take(usize::from(lower.num_labels() - zone.num_labels()))
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let record = |rdata: RData| Record::from_rdata(name.clone(), self.ttl, rdata);
        match labels.as_slice() {
            ["dns-version"] if qtype == RecordType::TXT => {
                Found::Records(vec![record(RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()])))], Vec::new())
            }
            ["dns-version"] | ["svc"] | ["pod"] => Found::NoData,
            [namespace, "svc" | "pod"] => {
                if data.has_namespace(namespace) {
                    Found::NoData
                } else {
                    Found::NxDomain
                }
            }
            [service, namespace, "svc"] => match data.service(&NamespacedName::new(*namespace, *service)) {
                Some(svc) => self.service(name, namespace, service, svc, qtype),
                None => Found::NxDomain,
            },
            // Endpoints of headless and, as CoreDNS names them too, of ClusterIP Services.
            [endpoint, service, namespace, "svc"] => match data.service(&NamespacedName::new(*namespace, *service)) {
                Some(svc) => match &svc.kind {
                    ServiceKind::Headless(endpoints) | ServiceKind::ClusterIp { endpoints, .. } => {
                        let named: Vec<&EndpointRecord> = endpoints.iter().filter(|e| e.label == *endpoint).collect();
                        if named.is_empty() {
                            Found::NxDomain
                        } else {
                            Found::Records(addresses(name, self.ttl, named.iter().map(|e| e.ip), qtype), Vec::new())
                        }
                    }
                    ServiceKind::ExternalName(_) => Found::NxDomain,
                },
                None => Found::NxDomain,
            },
            [port, protocol, service, namespace, "svc"] if port.starts_with('_') && protocol.starts_with('_') => {
                match data.service(&NamespacedName::new(*namespace, *service)) {
                    Some(svc) => {
                        let wanted = |p: &PortRecord| p.name == port[1..] && p.protocol == protocol[1..];
                        let srv = self.srv(name, namespace, service, svc, wanted);
                        match srv {
                            Found::Records(records, _) if records.is_empty() => Found::NxDomain,
                            Found::Records(..) if qtype != RecordType::SRV => Found::NoData,
                            other => other,
                        }
                    }
                    None => Found::NxDomain,
                }
            }
            [pod, namespace, "pod"] => self.pod(data, name, pod, namespace, qtype),
            _ => Found::NxDomain,
        }
    }

    /// `<service>.<namespace>.svc.<zone>`.
    fn service(&self, name: &Name, namespace: &str, service: &str, svc: &ServiceRecord, qtype: RecordType) -> Found {
        match &svc.kind {
            ServiceKind::ExternalName(target) => match Name::from_ascii(format!("{target}.")) {
                Ok(target) => Found::Records(
                    vec![Record::from_rdata(name.clone(), self.ttl, RData::CNAME(CNAME(target)))],
                    vec![],
                ),
                Err(_) => Found::NxDomain,
            },
            ServiceKind::ClusterIp { endpoints, .. } if endpoints.is_empty() && self.ignore_empty_service => {
                Found::NxDomain
            }
            ServiceKind::Headless(endpoints) if endpoints.is_empty() => Found::NxDomain,
            _ if qtype == RecordType::SRV => self.srv(name, namespace, service, svc, |_| true),
            ServiceKind::ClusterIp { ips, .. } => {
                Found::Records(addresses(name, self.ttl, ips.iter().copied(), qtype), Vec::new())
            }
            ServiceKind::Headless(endpoints) => {
                Found::Records(addresses(name, self.ttl, endpoints.iter().map(|e| e.ip), qtype), Vec::new())
            }
        }
    }

    /// SRV records of the ports `wanted` selects (at name `name`), with the targets' addresses
    /// as additionals. Weights as CoreDNS: 100 split evenly, rounded down.
    fn srv(
        &self,
        name: &Name,
        namespace: &str,
        service: &str,
        svc: &ServiceRecord,
        wanted: impl Fn(&PortRecord) -> bool,
    ) -> Found {
        let service_name = self.fqdn(&[service, namespace, "svc"]);
        let mut targets: Vec<(u16, Name, Vec<IpAddr>)> = Vec::new();
        match &svc.kind {
            ServiceKind::ClusterIp { ips, .. } => {
                for port in svc.ports.iter().filter(|p| wanted(p)) {
                    targets.push((port.port, service_name.clone(), ips.clone()));
                }
            }
            ServiceKind::Headless(endpoints) => {
                for endpoint in endpoints {
                    let target = self.fqdn(&[&endpoint.label, service, namespace, "svc"]);
                    for port in endpoint.ports.iter().filter(|p| wanted(p)) {
                        targets.push((port.port, target.clone(), vec![endpoint.ip]));
                    }
                }
            }
            ServiceKind::ExternalName(_) => return Found::NxDomain,
        }
        let weight = u16::try_from(100 / targets.len().max(1)).unwrap_or(100);
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        for (port, target, ips) in targets {
            answers.push(Record::from_rdata(
                name.clone(),
                self.ttl,
                RData::SRV(SRV::new(0, weight, port, target.clone())),
            ));
            for ip in ips {
                let address = if ip.is_ipv4() { RecordType::A } else { RecordType::AAAA };
                let record = addresses(&target, self.ttl, [ip], address);
                if !additionals.contains(&record[0]) {
                    additionals.extend(record);
                }
            }
        }
        Found::Records(answers, additionals)
    }

    /// `<dashed-ip>.<namespace>.pod.<zone>`.
    fn pod(&self, data: &ZoneData, name: &Name, label: &str, namespace: &str, qtype: RecordType) -> Found {
        let Some(ip) = undashed(label) else { return Found::NxDomain };
        let known = match self.pods {
            PodMode::Disabled => false,
            // Any address, as CoreDNS, but only in a namespace that exists.
            PodMode::Insecure => data.has_namespace(namespace),
            PodMode::Verified => data.has_pod_ip(namespace, ip),
        };
        if known { Found::Records(addresses(name, self.ttl, [ip], qtype), Vec::new()) } else { Found::NxDomain }
    }

    /// PTR for a Service or endpoint address.
    fn reverse_lookup(&self, data: &ZoneData, name: &Name, lower: &Name, qtype: RecordType) -> Found {
        let Some(ip) = reverse_ip(lower) else { return Found::NxDomain };
        let owners = data.reverse(&ip);
        if owners.is_empty() {
            return Found::NxDomain;
        }
        if qtype != RecordType::PTR {
            return Found::NoData;
        }
        let records = owners
            .iter()
            .map(|(service, endpoint)| {
                let mut labels: Vec<&str> = endpoint.iter().map(String::as_str).collect();
                labels.extend([service.name.as_str(), service.namespace.as_str(), "svc"]);
                Record::from_rdata(name.clone(), self.ttl, RData::PTR(PTR(self.fqdn(&labels))))
            })
            .collect();
        Found::Records(records, Vec::new())
    }

    /// `labels` under the cluster domain.
    fn fqdn(&self, labels: &[&str]) -> Name {
        Name::from_labels(labels.iter().map(|l| l.as_bytes()))
            .and_then(|n| n.append_domain(&self.cluster[0]))
            .unwrap_or_else(|_| self.cluster[0].clone())
    }
}

/// The owner and the target of `found` when it is a CNAME (an ExternalName Service's), lowercase.
fn cname(found: &Found) -> Option<(Name, Name)> {
    match found {
        Found::Records(answers, _) => match answers.as_slice() {
            [Record { name, data: RData::CNAME(CNAME(target)), .. }] => {
                Some((name.to_lowercase(), target.to_lowercase()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// `ns.dns.<zone>`: the server's name in the NS and SOA records of `zone`.
fn server_name(zone: &Name) -> Name {
    Name::from_ascii("ns.dns").and_then(|n| n.append_domain(zone)).expect("valid name")
}

/// Whether `lower`, a name in `zone`, is [`server_name`]`(zone)` (without building that name).
fn is_server_name(lower: &Name, zone: &Name) -> bool {
    let mut labels = lower.iter();
    lower.num_labels() == zone.num_labels() + 2 && labels.next() == Some(b"ns") && labels.next() == Some(b"dns")
}

/// A or AAAA records of the `ips` of the asked family (none for other types).
fn addresses(name: &Name, ttl: u32, ips: impl IntoIterator<Item = IpAddr>, qtype: RecordType) -> Vec<Record> {
    ips.into_iter()
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(v4))),
            (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(v6))),
            _ => None,
        })
        .map(|rdata| Record::from_rdata(name.clone(), ttl, rdata))
        .collect()
}

/// `10-244-0-5` as 10.244.0.5, `fd00--5` as fd00::5.
fn undashed(label: &str) -> Option<IpAddr> {
    let v4 = label.replace('-', ".");
    v4.parse::<Ipv4Addr>().map(IpAddr::V4).or_else(|_| label.replace('-', ":").parse::<Ipv6Addr>().map(IpAddr::V6)).ok()
}

/// The address a full reverse name (`5.0.244.10.in-addr.arpa.`, 32 nibbles `.ip6.arpa.`) spells.
fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let labels: Vec<&[u8]> = name.iter().collect();
    match labels.as_slice() {
        [d, c, b, a, in_addr, arpa]
            if in_addr.eq_ignore_ascii_case(b"in-addr") && arpa.eq_ignore_ascii_case(b"arpa") =>
        {
            let octet = |l: &[u8]| std::str::from_utf8(l).ok()?.parse::<u8>().ok();
            Some(IpAddr::V4(Ipv4Addr::new(octet(a)?, octet(b)?, octet(c)?, octet(d)?)))
        }
        [nibbles @ .., ip6, arpa]
            if nibbles.len() == 32 && ip6.eq_ignore_ascii_case(b"ip6") && arpa.eq_ignore_ascii_case(b"arpa") =>
        {
            let mut value: u128 = 0;
            for nibble in nibbles.iter().rev() {
                let digit = std::str::from_utf8(nibble).ok().filter(|d| d.len() == 1)?;
                value = (value << 4) | u128::from(u8::from_str_radix(digit, 16).ok()?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(value)))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
