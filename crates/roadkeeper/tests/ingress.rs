//! `roadkeeper ingress` end to end: the real binary in its own network namespace reading a
//! manifest folder, real HTTP backends, and curl as the client: host and path routing, the
//! one-label wildcard, 404, TLS by SNI from a `kubernetes.io/tls` Secret, X-Forwarded-For, and a
//! rule change applied without a restart.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{binary, eventually};
use roadkeeper_netlab::Netns;

/// Answers every HTTP request with `<name> <path> xff=<X-Forwarded-For>`.
fn backend(listener: TcpListener, name: &'static str) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut path = String::new();
            let mut forwarded = String::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if path.is_empty() {
                    path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("x-forwarded-for:") {
                    forwarded = value.trim().to_owned();
                }
                line.clear();
            }
            let body = format!("{name} {path} xff={forwarded}");
            let response =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            let _ = reader.get_mut().write_all(response.as_bytes());
        }
    });
}

fn service(name: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{clusterIP: None, ports: [{{name: http, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints: [{{addresses: [127.0.0.1]}}]\n"
    )
}

fn ingress(api_backend: &str) -> String {
    let path = |path: &str, service: &str, port: &str| {
        format!("{{path: {path}, pathType: Prefix, backend: {{service: {{name: {service}, port: {port}}}}}}}")
    };
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: web, namespace: default}}\n\
         spec:\n  ingressClassName: roadkeeper\n  tls: [{{hosts: [a.example], secretName: a-tls}}]\n  rules:\n\
         \x20 - {{host: a.example, http: {{paths: [{}, {}]}}}}\n\
         \x20 - {{host: '*.wild.example', http: {{paths: [{}]}}}}\n",
        path("/", "web-a", "{name: http}"),
        path("/api", api_backend, "{number: 80}"),
        path("/", "web-b", "{number: 80}"),
    )
}

/// A TLS Secret for a.example and the CA that signed it (PEM).
fn tls_secret() -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Distinct names: a leaf whose issuer equals its subject looks self-signed to clients.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "roadkeeper test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["a.example".to_owned()]).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, "a.example");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).expect("cert");
    let b64 = |pem: String| data_encoding::BASE64.encode(pem.as_bytes());
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: a-tls, namespace: default}}\ntype: kubernetes.io/tls\n\
         data: {{tls.crt: {}, tls.key: {}}}\n",
        b64(cert.pem()),
        b64(key.serialize_pem())
    );
    (secret, ca.pem())
}

/// `curl` in `ns` with `args`; the body (empty on failure).
fn curl(ns: &Netns, args: &[&str]) -> String {
    let mut command = vec!["curl", "-s", "--max-time", "3"];
    command.extend(args);
    ns.exec(&command).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

#[test]
fn routes_by_host_and_path_with_tls_and_follows_rule_changes() {
    let ns = Netns::new("rk-ingress").expect("netns");
    let a = ns.run(|| TcpListener::bind("127.0.0.1:8081").expect("bind"));
    let b = ns.run(|| TcpListener::bind("127.0.0.1:8082").expect("bind"));
    backend(a, "web-a");
    backend(b, "web-b");
    let dir = tempfile::tempdir().expect("tempdir");
    let (secret, ca) = tls_secret();
    for (file, yaml) in [
        ("a.yaml", service("web-a", 8081)),
        ("b.yaml", service("web-b", 8082)),
        ("ingress.yaml", ingress("web-b")),
        ("secret.yaml", secret),
    ] {
        std::fs::write(dir.path().join(file), yaml).expect("write");
    }
    let ca_file = dir.path().join(".ca.pem");
    std::fs::write(&ca_file, ca).expect("write ca");
    let log = dir.path().join(".ingress.log");
    let manifests = dir.path().display().to_string();
    let args = [binary().display().to_string(), "ingress".into(), "--manifests".into(), manifests];
    let args = args.into_iter().chain(["--http", "127.0.0.1:8080", "--https", "127.0.0.1:8443"].map(String::from));
    let _proxy = ns.spawn_logged(args.collect::<Vec<_>>(), &log).expect("spawn");
    let log = || std::fs::read_to_string(&log).unwrap_or_default();

    let get =
        |host: &str, path: &str| curl(&ns, &["-H", &format!("Host: {host}"), &format!("http://127.0.0.1:8080{path}")]);
    let up = eventually(Duration::from_secs(20), || get("a.example", "/").starts_with("web-a"));
    assert!(up, "no answer; log:\n{}", log());
    assert_eq!(get("a.example", "/x"), "web-a /x xff=127.0.0.1");
    assert!(get("A.Example:8080", "/api/v1").starts_with("web-b /api/v1"), "longest prefix, host case and port");
    assert!(get("a.example", "/apiary").starts_with("web-a"), "/api does not match /apiary");
    assert!(get("x.wild.example", "/").starts_with("web-b"), "one-label wildcard");
    let status = |host: &str| {
        curl(&ns, &["-o", "/dev/null", "-w", "%{http_code}", "-H", &format!("Host: {host}"), "http://127.0.0.1:8080/"])
    };
    assert_eq!(status("y.x.wild.example"), "404", "the wildcard covers one label only");
    assert_eq!(status("other.example"), "404");

    // TLS by SNI, from the Secret.
    let https = curl(
        &ns,
        &[
            "--cacert",
            &ca_file.display().to_string(),
            "--resolve",
            "a.example:8443:127.0.0.1",
            "https://a.example:8443/tls",
        ],
    );
    assert!(https.starts_with("web-a /tls"), "{https:?}; log:\n{}", log());

    // A rule change applies without a restart, within a second.
    let started = Instant::now();
    std::fs::write(dir.path().join("ingress.yaml"), ingress("web-a")).expect("write");
    let moved = eventually(Duration::from_secs(5), || get("a.example", "/api").starts_with("web-a"));
    assert!(moved && started.elapsed() < Duration::from_secs(1), "took {:?}; log:\n{}", started.elapsed(), log());
}
