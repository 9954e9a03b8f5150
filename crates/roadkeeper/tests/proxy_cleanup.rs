//! `roadkeeper cleanup` removes what roadkeeper installed, with either backend, and leaves
//! everything else alone: other tables, the kubelet's `KUBE-*` chains and another program's.

mod common;

use common::*;

per_backend!(cleanup_removes_what_roadkeeper_installed_and_nothing_else);

/// `KUBE-*` chains that are not roadkeeper's (nor kube-proxy's): the kubelet's (1.28 and later:
/// `KUBE-FIREWALL`, its canary, the iptables-flavour hint) and kube-router's network policy
/// chain.
const OTHERS: [&str; 4] = ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-ROUTER-INPUT"];

/// The commands that create [`OTHERS`], each chain with a rule and a jump from a builtin chain
/// where its owner makes one, as a kubelet (before the proxy starts) and kube-router would.
fn install_others(c: &Cluster) {
    let localnet = "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment COMMENT \
                    -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP";
    let mut commands: Vec<String> = vec![
        "iptables -t mangle -N KUBE-IPTABLES-HINT".into(),
        "iptables -t filter -N KUBE-FIREWALL".into(),
        format!("iptables -t filter -A KUBE-FIREWALL {localnet}"),
        "iptables -t filter -I INPUT -j KUBE-FIREWALL".into(),
        "iptables -t filter -I OUTPUT -j KUBE-FIREWALL".into(),
        "iptables -t filter -N KUBE-ROUTER-INPUT".into(),
        "iptables -t filter -A KUBE-ROUTER-INPUT -p tcp --dport 9 -j RETURN".into(),
        "iptables -t filter -I INPUT -m comment --comment kube-router -j KUBE-ROUTER-INPUT".into(),
    ];
    for tool in ["iptables", "ip6tables"] {
        for table in ["mangle", "nat", "filter"] {
            commands.push(format!("{tool} -t {table} -N KUBE-KUBELET-CANARY"));
        }
    }
    for command in &commands {
        // The kubelet's comment, the one word with spaces.
        let args =
            command.split_whitespace().map(|w| if w == "COMMENT" { "block incoming localnet connections" } else { w });
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", c.lab.node().name()])
            .args(args)
            .output()
            .expect("run in the node");
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn cleanup_removes_what_roadkeeper_installed_and_nothing_else(backend: Backend) {
    let mut c = Cluster::new("rk-clean", backend);
    install_others(&c);
    let theirs_before = theirs(&c);
    assert_eq!(theirs_before.iter().filter(|l| l.starts_with(':')).count(), 9, "{theirs_before:#?}");
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 20, ""));
    c.proxy_once(&[]);
    let unrelated = c.nft(&["add", "table", "inet", "unrelated"]);
    assert!(unrelated.status.success(), "{}", String::from_utf8_lossy(&unrelated.stderr));
    c.node_output(&["iptables", "-t", "filter", "-N", "UNRELATED"]);
    c.node_output(&["iptables", "-t", "filter", "-A", "INPUT", "-j", "UNRELATED"]);
    if backend == Backend::Ipvs {
        // Another program's virtual server, on an address of no Service.
        c.node_output(&["ipvsadm", "-A", "-t", "172.16.0.5:80", "-s", "rr"]);
    }
    assert!(!ours(&c).is_empty(), "nothing installed");

    let out = c.roadkeeper(&["cleanup"]);
    assert!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(ours(&c).is_empty(), "left behind: {:?}", ours(&c));
    assert!(c.ruleset().contains("table inet unrelated"), "an unrelated nftables table was removed");
    let filter = c.node_output(&["iptables-save", "-t", "filter"]);
    assert!(filter.contains("-A INPUT -j UNRELATED"), "an unrelated iptables rule was removed:\n{filter}");
    assert_eq!(theirs(&c), theirs_before, "the kubelet's or kube-router's chains, rules or jumps changed");
    if backend == Backend::Ipvs {
        let ipvs = c.node_output(&["ipvsadm", "-Ln"]);
        assert!(ipvs.contains("172.16.0.5:80"), "another program's virtual server was removed:\n{ipvs}");
    }
}

/// The node's `iptables-save` and `ip6tables-save` listings, one after the other.
fn listings(c: &Cluster) -> String {
    c.node_output(&["iptables-save"]) + &c.node_output(&["ip6tables-save"])
}

/// roadkeeper's own objects in the node: nftables tables named roadkeeper, iptables `KUBE-`
/// chains other than [`OTHERS`], and in IPVS mode `kube-ipvs0` and the virtual servers of the
/// Service (ClusterIP 10.96.0.20, NodePort 30020).
fn ours(c: &Cluster) -> Vec<String> {
    let tables = c.ruleset();
    let iptables = listings(c);
    let ipvs = if c.backend == Backend::Ipvs {
        c.node_output(&["ipvsadm", "-Ln"]) + &c.node_output(&["ip", "-o", "link", "show", "kube-ipvs0"])
    } else {
        String::new()
    };
    tables
        .lines()
        .filter(|l| l.starts_with("table") && l.contains("roadkeeper"))
        .chain(iptables.lines().filter(|l| l.starts_with(":KUBE-") && !mentions_others(l)))
        .chain(ipvs.lines().filter(|l| l.contains("10.96.0.20:") || l.contains(":30020") || l.contains("kube-ipvs0")))
        .map(str::to_owned)
        .collect()
}

/// The chain declarations and rules of the node that name one of [`OTHERS`] (counters cleared).
fn theirs(c: &Cluster) -> Vec<String> {
    let mut lines: Vec<String> = listings(c)
        .lines()
        .filter(|l| mentions_others(l))
        .map(|l| l.split(" [").next().unwrap_or(l).to_owned())
        .collect();
    lines.sort();
    lines
}

/// True when `line` names one of [`OTHERS`] as a chain.
fn mentions_others(line: &str) -> bool {
    line.split(|ch: char| ch.is_whitespace() || ch == ':').any(|word| OTHERS.contains(&word))
}
