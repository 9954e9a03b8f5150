//! References across objects: ReferenceGrants (may an object of one namespace name an object of
//! another?), Service backends resolved to their ready endpoints, and TLS certificates of Secrets.

use std::sync::Arc;

use roadkeeper_cluster::{NamespacedName, Store};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::routes::{PortRef, endpoints};
use crate::tls;

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// One side of a reference: API group (`""` for the core group), kind and namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
}

/// Whether `from` may name object `name` of `to`: always within a namespace, across namespaces
/// only when a ReferenceGrant in `to`'s namespace lets `from`'s group, kind and namespace name
/// `to`'s group and kind (and `name`, when the grant names one).
pub fn permitted(store: &Store, from: Side<'_>, to: Side<'_>, name: &str) -> bool {
    if from.namespace == to.namespace {
        return true;
    }
    store.reference_grants_in(to.namespace).any(|(_, grant)| {
        let spec = &grant.spec;
        let from_ok =
            spec.from.iter().any(|f| f.group == from.group && f.kind == from.kind && f.namespace == from.namespace);
        let to_ok = spec.to.iter().any(|t| {
            t.group == to.group && t.kind == to.kind && t.name.as_deref().is_none_or(|n| n.is_empty() || n == name)
        });
        from_ok && to_ok
    })
}

/// Why a backend reference cannot be used, as route `ResolvedRefs` reasons say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// Not a core Service (`InvalidKind`).
    InvalidKind(String),
    /// Another namespace without a ReferenceGrant (`RefNotPermitted`).
    NotPermitted(NamespacedName),
    /// No such Service, or no such port (`BackendNotFound`).
    NotFound(String),
}

impl BackendError {
    /// The `ResolvedRefs` reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidKind(_) => "InvalidKind",
            Self::NotPermitted(_) => "RefNotPermitted",
            Self::NotFound(_) => "BackendNotFound",
        }
    }

    /// For the condition's message.
    pub fn message(&self) -> String {
        match self {
            Self::InvalidKind(kind) => format!("{kind} is not a supported backend kind (only core Services)"),
            Self::NotPermitted(service) => format!("Service {service}: no ReferenceGrant allows it"),
            Self::NotFound(why) => why.clone(),
        }
    }
}

/// A backend reference as written: group, kind, namespace, name, port.
#[derive(Clone, Copy, Debug)]
pub struct BackendRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub port: Option<i32>,
}

/// The Service `backend` names from HTTPRoute `route`, with the ready endpoints of its port.
pub fn resolve_backend(
    store: &Store,
    route: &NamespacedName,
    backend: &BackendRef<'_>,
) -> Result<(NamespacedName, Arc<[std::net::SocketAddr]>), BackendError> {
    let (group, kind) = (backend.group.unwrap_or_default(), backend.kind.unwrap_or("Service"));
    if !group.is_empty() || kind != "Service" {
        return Err(BackendError::InvalidKind(if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        }));
    }
    let namespace = backend.namespace.unwrap_or(&route.namespace);
    let service = NamespacedName::new(namespace, backend.name);
    let from = Side { group: GROUP, kind: "HTTPRoute", namespace: &route.namespace };
    if !permitted(store, from, Side { group: "", kind: "Service", namespace }, backend.name) {
        return Err(BackendError::NotPermitted(service));
    }
    let Some(port) = backend.port else {
        return Err(BackendError::NotFound(format!("Service {service}: no port given")));
    };
    let endpoints =
        endpoints(store, &service, &PortRef::Number(port)).map_err(|(_, why)| BackendError::NotFound(why))?;
    Ok((service, endpoints))
}

/// The certificate and key of TLS Secret `secret`, or why it cannot serve.
pub fn certificate(store: &Store, secret: &NamespacedName) -> Result<Arc<CertifiedKey>, String> {
    let secret_object = store.secret(secret).ok_or_else(|| format!("Secret {secret} does not exist"))?;
    let data = secret_object.data.as_ref();
    let field = |key: &str| data.and_then(|d| d.get(key)).map(|bytes| bytes.0.as_slice());
    match (field("tls.crt"), field("tls.key")) {
        (Some(cert), Some(key)) => {
            tls::certified_key(cert, key).map(Arc::new).map_err(|err| format!("Secret {secret}: {err}"))
        }
        _ => Err(format!("Secret {secret} has no tls.crt and tls.key")),
    }
}
