//! Real-kernel tests: plans applied with the host's iptables tools in a scratch network
//! namespace, checked with `iptables-save`. Need root.

use std::collections::BTreeSet;
use std::process::Command;

use roadkeeper_cluster::{NamespacedName, Object, Store};
use roadkeeper_netlab::Netns;

use super::IptablesProxier;
use super::restore::{Flavour, IptablesBinary, cleanup};
use crate::proxier::{Proxier, RulesCheck};
use roadkeeper_rules::config::ProxyConfig;
use roadkeeper_rules::table::NodeInfo;

/// `default/hello` (one unnamed TCP port, ClusterIP 10.96.0.10) with `n` ready endpoints.
fn hello(n: u8) -> Vec<Object> {
    hello_at(&(1..=n).collect::<Vec<u8>>())
}

/// `default/hello` with endpoints 10.244.0.<i> for each i of `hosts`.
fn hello_at(hosts: &[u8]) -> Vec<Object> {
    let svc = "metadata: {name: hello, namespace: default}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80, targetPort: 8080}]}\n";
    let mut slice = "metadata: {name: hello-1, namespace: default, labels: {kubernetes.io/service-name: hello}}\n\
                     addressType: IPv4\nports: [{port: 8080}]\nendpoints:\n"
        .to_string();
    for i in hosts {
        slice.push_str(&format!("- {{addresses: [10.244.0.{i}]}}\n"));
    }
    vec![
        Object::Service(serde_saphyr::from_str(svc).unwrap()),
        Object::EndpointSlice(serde_saphyr::from_str(&slice).unwrap()),
    ]
}

/// A dual-stack NodePort Service `web` with two endpoints per family, one of them local.
fn web() -> Vec<Object> {
    let svc = "metadata: {name: web, namespace: default}\nspec: {type: NodePort, clusterIPs: [10.96.0.80, \"fd00:96::80\"], \
               ipFamilies: [IPv4, IPv6], sessionAffinity: ClientIP, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]}\n";
    let slice = |fam: &str, a: &str, b: &str| {
        format!(
            "metadata: {{name: web-{fam}, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n\
             addressType: {fam}\nports: [{{name: http, port: 8080}}]\n\
             endpoints: [{{addresses: [\"{a}\"], nodeName: node-a}}, {{addresses: [\"{b}\"], nodeName: node-b}}]\n"
        )
    };
    vec![
        Object::Service(serde_saphyr::from_str(svc).unwrap()),
        Object::EndpointSlice(serde_saphyr::from_str(&slice("IPv4", "10.244.0.20", "10.244.1.20")).unwrap()),
        Object::EndpointSlice(serde_saphyr::from_str(&slice("IPv6", "fd00:244::20", "fd00:244:1::20")).unwrap()),
    ]
}

fn save(tool: &str, table: &str) -> String {
    let out = Command::new(tool).args(["-t", table]).output().expect("run save");
    assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn count(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

fn proxier(flavour: Flavour) -> IptablesProxier<IptablesBinary> {
    let cfg = ProxyConfig {
        hostname: "node-a".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap(), "fd00:244::/48".parse().unwrap()],
        ..ProxyConfig::default()
    };
    let node =
        NodeInfo { name: "node-a".into(), primary_ips: vec!["192.168.77.2".parse().unwrap()], ..NodeInfo::default() };
    IptablesProxier::new(cfg, node, IptablesBinary::with_flavour(flavour))
}

fn applies_partial_syncs_and_cleans_up(flavour: Flavour) {
    let (save4, save6) = match flavour {
        Flavour::Nft => ("iptables-nft-save", "ip6tables-nft-save"),
        Flavour::Legacy => ("iptables-legacy-save", "ip6tables-legacy-save"),
    };
    let ns = Netns::new("rk-ipt").unwrap();
    ns.run(|| {
        let mut p = proxier(flavour);
        let objects = |n: u8| Store::from_objects(hello(n).into_iter().chain(web()));
        let report = p.sync(&objects(3), &BTreeSet::new()).unwrap();
        assert!(report.full && report.refused.is_empty(), "{report:?}");
        let nat = save(save4, "nat");
        assert_eq!(count(&nat, "default/hello"), 11, "{nat}");
        assert!(nat.contains("-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/hello cluster IP\" -m tcp --dport 80 -j KUBE-SVC-"), "{nat}");
        assert!(nat.contains("-m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-"), "{nat}");
        assert!(nat.contains("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"), "{nat}");
        assert!(nat.contains("-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-"), "{nat}");
        let last = nat.lines().rfind(|l| l.starts_with("-A KUBE-SERVICES")).unwrap();
        assert!(last.ends_with("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"), "{last}");
        let nat6 = save(save6, "nat");
        assert!(nat6.contains("-A KUBE-SERVICES -d fd00:96::80/128 -p tcp -m comment --comment \"default/web:http cluster IP\""), "{nat6}");
        assert!(nat6.contains("--to-destination [fd00:244::20]:8080"), "{nat6}");
        let filter = save(save4, "filter");
        assert!(filter.contains("-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"), "{filter}");
        assert!(save(save4, "mangle").contains(":KUBE-PROXY-CANARY"));
        assert!(matches!(p.check_rules(), RulesCheck::InPlace));

        // Two more endpoints: a partial sync rewrites hello's chains only.
        let hello_key = BTreeSet::from([NamespacedName::new("default", "hello")]);
        let report = p.sync(&objects(5), &hello_key).unwrap();
        assert!(!report.full && report.services_changed == 1, "{report:?}");
        assert_eq!(count(&save(save4, "nat"), "default/hello"), 17);
        // Back to one endpoint: the stale endpoint chains are deleted.
        p.sync(&objects(1), &hello_key).unwrap();
        let nat = save(save4, "nat");
        assert_eq!(count(&nat, "default/hello"), 5, "{nat}");
        assert_eq!(nat.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count(), 1 + 2, "{nat}");
        // The Service is gone: its chains too; no endpoints: REJECT.
        p.sync(&Store::from_objects(web()), &hello_key).unwrap();
        assert_eq!(count(&save(save4, "nat"), "default/hello"), 0);
        p.sync(&objects(0), &hello_key).unwrap();
        let filter = save(save4, "filter");
        assert!(filter.contains("--comment \"default/hello has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with tcp-reset"), "{filter}");

        // Someone flushes everything: unhealthy, and a full sync restores it all.
        let tool = save4.trim_end_matches("-save");
        for args in [["-t", "nat", "-F"], ["-t", "mangle", "-F"], ["-t", "mangle", "-X"]] {
            assert!(Command::new(tool).args(args).status().unwrap().success());
        }
        assert!(matches!(p.check_rules(), RulesCheck::Missing));
        p.force_full_sync();
        p.sync(&objects(3), &BTreeSet::new()).unwrap();
        assert!(matches!(p.check_rules(), RulesCheck::InPlace));
        assert_eq!(count(&save(save4, "nat"), "default/hello"), 11);
        // Another full sync does not duplicate the jumps.
        p.force_full_sync();
        p.sync(&objects(3), &BTreeSet::new()).unwrap();
        assert_eq!(count(&save(save4, "nat"), "-A PREROUTING"), 1);
        assert_eq!(count(&save(save4, "filter"), "-A FORWARD"), 4);

        cleanup().unwrap();
        // KUBE-FIREWALL (ensured while localhost NodePorts are on) is the kubelet's: it stays.
        for text in [save(save4, "nat"), save(save4, "filter"), save(save6, "nat"), save(save4, "mangle")] {
            let left: Vec<&str> = text.lines().filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL")).collect();
            assert!(left.is_empty(), "{text}");
        }
        assert_eq!(count(&save(save4, "filter"), "-j KUBE-FIREWALL"), 2);
    });
}

#[test]
fn nft_flavour_applies_partial_syncs_and_cleans_up() {
    applies_partial_syncs_and_cleans_up(Flavour::Nft);
}

#[test]
fn legacy_flavour_applies_partial_syncs_and_cleans_up() {
    applies_partial_syncs_and_cleans_up(Flavour::Legacy);
}

#[test]
fn a_service_the_kernel_refuses_keeps_its_last_good_rules_and_the_others_apply() {
    let ns = Netns::new("rk-ipt").unwrap();
    ns.run(|| {
        let mut p = proxier(Flavour::Nft);
        p.sync(&Store::from_objects(hello(2).into_iter().chain(web())), &BTreeSet::new()).unwrap();
        // A foreign chain references hello's first endpoint chain: the kernel refuses to delete it.
        let sep = format!(
            "KUBE-SEP-{}",
            roadkeeper_rules::hash::iptables_hash("default/hello", "tcp", Some("10.244.0.1:8080"))
        );
        for args in [vec!["-t", "nat", "-N", "FOREIGN"], vec!["-t", "nat", "-A", "FOREIGN", "-j", &sep]] {
            assert!(Command::new("iptables-nft").args(args).status().unwrap().success());
        }
        // hello drops that endpoint for two others, web is deleted, in one sync.
        let moved = hello_at(&[2, 3]);
        let both = BTreeSet::from([NamespacedName::new("default", "hello"), NamespacedName::new("default", "web")]);
        let report = p.sync(&Store::from_objects(moved.clone()), &both).unwrap();
        assert_eq!(report.refused.len(), 1, "{report:?}");
        assert_eq!(report.refused[0].0, NamespacedName::new("default", "hello"));
        assert!(report.refused[0].1.contains(&sep), "{:?}", report.refused);
        let nat = save("iptables-nft-save", "nat");
        assert_eq!(count(&nat, "default/web"), 0, "web is gone: {nat}");
        assert_eq!(count(&nat, "default/hello"), 8, "hello keeps its 2-endpoint rules: {nat}");
        assert!(p.wants_retry());
        // Once the foreign reference is gone, the next sync retries hello without being asked.
        assert!(Command::new("iptables-nft").args(["-t", "nat", "-F", "FOREIGN"]).status().unwrap().success());
        let report = p.sync(&Store::from_objects(moved), &BTreeSet::new()).unwrap();
        assert!(report.refused.is_empty() && report.services_changed == 1, "{report:?}");
        assert_eq!(count(&save("iptables-nft-save", "nat"), "default/hello"), 8);
        assert!(!save("iptables-nft-save", "nat").contains(&format!(":{sep} ")));
    });
}

/// A Service whose names try to break out of their comment (validation refuses them; nothing
/// taken from an object may add a rule without it either): in both flavours, the kernel holds the
/// Service's rules and not one rule it did not ask for.
#[test]
fn names_cannot_add_rules() {
    let hostile_port = "x\\\" -j ACCEPT\\n-A INPUT -j DROP\\n#";
    let svc = format!(
        "metadata: {{name: \"evil\\\" -j ACCEPT\", namespace: default}}\n\
         spec: {{clusterIP: 10.96.0.66, ports: [{{name: \"{hostile_port}\", port: 80, targetPort: 8080}}]}}\n"
    );
    let slice = format!(
        "metadata: {{name: evil-1, namespace: default, labels: {{kubernetes.io/service-name: \"evil\\\" -j ACCEPT\"}}}}\n\
         addressType: IPv4\nports: [{{name: \"{hostile_port}\", port: 8080}}]\nendpoints: [{{addresses: [10.244.0.66]}}]\n"
    );
    let store = Store::from_objects([
        Object::Service(serde_saphyr::from_str(&svc).unwrap()),
        Object::EndpointSlice(serde_saphyr::from_str(&slice).unwrap()),
    ]);
    for (flavour, save4) in [(Flavour::Nft, "iptables-nft-save"), (Flavour::Legacy, "iptables-legacy-save")] {
        let ns = Netns::new("rk-iptnames").unwrap();
        ns.run(|| {
            let mut p = proxier(flavour);
            let report = p.sync(&store, &BTreeSet::new()).unwrap();
            assert!(report.refused.is_empty(), "{report:?}");
            let (nat, filter) = (save(save4, "nat"), save(save4, "filter"));
            assert!(nat.contains("--to-destination 10.244.0.66:8080"), "the Service is programmed: {nat}");
            for table in [&nat, &filter] {
                assert!(!table.lines().any(|l| l.starts_with("-A INPUT -j DROP")), "{table}");
                let evil: Vec<&str> = table.lines().filter(|l| l.contains("evil")).collect();
                assert!(!evil.is_empty() && evil.iter().all(|l| l.contains("\"default/evil_ -j ACCEPT")), "{table}");
                assert!(!evil.iter().any(|l| l.ends_with("-j ACCEPT")), "{table}");
            }
        });
    }
}
