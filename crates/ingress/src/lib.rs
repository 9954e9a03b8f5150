//! roadkeeper ingress: the L7 front door. Ingress v1 rules become a route table ([`routes`],
//! pure); [`proxy`] serves HTTP/1.1 and HTTP/2 (TLS by SNI from [`tls`]) and forwards each request
//! to a ready endpoint of the chosen Service over its worker's pooled connections (`pool`), plain
//! HTTP/1.1 requests on a fast path of its own ([`h1`] parses and writes their messages), after
//! checking its host ([`host`]) and normalising its path ([`path`]), with forwarded headers
//! believed only from trusted proxies (`forwarded`) and HTTP/2 control frames bounded
//! ([`flood`]); [`status`] decides which Ingresses must carry our addresses in
//! `status.loadBalancer` (pure).

pub mod decision;
mod drain;
pub mod flood;
mod forwarded;
pub mod gateway;
pub mod h1;
pub mod host;
pub mod path;
mod pool;
pub mod proxy;
pub mod routes;
pub mod status;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use roadkeeper_cluster::NamespacedName;

/// Where one request goes: what the route table decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The Ingress whose rule (or default backend) matched, or the HTTPRoute, for logs and
    /// metrics.
    pub ingress: NamespacedName,
    /// The backend Service, for logs and metrics.
    pub service: NamespacedName,
    /// The ready endpoints of the backend port (address and target port), in a stable order;
    /// empty when the Service has none (the proxy answers 503).
    pub endpoints: Arc<[SocketAddr]>,
}

/// What the proxy asks of the cluster state. The route tables implement it; tests use fixtures.
pub trait Router: Send + Sync + 'static {
    /// What to do with `request`; `None` answers 404. Targets are shared, so that a lookup per
    /// request allocates nothing.
    fn route(&self, request: &decision::Request<'_>) -> Option<decision::Decision>;
}

/// Runs every file of the fuzz corpus `fuzz/corpus/<target>` through the fuzz target's `check`, so
/// that a seed that fails there fails the unit tests.
#[cfg(test)]
fn check_fuzz_corpus(target: &str, check: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(std::panic::catch_unwind(|| check(&bytes)).is_ok(), "seed {} fails", path.display());
        seeds += 1;
    }
    assert!(seeds >= 10, "{seeds} seeds in {}", dir.display());
}
