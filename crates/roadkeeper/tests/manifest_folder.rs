//! The manifest folder as untrusted input, for every command that reads one (`proxy`, `dns`,
//! `ingress`): a FIFO, a symlink to a device or to a FIFO and a file over the size limit, created
//! in the watched folder, are reported and skipped; later changes still apply, health stays true
//! and SIGTERM still stops the process.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::http::{parse_response, try_http_get};
use common::*;
use roadkeeper_netlab::{Netns, Process};

/// Plants a FIFO, a symlink to `/dev/zero`, a symlink to the FIFO and a sparse file one byte
/// over the limit in `dir`, all with manifest names.
fn plant_hostile_files(dir: &Path) {
    let fifo = dir.join("fifo.yaml");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.yaml")).expect("symlink");
    std::os::unix::fs::symlink(&fifo, dir.join("to-fifo.yml")).expect("symlink");
    let huge = std::fs::File::create(dir.join("huge.json")).expect("create");
    huge.set_len(roadkeeper_cluster::MAX_MANIFEST_BYTES + 1).expect("set_len");
}

/// What the log must say about the planted files.
const REPORTED: [&str; 4] = [
    "fifo.yaml: not a regular file",
    "zero.yaml: not a regular file",
    "to-fifo.yml: not a regular file",
    "huge.json: larger than the limit of 64 MiB",
];

/// Waits until `log()` reports every planted file.
fn assert_reported(log: impl Fn() -> String) {
    let reported = eventually(settle(), || REPORTED.iter().all(|r| log().contains(r)));
    assert!(reported, "expected {REPORTED:?} in the log:\n{}", log());
}

/// The status of `GET path` to `addr` inside `ns`, if it answers.
fn status_in(ns: &Netns, addr: &str, path: &str) -> Option<u16> {
    let raw = ns.run(|| try_http_get(addr.parse().expect("address"), path)).ok()?;
    Some(parse_response(&raw).0)
}

/// Sends SIGTERM and asserts the process exits within a few seconds.
fn assert_stops_on_sigterm(process: &Process, log: impl Fn() -> String) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(process.id()).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while process.try_wait().expect("poll").is_none() {
        assert!(Instant::now() < deadline, "did not stop on SIGTERM; log:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn proxy_skips_fifos_devices_and_huge_files_and_keeps_syncing() {
    let mut c = Cluster::new("rk-mfp", Backend::Nftables);
    c.add_pod("web-a", "app: web", NODE);
    c.write("web.yaml", &service_manifest("web", 70, ""));
    c.start_fast_proxy();
    plant_hostile_files(c.manifests.path());
    c.add_pod("later-a", "app: later", NODE);
    c.write("later.yaml", &service_manifest("later", 71, ""));
    let later = at(Family::V4.cluster_ip(71));
    let applied = eventually(settle(), || {
        matches!(probe(&c.client.ns, Proto::Tcp, later), roadkeeper_netlab::ProbeResult::Reply(_))
    });
    assert!(applied, "a change after the hostile files was not applied:\n{}", c.proxy_log());
    assert_reported(|| c.proxy_log());
    answers(&c.client.ns, Proto::Tcp, at(Family::V4.cluster_ip(70)), 2);
    assert_eq!(status_in(c.lab.node(), "127.0.0.1:10256", "/healthz"), Some(200));
    assert_stops_on_sigterm(c.proxy(), || c.proxy_log());
}

/// A command in its own namespace reading `manifests`, logging to a file in `scratch`.
struct Component {
    process: Process,
    ns: Netns,
    manifests: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl Component {
    fn start(prefix: &str, args: &[&str]) -> Component {
        let ns = Netns::new(prefix).expect("netns");
        let manifests = tempfile::tempdir().expect("tempdir");
        let scratch = tempfile::tempdir().expect("tempdir");
        let mut argv = vec![binary().display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--manifests".into(), manifests.path().display().to_string(), "-v".into()]);
        let process = ns.spawn_logged(&argv, &scratch.path().join("log")).expect("spawn");
        Component { process, ns, manifests, scratch }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("log")).unwrap_or_default()
    }

    fn write(&self, file: &str, yaml: &str) {
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write");
        std::fs::rename(&tmp, self.manifests.path().join(file)).expect("rename");
    }
}

#[test]
fn dns_skips_fifos_devices_and_huge_files_and_keeps_answering() {
    let dns = Component::start("rk-mfd", &["dns", "--listen", "127.0.0.1:53", "--upstream", "127.0.0.1:9"]);
    let ready = eventually(Duration::from_secs(30), || status_in(&dns.ns, "127.0.0.1:8080", "/ready") == Some(200));
    assert!(ready, "dns not ready:\n{}", dns.log());
    plant_hostile_files(dns.manifests.path());
    dns.write("web.yaml", &service_manifest("web", 72, ""));
    let answer = || {
        let out =
            dns.ns.exec(["dig", "+short", "+time=1", "+tries=1", "@127.0.0.1", "web.default.svc.cluster.local", "A"]);
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
    };
    assert!(eventually(settle(), || answer() == "10.96.0.72"), "got {:?}; log:\n{}", answer(), dns.log());
    assert_reported(|| dns.log());
    assert_eq!(status_in(&dns.ns, "127.0.0.1:8080", "/health"), Some(200));
    assert_stops_on_sigterm(&dns.process, || dns.log());
}

#[test]
fn ingress_skips_fifos_devices_and_huge_files_and_keeps_routing() {
    let ingress = Component::start(
        "rk-mfi",
        &[
            "ingress",
            "--http",
            "127.0.0.1:8080",
            "--https",
            "",
            "--metrics-bind-address",
            "",
            "--shutdown-timeout",
            "1s",
        ],
    );
    let status = |host: &str| {
        let out = ingress.ns.exec([
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            &format!("Host: {host}"),
            "http://127.0.0.1:8080/",
        ]);
        out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default()
    };
    assert!(eventually(Duration::from_secs(30), || status("a.example") == "404"), "ingress not up:\n{}", ingress.log());
    plant_hostile_files(ingress.manifests.path());
    let route = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: a}\n\
                 spec: {ingressClassName: roadkeeper, rules: [{host: a.example, http: {paths: [{path: /, pathType: Prefix, \
                 backend: {service: {name: web, port: {number: 80}}}}]}}]}\n";
    ingress.write("web.yaml", &format!("{}---\n{route}", service_manifest("web", 73, "")));
    // The route exists (its Service has no endpoints yet): 503 instead of 404.
    assert!(
        eventually(settle(), || status("a.example") == "503"),
        "got {}; log:\n{}",
        status("a.example"),
        ingress.log()
    );
    assert_stops_on_sigterm(&ingress.process, || ingress.log());
}
