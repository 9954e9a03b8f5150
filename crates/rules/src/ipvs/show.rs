//! The IPVS table as `ipvsadm -Ln` prints it (without its kernel version line, and with the
//! connection counters of a table just programmed: 0).

use std::fmt::Write as _;

use super::plan::IpvsTable;
use crate::table::Protocol;

/// `ipvsadm -Ln`'s listing of `table`: virtual servers ordered by protocol, address and port,
/// each with its real servers (all masqueraded: IPVS mode's forwarding method is NAT).
pub fn ipvsadm_list(table: &IpvsTable) -> String {
    let mut out = String::from(
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n",
    );
    for (key, server) in &table.virtual_servers {
        let protocol = match key.protocol {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        };
        let _ = write!(out, "{protocol:<4} {key} {}", server.scheduler);
        if let Some(timeout) = server.persistence {
            let _ = write!(out, " persistent {timeout}");
        }
        out.push('\n');
        for (real, weight) in &server.real_servers {
            let _ = writeln!(out, "  -> {:<28} {:<7} {:<6} {:<10} {:<10}", real.to_string(), "Masq", weight, 0, 0);
        }
    }
    out
}

/// What `roadkeeper rules --proxy-mode ipvs` prints for `plan`: the virtual servers as
/// [`ipvsadm_list`], the addresses of `kube-ipvs0`, and the helper tables of both families as an
/// `nft -f` script.
pub fn rules_listing(plan: &super::IpvsPlan) -> String {
    let mut out = ipvsadm_list(&plan.table);
    let addresses: Vec<String> = plan.table.addresses.iter().map(ToString::to_string).collect();
    let _ = write!(out, "\n# {}: {}\n\n", super::plan::DUMMY_INTERFACE, addresses.join(" "));
    for family in [crate::table::IpFamily::V4, crate::table::IpFamily::V6] {
        out.push_str(&plan.helpers.script(family));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::plan::IpvsPlan;
    use crate::ipvs::plan::tests::{ep, ipvs_cfg, node, port};

    #[test]
    fn lists_virtual_and_real_servers_as_ipvsadm() {
        let mut tcp = port("a", "10.96.0.10", vec![ep("10.244.0.11", 8080, false), ep("10.244.0.12", 8080, false)]);
        tcp.affinity_timeout = Some(10800);
        let mut udp = port("dns", "10.96.0.53", vec![ep("10.244.0.20", 53, false)]);
        udp.name.protocol = Protocol::Udp;
        udp.port = 53;
        let v6 = port("b", "fd00:96::10", vec![ep("fd00:244::11", 8080, false)]);
        let listing = ipvsadm_list(&IpvsPlan::new(&ipvs_cfg(), &node(), [&tcp, &udp, &v6]).table);
        assert_eq!(
            listing,
            "Prot LocalAddress:Port Scheduler Flags\n\
             \x20 -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
             TCP  10.96.0.10:80 rr persistent 10800\n\
             \x20 -> 10.244.0.11:8080             Masq    1      0          0         \n\
             \x20 -> 10.244.0.12:8080             Masq    1      0          0         \n\
             TCP  [fd00:96::10]:80 rr\n\
             \x20 -> [fd00:244::11]:8080          Masq    1      0          0         \n\
             UDP  10.96.0.53:53 rr\n\
             \x20 -> 10.244.0.20:53               Masq    1      0          0         \n"
        );
    }
}
