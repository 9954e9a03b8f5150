//! roadkeeper dns: cluster DNS per the Kubernetes DNS specification, with CoreDNS's behaviour.
//!
//! [`zone`] keeps a snapshot of what the cluster zone holds, updated per changed object;
//! [`answer`] answers a question from a snapshot (pure); [`forward`] asks upstream resolvers for
//! everything else, with a cache, through the reused sockets of `upstream`; [`server`] serves UDP
//! with hickory-server and TCP with [`tcp`], which bounds the connections each worker holds.

pub mod answer;
pub mod forward;
pub mod server;
pub mod tcp;
mod upstream;
pub mod wire;
pub mod zone;
