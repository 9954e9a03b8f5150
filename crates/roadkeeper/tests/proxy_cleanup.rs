//! `roadkeeper cleanup` removes what roadkeeper installed, with either backend, and leaves
//! everything else alone.

mod common;

use common::*;

per_backend!(cleanup_removes_what_roadkeeper_installed_and_nothing_else);

fn cleanup_removes_what_roadkeeper_installed_and_nothing_else(backend: Backend) {
    let mut c = Cluster::new("rk-clean", backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 20, ""));
    c.proxy_once(&[]);
    let unrelated = c.nft(&["add", "table", "inet", "unrelated"]);
    assert!(unrelated.status.success(), "{}", String::from_utf8_lossy(&unrelated.stderr));
    c.node_output(&["iptables", "-t", "filter", "-N", "UNRELATED"]);
    c.node_output(&["iptables", "-t", "filter", "-A", "INPUT", "-j", "UNRELATED"]);
    assert!(!ours(&c).is_empty(), "nothing installed");

    let out = c.roadkeeper(&["cleanup"]);
    assert!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(ours(&c).is_empty(), "left behind: {:?}", ours(&c));
    assert!(c.ruleset().contains("table inet unrelated"), "an unrelated nftables table was removed");
    let filter = c.node_output(&["iptables-save", "-t", "filter"]);
    assert!(filter.contains("-A INPUT -j UNRELATED"), "an unrelated iptables rule was removed:\n{filter}");
}

/// roadkeeper's own objects in the node: nftables tables named roadkeeper, iptables KUBE- chains.
fn ours(c: &Cluster) -> Vec<String> {
    let tables = c.ruleset();
    let iptables = c.node_output(&["iptables-save"]) + &c.node_output(&["ip6tables-save"]);
    tables
        .lines()
        .filter(|l| l.starts_with("table") && l.contains("roadkeeper"))
        .chain(iptables.lines().filter(|l| l.starts_with(":KUBE-")))
        .map(str::to_owned)
        .collect()
}
