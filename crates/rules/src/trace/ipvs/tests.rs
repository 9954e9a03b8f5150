//! IPVS mode traced: the helper tables from the proxy's own scripts and the IPVS stage, over the
//! lab of the tracer's tests.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::super::lab::*;
use super::super::{Delivery, Effect, Fate, Ruleset, Step, Trace, Verdict};
use super::{IPVS, persistence_entry};
use crate::config::ProxyMode;
use crate::ipvs::{RealServer, Scheduler, VirtualKey};
use crate::table::{IpFamily, Protocol};

const MODE: ProxyMode = ProxyMode::Ipvs;

/// `web` (ClusterIP 10.96.0.80, NodePort 30080) over `pods` of this node.
fn web(pods: &[&str], extra: &str) -> Lab {
    let mut lab = Lab::new();
    for name in pods {
        lab.pod(name, "app: web", NODE, PodState::Ready);
    }
    lab.service("web", 80, extra);
    lab
}

/// The IPVS steps of a path: the virtual server each names and the real server it chose.
fn ipvs_steps(trace: &Trace, path: usize) -> Vec<(String, Option<SocketAddr>)> {
    trace
        .steps(path)
        .into_iter()
        .filter_map(|step| match step {
            Step::Rule { table, matched: true, element, effects, .. } if table == IPVS => {
                let dnat = effects.iter().find_map(|e| match e {
                    Effect::Dnat { to } => Some(*to),
                    _ => None,
                });
                Some((element.clone().unwrap_or_default(), dnat))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn pod_to_cluster_ip_lands_on_every_real_server_unmasqueraded() {
    let lab = web(&["web-a", "web-b", "web-c"], "");
    for family in FAMILIES {
        for protocol in PROTOCOLS {
            let to = at(cluster_ip(family, 80));
            let trace = lab.trace(MODE, From::Pod(0), to, protocol);
            assert_eq!(trace.backend, "ipvs");
            assert_eq!(lab.reaches(&trace), (names(&["web-a", "web-b", "web-c"]), false), "{to} {protocol:?}");
            for (index, path) in trace.paths.iter().enumerate() {
                assert!((path.probability - 1.0 / 3.0).abs() < 1e-9, "{to}: rr: {}", path.probability);
                let proto = protocol.as_str().to_ascii_uppercase();
                let vs = VirtualKey { protocol, address: to.ip(), port: 80 };
                assert_eq!(ipvs_steps(&trace, index), [(format!("{proto} {vs} rr"), path.dnat)], "{to}");
                // The packet is taken at LOCAL_IN after the filter chains and sent on.
                let hooks: Vec<String> = trace
                    .steps(index)
                    .iter()
                    .filter_map(|s| match s {
                        Step::Enter { table, chain, .. } => Some(format!("{table} {chain}")),
                        _ => None,
                    })
                    .collect();
                let ip = if family == IpFamily::V4 { "ip" } else { "ip6" };
                let input = hooks.iter().position(|h| *h == format!("{ip} roadkeeper-ipvs filter-input")).unwrap();
                let stage = hooks.iter().position(|h| *h == "IPVS LOCAL_IN").unwrap();
                assert!(input < stage, "{hooks:?}");
                assert!(hooks.last().unwrap().ends_with("nat-postrouting"), "{hooks:?}");
                assert_eq!(
                    path.fate(),
                    Fate::Delivered { delivery: Delivery::Forwarded, dnat: path.dnat, masqueraded: false }
                );
            }
        }
    }
}

#[test]
fn host_to_cluster_ip_is_scheduled_at_local_out_and_masqueraded() {
    let lab = web(&["web-a", "web-b"], "");
    for family in FAMILIES {
        let trace = lab.trace(MODE, From::Host, at(cluster_ip(family, 80)), Protocol::Tcp);
        assert_eq!(lab.reaches(&trace), (names(&["web-a", "web-b"]), true), "{family:?}");
        let steps = trace.steps(0);
        let entered: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Enter { table, chain, .. } => Some(format!("{table} {chain}")),
                _ => None,
            })
            .collect();
        let nat = entered.iter().position(|h| h.ends_with("nat-output")).unwrap();
        let stage = entered.iter().position(|h| h == "IPVS LOCAL_OUT").unwrap();
        assert!(nat < stage, "the nat output chain (-100) before IPVS (-98): {entered:?}");
        let masquerade = trace.paths[0].masquerade.as_ref().unwrap();
        assert!(masquerade.marked_by.iter().any(|r| r.rule.contains("@cluster-ips meta mark set")), "{masquerade:?}");
        assert!(masquerade.by.rule.contains("masquerade"), "{masquerade:?}");
    }
}

#[test]
fn node_port_from_outside_is_masqueraded_and_a_local_policy_keeps_the_client() {
    let lab = web(&["web-a", "web-b"], "type: NodePort");
    for family in FAMILIES {
        let to = SocketAddr::new(node_ip(family), node_port(80));
        let trace = lab.trace(MODE, From::External, to, Protocol::Tcp);
        assert_eq!(lab.reaches(&trace), (names(&["web-a", "web-b"]), true), "{to}");
    }
    let mut lab = Lab::new();
    lab.pod("web-local", "app: web", NODE, PodState::Ready);
    lab.pod("web-remote", "app: web", "node-b", PodState::Ready);
    lab.service("web", 80, "type: NodePort, externalTrafficPolicy: Local");
    for family in FAMILIES {
        let to = SocketAddr::new(node_ip(family), node_port(80));
        let trace = lab.trace(MODE, From::External, to, Protocol::Tcp);
        assert_eq!(lab.reaches(&trace), (names(&["web-local"]), false), "{to}");
        let trace = lab.trace(MODE, From::Pod(0), at(cluster_ip(family, 80)), Protocol::Tcp);
        assert_eq!(lab.reaches(&trace).0, names(&["web-local", "web-remote"]), "the ClusterIP: every endpoint");
    }
}

#[test]
fn a_service_without_endpoints_is_rejected_by_the_helper_rule_before_ipvs() {
    let lab = web(&[], "");
    for family in FAMILIES {
        for from in [From::Pod(0), From::Host, From::External] {
            let trace = lab.trace(MODE, from, at(cluster_ip(family, 80)), Protocol::Tcp);
            assert_eq!(trace.paths.len(), 1);
            let Verdict::Rejected { by, .. } = &trace.paths[0].verdict else { panic!("{:?}", trace.paths[0]) };
            assert!(by.table.ends_with("roadkeeper-ipvs") && by.rule.contains("@no-endpoints"), "{by:?}");
            assert!(ipvs_steps(&trace, 0).is_empty(), "IPVS never sees it");
        }
    }
}

#[test]
fn an_unused_port_of_a_cluster_ip_is_rejected() {
    let lab = web(&["web-a"], "");
    for family in FAMILIES {
        for from in [From::Pod(0), From::Host] {
            let to = SocketAddr::new(cluster_ip(family, 80), 81);
            let trace = lab.trace(MODE, from, to, Protocol::Tcp);
            assert_eq!(only_fate(&trace), Fate::Rejected, "{to} {from:?}");
            let Verdict::Rejected { by, .. } = &trace.paths[0].verdict else { unreachable!() };
            assert!(by.rule.contains("!= @virtual-servers"), "{by:?}");
        }
    }
}

#[test]
fn a_virtual_server_without_live_real_servers_is_dropped_by_ipvs() {
    let lab = web(&["web-a"], "");
    let Ruleset::Ipvs(mut tables) = lab.ruleset(MODE) else { panic!("IPVS mode") };
    // Draining: the real server is kept at weight 0, and the helper sets still say it serves.
    for server in tables.ipvs.virtual_servers.values_mut() {
        server.real_servers.values_mut().for_each(|weight| *weight = 0);
    }
    let packet = lab.packet(From::Pod(0), at(cluster_ip(IpFamily::V4, 80)), Protocol::Tcp);
    let trace = tables.trace(&packet, &lab.environment(BTreeSet::new())).unwrap();
    let Verdict::Dropped { by } = &trace.paths[0].verdict else { panic!("{:?}", trace.paths[0]) };
    assert_eq!(by.table, IPVS);
    assert_eq!(ipvs_steps(&trace, 0), [("TCP 10.96.0.80:80 rr, no real server of weight > 0".to_string(), None)]);
}

#[test]
fn source_hashing_lands_on_one_real_server_per_client_without_claiming_which() {
    let mut lab = web(&["web-a", "web-b"], "");
    lab.cfg.ipvs.scheduler = Scheduler::SourceHashing;
    let trace = lab.trace(MODE, From::Pod(0), at(cluster_ip(IpFamily::V4, 80)), Protocol::Tcp);
    assert_eq!(lab.reaches(&trace).0, names(&["web-a", "web-b"]));
    for (index, path) in trace.paths.iter().enumerate() {
        assert!((path.probability - 0.5).abs() < 1e-9);
        let (element, _) = &ipvs_steps(&trace, index)[0];
        assert!(
            element.starts_with("TCP 10.96.0.80:80 sh, source hashing: this client always lands on the same one"),
            "{element}"
        );
        assert!(element.contains("not computed"), "{element}");
    }
}

#[test]
fn persistence_sends_a_client_with_a_template_to_its_real_server() {
    let lab = web(&["web-a", "web-b", "web-c"], "sessionAffinity: ClientIP");
    let ruleset = lab.ruleset(MODE);
    let to = at(cluster_ip(IpFamily::V4, 80));
    let packet = lab.packet(From::Pod(0), to, Protocol::Tcp);
    // No template: any real server, and the template is made.
    let trace = ruleset.trace(&packet, &lab.environment(BTreeSet::new())).unwrap();
    assert_eq!(lab.reaches(&trace).0, names(&["web-a", "web-b", "web-c"]));
    let key = VirtualKey { protocol: Protocol::Tcp, address: to.ip(), port: 80 };
    for (index, path) in trace.paths.iter().enumerate() {
        let dnat = path.dnat.unwrap();
        let real = RealServer { address: dnat.ip(), port: dnat.port() };
        assert_eq!(path.affinity, [persistence_entry(&key, &real)]);
        assert_eq!(ipvs_steps(&trace, index)[0].0, "TCP 10.96.0.80:80 rr persistent 10800");
    }
    // The template of web-b: web-b only.
    let web_b = SocketAddr::new(lab.pod_ip(2, IpFamily::V4), ECHO);
    let affinity = ruleset.affinity_sets(Protocol::Tcp, web_b);
    assert!(
        affinity.contains(&persistence_entry(&key, &RealServer { address: web_b.ip(), port: ECHO })),
        "{affinity:?}"
    );
    let trace = ruleset.trace(&packet, &lab.environment(affinity)).unwrap();
    assert_eq!(lab.reaches(&trace).0, names(&["web-b"]));
    assert_eq!(trace.paths[0].probability, 1.0);
    assert!(ipvs_steps(&trace, 0)[0].0.ends_with("this client's persistence template"));
}

#[test]
fn a_partial_sync_script_updates_the_helper_sets() {
    let lab = web(&["web-a"], "");
    let Ruleset::Ipvs(mut tables) = lab.ruleset(MODE) else { panic!("IPVS mode") };
    let frontend = VirtualKey { protocol: Protocol::Tcp, address: cluster_ip(IpFamily::V4, 80), port: 80 };
    let added = [crate::ipvs::HelperElement::NoEndpoints(frontend)];
    tables.apply_helpers(&crate::ipvs::element_script(&added, &[])).unwrap();
    let trace = tables
        .trace(&lab.packet(From::Pod(0), at(frontend.address), Protocol::Tcp), &lab.environment(BTreeSet::new()))
        .unwrap();
    assert_eq!(only_fate(&trace), Fate::Rejected);
    // A script the kernel refuses changes nothing.
    let bad = "add element ip roadkeeper-ipvs no-endpoints { 10.96.0.81 . tcp . 80 }\ndelete element ip roadkeeper-ipvs cluster-ips { 10.0.0.1 . tcp . 1 }\n";
    let before = format!("{:?}", tables.helpers);
    assert!(tables.apply_helpers(bad).is_err());
    assert_eq!(format!("{:?}", tables.helpers), before);
    // And one outside the grammar names its line.
    let err = tables
        .apply_helpers("table ip roadkeeper-ipvs {\n\tchain x {\n\t\tip daddr 10.0.0.1 counter\n\t}\n}\n")
        .unwrap_err();
    assert!(err.to_string().starts_with("line 3:"), "{err}");
}

#[test]
fn each_real_server_lands_with_its_share_of_the_weights_and_a_drained_one_never() {
    let lab = web(&["web-a", "web-b", "web-c"], "");
    let Ruleset::Ipvs(mut tables) = lab.ruleset(MODE) else { panic!("IPVS mode") };
    let to = at(cluster_ip(IpFamily::V4, 80));
    let key = VirtualKey { protocol: Protocol::Tcp, address: to.ip(), port: 80 };
    let server = tables.ipvs.virtual_servers.get_mut(&key).unwrap();
    server.scheduler = Scheduler::WeightedRoundRobin;
    for (weight, real) in [3, 1, 0].into_iter().zip(server.real_servers.values_mut()) {
        *real = weight;
    }
    let trace = tables.trace(&lab.packet(From::Pod(0), to, Protocol::Tcp), &lab.environment(BTreeSet::new())).unwrap();
    let mut shares: Vec<(String, f64)> =
        trace.paths.iter().map(|p| (p.dnat.unwrap().ip().to_string(), p.probability)).collect();
    shares.sort_by(|a, b| a.0.cmp(&b.0));
    let pod_ip = |i: usize| lab.pod_ip(i, IpFamily::V4).to_string();
    assert_eq!(shares, [(pod_ip(1), 0.75), (pod_ip(2), 0.25)], "web-c is drained (weight 0)");
    assert_eq!(ipvs_steps(&trace, 0)[0].0, "TCP 10.96.0.80:80 wrr");
}

#[test]
fn the_step_says_what_the_tracer_cannot_know_of_a_scheduler() {
    for (scheduler, note) in [
        (
            Scheduler::LeastConnection,
            "TCP 10.96.0.80:80 lc, picked by connection counts, which the tracer does not know",
        ),
        (
            Scheduler::DestinationHashing,
            "TCP 10.96.0.80:80 dh, destination hashing: every client of this virtual server",
        ),
        (Scheduler::MaglevHashing, "TCP 10.96.0.80:80 mh, maglev hashing of the source: this client always lands"),
    ] {
        let mut lab = web(&["web-a", "web-b"], "");
        lab.cfg.ipvs.scheduler = scheduler;
        let trace = lab.trace(MODE, From::Pod(0), at(cluster_ip(IpFamily::V4, 80)), Protocol::Tcp);
        assert_eq!(lab.reaches(&trace).0, names(&["web-a", "web-b"]), "{scheduler}: either is possible");
        for index in 0..trace.paths.len() {
            let (element, _) = &ipvs_steps(&trace, index)[0];
            assert!(element.starts_with(note), "{element}");
        }
    }
}

/// The fuzz target's check (`crates/rules/fuzz`, target `ipvs_script`) over a corpus: the
/// proxy's own scripts (whole, cut at every line, with a byte changed) and junk.
#[test]
fn the_fuzz_check_takes_real_scripts_cut_and_changed_without_panicking() {
    let mut lab = web(
        &["web-a", "web-b"],
        "type: LoadBalancer, externalTrafficPolicy: Local, loadBalancerSourceRanges: [198.51.100.0/24]",
    );
    lab.service("empty", 81, "");
    let plan = lab.plan(MODE).ipvs();
    let mut corpus: Vec<String> = [IpFamily::V4, IpFamily::V6].map(|f| plan.helpers.script(f)).to_vec();
    let elements: Vec<_> = plan.helpers.elements().into_iter().collect();
    corpus.push(crate::ipvs::element_script(&elements, &[]));
    for script in corpus.clone() {
        let lines: Vec<&str> = script.lines().collect();
        corpus.extend((0..lines.len()).map(|n| lines[..n].join("\n")));
        corpus.extend(script.char_indices().step_by(97).map(|(i, _)| format!("{}}}{}", &script[..i], &script[i..])));
    }
    corpus.extend(
        ["", "table", "table ip roadkeeper-ipvs {", "}}}}", "add element ip roadkeeper-ipvs x { 1 }"].map(String::from),
    );
    for input in &corpus {
        super::check(input.as_bytes());
    }
}
