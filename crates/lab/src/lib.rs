//! `roadkeeper lab`: the whole road of a Kubernetes request on one Linux machine, out of network
//! namespaces, with every roadkeeper component working from one cluster state.
//!
//! The lab is the cluster's control plane. Its controller (a background process started by
//! `lab up`) reads the watched manifest folder, runs the Deployments' pods ([`replicas`]), hands
//! out addresses ([`alloc`]), adds its own components ([`system`]) and writes what an API server
//! would hold into a generated cluster-state folder ([`render`]), which every component reads
//! with `--manifests`: `roadkeeper proxy` in every node, `roadkeeper dns` and `roadkeeper
//! ingress` in pods of their own. Pods are namespaces on their node ([`roadkeeper_netlab::cluster`]),
//! each container a process with mounts of its own ([`container`]) that runs only what
//! [`confine`] allows. [`state`] is the public record of a lab other commands use to find it and
//! enter its hosts.
//!
//! Pure: [`alloc`], [`confine`], [`replicas`], [`render`], [`system`], [`table`], [`selector`],
//! [`scale`], [`labels`], [`kinds`], [`hints`].
//! Thin: [`container`], [`controller`], [`commands`], [`checks`], [`process`], [`files`].

pub mod alloc;
pub mod checks;
pub mod commands;
pub mod confine;
pub mod container;
pub mod controller;
mod error;
pub mod files;
pub mod hints;
pub mod kinds;
pub mod labels;
pub mod node_cgroups;
pub mod process;
pub mod render;
pub mod replicas;
pub mod scale;
pub mod selector;
pub mod state;
pub mod system;
pub mod table;
#[cfg(test)]
mod testing;

pub use error::{Error, Result};
