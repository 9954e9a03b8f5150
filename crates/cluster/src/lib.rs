//! Typed cluster state for roadkeeper, read from a folder of Kubernetes manifests or from a
//! Kubernetes API server, through one interface: [`Feed`].
//!
//! [`ManifestSource`] loads `*.yaml`, `*.yml` and `*.json` files into a [`Store`] of Services,
//! EndpointSlices, Pods, Nodes, ServiceCIDRs, Namespaces, Ingresses, IngressClasses, Secrets, the
//! Gateway API's GatewayClasses, Gateways, HTTPRoutes, ReferenceGrants and GRPCRoutes (types in
//! [`gateway_api`]) and (for the lab) Deployments and ConfigMaps; [`watch`] reports changed files
//! so that [`ManifestSource::reload`] can apply them incrementally. EndpointSlices for Services
//! with a selector are derived from the Pods, like kube-controller-manager would. [`client`]
//! connects to the API server a [`Feed`] reads from, for components that also write to it.

mod api_source;
mod changes;
mod endpointslices;
mod error;
mod feed;
mod formats;
pub mod gateway_api;
mod index;
mod names;
mod node_ports;
mod object;
mod parse;
mod read;
mod source;
mod store;
mod validate;
mod watch;

pub use k8s_openapi;
pub use kube;

pub use api_source::client;
pub use changes::Changes;
pub use error::{Error, ManifestError};
pub use feed::{Feed, Interest, ManifestFolder, SourceSpec};
pub use formats::{label_value, qualified_name};
pub use names::NamespacedName;
pub use node_ports::{NodePortRange, NodePortRangeError};
pub use object::{Kind, Object};
pub use read::MAX_MANIFEST_BYTES;
pub use source::{ManifestSource, Unsupported};
pub use store::Store;
pub use validate::selector_matches;
pub use watch::{Watcher, watch};
