//! The helper tables' elements as nf_tables bytes, so that a partial sync adds and deletes them
//! over netlink ([`crate::nft::netlink::Session::apply_elements`]) in one batch instead of an
//! `nft -f` process. Each set's key is [`HelperElement::text`]'s, typed as
//! [`HelperRules::script_with`](roadkeeper_rules::ipvs::HelperRules::script_with) declares it.

use std::net::IpAddr;

use roadkeeper_rules::ipvs::helpers::TABLE;
use roadkeeper_rules::ipvs::{ElementShape, HelperElement, VirtualKey};
use roadkeeper_rules::nft::rule::ElementKey;

use crate::nft::netlink::{SetElement, addr_bytes, endpoint_bytes, key_bytes};

/// `element` of its family's helper table, as bytes.
pub fn set_element(element: &HelperElement) -> SetElement<'static> {
    let with_addr = |key: &VirtualKey, addr: IpAddr| {
        let mut out = frontend(key);
        out.extend(addr_bytes(addr));
        out
    };
    let (key, key_end, data) = match element.shape() {
        ElementShape::Frontend(k) => (frontend(k), None, None),
        // An interval of a concatenation: its first and last keys, as nft sends it.
        ElementShape::FrontendSource(k, range) => {
            (with_addr(k, range.network()), Some(with_addr(k, range.broadcast())), None)
        }
        ElementShape::FrontendTo(k, ip, port) => (frontend(k), None, Some(endpoint_bytes(ip, port))),
        ElementShape::Hairpin(real, protocol) => {
            let endpoint = VirtualKey { address: real.address, protocol, port: real.port };
            (with_addr(&endpoint, real.address), None, None)
        }
        ElementShape::Address(address) => (addr_bytes(address), None, None),
    };
    SetElement { family: element.family(), table: TABLE, set: element.set(), key, key_end, data, text: element.text() }
}

/// A partial sync's element changes as one batch: `removed` deleted, then `added` added.
pub fn changes(added: &[HelperElement], removed: &[HelperElement]) -> Vec<(bool, SetElement<'static>)> {
    let deletes = removed.iter().map(|e| (false, set_element(e)));
    deletes.chain(added.iter().map(|e| (true, set_element(e)))).collect()
}

/// `address . protocol . port`.
fn frontend(key: &VirtualKey) -> Vec<u8> {
    key_bytes(&ElementKey::AddrProtoPort(key.address, key.protocol, key.port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_rules::ipvs::RealServer;
    use roadkeeper_rules::table::{IpFamily, Protocol};

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn lb() -> VirtualKey {
        VirtualKey { protocol: Protocol::Tcp, address: "203.0.113.9".parse().unwrap(), port: 80 }
    }

    /// Against `nft --debug=netlink add element ...` (nft 1.0.6), which prints each 4-byte
    /// register in host order (little-endian here): `097100cb 00000006 00005000 006433c6 -
    /// 097100cb 00000006 00005000 ff6433c6` for `203.0.113.9 . tcp . 80 . 198.51.100.0/24`, and
    /// `0200000a 00000006 00008075 : 0200600a 00005000` for `10.0.0.2 . tcp . 30080 : 10.96.0.2 . 80`.
    #[test]
    fn keys_ranges_and_data_are_what_nft_sends() {
        let allow = set_element(&HelperElement::FirewallAllow(lb(), "198.51.100.0/24".parse().unwrap()));
        assert_eq!((allow.family, allow.table, allow.set), (IpFamily::V4, TABLE, "firewall-allow"));
        assert_eq!(hex(&allow.key), "cb0071090600000000500000c6336400");
        assert_eq!(hex(allow.key_end.as_ref().unwrap()), "cb0071090600000000500000c63364ff");
        assert_eq!(allow.data, None);
        let frontend = VirtualKey { address: "10.0.0.2".parse().unwrap(), port: 30080, ..lb() };
        let short = set_element(&HelperElement::ShortCircuit(frontend, "10.96.0.2".parse().unwrap(), 80));
        assert_eq!(hex(&short.key), "0a0000020600000075800000");
        assert_eq!(hex(short.data.as_ref().unwrap()), "0a60000200500000");
        let real = RealServer { address: "fd00::5".parse().unwrap(), port: 8080 };
        let hairpin = set_element(&HelperElement::Hairpin(real, Protocol::Udp));
        let v6 = "fd000000000000000000000000000005";
        assert_eq!(hex(&hairpin.key), format!("{v6}110000001f900000{v6}"));
        assert_eq!((hairpin.family, hairpin.set, hairpin.key_end), (IpFamily::V6, "hairpin", None));
        let address = set_element(&HelperElement::IpvsAddress("10.96.0.1".parse().unwrap()));
        assert_eq!((hex(&address.key), address.text.as_str()), ("0a600001".to_string(), "10.96.0.1"));
    }

    // ---- against a live kernel (root, scratch network namespaces) -------------------------

    use std::collections::BTreeSet;

    use roadkeeper_cluster::NamespacedName;
    use roadkeeper_netlab::Netns;
    use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
    use roadkeeper_rules::ipvs::{HelperRules, IpvsPlan, element_script};
    use roadkeeper_rules::nft::objects::family_keyword;
    use roadkeeper_rules::table::{Endpoint, NodeInfo, ServicePort};

    use crate::nft::netlink::Session;
    use crate::tool;

    fn nft(args: &[&str], stdin: Option<&str>) -> String {
        tool::run("nft", args, stdin).unwrap_or_else(|e| panic!("nft {args:?}: {e:?}"))
    }

    fn list(family: IpFamily) -> String {
        nft(&["list", "table", family_keyword(family), TABLE], None)
    }

    /// Services of `family` whose helper elements fill every set: a Local-policy LoadBalancer
    /// with source ranges (a /24 and a single address), a NodePort and a remote endpoint (which
    /// hairpins), a Cluster-policy one with an external IP, one without endpoints.
    fn plan(family: IpFamily) -> IpvsPlan {
        let pick = |v4: &'static str, v6: &'static str| if family == IpFamily::V4 { v4 } else { v6 };
        let ip = |v4, v6| -> IpAddr { pick(v4, v6).parse().unwrap() };
        let ranges = [pick("198.51.100.0/24", "2001:db8:1::/64"), pick("192.0.2.7/32", "2001:db8:2::7/128")];
        let port = |name: &str, cluster_ip: IpAddr, endpoints: Vec<Endpoint>| {
            ServicePort::for_test(NamespacedName::new("default", name), Protocol::Tcp, cluster_ip, 80, endpoints)
        };
        let endpoint = Endpoint { ip: ip("10.244.0.11", "fd00:244::11"), port: 8080, is_local: false };
        let mut local = port("lb", ip("10.96.0.10", "fd00:96::10"), vec![endpoint.clone()]);
        local.external_policy_local = true;
        local.node_port = Some(30080);
        local.load_balancer_ips = vec![ip("203.0.113.9", "2001:db8:9::9")];
        local.source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        let mut cluster = port("ext", ip("10.96.0.11", "fd00:96::11"), vec![endpoint]);
        cluster.external_ips = vec![ip("203.0.113.7", "2001:db8:9::7")];
        let empty = port("empty", ip("10.96.0.12", "fd00:96::12"), vec![]);
        let node = NodeInfo {
            name: "node-a".into(),
            primary_ips: vec![ip("192.168.77.2", "fd00:77::2")],
            local_addresses: vec![ip("192.168.77.2", "fd00:77::2")],
            zone: None,
        };
        let cfg = ProxyConfig { mode: ProxyMode::Ipvs, ..ProxyConfig::default() };
        IpvsPlan::new(&cfg, &node, [&local, &cluster, &empty])
    }

    /// The table `helpers` declares holding `elements`, loaded with `nft -f` in a fresh
    /// namespace and listed.
    fn reference(helpers: &HelperRules, family: IpFamily, elements: &BTreeSet<HelperElement>) -> String {
        Netns::new("rk-ipvs-elref").expect("netns").run(|| {
            nft(&["-f", "-"], Some(&helpers.script_with(family, elements)));
            list(family)
        })
    }

    /// Every kind of helper element, both families, added and deleted over netlink in one batch
    /// each, lists exactly as the same tables written by `nft -f` (and as [`element_script`]
    /// applied by nft).
    #[test]
    fn helper_elements_of_every_set_are_added_and_deleted_over_netlink() {
        for family in [IpFamily::V4, IpFamily::V6] {
            let plan = plan(family);
            let all: BTreeSet<HelperElement> = plan.helpers.elements();
            let sets: BTreeSet<&str> = all.iter().map(HelperElement::set).collect();
            assert_eq!(sets, BTreeSet::from(HelperElement::SETS), "the fixture fills every set");
            assert!(all.iter().all(|e| e.family() == family));
            // Every other element of each set: a partial sync's mixed batch.
            let mut seen = BTreeSet::new();
            let (kept, dropped): (BTreeSet<HelperElement>, BTreeSet<HelperElement>) =
                all.iter().partition(|e| seen.insert(e.set()));
            let empty = BTreeSet::new();
            let want_empty = reference(&plan.helpers, family, &empty);
            let want_full = reference(&plan.helpers, family, &all);
            let want_kept = reference(&plan.helpers, family, &kept);
            let by_script = Netns::new("rk-ipvs-elscr").expect("netns").run(|| {
                nft(&["-f", "-"], Some(&plan.helpers.script_with(family, &empty)));
                nft(&["-f", "-"], Some(&element_script(&all.iter().copied().collect::<Vec<_>>(), &[])));
                list(family)
            });
            assert_eq!(by_script, want_full);

            let changes = |add: bool, elements: &BTreeSet<HelperElement>| -> Vec<(bool, SetElement<'static>)> {
                elements.iter().map(|e| (add, set_element(e))).collect()
            };
            Netns::new("rk-ipvs-elnl").expect("netns").run(|| {
                nft(&["-f", "-"], Some(&plan.helpers.script_with(family, &empty)));
                assert_eq!(list(family), want_empty);
                let mut session = Session::default();
                session.apply_elements(&changes(true, &all)).expect("add every element");
                assert_eq!(list(family), want_full, "netlink and nft -f disagree");
                session.apply_elements(&changes(false, &dropped)).expect("delete some");
                assert_eq!(list(family), want_kept);
                // Deletes then adds in one batch, as a partial sync sends them.
                let (added, removed): (Vec<HelperElement>, Vec<HelperElement>) =
                    (dropped.iter().copied().collect(), kept.iter().copied().collect());
                session.apply_elements(&super::changes(&added, &removed)).expect("mixed");
                let want_dropped = reference(&plan.helpers, family, &dropped);
                assert_eq!(list(family), want_dropped);
                session.apply_elements(&changes(false, &dropped)).expect("delete the rest");
                assert_eq!(list(family), want_empty);

                // A refused change (deleting what is not there) is named, and nothing of its
                // batch is applied.
                let mut refused = changes(true, &kept);
                refused.extend(changes(false, &dropped).into_iter().take(1));
                let err = session.apply_elements(&refused).expect_err("deleting an absent element");
                let text = dropped.iter().next().unwrap().text();
                assert!(err.to_string().contains(&text), "{err}");
                assert_eq!(list(family), want_empty, "a refused batch leaves nothing behind");
            });
        }
    }
}
