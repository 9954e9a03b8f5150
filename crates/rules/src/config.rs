//! Proxy settings: kube-proxy's flags and its `KubeProxyConfiguration` file, merged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::Error;
use crate::ipvs::Scheduler;

/// Which kernel backend programs the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// nftables tables `ip roadkeeper` / `ip6 roadkeeper` (the default).
    #[default]
    Nftables,
    /// iptables / ip6tables `nat` and `filter` chains with upstream's layout (`KUBE-SERVICES`...).
    Iptables,
    /// IPVS virtual servers, the `kube-ipvs0` addresses and table `roadkeeper-ipvs`
    /// ([`crate::ipvs`]).
    Ipvs,
    /// BPF programs and maps instead of rules ([`crate::ebpf`]): cgroup socket programs
    /// translate a Service frontend once per connection.
    Ebpf,
}

impl std::fmt::Display for ProxyMode {
    /// The mode's name in the config (`nftables`, `iptables`, `ipvs`), as kube-proxy's `/proxyMode` says.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Ebpf => "ebpf",
        })
    }
}

impl std::str::FromStr for ProxyMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "" | "nftables" => Ok(ProxyMode::Nftables),
            "iptables" => Ok(ProxyMode::Iptables),
            "ipvs" => Ok(ProxyMode::Ipvs),
            "ebpf" => Ok(ProxyMode::Ebpf),
            other => Err(Error::Config(format!(
                "mode: unsupported proxy mode {other:?} (supported: nftables, iptables, ipvs, ebpf)"
            ))),
        }
    }
}

/// Which node addresses accept NodePort traffic (`--nodeport-addresses`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Not configured: the mode's default, i.e. the primary IPs in nftables mode and every local
    /// address in iptables and IPVS mode (as kube-proxy).
    #[default]
    Unset,
    /// The node's primary IP of each family (`primary`).
    Primary,
    /// Every local address inside one of these CIDRs.
    Cidrs(Vec<IpNet>),
}

impl NodePortAddresses {
    /// True when the CIDRs include the whole address space of `family` (`0.0.0.0/0`, `::/0`).
    pub fn covers_all(&self, family: crate::table::IpFamily) -> bool {
        match self {
            NodePortAddresses::Unset | NodePortAddresses::Primary => false,
            NodePortAddresses::Cidrs(cidrs) => {
                cidrs.iter().any(|c| c.prefix_len() == 0 && crate::table::IpFamily::of(&c.addr()) == family)
            }
        }
    }

    /// Parses the flag value: a comma-separated list of CIDRs and/or the word `primary`.
    pub fn parse(items: &[String]) -> Result<Self, Error> {
        let items: Vec<&str> = items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
        if items.is_empty() {
            return Ok(NodePortAddresses::Unset);
        }
        if items == ["primary"] {
            return Ok(NodePortAddresses::Primary);
        }
        items
            .iter()
            .map(|s| {
                s.parse::<IpNet>()
                    .map_err(|e| Error::Config(format!("nodePortAddresses: {s:?} is not a CIDR or \"primary\": {e}")))
            })
            .collect::<Result<_, _>>()
            .map(NodePortAddresses::Cidrs)
    }
}

/// kube-proxy's conntrack settings (`conntrack:` of the file, the `--conntrack-*` flags): the
/// node's netfilter sysctls written at start (see [`crate::sysctls`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ConntrackConfig {
    /// Entries per CPU for `nf_conntrack_max` (`maxPerCore`, default 32768); 0 leaves the limit
    /// as it is, and `min` with it.
    pub max_per_core: u32,
    /// The least `nf_conntrack_max` whatever the CPU count (`min`, default 131072).
    pub min: u32,
    /// Idle timeout of established TCP flows (`tcpEstablishedTimeout`, default 24h; 0 leaves it).
    pub tcp_established_timeout: Duration,
    /// Timeout of TCP flows in CLOSE_WAIT (`tcpCloseWaitTimeout`, default 1h; 0 leaves it).
    pub tcp_close_wait_timeout: Duration,
    /// TCP tracking is liberal on this node: `tcpBeLiberal` asks for `nf_conntrack_tcp_be_liberal=1`,
    /// and `roadkeeper proxy` also sets this when it finds the kernel's flag already on. Then the
    /// iptables mode does not drop packets conntrack calls INVALID, as kube-proxy.
    pub tcp_be_liberal: bool,
    /// Timeout of unreplied UDP flows (`udpTimeout`, default 0: left as it is).
    pub udp_timeout: Duration,
    /// Timeout of assured UDP flows (`udpStreamTimeout`, default 0: left as it is).
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// eBPF mode's settings: where its programs attach and pin, and how large its maps are
/// (`--cgroup-root`, `--bpf-root`, `--bpf-lb-map-max`, `--bpf-lb-maglev-table-size`; flags only:
/// KubeProxyConfiguration has no section for them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfConfig {
    /// The cgroup v2 directory whose processes' sockets are translated (`None`: the root of the
    /// node's cgroup v2 hierarchy).
    pub cgroup_root: Option<PathBuf>,
    /// The bpffs mount; the programs' maps and links are pinned in its `roadkeeper/`.
    pub bpf_root: PathBuf,
    /// The maps' sizes.
    pub limits: crate::ebpf::MapLimits,
    /// The interfaces whose external traffic is translated (empty: those holding the node's
    /// addresses).
    pub devices: Vec<String>,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            cgroup_root: None,
            bpf_root: "/sys/fs/bpf".into(),
            limits: crate::ebpf::MapLimits::default(),
            devices: Vec::new(),
        }
    }
}

/// Bounds of `--bpf-lb-map-max`.
pub const BPF_LB_MAP_MAX: std::ops::RangeInclusive<usize> = 1 << 10..=1 << 24;

impl EbpfConfig {
    /// The directory under [`EbpfConfig::bpf_root`] that holds eBPF mode's pins.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpf_root.join("roadkeeper")
    }

    /// `--bpf-devices`: comma-separated interface names (each 1-15 characters, none of `/`, `:`
    /// or whitespace, as the kernel names them).
    pub fn set_devices(&mut self, list: &str) -> Result<(), Error> {
        let mut devices = Vec::new();
        for name in list.split(',').map(str::trim) {
            let valid = (1..=15).contains(&name.len())
                && name != "."
                && name != ".."
                && !name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
            if !valid {
                return Err(Error::Config(format!("--bpf-devices: {name:?} is not an interface name")));
            }
            if !devices.iter().any(|d| d == name) {
                devices.push(name.to_owned());
            }
        }
        self.devices = devices;
        Ok(())
    }

    /// `--bpf-lb-map-max`: entries of the services and backends maps.
    pub fn set_map_max(&mut self, entries: usize) -> Result<(), Error> {
        if !BPF_LB_MAP_MAX.contains(&entries) {
            return Err(Error::Config(format!(
                "--bpf-lb-map-max: {entries} is out of range {}-{}",
                BPF_LB_MAP_MAX.start(),
                BPF_LB_MAP_MAX.end()
            )));
        }
        (self.limits.services, self.limits.backends) = (entries, entries);
        Ok(())
    }

    /// `--bpf-lb-maglev-table-size`: slots of each Maglev table, one of
    /// [`crate::ebpf::maglev::TABLE_SIZES`].
    pub fn set_maglev_table_size(&mut self, size: u32) -> Result<(), Error> {
        if !crate::ebpf::maglev::is_table_size(size) {
            return Err(Error::Config(format!(
                "--bpf-lb-maglev-table-size: {size} is not one of {:?}",
                crate::ebpf::maglev::TABLE_SIZES
            )));
        }
        self.limits.maglev_table_size = size;
        Ok(())
    }
}

/// kube-proxy's IPVS settings (`ipvs:` of the file, the `--ipvs-*` flags; its `syncPeriod` and
/// `minSyncPeriod` go to [`ProxyConfig`]'s in IPVS mode).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IpvsConfig {
    /// The scheduler of every virtual server (`scheduler`, default `rr`).
    pub scheduler: Scheduler,
    /// `strictARP`: `arp_ignore=1`, `arp_announce=2`, so that the node does not answer ARP for the
    /// addresses of `kube-ipvs0` (MetalLB's L2 mode needs it).
    pub strict_arp: bool,
    /// `excludeCIDRs`: virtual servers in them belong to other programs and are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    /// IPVS's idle timeout of TCP connections (`tcpTimeout`; 0: left as it is).
    pub tcp_timeout: Duration,
    /// IPVS's timeout of TCP connections after a FIN (`tcpFinTimeout`; 0: left as it is).
    pub tcp_fin_timeout: Duration,
    /// IPVS's timeout of UDP flows (`udpTimeout`; 0: left as it is).
    pub udp_timeout: Duration,
}

/// A conntrack timeout as written (a Go duration): whole seconds, or zero; a fraction of a
/// second would truncate to a zero timeout in the kernel, so it is refused, naming `field`.
pub fn parse_conntrack_timeout(field: &str, value: &str) -> Result<Duration, Error> {
    let duration = parse_go_duration(field, value)?;
    if duration.subsec_nanos() != 0 {
        return Err(Error::Config(format!("{field}: {value:?} is not a whole number of seconds")));
    }
    Ok(duration)
}

/// A count of the file's `conntrack:` section (an int32 that must not be negative).
fn conntrack_count(field: &str, value: i64) -> Result<u32, Error> {
    u32::try_from(value)
        .ok()
        .filter(|v| i32::try_from(*v).is_ok())
        .ok_or_else(|| Error::Config(format!("{field}: {value} must be between 0 and 2147483647")))
}

/// Everything the planners need to know about how to proxy (pure data, no I/O).
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// This node's name (`--hostname-override`, default the host name).
    pub hostname: String,
    /// Pod CIDRs used to tell pod traffic from external traffic (`--cluster-cidr`).
    pub cluster_cidrs: Vec<IpNet>,
    /// Masquerade all traffic sent to ClusterIPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// The packet-mark bit that flags traffic for masquerading (default 14, i.e. 0x4000).
    pub masquerade_bit: u8,
    /// Which addresses accept NodePort traffic.
    pub nodeport_addresses: NodePortAddresses,
    /// The kernel backend.
    pub mode: ProxyMode,
    /// Minimum time between two syncs (`minSyncPeriod`, default 1s).
    pub min_sync_period: Duration,
    /// Period of the health check of our tables and retry after failure (`syncPeriod`, default 30s).
    pub sync_period: Duration,
    /// iptables mode: NodePorts also answer on 127.0.0.1 (`iptables.localhostNodePorts`, default
    /// true; needs `net.ipv4.conf.all.route_localnet=1`, which the iptables runner sets).
    pub localhost_nodeports: bool,
    /// Where `/healthz` and `/livez` are served (`healthzBindAddress`, default `0.0.0.0:10256`;
    /// empty: not served).
    pub healthz_bind_address: String,
    /// Where `/metrics` is served (`metricsBindAddress`, default `127.0.0.1:10249`; empty: not
    /// served).
    pub metrics_bind_address: String,
    /// `clientConnection.kubeconfig`: the API server's kubeconfig (the `--kubeconfig` flag wins).
    pub kubeconfig: Option<PathBuf>,
    /// kube-proxy's conntrack settings.
    pub conntrack: ConntrackConfig,
    /// kube-proxy's IPVS settings (used in IPVS mode).
    pub ipvs: IpvsConfig,
    /// Where eBPF mode attaches and pins, and its map sizes (used in eBPF mode).
    pub ebpf: EbpfConfig,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            hostname: String::new(),
            cluster_cidrs: Vec::new(),
            masquerade_all: false,
            masquerade_bit: 14,
            nodeport_addresses: NodePortAddresses::Unset,
            mode: ProxyMode::Nftables,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            localhost_nodeports: true,
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            kubeconfig: None,
            conntrack: ConntrackConfig::default(),
            ipvs: IpvsConfig::default(),
            ebpf: EbpfConfig::default(),
        }
    }
}

impl ProxyConfig {
    /// The masquerade mark value, e.g. `0x4000` for bit 14.
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit
    }

    /// Applies a `KubeProxyConfiguration` file on top of `self` (flags are applied after it) and
    /// returns the fields it holds that have no effect. `mode_flag` is the `--proxy-mode` flag,
    /// which overrides the file's `mode` and so picks the mode section that is read.
    pub fn apply_file(&mut self, path: &Path, mode_flag: Option<ProxyMode>) -> Result<Vec<IgnoredField>, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let file: KubeProxyConfiguration =
            serde_saphyr::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        file.apply(self, mode_flag).map_err(|Error::Config(msg)| Error::Config(format!("{}: {msg}", path.display())))
    }
}

/// A field of a config file that is accepted and has no effect (see [`ProxyConfig::apply_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredField {
    /// The field's path, e.g. `iptables.localhostNodePorts`.
    pub field: String,
    /// Why it has no effect.
    pub reason: IgnoredBecause,
}

/// Why a config field has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoredBecause {
    /// kube-proxy's, without a counterpart in roadkeeper.
    KubeProxyOnly,
    /// In the mode section not read (the one of this mode is).
    OtherSection(ProxyMode),
    /// `iptables.syncPeriod` and `minSyncPeriod` in IPVS mode, which reads the `iptables` section's
    /// masquerading settings and the `ipvs` section's periods, as kube-proxy.
    IpvsPeriods,
    /// `iptables.localhostNodePorts`: read in iptables mode only.
    IptablesModeOnly,
}

impl IgnoredField {
    /// True when the field has no effect in `mode` (the mode flags and file settled on).
    pub fn ignored_in(&self, mode: ProxyMode) -> bool {
        !(self.reason == IgnoredBecause::IptablesModeOnly && mode == ProxyMode::Iptables)
    }
}

impl std::fmt::Display for IgnoredField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let field = &self.field;
        match self.reason {
            IgnoredBecause::KubeProxyOnly => {
                write!(f, "{field}: accepted for kube-proxy compatibility, not used by roadkeeper")
            }
            IgnoredBecause::OtherSection(read) => write!(f, "{field}: not used (the {read} section is read)"),
            IgnoredBecause::IptablesModeOnly => write!(f, "{field}: not used (iptables mode only)"),
            IgnoredBecause::IpvsPeriods => write!(f, "{field}: not used (the ipvs section's is read)"),
        }
    }
}

/// The ignored fields below `prefix` among `fields` (name, present).
fn ignored<'a>(
    prefix: &'a str,
    fields: impl IntoIterator<Item = (&'a str, bool)> + 'a,
    reason: IgnoredBecause,
) -> impl Iterator<Item = IgnoredField> + 'a {
    fields
        .into_iter()
        .filter(|(_, present)| *present)
        .map(move |(name, _)| IgnoredField { field: format!("{prefix}{name}"), reason })
}

/// Parses a comma-separated CIDR list such as `10.244.0.0/16,fd00:244::/48`.
pub fn parse_cidrs(field: &str, value: &str) -> Result<Vec<IpNet>, Error> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e| Error::Config(format!("{field}: {s:?} is not a CIDR: {e}"))))
        .collect()
}

/// Parses a Go duration as written in kube-proxy configs (`1s`, `30s`, `1m0s`, `500ms`, `1h`).
pub fn parse_go_duration(field: &str, value: &str) -> Result<Duration, Error> {
    let bad = || Error::Config(format!("{field}: {value:?} is not a duration like 30s or 1m0s"));
    let mut total = Duration::ZERO;
    let mut rest = value.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(number * seconds);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// The subset of `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` that roadkeeper reads.
/// Fields kube-proxy knows but roadkeeper does not use are accepted and ignored; anything else is
/// an error, as in kube-proxy's strict decoding.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KubeProxyConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    mode: Option<String>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    hostname_override: Option<String>,
    node_port_addresses: Option<Vec<String>>,
    detect_local_mode: Option<String>,
    iptables: Option<MasqueradeSettings>,
    nftables: Option<MasqueradeSettings>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    conntrack: Option<ConntrackSection>,
    // Known to kube-proxy, accepted so that its files load, not used by roadkeeper.
    feature_gates: Option<IgnoredAny>,
    client_connection: Option<ClientConnection>,
    bind_address: Option<IgnoredAny>,
    bind_address_hard_fail: Option<IgnoredAny>,
    enable_profiling: Option<IgnoredAny>,
    show_hidden_metrics_for_version: Option<IgnoredAny>,
    ipvs: Option<IpvsSection>,
    winkernel: Option<IgnoredAny>,
    detect_local: Option<IgnoredAny>,
    oom_score_adj: Option<IgnoredAny>,
    config_sync_period: Option<IgnoredAny>,
    port_range: Option<IgnoredAny>,
    logging: Option<IgnoredAny>,
}

/// `clientConnection:` of the file: only `kubeconfig` is used (kube-rs sets its own content
/// type and has no client-side rate limit).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClientConnection {
    kubeconfig: Option<String>,
    accept_content_types: Option<IgnoredAny>,
    content_type: Option<IgnoredAny>,
    qps: Option<IgnoredAny>,
    burst: Option<IgnoredAny>,
}

/// `conntrack:` of the file (kube-proxy's `KubeProxyConntrackConfiguration`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConntrackSection {
    max_per_core: Option<i64>,
    min: Option<i64>,
    tcp_established_timeout: Option<String>,
    tcp_close_wait_timeout: Option<String>,
    tcp_be_liberal: Option<bool>,
    udp_timeout: Option<String>,
    udp_stream_timeout: Option<String>,
}

impl ConntrackSection {
    fn apply(self, cfg: &mut ConntrackConfig) -> Result<(), Error> {
        if let Some(n) = self.max_per_core {
            cfg.max_per_core = conntrack_count("conntrack.maxPerCore", n)?;
        }
        if let Some(n) = self.min {
            cfg.min = conntrack_count("conntrack.min", n)?;
        }
        let timeouts = [
            (self.tcp_established_timeout, "conntrack.tcpEstablishedTimeout", &mut cfg.tcp_established_timeout),
            (self.tcp_close_wait_timeout, "conntrack.tcpCloseWaitTimeout", &mut cfg.tcp_close_wait_timeout),
            (self.udp_timeout, "conntrack.udpTimeout", &mut cfg.udp_timeout),
            (self.udp_stream_timeout, "conntrack.udpStreamTimeout", &mut cfg.udp_stream_timeout),
        ];
        for (value, field, slot) in timeouts {
            if let Some(value) = value {
                *slot = parse_conntrack_timeout(field, &value)?;
            }
        }
        if let Some(liberal) = self.tcp_be_liberal {
            cfg.tcp_be_liberal = liberal;
        }
        Ok(())
    }
}

/// `iptables:` / `nftables:` sections of the file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MasqueradeSettings {
    masquerade_all: Option<bool>,
    masquerade_bit: Option<i32>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    /// iptables mode only (`iptables.localhostNodePorts`).
    localhost_node_ports: Option<bool>,
}

impl MasqueradeSettings {
    /// The section's fields, each with whether the file sets it (`localhostNodePorts` apart).
    fn fields(&self) -> [(&'static str, bool); 4] {
        [
            ("masqueradeAll", self.masquerade_all.is_some()),
            ("masqueradeBit", self.masquerade_bit.is_some()),
            ("syncPeriod", self.sync_period.is_some()),
            ("minSyncPeriod", self.min_sync_period.is_some()),
        ]
    }
}

/// `ipvs:` of the file (kube-proxy's `KubeProxyIPVSConfiguration`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IpvsSection {
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    strict_arp: Option<bool>,
    tcp_timeout: Option<String>,
    tcp_fin_timeout: Option<String>,
    udp_timeout: Option<String>,
}

impl IpvsSection {
    /// The section's fields, each with whether the file sets it.
    fn fields(&self) -> [(&'static str, bool); 8] {
        [
            ("syncPeriod", self.sync_period.is_some()),
            ("minSyncPeriod", self.min_sync_period.is_some()),
            ("scheduler", self.scheduler.is_some()),
            ("excludeCIDRs", self.exclude_cidrs.is_some()),
            ("strictARP", self.strict_arp.is_some()),
            ("tcpTimeout", self.tcp_timeout.is_some()),
            ("tcpFinTimeout", self.tcp_fin_timeout.is_some()),
            ("udpTimeout", self.udp_timeout.is_some()),
        ]
    }

    /// Validates the section and writes its IPVS settings (not its periods) into `cfg`.
    fn apply(&self, cfg: &mut IpvsConfig) -> Result<(), Error> {
        if let Some(scheduler) = &self.scheduler {
            cfg.scheduler = scheduler.parse()?;
        }
        if let Some(cidrs) = &self.exclude_cidrs {
            cfg.exclude_cidrs = parse_cidrs("ipvs.excludeCIDRs", &cidrs.join(","))?;
        }
        if let Some(strict) = self.strict_arp {
            cfg.strict_arp = strict;
        }
        let timeouts = [
            (&self.tcp_timeout, "ipvs.tcpTimeout", &mut cfg.tcp_timeout),
            (&self.tcp_fin_timeout, "ipvs.tcpFinTimeout", &mut cfg.tcp_fin_timeout),
            (&self.udp_timeout, "ipvs.udpTimeout", &mut cfg.udp_timeout),
        ];
        for (value, field, slot) in timeouts {
            if let Some(value) = value {
                *slot = parse_conntrack_timeout(field, value)?;
            }
        }
        Ok(())
    }
}

impl KubeProxyConfiguration {
    /// The fields of kube-proxy's that the file sets and roadkeeper does not use.
    fn kube_proxy_only(&self) -> impl Iterator<Item = IgnoredField> + '_ {
        let top = [
            ("featureGates", self.feature_gates.is_some()),
            ("bindAddress", self.bind_address.is_some()),
            ("bindAddressHardFail", self.bind_address_hard_fail.is_some()),
            ("enableProfiling", self.enable_profiling.is_some()),
            ("showHiddenMetricsForVersion", self.show_hidden_metrics_for_version.is_some()),
            ("winkernel", self.winkernel.is_some()),
            ("detectLocal", self.detect_local.is_some()),
            ("oomScoreAdj", self.oom_score_adj.is_some()),
            ("configSyncPeriod", self.config_sync_period.is_some()),
            ("portRange", self.port_range.is_some()),
            ("logging", self.logging.is_some()),
        ];
        let client = self.client_connection.as_ref().map(|c| {
            [
                ("acceptContentTypes", c.accept_content_types.is_some()),
                ("contentType", c.content_type.is_some()),
                ("qps", c.qps.is_some()),
                ("burst", c.burst.is_some()),
            ]
        });
        let nft_localhost =
            [("localhostNodePorts", self.nftables.as_ref().is_some_and(|s| s.localhost_node_ports.is_some()))];
        ignored("", top, IgnoredBecause::KubeProxyOnly)
            .chain(ignored("clientConnection.", client.into_iter().flatten(), IgnoredBecause::KubeProxyOnly))
            .chain(ignored("nftables.", nft_localhost, IgnoredBecause::KubeProxyOnly))
    }

    fn apply(self, cfg: &mut ProxyConfig, mode_flag: Option<ProxyMode>) -> Result<Vec<IgnoredField>, Error> {
        let mut ignored_fields: Vec<IgnoredField> = self.kube_proxy_only().collect();
        if self.iptables.as_ref().is_some_and(|s| s.localhost_node_ports.is_some()) {
            let field = "iptables.localhostNodePorts".into();
            ignored_fields.push(IgnoredField { field, reason: IgnoredBecause::IptablesModeOnly });
        }
        if let Some(api) = self.api_version.as_deref()
            && api != "kubeproxy.config.k8s.io/v1alpha1"
        {
            return Err(Error::Config(format!("apiVersion: {api:?} is not kubeproxy.config.k8s.io/v1alpha1")));
        }
        if let Some(kind) = self.kind.as_deref()
            && kind != "KubeProxyConfiguration"
        {
            return Err(Error::Config(format!("kind: {kind:?} is not KubeProxyConfiguration")));
        }
        let mode_given = self.mode.is_some() || mode_flag.is_some();
        if let Some(mode) = self.mode {
            cfg.mode = mode.parse()?;
        }
        if let Some(mode) = mode_flag {
            cfg.mode = mode;
        }
        if let Some(cidr) = self.cluster_cidr {
            cfg.cluster_cidrs = parse_cidrs("clusterCIDR", &cidr)?;
        }
        if let Some(name) = self.hostname_override.filter(|n| !n.is_empty()) {
            cfg.hostname = name;
        }
        if let Some(addrs) = self.node_port_addresses {
            cfg.nodeport_addresses = NodePortAddresses::parse(&addrs)?;
        }
        if let Some(mode) = self.detect_local_mode.as_deref()
            && !matches!(mode, "" | "ClusterCIDR")
        {
            return Err(Error::Config(format!("detectLocalMode: {mode:?} is not supported (supported: ClusterCIDR)")));
        }
        if let Some(period) = self.sync_period {
            cfg.sync_period = parse_go_duration("syncPeriod", &period)?;
        }
        if let Some(period) = self.min_sync_period {
            cfg.min_sync_period = parse_go_duration("minSyncPeriod", &period)?;
        }
        if let Some(address) = self.healthz_bind_address {
            cfg.healthz_bind_address = address;
        }
        if let Some(address) = self.metrics_bind_address {
            cfg.metrics_bind_address = address;
        }
        if let Some(kubeconfig) = self.client_connection.and_then(|c| c.kubeconfig).filter(|k| !k.is_empty()) {
            cfg.kubeconfig = Some(kubeconfig.into());
        }
        if let Some(conntrack) = self.conntrack {
            conntrack.apply(&mut cfg.conntrack)?;
        }
        if let Some(localhost) = self.iptables.as_ref().and_then(|s| s.localhost_node_ports) {
            cfg.localhost_nodeports = localhost;
        }
        if let Some(ipvs) = &self.ipvs {
            ipvs.apply(&mut cfg.ipvs)?;
        }
        // The sections of the mode (the flag's, else the file's); without either, the only
        // section present, else the default mode's. IPVS mode reads the `iptables` section's
        // masquerading settings and the `ipvs` section's periods, as kube-proxy.
        let read = match (mode_given, &self.nftables, &self.iptables, &self.ipvs) {
            (false, None, Some(_), None) => ProxyMode::Iptables,
            (false, None, None, Some(_)) => ProxyMode::Ipvs,
            (false, Some(_), None, None) => ProxyMode::Nftables,
            _ => cfg.mode,
        };
        let other = IgnoredBecause::OtherSection(cfg.mode);
        let (section, periods) = match read {
            ProxyMode::Nftables | ProxyMode::Ebpf => {
                let ipt = self.iptables.iter().flat_map(|s| ignored("iptables.", s.fields(), other));
                ignored_fields.extend(ipt.collect::<Vec<_>>());
                (self.nftables, None)
            }
            ProxyMode::Iptables => {
                let nft = self.nftables.iter().flat_map(|s| ignored("nftables.", s.fields(), other));
                ignored_fields.extend(nft.collect::<Vec<_>>());
                (self.iptables, None)
            }
            ProxyMode::Ipvs => {
                let nft = self.nftables.iter().flat_map(|s| ignored("nftables.", s.fields(), other));
                ignored_fields.extend(nft.collect::<Vec<_>>());
                let mut section = self.iptables;
                if let Some(ipt) = section.as_mut() {
                    let periods =
                        [("syncPeriod", ipt.sync_period.take()), ("minSyncPeriod", ipt.min_sync_period.take())];
                    let periods = periods.map(|(name, value)| (name, value.is_some()));
                    ignored_fields.extend(ignored("iptables.", periods, IgnoredBecause::IpvsPeriods));
                }
                let periods = self.ipvs.as_ref().map(|s| (s.sync_period.clone(), s.min_sync_period.clone()));
                (section, periods)
            }
        };
        if read != ProxyMode::Ipvs
            && let Some(ipvs) = &self.ipvs
        {
            ignored_fields.extend(ignored("ipvs.", ipvs.fields(), other));
        }
        if let Some((sync, min_sync)) = periods {
            if let Some(period) = sync {
                cfg.sync_period = parse_go_duration("ipvs.syncPeriod", &period)?;
            }
            if let Some(period) = min_sync {
                cfg.min_sync_period = parse_go_duration("ipvs.minSyncPeriod", &period)?;
            }
        }
        if let Some(section) = section {
            if let Some(all) = section.masquerade_all {
                cfg.masquerade_all = all;
            }
            if let Some(bit) = section.masquerade_bit {
                cfg.masquerade_bit = u8::try_from(bit)
                    .ok()
                    .filter(|b| *b <= 31)
                    .ok_or_else(|| Error::Config(format!("masqueradeBit: {bit} is out of range 0-31")))?;
            }
            if let Some(period) = section.sync_period {
                cfg.sync_period = parse_go_duration("syncPeriod", &period)?;
            }
            if let Some(period) = section.min_sync_period {
                cfg.min_sync_period = parse_go_duration("minSyncPeriod", &period)?;
            }
        }
        Ok(ignored_fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` as a config file, applied over the defaults; the file is removed afterwards.
    fn from_yaml(text: &str) -> Result<ProxyConfig, Error> {
        let file = tempfile::Builder::new().prefix("rk-config-").suffix(".yaml").tempfile().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let mut cfg = ProxyConfig::default();
        cfg.apply_file(file.path(), None)?;
        Ok(cfg)
    }

    #[test]
    fn the_proxy_mode_flag_picks_the_section_read() {
        let text = "nftables: {minSyncPeriod: 3s}\niptables: {minSyncPeriod: 4s}\n";
        let file = tempfile::Builder::new().prefix("rk-config-").suffix(".yaml").tempfile().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let mut cfg = ProxyConfig::default();
        let ignored = cfg.apply_file(file.path(), Some(ProxyMode::Iptables)).unwrap();
        assert_eq!((cfg.mode, cfg.min_sync_period), (ProxyMode::Iptables, Duration::from_secs(4)));
        assert_eq!(
            ignored.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["nftables.minSyncPeriod: not used (the iptables section is read)"]
        );
        // The flag wins over the file's mode too.
        std::fs::write(file.path(), format!("mode: nftables\n{text}")).unwrap();
        let mut cfg = ProxyConfig::default();
        cfg.apply_file(file.path(), Some(ProxyMode::Iptables)).unwrap();
        assert_eq!((cfg.mode, cfg.min_sync_period), (ProxyMode::Iptables, Duration::from_secs(4)));
    }

    #[test]
    fn reads_a_kubeadm_style_file() {
        let cfg = from_yaml(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: nftables\nclusterCIDR: 10.244.0.0/16,fd00:244::/48\nhostnameOverride: node-a\n\
             nodePortAddresses: [\"192.168.0.0/16\"]\nbindAddress: 0.0.0.0\n\
             healthzBindAddress: \"[::]:10256\"\nmetricsBindAddress: \"\"\n\
             conntrack: {maxPerCore: 32768}\nclientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf, qps: 5}\nnftables: {masqueradeAll: true, masqueradeBit: 15, minSyncPeriod: 2s, syncPeriod: 1m0s}\n",
        )
        .unwrap();
        assert_eq!(cfg.hostname, "node-a");
        assert_eq!(cfg.kubeconfig, Some("/var/lib/kube-proxy/kubeconfig.conf".into()));
        assert_eq!(cfg.cluster_cidrs.len(), 2);
        assert!(cfg.masquerade_all);
        assert_eq!(cfg.masquerade_mark(), 0x8000);
        assert_eq!(cfg.min_sync_period, Duration::from_secs(2));
        assert_eq!(cfg.sync_period, Duration::from_secs(60));
        assert_eq!((cfg.healthz_bind_address.as_str(), cfg.metrics_bind_address.as_str()), ("[::]:10256", ""));
        assert_eq!(cfg.nodeport_addresses, NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()]));
    }

    #[test]
    fn iptables_mode_reads_its_own_section() {
        let cfg = from_yaml(
            "mode: iptables\niptables: {masqueradeBit: 15, localhostNodePorts: false, minSyncPeriod: 2s}\n\
             nftables: {masqueradeBit: 16}\n",
        )
        .unwrap();
        assert_eq!(cfg.mode, ProxyMode::Iptables);
        assert_eq!(cfg.masquerade_mark(), 0x8000);
        assert!(!cfg.localhost_nodeports);
        assert_eq!(cfg.min_sync_period, Duration::from_secs(2));
        assert_eq!(cfg.nodeport_addresses, NodePortAddresses::Unset);
        // Without a mode in the file (it may come from --proxy-mode), the only section present.
        let cfg = from_yaml("iptables: {syncPeriod: 2s, minSyncPeriod: 100ms}\n").unwrap();
        assert_eq!((cfg.sync_period, cfg.min_sync_period), (Duration::from_secs(2), Duration::from_millis(100)));
        assert!(cfg.localhost_nodeports);
    }

    #[test]
    fn conntrack_section_defaults_and_values() {
        let cfg = from_yaml("kind: KubeProxyConfiguration\n").unwrap();
        assert_eq!(cfg.conntrack, ConntrackConfig::default());
        assert_eq!((cfg.conntrack.max_per_core, cfg.conntrack.min), (32768, 131072));
        assert_eq!(cfg.conntrack.tcp_close_wait_timeout, Duration::from_secs(3600));
        let cfg = from_yaml(
            "conntrack: {maxPerCore: 0, min: 5, tcpEstablishedTimeout: 2h, tcpCloseWaitTimeout: 0s, \
             tcpBeLiberal: true, udpTimeout: 1m, udpStreamTimeout: 2m30s}\n",
        )
        .unwrap();
        let want = ConntrackConfig {
            max_per_core: 0,
            min: 5,
            tcp_established_timeout: Duration::from_secs(7200),
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(60),
            udp_stream_timeout: Duration::from_secs(150),
        };
        assert_eq!(cfg.conntrack, want);
        for (yaml, field) in [
            ("conntrack: {maxPerCore: -1}\n", "conntrack.maxPerCore"),
            ("conntrack: {min: 4294967296}\n", "conntrack.min"),
            ("conntrack: {udpTimeout: 1500ms}\n", "conntrack.udpTimeout"),
            ("conntrack: {tcpCloseWaitTimeout: later}\n", "conntrack.tcpCloseWaitTimeout"),
            ("conntrack: {tcpFinTimeout: 1s}\n", "tcpFinTimeout"),
        ] {
            let err = from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{yaml}: {err}");
        }
    }

    /// The fields of `text` (a config file) that have no effect in `mode`, as logged.
    fn ignored_in(text: &str, mode: ProxyMode) -> Vec<String> {
        let file = tempfile::Builder::new().prefix("rk-config-").suffix(".yaml").tempfile().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let ignored = ProxyConfig::default().apply_file(file.path(), None).unwrap();
        ignored.iter().filter(|f| f.ignored_in(mode)).map(ToString::to_string).collect()
    }

    #[test]
    fn fields_accepted_and_not_used_are_named() {
        let text = "mode: nftables\nbindAddress: 0.0.0.0\nipvs: {scheduler: rr}\n\
                    clientConnection: {kubeconfig: /k, qps: 5}\nconntrack: {min: 1}\n\
                    iptables: {localhostNodePorts: false, masqueradeBit: 15}\nnftables: {masqueradeAll: true}\n";
        assert_eq!(
            ignored_in(text, ProxyMode::Nftables),
            [
                "bindAddress: accepted for kube-proxy compatibility, not used by roadkeeper",
                "clientConnection.qps: accepted for kube-proxy compatibility, not used by roadkeeper",
                "iptables.localhostNodePorts: not used (iptables mode only)",
                "iptables.masqueradeBit: not used (the nftables section is read)",
                "ipvs.scheduler: not used (the nftables section is read)",
            ]
        );
        // --proxy-mode iptables after the file: localhostNodePorts counts.
        assert!(!ignored_in(text, ProxyMode::Iptables).iter().any(|f| f.contains("localhostNodePorts")));
        assert!(ignored_in("mode: iptables\niptables: {masqueradeAll: true}\n", ProxyMode::Iptables).is_empty());
    }

    #[test]
    fn unknown_field_is_an_error_naming_it() {
        let err = from_yaml("kind: KubeProxyConfiguration\nclusterCidr: 10.0.0.0/8\n").unwrap_err();
        assert!(err.to_string().contains("clusterCidr"), "{err}");
    }

    #[test]
    fn bad_values_name_their_field() {
        let err = from_yaml("clusterCIDR: 10.0.0.300/8\n").unwrap_err();
        assert!(err.to_string().contains("clusterCIDR"), "{err}");
        let err = from_yaml("mode: userspace\n").unwrap_err();
        assert!(err.to_string().contains("mode") && err.to_string().contains("ipvs"), "{err}");
        let err = from_yaml("syncPeriod: soon\n").unwrap_err();
        assert!(err.to_string().contains("syncPeriod"), "{err}");
    }

    #[test]
    fn ipvs_mode_is_accepted_by_the_file() {
        let cfg = from_yaml("mode: ipvs\n").unwrap();
        assert_eq!(cfg.mode.to_string(), "ipvs");
        assert_eq!("ipvs".parse::<ProxyMode>().unwrap(), ProxyMode::Ipvs);
        assert_eq!(cfg.ipvs, IpvsConfig::default());
        assert_eq!(cfg.ipvs.scheduler, Scheduler::RoundRobin);
    }

    #[test]
    fn ebpf_mode_reads_the_top_level_periods_and_the_nftables_section() {
        let cfg = from_yaml("mode: ebpf\nminSyncPeriod: 100ms\nnftables: {syncPeriod: 2s}\n").unwrap();
        assert_eq!((cfg.mode, cfg.mode.to_string().as_str()), (ProxyMode::Ebpf, "ebpf"));
        assert_eq!((cfg.min_sync_period, cfg.sync_period), (Duration::from_millis(100), Duration::from_secs(2)));
        assert_eq!(cfg.ebpf.pin_dir(), Path::new("/sys/fs/bpf/roadkeeper"));
        assert_eq!(cfg.ebpf.cgroup_root, None, "the hierarchy's root, found at start");
    }

    #[test]
    fn ebpf_map_sizes_are_bounded() {
        let mut ebpf = EbpfConfig::default();
        ebpf.set_map_max(1 << 20).unwrap();
        assert_eq!((ebpf.limits.services, ebpf.limits.backends), (1 << 20, 1 << 20));
        for bad in [0, 1023, (1 << 24) + 1] {
            let err = ebpf.set_map_max(bad).unwrap_err().to_string();
            assert!(err.contains("--bpf-lb-map-max") && err.contains("1024-16777216"), "{err}");
        }
        ebpf.set_maglev_table_size(65521).unwrap();
        assert_eq!(ebpf.limits.maglev_table_size, 65521);
        let err = ebpf.set_maglev_table_size(65536).unwrap_err().to_string();
        assert!(err.contains("--bpf-lb-maglev-table-size: 65536 is not one of [251,"), "{err}");
        assert_eq!(ebpf.limits.maglev_table_size, 65521, "a refused size changes nothing");
    }

    #[test]
    fn ebpf_devices_are_interface_names() {
        let mut ebpf = EbpfConfig::default();
        ebpf.set_devices("eth0, bond0.100,eth0").unwrap();
        assert_eq!(ebpf.devices, ["eth0", "bond0.100"], "trimmed, duplicates once");
        for bad in ["", "eth0,", "../etc", "averyveryverylongname", "eth 0", "..", "a:b"] {
            let err = ebpf.set_devices(bad).unwrap_err().to_string();
            assert!(err.contains("--bpf-devices") && err.contains("is not an interface name"), "{bad}: {err}");
        }
        assert_eq!(ebpf.devices, ["eth0", "bond0.100"], "a refused list changes nothing");
    }

    #[test]
    fn ipvs_mode_reads_the_ipvs_section_and_the_iptables_masquerading() {
        let text = "mode: ipvs\nipvs: {scheduler: sh, strictARP: true, excludeCIDRs: [\"172.16.0.0/12\"], \
                    syncPeriod: 45s, minSyncPeriod: 2s, tcpTimeout: 15m, tcpFinTimeout: 30s, udpTimeout: 5s}\n\
                    iptables: {masqueradeBit: 15, masqueradeAll: true, syncPeriod: 1m}\nnftables: {masqueradeBit: 16}\n";
        let file = tempfile::Builder::new().prefix("rk-config-").suffix(".yaml").tempfile().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let mut cfg = ProxyConfig::default();
        let ignored = cfg.apply_file(file.path(), None).unwrap();
        let want = IpvsConfig {
            scheduler: Scheduler::SourceHashing,
            strict_arp: true,
            exclude_cidrs: vec!["172.16.0.0/12".parse().unwrap()],
            tcp_timeout: Duration::from_secs(900),
            tcp_fin_timeout: Duration::from_secs(30),
            udp_timeout: Duration::from_secs(5),
        };
        assert_eq!((cfg.mode, &cfg.ipvs), (ProxyMode::Ipvs, &want));
        assert_eq!((cfg.sync_period, cfg.min_sync_period), (Duration::from_secs(45), Duration::from_secs(2)));
        assert_eq!((cfg.masquerade_mark(), cfg.masquerade_all), (0x8000, true), "iptables' masquerading");
        assert_eq!(
            ignored.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "nftables.masqueradeBit: not used (the ipvs section is read)",
                "iptables.syncPeriod: not used (the ipvs section's is read)",
            ]
        );
        // In another mode, the ipvs section is named as not used.
        let mut cfg = ProxyConfig::default();
        let ignored = cfg.apply_file(file.path(), Some(ProxyMode::Iptables)).unwrap();
        assert_eq!(cfg.sync_period, Duration::from_secs(60));
        let names: Vec<String> = ignored.iter().map(|f| f.field.clone()).collect();
        assert!(
            names.contains(&"ipvs.scheduler".to_string()) && names.contains(&"ipvs.syncPeriod".to_string()),
            "{names:?}"
        );
    }

    #[test]
    fn bad_ipvs_values_name_their_field() {
        for (yaml, field) in [
            ("ipvs: {scheduler: fastest}\n", "ipvs.scheduler"),
            ("ipvs: {excludeCIDRs: [10.0.0.1/33]}\n", "ipvs.excludeCIDRs"),
            ("ipvs: {tcpTimeout: 1500ms}\n", "ipvs.tcpTimeout"),
            ("ipvs: {udpTimeout: soon}\n", "ipvs.udpTimeout"),
            ("mode: ipvs\nipvs: {syncPeriod: soon}\n", "ipvs.syncPeriod"),
            ("ipvs: {strictArp: true}\n", "strictArp"),
        ] {
            let err = from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{yaml}: {err}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("x", "1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("x", "250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_go_duration("x", "5").is_err());
    }

    #[test]
    fn nodeport_addresses_accepts_primary_and_cidrs() {
        assert_eq!(NodePortAddresses::parse(&["primary".into()]).unwrap(), NodePortAddresses::Primary);
        assert!(NodePortAddresses::parse(&["nonsense".into()]).is_err());
    }
}
