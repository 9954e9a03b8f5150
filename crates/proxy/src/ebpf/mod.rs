//! eBPF mode (`--proxy-mode ebpf`), the thin part: the maps `roadkeeper_rules::ebpf` lays out,
//! written into the BPF programs' maps. [`proxier`] keeps the layout and applies full and
//! partial syncs through an [`EbpfRunner`](proxier::EbpfRunner); [`kernel`] loads, pins and
//! attaches the programs (the socket programs to a cgroup, those of `interfaces` to the node's
//! devices) and writes the maps; [`wire`] converts the planner's entries to the
//! programs' bytes and back; [`sockets`] destroys the connected UDP sockets left on an endpoint
//! that went. `kernel` builds only with feature `ebpf-kernel` (it embeds the BPF
//! object, built by the nightly toolchain).

#[cfg(feature = "ebpf-kernel")]
mod interfaces;
#[cfg(feature = "ebpf-kernel")]
pub mod kernel;
pub mod proxier;
pub mod sockets;
pub mod wire;
