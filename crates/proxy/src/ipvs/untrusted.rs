//! Every parser of the kernel's answers to IPVS mode, run on one byte string: the entry of the
//! fuzz target `ipvs_answers` (`crates/proxy/fuzz`) and of a unit test that mutates real
//! messages. The kernel is trusted less than it seems: a bug or another program on the netlink
//! socket must get an error, never a panic or an unbounded allocation.

use super::message::{AF_INET, AF_INET6};
use super::{dummy, exchange, kernel};

/// Feeds `data` to each parser: as a datagram (acks, a dump) and as a message payload (the
/// family id, a service, a destination of each family, a link, an address). Returns whatever
/// the bytes; what the parsers answer is not looked at.
pub fn parse_all(data: &[u8]) {
    let mut acks = exchange::Acks::new(1, 4);
    let _ = acks.feed(data);
    let mut dump = exchange::Dump::new(1);
    let _ = dump.feed(data);
    for payload in dump.replies.iter().map(Vec::as_slice).chain([data]) {
        let _ = kernel::parse_family_id(payload);
        let _ = kernel::parse_service(payload);
        for af in [AF_INET, AF_INET6, 0] {
            let _ = kernel::parse_dest(payload, af);
        }
        let _ = dummy::parse_link(payload);
        let _ = dummy::parse_addr(payload);
    }
}

#[cfg(test)]
mod tests {
    use roadkeeper_cluster::NamespacedName;
    use roadkeeper_rules::ipvs::{FrontendKind, IpvsOp, RealServer, Scheduler, VirtualKey, VirtualServer};
    use roadkeeper_rules::table::{Protocol, ServicePortName};

    use super::*;
    use crate::ipvs::message;

    /// Real IPVS messages (as the kernel's answers carry the same attributes), whole and as
    /// payloads after the netlink header.
    fn seeds() -> Vec<Vec<u8>> {
        let key = VirtualKey { protocol: Protocol::Tcp, address: "fd00:96::10".parse().unwrap(), port: 80 };
        let service = ServicePortName {
            service: NamespacedName::new("default", "a"),
            port: String::new(),
            protocol: Protocol::Tcp,
        };
        let real = RealServer { address: "10.244.0.11".parse().unwrap(), port: 8080 };
        let server = VirtualServer {
            service,
            kind: FrontendKind::ClusterIp,
            scheduler: Scheduler::SourceHashing,
            persistence: Some(600),
            real_servers: [(real, 1)].into(),
        };
        let ops = [IpvsOp::AddService(key, server), IpvsOp::AddDest(key, real, 1), IpvsOp::DelDest(key, real)];
        let mut seeds: Vec<Vec<u8>> = ops.iter().filter_map(|op| message::encode(op, 0x20, 1)).collect();
        seeds.push(message::get_family(1));
        let payloads: Vec<Vec<u8>> = seeds.iter().map(|m| m[16..].to_vec()).collect();
        seeds.extend(payloads);
        seeds
    }

    #[test]
    fn mutated_answers_never_panic_the_parsers() {
        // xorshift64: the same mutations every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for seed in seeds() {
            parse_all(&seed);
            for _ in 0..3000 {
                let mut data = seed.clone();
                for _ in 0..(next() % 4 + 1) {
                    let at = (next() as usize) % data.len();
                    data[at] = next() as u8;
                }
                data.truncate((next() as usize) % (data.len() + 1));
                parse_all(&data);
            }
        }
    }
}
