//! Bad manifests reach a watching proxy: each is reported (file, object, field) on its log, the
//! Services already programmed keep answering, later good changes still apply and the proxy stays
//! up.

mod common;

use common::*;

per_backend!(
    a_yaml_syntax_error_is_reported_with_its_file,
    invalid_new_services_are_reported_with_object_and_field,
    an_invalid_edit_keeps_the_last_good_rules,
    hostile_names_and_special_addresses_are_refused_as_the_api_server_does_and_add_no_rule,
    a_bad_flag_value_fails_once_with_a_message_naming_the_flag_and_touches_nothing,
);

/// Service number of `web`: ClusterIPs 10.96.0.90 / fd00:96::90.
const WEB: u8 = 90;

/// A watching proxy serving Service `web` (pod `web-a`).
fn serving_web(prefix: &str, backend: Backend) -> Cluster {
    let mut c = Cluster::new(prefix, backend);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", WEB, ""));
    c.start_fast_proxy();
    c
}

/// Waits until the proxy log holds every piece of `report`, then checks that `web` still answers,
/// a Service added afterwards is programmed, the proxy is alive and reported each piece once.
fn assert_reported_and_unharmed(c: &mut Cluster, report: &[&str]) {
    let logged = eventually(settle(), || {
        let log = c.proxy_log();
        report.iter().all(|part| log.contains(part))
    });
    assert!(logged, "expected {report:?} in the proxy log:\n{}", c.proxy_log());
    for family in FAMILIES {
        for proto in PROTOS {
            answers(&c.client.ns, proto, at(family.cluster_ip(WEB)), 2);
        }
    }
    c.add_pod("later-a", "app: later", NODE);
    c.write("later.yaml", &service_manifest("later", WEB + 1, ""));
    let later = at(Family::V6.cluster_ip(WEB + 1));
    let applied = eventually(settle(), || {
        matches!(probe(&c.client.ns, Proto::Tcp, later), roadkeeper_netlab::ProbeResult::Reply(_))
    });
    assert!(applied, "a good change after the bad one was not applied; proxy log:\n{}", c.proxy_log());
    assert!(c.proxy().try_wait().expect("poll proxy").is_none(), "proxy exited; log:\n{}", c.proxy_log());
    let log = c.proxy_log();
    for part in report {
        assert_eq!(log.matches(part).count(), 1, "{part:?} reported more than once (reload loop?):\n{log}");
    }
}

fn a_yaml_syntax_error_is_reported_with_its_file(backend: Backend) {
    let mut c = serving_web("rk-esyn", backend);
    c.write("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: broken\nspec: [\n");
    assert_reported_and_unharmed(&mut c, &["broken.yaml: "]);
}

fn invalid_new_services_are_reported_with_object_and_field(backend: Backend) {
    let mut c = serving_web("rk-enew", backend);
    c.write(
        "bad-ip.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad-ip}\nspec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}\n",
    );
    c.write(
        "bad-port.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad-port}\nspec: {clusterIP: 10.96.0.92, ports: [{port: 70000}]}\n",
    );
    assert_reported_and_unharmed(
        &mut c,
        &[
            "bad-ip.yaml: Service default/bad-ip: spec.clusterIP: ",
            "bad-port.yaml: Service default/bad-port: spec.ports[0].port: ",
        ],
    );
}

fn hostile_names_and_special_addresses_are_refused_as_the_api_server_does_and_add_no_rule(backend: Backend) {
    let mut c = serving_web("rk-ehost", backend);
    let service = |name: &str, spec: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{{spec}}}\n")
    };
    // A port name that would close its comment and add a rule to the filter table.
    let inject = service(
        "inject",
        "clusterIP: 10.96.0.93, ports: [{name: \"x\\\" -j ACCEPT\\n-A INPUT -j DROP\\n#\", port: 80}]",
    );
    c.write("inject.yaml", &inject);
    c.write("loopback.yaml", &service("loopback", "clusterIP: 127.0.0.1, ports: [{port: 80}]"));
    c.write("upper.yaml", &service("Web_1", "ports: [{port: 80}]"));
    // The cloud metadata address as an endpoint.
    let metadata_server = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
        metadata: {name: meta-1, labels: {kubernetes.io/service-name: web}}\n\
        addressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints: [{addresses: [169.254.169.254]}]\n";
    c.write("meta.yaml", metadata_server);
    assert_reported_and_unharmed(
        &mut c,
        &[
            "inject.yaml: Service default/inject: spec.ports[0].name: ",
            "loopback.yaml: Service default/loopback: spec.clusterIP: \"127.0.0.1\" may not be in the loopback range",
            "upper.yaml: Service default/Web_1: metadata.name: \"Web_1\" must be an RFC 1035 label",
            "meta.yaml: EndpointSlice default/meta-1: endpoints[0].addresses[0]: \"169.254.169.254\" may not be in the link-local range",
        ],
    );
    let rules = c.kernel_rules();
    for absent in ["INPUT -j DROP", "169.254.169.254", "127.0.0.1:80", "default/inject", "default/loopback"] {
        assert!(!rules.contains(absent), "{absent:?} made it into the kernel:\n{rules}");
    }
}

fn an_invalid_edit_keeps_the_last_good_rules(backend: Backend) {
    let mut c = serving_web("rk-eedit", backend);
    let broken = service_manifest("web", WEB, "").replace(&format!("port: {SERVICE_PORT},"), "port: 70000,");
    c.write("web.yaml", &broken);
    assert_reported_and_unharmed(&mut c, &["web.yaml: Service default/web: spec.ports[0].port: 70000"]);
}

fn a_bad_flag_value_fails_once_with_a_message_naming_the_flag_and_touches_nothing(backend: Backend) {
    let c = Cluster::new("rk-flag", backend);
    let out = c.try_proxy_once(&["--nodeport-addresses", "10.0.0.300/8"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nodePortAddresses") && stderr.contains("10.0.0.300/8"), "{stderr}");
    assert!(c.ruleset().trim().is_empty(), "nothing was programmed");
}

/// Runs `roadkeeper ARGS` in a network namespace of its own (nothing of the host's to touch, were
/// the line to parse), reading an empty manifest folder.
fn isolated(args: &[&str]) -> std::process::Output {
    let empty = tempfile::tempdir().expect("tempdir");
    std::process::Command::new("unshare")
        .args(["--net", "--"])
        .arg(binary())
        .args(args)
        .args(["--manifests", &empty.path().display().to_string(), "--once"])
        .output()
        .expect("run roadkeeper")
}

/// kube-proxy flags typed by habit are refused before anything runs, each naming what roadkeeper
/// does instead; a typo of one of roadkeeper's own flags keeps clap's error and its suggestion.
#[test]
fn kube_proxy_flags_are_refused_with_what_roadkeeper_does_instead() {
    for (args, pointer) in [
        (&["proxy", "--v=2"][..], "-vv (debug)"),
        (&["proxy", "-v", "2"], "RUST_LOG"),
        (&["proxy", "--cleanup"], "`roadkeeper cleanup`"),
        (&["proxy", "--bind-address", "0.0.0.0"], "--metrics-bind-address"),
        (&["proxy", "--master", "https://10.0.0.1:6443"], "--kubeconfig"),
        (&["rules", "--write-config-to", "/x"], "does not write its configuration"),
        (&["proxy", "--oncee"], "a similar argument exists: '--once'"),
    ] {
        let out = isolated(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(pointer), "{args:?}: expected {pointer:?} in:\n{stderr}");
    }
}

/// A config file's fields that roadkeeper accepts (so that kube-proxy's files load) and does not
/// use are each logged at start, naming the field; the fields it uses are not.
#[test]
fn config_fields_accepted_and_ignored_are_logged_by_name() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let config = scratch.path().join("kube-proxy.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
         bindAddress: 0.0.0.0\nclientConnection: {kubeconfig: /nonexistent, qps: 5}\n\
         iptables: {localhostNodePorts: false, masqueradeAll: true}\nnftables: {masqueradeAll: true}\n",
    )
    .expect("write config");
    let out = isolated(&["rules", "--config", &config.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for ignored in [
        "bindAddress: accepted for kube-proxy compatibility, not used by roadkeeper",
        "clientConnection.qps: accepted for kube-proxy compatibility, not used by roadkeeper",
        "iptables.localhostNodePorts: ",
        "iptables.masqueradeAll: ",
    ] {
        assert_eq!(stderr.matches(ignored).count(), 1, "expected {ignored:?} once in:\n{stderr}");
    }
    for used in ["nftables.masqueradeAll", "clientConnection.kubeconfig", "mode:"] {
        assert!(!stderr.contains(used), "{used} is used, yet logged:\n{stderr}");
    }
}

/// An error's cause is printed once: each part of the chain says only what it adds.
#[test]
fn an_errors_cause_is_printed_once() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let missing = scratch.path().join("missing");
    let out = std::process::Command::new("unshare")
        .args(["--net", "--"])
        .arg(binary())
        .args(["rules", "--manifests", &missing.display().to_string()])
        .output()
        .expect("run roadkeeper");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let cause = std::fs::read_dir(&missing).map(|_| ()).unwrap_err().to_string();
    assert!(stderr.contains(&format!("{}: {cause}", missing.display())), "{stderr}");
    assert_eq!(stderr.matches(&cause).count(), 1, "the cause {cause:?} more than once:\n{stderr}");
}

/// IPVS mode is planned and printed (`rules`) anywhere; `proxy` runs it where the kernel has
/// IPVS and, where it has none (this machine), stops at once with an error saying so and naming
/// the modes that work; `--ipvs-*` flags are read.
#[test]
fn ipvs_mode_is_printed_by_rules_and_refused_by_proxy_on_a_kernel_without_ipvs() {
    let out = isolated(&["rules", "--proxy-mode", "ipvs", "--ipvs-scheduler", "lc", "--ipvs-sync-period", "10s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("Prot LocalAddress:Port Scheduler Flags\n"), "{stdout}");
    assert!(
        stdout.contains("table ip roadkeeper-ipvs {") && stdout.contains("table ip6 roadkeeper-ipvs {"),
        "{stdout}"
    );
    let out = isolated(&["rules", "--proxy-mode", "ipvs", "--ipvs-scheduler", "fastest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--ipvs-scheduler") && stderr.contains("fastest"), "{stderr}");
    let out = isolated(&["proxy", "--proxy-mode", "ipvs"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        assert!(out.status.success(), "{stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for part in ["starting IPVS mode: IPVS is not available in this kernel", "--proxy-mode nftables and iptables"] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
}
