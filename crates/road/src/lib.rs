//! The road one request takes through a cluster, computed, for `roadkeeper trace`: the DNS answer
//! for a name, the Service and port its address is a frontend of, the EndpointSlices and which
//! endpoints are eligible on the node the packet enters, the node's rules as the kernel would
//! evaluate them (the tracer of [`roadkeeper_rules::trace`], fed by the same plan a full sync
//! programs), the DNAT target and the pod and node it lands on, whether the source is
//! masqueraded and why, and for the Ingress controller's Service the Ingress rule that matched
//! and the second leg from the controller's pod to the backend.
//!
//! Pure: [`World`] holds the cluster state and each node's identity and proxy flags, [`road`]
//! computes a [`Road`], [`text`] prints it. Reading a lab or an API server, sending the real
//! request and reading conntrack is the shell's (`roadkeeper trace`).

mod error;
pub mod request;
mod road;
pub mod text;
mod world;

pub use error::Error;
pub use request::Request;
pub use road::{
    DnsStation, EndpointView, IngressStation, Landing, Leg, Observed, Place, Road, ServiceStation, Traced, road,
};
pub use world::{Node, Origin, World};

#[cfg(test)]
mod road_tests;
