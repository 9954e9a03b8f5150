//! The Gateway API's kinds (`gateway.networking.k8s.io/v1`, standard channel of release v1.6.3),
//! generated from its CRDs by kopium (`generate.sh`): one module per kind, named by its plural.
//!
//! Fields the CRDs default are `Option`s: objects from an API server carry the defaults, those of
//! a manifest folder only what their files say.

pub mod gatewayclasses;
pub mod gateways;
pub mod grpcroutes;
pub mod httproutes;
pub mod referencegrants;
