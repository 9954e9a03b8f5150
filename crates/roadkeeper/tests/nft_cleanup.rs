//! `roadkeeper cleanup` removes roadkeeper's tables and leaves everything else alone.

mod common;

use common::*;

#[test]
fn cleanup_removes_both_tables_and_nothing_else() {
    let mut c = Cluster::new("rk-clean");
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 20, ""));
    c.proxy_once(&[]);
    let unrelated = c.nft(&["add", "table", "inet", "unrelated"]);
    assert!(unrelated.status.success(), "{}", String::from_utf8_lossy(&unrelated.stderr));
    assert_eq!(tables(&c), ["table inet unrelated", "table ip roadkeeper", "table ip6 roadkeeper"]);

    let out = c.roadkeeper(&["cleanup"]);
    assert!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tables(&c), ["table inet unrelated"]);
}

/// The node's nftables tables, sorted.
fn tables(c: &Cluster) -> Vec<String> {
    let out = c.nft(&["list", "tables"]);
    let mut tables: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    tables.sort();
    tables
}
