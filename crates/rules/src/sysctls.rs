//! kube-proxy's conntrack sysctls, planned: from the conntrack settings, the node's CPU count and
//! the values the node holds, which values to write (kube-proxy's `setupConntrack`). Pure; the
//! proxy writes them at start (`roadkeeper_proxy::sysctls`).

use std::time::Duration;

use crate::config::ConntrackConfig;

/// `net.netfilter.nf_conntrack_max`: node-wide, read-only outside the initial network namespace.
pub const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
/// nf_conntrack's hash table size: node-wide, writable only from the initial network namespace.
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";
/// `net.netfilter.nf_conntrack_tcp_timeout_established` (per network namespace).
pub const TCP_ESTABLISHED: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established";
/// `net.netfilter.nf_conntrack_tcp_timeout_close_wait` (per network namespace).
pub const TCP_CLOSE_WAIT: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";
/// `net.netfilter.nf_conntrack_tcp_be_liberal` (per network namespace).
pub const TCP_BE_LIBERAL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";
/// `net.netfilter.nf_conntrack_udp_timeout` (per network namespace).
pub const UDP: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout";
/// `net.netfilter.nf_conntrack_udp_timeout_stream` (per network namespace).
pub const UDP_STREAM: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";

/// `net.ipv4.vs.conntrack`: IPVS connections keep conntrack entries, so that the helper rules'
/// masquerading applies to them (per network namespace, like the other IPVS settings).
pub const VS_CONNTRACK: &str = "/proc/sys/net/ipv4/vs/conntrack";
/// `net.ipv4.vs.expire_nodest_conn`: a packet of a connection whose real server was deleted
/// ends that connection at once, so a client's next one picks a live real server.
pub const VS_EXPIRE_NODEST_CONN: &str = "/proc/sys/net/ipv4/vs/expire_nodest_conn";
/// `net.ipv4.vs.expire_quiescent_template`: persistence (affinity) entries of a drained real
/// server expire, so its clients move on.
pub const VS_EXPIRE_QUIESCENT_TEMPLATE: &str = "/proc/sys/net/ipv4/vs/expire_quiescent_template";
/// `net.ipv4.ip_forward`: the node routes its pods' traffic.
pub const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// `net.ipv4.conf.all.arp_ignore` (strict ARP).
pub const ARP_IGNORE: &str = "/proc/sys/net/ipv4/conf/all/arp_ignore";
/// `net.ipv4.conf.all.arp_announce` (strict ARP).
pub const ARP_ANNOUNCE: &str = "/proc/sys/net/ipv4/conf/all/arp_announce";

/// One value to write to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    /// The file ([`MAX`], [`HASHSIZE`], ...).
    pub path: &'static str,
    /// The value, written in decimal.
    pub value: u64,
    /// What the file held (`None`: unreadable).
    pub current: Option<u64>,
}

impl Write {
    /// True for the node-wide settings, which only the initial network namespace may change.
    pub fn node_wide(&self) -> bool {
        matches!(self.path, MAX | HASHSIZE)
    }
}

/// The `nf_conntrack_max` kube-proxy asks for: `max_per_core` per CPU, at least `min`; 0 (leave
/// the limit as it is) when `max_per_core` is 0.
pub fn conntrack_max(cfg: &ConntrackConfig, cpus: u64) -> u64 {
    if cfg.max_per_core == 0 { 0 } else { (u64::from(cfg.max_per_core) * cpus).max(u64::from(cfg.min)) }
}

/// What to write, in kube-proxy's order, given what each file holds (`current`; `None` when it
/// cannot be read, which kube-proxy takes as a value to change). As kube-proxy: a value is written
/// only when the file holds another one; the hash table is only ever grown, to a quarter of
/// `nf_conntrack_max`, when smaller than that; a zero timeout and a false `tcp_be_liberal` leave
/// their sysctl alone.
pub fn plan(cfg: &ConntrackConfig, cpus: u64, current: impl Fn(&'static str) -> Option<u64>) -> Vec<Write> {
    let mut writes = Vec::new();
    let mut set = |path: &'static str, value: u64| {
        let current = current(path);
        if current != Some(value) {
            writes.push(Write { path, value, current });
        }
    };
    let max = conntrack_max(cfg, cpus);
    if max > 0 {
        set(MAX, max);
    }
    let seconds = |d: Duration| d.as_secs();
    for (path, timeout) in
        [(TCP_ESTABLISHED, cfg.tcp_established_timeout), (TCP_CLOSE_WAIT, cfg.tcp_close_wait_timeout)]
    {
        if seconds(timeout) > 0 {
            set(path, seconds(timeout));
        }
    }
    if cfg.tcp_be_liberal {
        set(TCP_BE_LIBERAL, 1);
    }
    for (path, timeout) in [(UDP, cfg.udp_timeout), (UDP_STREAM, cfg.udp_stream_timeout)] {
        if seconds(timeout) > 0 {
            set(path, seconds(timeout));
        }
    }
    if max > 0 {
        let hashsize = current(HASHSIZE);
        if hashsize.is_none_or(|size| size < max / 4) {
            // Right after the limit, as kube-proxy's SetMax.
            let at = writes.iter().position(|w| w.path != MAX).unwrap_or(writes.len());
            writes.insert(at, Write { path: HASHSIZE, value: max / 4, current: hashsize });
        }
    }
    writes
}

/// What IPVS mode writes at start, as kube-proxy's IPVS proxier (given what each file holds):
/// IPVS's conntrack, expiry of connections to deleted real servers and of quiescent persistence
/// templates, IP forwarding, and with `strict_arp` (`--ipvs-strict-arp`) `arp_ignore=1` and
/// `arp_announce=2`, so that the node does not answer ARP for the addresses of `kube-ipvs0`.
pub fn ipvs(strict_arp: bool, current: impl Fn(&'static str) -> Option<u64>) -> Vec<Write> {
    let mut wanted =
        vec![(VS_CONNTRACK, 1), (VS_EXPIRE_NODEST_CONN, 1), (VS_EXPIRE_QUIESCENT_TEMPLATE, 1), (IP_FORWARD, 1)];
    if strict_arp {
        wanted.extend([(ARP_IGNORE, 1), (ARP_ANNOUNCE, 2)]);
    }
    wanted
        .into_iter()
        .filter_map(|(path, value)| {
            let current = current(path);
            (current != Some(value)).then_some(Write { path, value, current })
        })
        .collect()
}

/// The number of CPUs in a list such as `/sys/devices/system/cpu/online` (`0-3,6,8-9`): kube-proxy
/// counts the machine's CPUs, not those this process may run on. `None` when it does not parse.
pub fn count_cpus(list: &str) -> Option<u64> {
    let mut count = 0u64;
    for part in list.trim().split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?),
            None => {
                let one = part.parse::<u64>().ok()?;
                (one, one)
            }
        };
        count = count.checked_add(last.checked_sub(first)?.checked_add(1)?)?;
    }
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A fresh network namespace of a 2-CPU host, as the kernel sets it up.
    fn fresh() -> BTreeMap<&'static str, u64> {
        BTreeMap::from([
            (MAX, 262_144),
            (HASHSIZE, 262_144),
            (TCP_ESTABLISHED, 432_000),
            (TCP_CLOSE_WAIT, 60),
            (TCP_BE_LIBERAL, 0),
            (UDP, 30),
            (UDP_STREAM, 120),
        ])
    }

    fn writes(cfg: &ConntrackConfig, cpus: u64, node: &BTreeMap<&'static str, u64>) -> Vec<(&'static str, u64)> {
        plan(cfg, cpus, |path| node.get(path).copied()).into_iter().map(|w| (w.path, w.value)).collect()
    }

    #[test]
    fn kube_proxys_defaults_on_a_fresh_node() {
        let cfg = ConntrackConfig::default();
        assert_eq!(conntrack_max(&cfg, 2), 131_072, "the minimum wins on 2 CPUs");
        assert_eq!(conntrack_max(&cfg, 8), 262_144, "32768 per CPU");
        // The limit differs (and is lowered, as kube-proxy does); the hash table is big enough.
        assert_eq!(writes(&cfg, 2, &fresh()), [(MAX, 131_072), (TCP_ESTABLISHED, 86_400), (TCP_CLOSE_WAIT, 3_600)]);
        // Nothing to write once the node holds the values.
        let mut node = fresh();
        node.extend([(MAX, 131_072), (TCP_ESTABLISHED, 86_400), (TCP_CLOSE_WAIT, 3_600)]);
        assert_eq!(writes(&cfg, 2, &node), []);
    }

    #[test]
    fn the_hash_table_only_grows_to_a_quarter_of_the_limit() {
        let cfg = ConntrackConfig { tcp_established_timeout: Duration::ZERO, ..ConntrackConfig::default() };
        let mut node = fresh();
        node.insert(HASHSIZE, 16_384);
        assert_eq!(
            writes(&cfg, 64, &node),
            [(MAX, 2_097_152), (HASHSIZE, 524_288), (TCP_CLOSE_WAIT, 3_600)],
            "64 CPUs"
        );
        node.insert(HASHSIZE, 1_000_000);
        assert_eq!(writes(&cfg, 64, &node), [(MAX, 2_097_152), (TCP_CLOSE_WAIT, 3_600)], "never shrunk");
        // Unreadable files are written, as kube-proxy (reading 0).
        let none = plan(&cfg, 1, |_| None);
        assert_eq!(none.iter().map(|w| w.path).collect::<Vec<_>>(), [MAX, HASHSIZE, TCP_CLOSE_WAIT]);
        assert!(none.iter().all(|w| w.current.is_none()));
        assert!(none[0].node_wide() && none[1].node_wide() && !none[2].node_wide());
    }

    #[test]
    fn zero_leaves_a_setting_alone_and_the_rest_are_written() {
        let cfg = ConntrackConfig {
            max_per_core: 0,
            min: 1,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::from_secs(7200),
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(45),
            udp_stream_timeout: Duration::from_secs(180),
        };
        assert_eq!(conntrack_max(&cfg, 2), 0);
        assert_eq!(
            writes(&cfg, 2, &fresh()),
            [(TCP_CLOSE_WAIT, 7_200), (TCP_BE_LIBERAL, 1), (UDP, 45), (UDP_STREAM, 180)]
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0-3,6,8-9"), Some(7));
        for bad in ["", "3-1", "a", "0-", "1,,2"] {
            assert_eq!(count_cpus(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ipvs_mode_writes_what_the_node_lacks_and_strict_arp_only_when_asked() {
        let held = |path: &'static str| (path == VS_CONNTRACK).then_some(1);
        let paths = |writes: Vec<Write>| writes.into_iter().map(|w| (w.path, w.value)).collect::<Vec<_>>();
        assert_eq!(
            paths(ipvs(false, held)),
            [(VS_EXPIRE_NODEST_CONN, 1), (VS_EXPIRE_QUIESCENT_TEMPLATE, 1), (IP_FORWARD, 1)]
        );
        let strict = paths(ipvs(true, held));
        assert_eq!(strict[3..], [(ARP_IGNORE, 1), (ARP_ANNOUNCE, 2)]);
    }
}
