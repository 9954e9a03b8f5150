//! kube-proxy's conntrack sysctls, written: reads what the node holds, writes what
//! [`roadkeeper_rules::sysctls::plan`] says. A value the kernel or the container does not let us
//! write is reported and left (see [`apply_conntrack`]); the proxy keeps running.

use roadkeeper_rules::config::ConntrackConfig;
use roadkeeper_rules::sysctls::{self, Write};

/// A conntrack setting that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot set {} to {} (it holds {}): {error}", .write.path, .write.value, held(.write.current))]
pub struct SysctlError {
    /// What was to be written.
    pub write: Write,
    /// Why it was not (in the message, so not a source as well: printed once).
    pub error: std::io::Error,
}

/// The value a file held, for messages.
fn held(current: Option<u64>) -> String {
    current.map_or_else(|| "no readable value".into(), |v| v.to_string())
}

/// Reads a file holding one decimal number.
fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Has the kernel load `nf_conntrack` if it has not yet (a fresh node: nothing has used
/// connection tracking, and its sysctls do not exist). A ctnetlink request makes nfnetlink load
/// `nf_conntrack_netlink`, which needs `nf_conntrack`: no `modprobe` and no `CAP_SYS_MODULE`.
fn load_conntrack() {
    if std::path::Path::new(sysctls::MAX).exists() {
        return;
    }
    match crate::conntrack::dump_flows(roadkeeper_rules::table::IpFamily::V4) {
        Ok(_) => tracing::info!("loaded the kernel's connection tracking (nf_conntrack) to set its sysctls"),
        Err(err) => tracing::warn!(%err, "connection tracking could not be loaded"),
    }
}

/// The machine's CPU count as kube-proxy takes it (every online CPU, not only those this process
/// may use), else the CPUs available to this process.
fn cpus() -> u64 {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| sysctls::count_cpus(&list))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// Writes the conntrack settings of `cfg` that the node does not hold yet, each logged. Those
/// that cannot be written (`nf_conntrack_max` and the hash size are read-only outside the
/// initial network namespace; `/proc/sys` is read-only in an unprivileged container; no
/// conntrack module) are returned, and the rest are still written. Returns also whether the
/// node's TCP tracking is liberal afterwards (`nf_conntrack_tcp_be_liberal` non-zero).
pub fn apply_conntrack(cfg: &ConntrackConfig) -> (Vec<SysctlError>, bool) {
    load_conntrack();
    let failed = write_all(sysctls::plan(cfg, cpus(), read_number));
    (failed, read_number(sysctls::TCP_BE_LIBERAL).is_some_and(|v| v != 0))
}

/// Writes IPVS mode's settings ([`sysctls::ipvs`]: run once the `ip_vs` module is loaded, which
/// makes its `net.ipv4.vs` files); those that could not be written are returned.
pub fn apply_ipvs(strict_arp: bool) -> Vec<SysctlError> {
    write_all(sysctls::ipvs(strict_arp, read_number))
}

/// Writes each value, logged; those that failed are returned and the rest still written.
fn write_all(writes: Vec<Write>) -> Vec<SysctlError> {
    let mut failed = Vec::new();
    for write in writes {
        match std::fs::write(write.path, write.value.to_string()) {
            Ok(()) => tracing::info!(path = write.path, value = write.value, was = held(write.current), "set"),
            Err(error) => failed.push(SysctlError { write, error }),
        }
    }
    failed
}
