//! `roadkeeper proxy`, `rules` and `cleanup`: wiring the cluster state ([`Feed`]) to the proxier.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use roadkeeper_cluster::{Changes, Feed, Interest, Kind, Store};
use roadkeeper_proxy::ebpf::proxier::{EbpfProxier, FakeMaps};
use roadkeeper_proxy::health::ProxyHealth;
use roadkeeper_proxy::iptables::{self, IptablesBinary, IptablesProxier};
use roadkeeper_proxy::ipvs::proxier::IpvsProxier;
use roadkeeper_proxy::ipvs::runner::KernelRunner;
use roadkeeper_proxy::nft::apply::{NftBinary, NftRunner, Recorder};
use roadkeeper_proxy::nft::proxier::NftProxier;
use roadkeeper_proxy::node::{host_addresses, hostname, node_eligible, node_info};
use roadkeeper_proxy::proxier::{Proxier, RulesCheck, SyncReport};
use roadkeeper_proxy::sysctls;
use roadkeeper_rules::config::{
    EbpfConfig, IgnoredField, NodePortAddresses, ProxyConfig, ProxyMode, parse_cidrs, parse_conntrack_timeout,
    parse_go_duration,
};
use roadkeeper_rules::ipvs;
use roadkeeper_rules::nft::transaction;
use roadkeeper_rules::plan::{NodePlan, service_cidrs};
use roadkeeper_rules::table::{IpFamily, NodeInfo};

use crate::cli::{CleanupArgs, EbpfArgs, IpvsArgs, ProxyArgs, RuleArgs, RulesArgs};
use crate::healthcheck::HealthCheckServers;
use crate::proxy_metrics::{self, NoLocalEndpoints};
use crate::serve::{self, SharedHealth};

/// A full resync rewrites everything this often even when nothing seems wrong (upstream's
/// nftables proxier does the same, hourly).
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// Merges the config file and the flags (flags win), as kube-proxy does, logging the file's
/// fields that have no effect.
fn build_config(args: &ProxyArgs) -> anyhow::Result<ProxyConfig> {
    let (mut cfg, ignored) = rule_config_and_ignored(&args.rules, args.hostname_override.as_deref())?;
    if let Some(file) = &args.rules.config {
        for field in ignored {
            tracing::info!("--config {}: {field}", file.display());
        }
    }
    if let Some(address) = &args.healthz_bind_address {
        cfg.healthz_bind_address = address.clone();
    }
    if let Some(address) = &args.metrics_bind_address {
        cfg.metrics_bind_address = address.clone();
    }
    let conntrack = &args.conntrack;
    if let Some(n) = conntrack.conntrack_max_per_core {
        cfg.conntrack.max_per_core = n;
    }
    if let Some(n) = conntrack.conntrack_min {
        cfg.conntrack.min = n;
    }
    for (flag, value, slot) in [
        (
            "--conntrack-tcp-timeout-established",
            &conntrack.conntrack_tcp_timeout_established,
            &mut cfg.conntrack.tcp_established_timeout,
        ),
        (
            "--conntrack-tcp-timeout-close-wait",
            &conntrack.conntrack_tcp_timeout_close_wait,
            &mut cfg.conntrack.tcp_close_wait_timeout,
        ),
        ("--conntrack-udp-timeout", &conntrack.conntrack_udp_timeout, &mut cfg.conntrack.udp_timeout),
        (
            "--conntrack-udp-timeout-stream",
            &conntrack.conntrack_udp_timeout_stream,
            &mut cfg.conntrack.udp_stream_timeout,
        ),
    ] {
        if let Some(value) = value {
            *slot = parse_conntrack_timeout(flag, value)?;
        }
    }
    if cfg.mode == ProxyMode::Iptables {
        if let Some(period) = &args.iptables_min_sync_period {
            cfg.min_sync_period = parse_go_duration("--iptables-min-sync-period", period)?;
        }
        if let Some(period) = &args.iptables_sync_period {
            cfg.sync_period = parse_go_duration("--iptables-sync-period", period)?;
        }
    }
    Ok(cfg)
}

/// The configuration the rule flags (and their config file) give node `hostname` (default: the
/// config file's, else the host name).
pub(crate) fn rule_config(args: &RuleArgs, hostname_override: Option<&str>) -> anyhow::Result<ProxyConfig> {
    Ok(rule_config_and_ignored(args, hostname_override)?.0)
}

/// [`rule_config`], and the config file's fields that have no effect in the mode it settles on.
fn rule_config_and_ignored(
    args: &RuleArgs,
    hostname_override: Option<&str>,
) -> anyhow::Result<(ProxyConfig, Vec<IgnoredField>)> {
    let mut cfg = ProxyConfig::default();
    let mode_flag = args.proxy_mode.as_deref().map(str::parse).transpose()?;
    let ignored = match &args.config {
        Some(file) => cfg.apply_file(file, mode_flag)?,
        None => Vec::new(),
    };
    if let Some(name) = hostname_override {
        cfg.hostname = name.to_owned();
    }
    if cfg.hostname.is_empty() {
        cfg.hostname = hostname();
    }
    if let Some(cidrs) = &args.cluster_cidr {
        cfg.cluster_cidrs = parse_cidrs("--cluster-cidr", cidrs)?;
    }
    if args.masquerade_all {
        cfg.masquerade_all = true;
    }
    if let Some(addresses) = &args.nodeport_addresses {
        cfg.nodeport_addresses = NodePortAddresses::parse(addresses)?;
    }
    if let Some(mode) = &args.proxy_mode {
        cfg.mode = mode.parse()?;
    }
    if let Some(liberal) = args.conntrack_tcp_be_liberal {
        cfg.conntrack.tcp_be_liberal = liberal;
    }
    // IPVS mode masquerades with the iptables flag's bit, as kube-proxy.
    if matches!(cfg.mode, ProxyMode::Iptables | ProxyMode::Ipvs)
        && let Some(bit) = args.iptables_masquerade_bit
    {
        anyhow::ensure!(bit <= 31, "--iptables-masquerade-bit: {bit} is out of range 0-31");
        cfg.masquerade_bit = bit;
    }
    if cfg.mode == ProxyMode::Iptables
        && let Some(on) = args.iptables_localhost_nodeports
    {
        cfg.localhost_nodeports = on;
    }
    apply_ipvs_flags(&args.ipvs, &mut cfg)?;
    apply_ebpf_flags(&args.ebpf, &mut cfg.ebpf)?;
    let ignored = ignored.into_iter().filter(|f| f.ignored_in(cfg.mode)).collect();
    Ok((cfg, ignored))
}

/// Applies the `--ipvs-*` flags over the file's `ipvs:` section; the periods only in IPVS mode.
fn apply_ipvs_flags(args: &IpvsArgs, cfg: &mut ProxyConfig) -> anyhow::Result<()> {
    if let Some(name) = &args.ipvs_scheduler {
        cfg.ipvs.scheduler = name.parse().context("--ipvs-scheduler")?;
    }
    if let Some(strict) = args.ipvs_strict_arp {
        cfg.ipvs.strict_arp = strict;
    }
    if let Some(cidrs) = &args.ipvs_exclude_cidrs {
        cfg.ipvs.exclude_cidrs = parse_cidrs("--ipvs-exclude-cidrs", cidrs)?;
    }
    let timeouts = [
        ("--ipvs-tcp-timeout", &args.ipvs_tcp_timeout, &mut cfg.ipvs.tcp_timeout),
        ("--ipvs-tcpfin-timeout", &args.ipvs_tcpfin_timeout, &mut cfg.ipvs.tcp_fin_timeout),
        ("--ipvs-udp-timeout", &args.ipvs_udp_timeout, &mut cfg.ipvs.udp_timeout),
    ];
    for (flag, value, slot) in timeouts {
        if let Some(value) = value {
            *slot = parse_conntrack_timeout(flag, value)?;
        }
    }
    if cfg.mode == ProxyMode::Ipvs {
        if let Some(period) = &args.ipvs_min_sync_period {
            cfg.min_sync_period = parse_go_duration("--ipvs-min-sync-period", period)?;
        }
        if let Some(period) = &args.ipvs_sync_period {
            cfg.sync_period = parse_go_duration("--ipvs-sync-period", period)?;
        }
    }
    Ok(())
}

/// Applies the eBPF mode's flags.
fn apply_ebpf_flags(args: &EbpfArgs, cfg: &mut EbpfConfig) -> anyhow::Result<()> {
    if let Some(path) = &args.cgroup_root {
        cfg.cgroup_root = Some(path.clone());
    }
    if let Some(path) = &args.bpf_root {
        cfg.bpf_root = path.clone();
    }
    if let Some(entries) = args.bpf_lb_map_max {
        cfg.set_map_max(entries)?;
    }
    if let Some(size) = args.bpf_lb_maglev_table_size {
        cfg.set_maglev_table_size(size)?;
    }
    if let Some(devices) = &args.bpf_devices {
        cfg.set_devices(devices)?;
    }
    Ok(())
}

/// The one line logged per sync: what changed, what was rewritten, how long it took.
fn log_sync(report: &SyncReport, changes: &Changes) {
    tracing::info!(
        full = report.full,
        service_changes = changes.service_updates,
        endpoint_changes = changes.endpoint_updates,
        services = report.services_changed,
        ops = report.ops,
        refused = report.refused.len(),
        duration_ms = format!("{:.1}", report.duration.as_secs_f64() * 1e3),
        kernel_ms = format!("{:.1}", report.kernel.as_secs_f64() * 1e3),
        conntrack_deleted = report.conntrack_deleted,
        frontend_conflicts = report.frontend_conflicts,
        "synced rules"
    );
}

/// A runtime for the feed's watchers and the servers; the sync loop runs on the calling thread
/// (in `block_on`), so a long sync never stalls them.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// What the proxy reads: as kube-proxy, Services, EndpointSlices, ServiceCIDRs and its own Node.
fn interest(cfg: &ProxyConfig) -> Interest {
    let kinds = [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr].into();
    Interest { kinds, node: Some(cfg.hostname.clone()) }
}

/// Opens the cluster state (following changes with `follow`) and works out this node's identity.
async fn open(args: &ProxyArgs, cfg: &ProxyConfig, follow: bool) -> anyhow::Result<(Feed, NodeInfo)> {
    let spec = args.source.spec(cfg.kubeconfig.as_deref());
    let feed = Feed::open(&spec, &interest(cfg), follow).await.context("reading the cluster state")?;
    let node = node_info(&cfg.hostname, feed.store(), &host_addresses());
    tracing::info!(node = %node.name, ips = ?node.primary_ips, source = feed.describe(), "node identity");
    Ok((feed, node))
}

/// Writes kube-proxy's conntrack settings (see [`roadkeeper_proxy::sysctls`]), logging those the
/// node does not let us write, and returns `cfg` knowing whether the node's TCP tracking is
/// liberal (asked for, or found so: kube-proxy reads the kernel's flag too).
fn setup_conntrack(cfg: &ProxyConfig) -> ProxyConfig {
    let (failed, liberal) = sysctls::apply_conntrack(&cfg.conntrack);
    for err in failed {
        if err.write.node_wide() {
            tracing::warn!("{err} (node-wide: only the host's network namespace may change it)");
        } else {
            tracing::warn!("{err}");
        }
    }
    let mut cfg = cfg.clone();
    cfg.conntrack.tcp_be_liberal |= liberal;
    cfg
}

/// `--init-only`: writes the conntrack settings (in IPVS mode also loads the modules, checks
/// that the kernel has IPVS and writes IPVS's settings), failing with every one the node refused.
fn init_only(cfg: &ProxyConfig) -> anyhow::Result<()> {
    let (mut failed, _) = sysctls::apply_conntrack(&cfg.conntrack);
    if cfg.mode == ProxyMode::Ipvs {
        roadkeeper_proxy::ipvs::runner::load_modules(&cfg.ipvs);
        roadkeeper_proxy::ipvs::kernel::IpvsKernel::open().context("--proxy-mode ipvs")?;
        failed.extend(sysctls::apply_ipvs(cfg.ipvs.strict_arp));
    }
    if !failed.is_empty() {
        let errors: Vec<String> = failed.iter().map(ToString::to_string).collect();
        bail!("{} setting(s) not written:\n{}", errors.len(), errors.join("\n"));
    }
    Ok(())
}

/// The proxier of the configured backend, programming the kernel.
pub(crate) fn kernel_proxier(cfg: &ProxyConfig, node: NodeInfo, store: &Store) -> anyhow::Result<Box<dyn Proxier>> {
    let mut proxier: Box<dyn Proxier> = match cfg.mode {
        ProxyMode::Nftables => Box::new(NftProxier::new(cfg.clone(), node, NftBinary::default())),
        ProxyMode::Iptables => Box::new(IptablesProxier::new(cfg.clone(), node, IptablesBinary::new())),
        ProxyMode::Ipvs => {
            let runner = KernelRunner::open(&cfg.ipvs).context("starting IPVS mode")?;
            for err in sysctls::apply_ipvs(cfg.ipvs.strict_arp) {
                tracing::warn!("{err}");
            }
            Box::new(IpvsProxier::new(cfg.clone(), node, runner))
        }
        ProxyMode::Ebpf => ebpf_proxier(cfg, node)?,
    };
    // Upstream's line, which operators and the tutorials look for.
    tracing::info!("Using {} Proxier", cfg.mode);
    proxier.set_service_cidrs(service_cidrs(store));
    Ok(proxier)
}

/// eBPF mode's proxier: loads and attaches the programs where `--cgroup-root` and `--bpf-root`
/// say, adopting the maps a previous run pinned.
#[cfg(feature = "ebpf")]
fn ebpf_proxier(cfg: &ProxyConfig, node: NodeInfo) -> anyhow::Result<Box<dyn Proxier>> {
    use roadkeeper_proxy::ebpf::kernel::{EbpfKernel, Placement};
    let placement = Placement::of(&cfg.ebpf, &node.primary_ips).context("--proxy-mode ebpf")?;
    let kernel = EbpfKernel::open(&placement, &cfg.ebpf.limits).context("starting eBPF mode")?;
    tracing::info!(
        cgroup = %placement.cgroup.display(),
        pins = %placement.pin_dir.display(),
        devices = %placement.devices.join(","),
        "eBPF programs attached"
    );
    Ok(Box::new(EbpfProxier::new(cfg.clone(), node, kernel)))
}

/// Without feature `ebpf`, eBPF mode is refused.
#[cfg(not(feature = "ebpf"))]
fn ebpf_proxier(_: &ProxyConfig, _: NodeInfo) -> anyhow::Result<Box<dyn Proxier>> {
    bail!(
        "--proxy-mode ebpf: this roadkeeper was built without eBPF mode (cargo feature `ebpf`); nftables, iptables and ipvs work"
    )
}

/// `roadkeeper rules`: prints what a full sync would send, touching nothing.
pub fn print_rules(args: RulesArgs) -> anyhow::Result<()> {
    let RulesArgs { proxy: args, from_kernel } = args;
    let cfg = build_config(&args)?;
    if from_kernel {
        if cfg.mode != ProxyMode::Ebpf {
            bail!(
                "--from-kernel reads eBPF mode's maps; the other modes' kernel state is `nft list ruleset`, `iptables-save` or `ipvsadm -Ln`"
            );
        }
        print!("{}", roadkeeper_rules::ebpf::show::lb_list(&pinned_maps(&cfg)?));
        return Ok(());
    }
    let (feed, node) = runtime()?.block_on(open(&args, &cfg, false))?;
    let store = feed.store();
    match cfg.mode {
        ProxyMode::Nftables => {
            let mut proxier = NftProxier::new(cfg, node, Recorder::default());
            proxier.set_service_cidrs(service_cidrs(store));
            proxier.sync(store, &BTreeSet::new())?;
            print!("{}", proxier.runner().scripts.concat());
        }
        ProxyMode::Iptables => {
            let mut proxier = IptablesProxier::new(cfg, node, iptables::Recorder::default());
            proxier.set_service_cidrs(service_cidrs(store));
            proxier.sync(store, &BTreeSet::new())?;
            print!("{}", proxier.runner().script());
        }
        ProxyMode::Ipvs => {
            let plan = NodePlan::new(store, &cfg, &node, &service_cidrs(store)).ipvs();
            print!("{}", ipvs::show::rules_listing(&plan));
        }
        ProxyMode::Ebpf => {
            let mut proxier = EbpfProxier::new(cfg, node, FakeMaps::default());
            proxier.set_service_cidrs(service_cidrs(store));
            let report = proxier.sync(store, &BTreeSet::new())?;
            print!("{}", roadkeeper_rules::ebpf::show::lb_list(proxier.maps()));
            if !report.refused.is_empty() {
                let refusals: Vec<&str> = report.refused.iter().map(|(_, refusal)| refusal.as_str()).collect();
                bail!("the maps cannot hold {} Service(s):\n{}", refusals.len(), refusals.join("\n"));
            }
        }
    }
    Ok(())
}

/// `roadkeeper cleanup`: deletes our nftables tables, our iptables chains (both flavours, both
/// families), what IPVS mode made (its virtual servers, `kube-ipvs0`, its helper tables) and
/// eBPF mode's pins, and nothing else.
pub fn cleanup(args: &CleanupArgs) -> anyhow::Result<()> {
    NftBinary::default().apply(&transaction::cleanup()).context("removing nftables tables")?;
    iptables::cleanup().context("removing iptables chains")?;
    let deleted = roadkeeper_proxy::ipvs::runner::cleanup(&host_addresses()).context("removing IPVS mode's objects")?;
    if deleted > 0 {
        tracing::info!(virtual_servers = deleted, "deleted IPVS virtual servers");
    }
    cleanup_ebpf(&args.bpf_root)
}

/// Unpins eBPF mode's maps and links under `bpf_root`.
#[cfg(feature = "ebpf")]
fn cleanup_ebpf(bpf_root: &std::path::Path) -> anyhow::Result<()> {
    let cfg = EbpfConfig { bpf_root: bpf_root.to_path_buf(), ..EbpfConfig::default() };
    let removed = roadkeeper_proxy::ebpf::kernel::cleanup(&cfg.pin_dir()).context("removing eBPF mode's pins")?;
    if removed > 0 {
        tracing::info!(pins = removed, "unpinned eBPF maps and links");
    }
    Ok(())
}

/// What eBPF mode's pinned maps hold on this node.
#[cfg(feature = "ebpf")]
fn pinned_maps(cfg: &ProxyConfig) -> anyhow::Result<roadkeeper_rules::ebpf::Maps> {
    roadkeeper_proxy::ebpf::kernel::read_pinned(&cfg.ebpf.pin_dir(), cfg.ebpf.limits.maglev_table_size)
        .context("reading eBPF mode's pinned maps")
}

/// Without eBPF mode there are no maps to read.
#[cfg(not(feature = "ebpf"))]
fn pinned_maps(_: &ProxyConfig) -> anyhow::Result<roadkeeper_rules::ebpf::Maps> {
    bail!("--from-kernel: this roadkeeper was built without eBPF mode (cargo feature `ebpf`)")
}

/// Without eBPF mode nothing was pinned.
#[cfg(not(feature = "ebpf"))]
fn cleanup_ebpf(_: &std::path::Path) -> anyhow::Result<()> {
    Ok(())
}

/// Applies pending changes from the store to the proxier, then removes conntrack entries of
/// UDP/SCTP flows whose endpoint is gone.
fn sync_changes(
    proxier: &mut dyn Proxier,
    store: &Store,
    cfg: &ProxyConfig,
    node: &mut NodeInfo,
    changes: &Changes,
) -> anyhow::Result<SyncReport> {
    if changes.nodes.contains(&cfg.hostname) {
        *node = node_info(&cfg.hostname, store, &host_addresses());
        proxier.set_node(node.clone());
    }
    if changes.service_cidrs {
        proxier.set_service_cidrs(service_cidrs(store));
    }
    let mut report = proxier.sync(store, &changes.services)?;
    let node_ips: Vec<IpAddr> =
        [IpFamily::V4, IpFamily::V6].into_iter().flat_map(|f| node.nodeport_ips(f, cfg)).collect();
    match proxier.cleanup_stale_flows(&node_ips) {
        Ok(deleted) => report.conntrack_deleted = deleted,
        Err(err) => tracing::warn!("cleaning up stale flows: {err}"),
    }
    log_sync(&report, changes);
    Ok(report)
}

/// The health state, even if a panic poisoned its lock.
fn health_of(health: &SharedHealth) -> std::sync::MutexGuard<'_, ProxyHealth> {
    health.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `roadkeeper proxy`: first sync, then (unless `--once`) watch and re-sync until SIGTERM/SIGINT,
/// leaving the rules in place on exit.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let cfg = build_config(&args)?;
    if args.init_only {
        return init_only(&cfg);
    }
    let runtime = runtime()?;
    if args.once { run_once(&runtime, &args, &cfg) } else { runtime.block_on(run_watching(&args, &cfg)) }
}

/// `--once`: one sync; an error names the Services the kernel refused.
fn run_once(runtime: &tokio::runtime::Runtime, args: &ProxyArgs, cfg: &ProxyConfig) -> anyhow::Result<()> {
    let cfg = &setup_conntrack(cfg);
    let (feed, mut node) = runtime.block_on(open(args, cfg, false))?;
    let mut proxier = kernel_proxier(cfg, node.clone(), feed.store())?;
    let report = sync_changes(proxier.as_mut(), feed.store(), cfg, &mut node, &Changes::default())
        .context("programming the kernel")?;
    if !report.refused.is_empty() {
        let names: Vec<String> = report.refused.iter().map(|(k, e)| format!("{k}: {e}")).collect();
        bail!("the kernel refused the rules of {} Service(s):\n{}", names.len(), names.join("\n"));
    }
    Ok(())
}

/// What the sync loop updates after each sync besides the kernel.
struct Observers {
    health: SharedHealth,
    health_checks: HealthCheckServers,
    no_local_endpoints: NoLocalEndpoints,
    /// When the proxy started (network programming latency is measured for later changes).
    started: SystemTime,
}

impl Observers {
    /// Feeds the outcome of a sync of `applied` to the health state, the health-check servers and
    /// the metrics.
    fn synced(&mut self, proxier: &dyn Proxier, applied: &Changes, result: &anyhow::Result<SyncReport>) {
        match result {
            Ok(report) => {
                proxy_metrics::record_sync(report, applied, self.started);
                let changed = (!report.full).then(|| applied.services.iter());
                self.no_local_endpoints.update(proxier.table(), changed);
                health_of(&self.health).synced(SystemTime::now());
            }
            Err(_) => health_of(&self.health).sync_failed(Instant::now()),
        }
        self.health_checks.reconcile(proxier.table());
    }
}

/// Watch mode: serves health and metrics (see [`serve`]) from the start, opens the cluster state,
/// then runs the rate-limited sync loop, with the Services' health-check node ports (see
/// [`crate::healthcheck`]).
async fn run_watching(args: &ProxyArgs, cfg: &ProxyConfig) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Signals are caught from the start: a SIGTERM while waiting for the API server or during
    // the first sync still stops cleanly.
    let (mut sigterm, mut sigint) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    // Trigger times have whole seconds (they come from Pod conditions): the start is counted in
    // whole seconds too, so that a change made in the same second as the start still counts.
    let started = std::time::UNIX_EPOCH
        + Duration::from_secs(SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs());
    // Bound before anything else: a bad address fails before the kernel is touched.
    let healthz = serve::bind("--healthz-bind-address", &cfg.healthz_bind_address)?;
    let metrics = serve::bind("--metrics-bind-address", &cfg.metrics_bind_address)?;
    let cfg = &setup_conntrack(cfg);
    let (sync_period, min_sync_period) = (cfg.sync_period, cfg.min_sync_period);
    // kube-proxy's health timeout: a queued change older than two sync periods is unhealthy; the
    // first sync is queued from the start, so a proxy that never gets its state turns unhealthy.
    let health: SharedHealth = Arc::new(Mutex::new(ProxyHealth::new(2 * sync_period)));
    health_of(&health).queued(Instant::now());
    if let Some(listener) = healthz {
        serve::spawn_health(listener, health.clone())?;
    }
    if let Some(listener) = metrics {
        serve::spawn_proxy_metrics(listener, proxy_metrics::install()?, cfg.mode)?;
    }
    let (mut feed, mut node) = tokio::select! {
        opened = open(args, cfg, true) => opened?,
        _ = sigterm.recv() => return Ok(()),
        _ = sigint.recv() => return Ok(()),
    };
    let mut proxier = kernel_proxier(cfg, node.clone(), feed.store())?;
    let mut observers = Observers {
        health: health.clone(),
        health_checks: HealthCheckServers::new(health.clone()),
        no_local_endpoints: NoLocalEndpoints::default(),
        started,
    };
    health_of(&health).set_node_eligible(node_eligible(&cfg.hostname, feed.store()));
    let first = sync_changes(proxier.as_mut(), feed.store(), cfg, &mut node, &Changes::default());
    observers.synced(proxier.as_ref(), &Changes::default(), &first);
    if let Err(err) = &first {
        tracing::error!("first sync failed, retrying in {sync_period:?}: {err:#}");
    }

    let mut periodic = tokio::time::interval(sync_period);
    periodic.tick().await;
    let mut hourly = tokio::time::interval(FULL_SYNC_PERIOD);
    hourly.tick().await;
    let mut pending = Changes::default();
    let mut sync_due = first.is_err();
    let mut last_sync = Instant::now();
    loop {
        let due = tokio::time::Instant::from_std(last_sync + min_sync_period);
        let work = !pending.is_empty() || sync_due;
        if work {
            health_of(&health).queued(Instant::now());
        }
        tokio::select! {
            changes = feed.changed() => {
                if changes.nodes.contains(&cfg.hostname) {
                    health_of(&health).set_node_eligible(node_eligible(&cfg.hostname, feed.store()));
                }
                if !changes.is_empty() {
                    proxy_metrics::record_queued();
                }
                pending.merge(changes);
                proxy_metrics::record_pending(&pending);
            }
            _ = tokio::time::sleep_until(due), if work => {
                last_sync = Instant::now();
                let changes = std::mem::take(&mut pending);
                let result = sync_changes(proxier.as_mut(), feed.store(), cfg, &mut node, &changes);
                observers.synced(proxier.as_ref(), &changes, &result);
                match result {
                    Ok(_) => sync_due = false,
                    Err(err) => {
                        tracing::error!("sync failed, full resync in {sync_period:?}: {err:#}");
                        proxier.force_full_sync();
                        last_sync = Instant::now() + sync_period - min_sync_period.min(sync_period);
                        sync_due = true;
                    }
                }
            }
            _ = periodic.tick() => {
                match proxier.check_rules() {
                    RulesCheck::InPlace => {}
                    RulesCheck::Missing => {
                        tracing::warn!("our rules were removed or flushed by someone else; full resync");
                        proxier.force_full_sync();
                        sync_due = true;
                    }
                    RulesCheck::Unknown(err) => {
                        tracing::warn!("cannot tell whether our rules are in place (unknown), checking again in {sync_period:?}: {err}");
                    }
                }
                // Services the kernel refused are retried every syncPeriod, and so are
                // health-check ports that could not be bound.
                sync_due |= proxier.wants_retry();
                observers.health_checks.reconcile(proxier.table());
            }
            _ = hourly.tick() => {
                proxier.force_full_sync();
                sync_due = true;
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }
    tracing::info!("stopping; the rules stay in place");
    Ok(())
}
