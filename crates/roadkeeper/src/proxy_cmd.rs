//! `roadkeeper proxy`, `rules` and `cleanup`: wiring the manifest source to the nftables proxier.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use roadkeeper_cluster::{Changes, ManifestError, ManifestSource, Store, watch};
use roadkeeper_proxy::config::{NodePortAddresses, ProxyConfig, ProxyMode, parse_cidrs, parse_go_duration};
use roadkeeper_proxy::conntrack;
use roadkeeper_proxy::health::ProxyHealth;
use roadkeeper_proxy::iptables::{self, IptablesBinary, IptablesProxier};
use roadkeeper_proxy::nft::apply::{NftBinary, NftRunner, Recorder};
use roadkeeper_proxy::nft::proxier::NftProxier;
use roadkeeper_proxy::nft::transaction;
use roadkeeper_proxy::node::{host_addresses, hostname, node_info};
use roadkeeper_proxy::proxier::{Proxier, SyncReport, service_cidrs};
use roadkeeper_proxy::table::{IpFamily, NodeInfo};

use crate::cli::ProxyArgs;
use crate::healthcheck::HealthCheckServers;
use crate::serve::{self, SharedHealth};

/// How long file events are collected before a reload.
const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);
/// A full resync rewrites everything this often even when nothing seems wrong (upstream's
/// nftables proxier does the same, hourly).
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// Merges the config file and the flags (flags win), as kube-proxy does.
fn build_config(args: &ProxyArgs) -> anyhow::Result<ProxyConfig> {
    let mut cfg = ProxyConfig::default();
    if let Some(file) = &args.config {
        cfg.apply_file(file)?;
    }
    if let Some(name) = &args.hostname_override {
        cfg.hostname = name.clone();
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
    if let Some(address) = &args.healthz_bind_address {
        cfg.healthz_bind_address = address.clone();
    }
    if let Some(address) = &args.metrics_bind_address {
        cfg.metrics_bind_address = address.clone();
    }
    if let Some(mode) = &args.proxy_mode {
        cfg.mode = mode.parse()?;
    }
    if cfg.mode == ProxyMode::Iptables {
        if let Some(bit) = args.iptables_masquerade_bit {
            anyhow::ensure!(bit <= 31, "--iptables-masquerade-bit: {bit} is out of range 0-31");
            cfg.masquerade_bit = bit;
        }
        if let Some(period) = &args.iptables_min_sync_period {
            cfg.min_sync_period = parse_go_duration("--iptables-min-sync-period", period)?;
        }
        if let Some(period) = &args.iptables_sync_period {
            cfg.sync_period = parse_go_duration("--iptables-sync-period", period)?;
        }
        if let Some(on) = args.iptables_localhost_nodeports {
            cfg.localhost_nodeports = on;
        }
    }
    Ok(cfg)
}

fn log_manifest_errors(errors: &[ManifestError]) {
    for error in errors {
        tracing::error!("{error}");
    }
}

fn log_sync(report: &SyncReport) {
    tracing::info!(
        full = report.full,
        services = report.services_changed,
        ops = report.ops,
        refused = report.refused.len(),
        duration_ms = format!("{:.1}", report.duration.as_secs_f64() * 1e3),
        kernel_ms = format!("{:.1}", report.kernel.as_secs_f64() * 1e3),
        conntrack_deleted = report.conntrack_deleted,
        "synced rules"
    );
}

/// Loads the config and the manifests, and works out this node's identity.
fn load(args: &ProxyArgs) -> anyhow::Result<(ManifestSource, ProxyConfig, NodeInfo)> {
    let cfg = build_config(args)?;
    let (source, errors) = ManifestSource::load(&args.manifests)
        .with_context(|| format!("reading manifests from {}", args.manifests.display()))?;
    log_manifest_errors(&errors);
    let node = node_info(&cfg.hostname, source.store(), &host_addresses());
    tracing::info!(node = %node.name, ips = ?node.primary_ips, "node identity");
    Ok((source, cfg, node))
}

/// The proxier of the configured backend, programming the kernel.
pub(crate) fn kernel_proxier(cfg: &ProxyConfig, node: NodeInfo, store: &Store) -> Box<dyn Proxier> {
    let mut proxier: Box<dyn Proxier> = match cfg.mode {
        ProxyMode::Nftables => Box::new(NftProxier::new(cfg.clone(), node, NftBinary)),
        ProxyMode::Iptables => Box::new(IptablesProxier::new(cfg.clone(), node, IptablesBinary::new())),
    };
    proxier.set_service_cidrs(service_cidrs(store));
    proxier
}

/// `roadkeeper rules`: prints what a full sync would send, touching nothing.
pub fn print_rules(args: ProxyArgs) -> anyhow::Result<()> {
    let (source, cfg, node) = load(&args)?;
    match cfg.mode {
        ProxyMode::Nftables => {
            let mut proxier = NftProxier::new(cfg, node, Recorder::default());
            proxier.set_service_cidrs(service_cidrs(source.store()));
            proxier.sync(source.store(), &BTreeSet::new())?;
            print!("{}", proxier.runner().scripts.concat());
        }
        ProxyMode::Iptables => {
            let mut proxier = IptablesProxier::new(cfg, node, iptables::Recorder::default());
            proxier.set_service_cidrs(service_cidrs(source.store()));
            proxier.sync(source.store(), &BTreeSet::new())?;
            print!("{}", proxier.runner().script());
        }
    }
    Ok(())
}

/// `roadkeeper cleanup`: deletes our nftables tables and our iptables chains (both flavours, both
/// families), and nothing else.
pub fn cleanup() -> anyhow::Result<()> {
    NftBinary.apply(&transaction::cleanup()).context("removing nftables tables")?;
    iptables::cleanup().context("removing iptables chains")?;
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
    match conntrack::cleanup_stale_flows(proxier.table(), &node_ips) {
        Ok(deleted) => report.conntrack_deleted = deleted,
        Err(err) => tracing::warn!("cleaning up stale conntrack entries: {err}"),
    }
    log_sync(&report);
    Ok(report)
}

/// The health state, even if a panic poisoned its lock.
fn health_of(health: &SharedHealth) -> std::sync::MutexGuard<'_, ProxyHealth> {
    health.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Feeds the outcome of a sync to the health state and the metrics.
fn record(health: &SharedHealth, result: &anyhow::Result<SyncReport>) {
    match result {
        Ok(report) => {
            serve::record_sync(report);
            health_of(health).synced(SystemTime::now());
        }
        Err(_) => health_of(health).sync_failed(Instant::now()),
    }
}

/// `roadkeeper proxy`: first sync, then (unless `--once`) watch and re-sync until SIGTERM/SIGINT,
/// leaving the rules in place on exit.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    if args.once { run_once(&args) } else { run_watching(&args) }
}

/// `--once`: one sync; an error names the Services the kernel refused.
fn run_once(args: &ProxyArgs) -> anyhow::Result<()> {
    let (source, cfg, mut node) = load(args)?;
    let mut proxier = kernel_proxier(&cfg, node.clone(), source.store());
    let report = sync_changes(proxier.as_mut(), source.store(), &cfg, &mut node, &Changes::default())
        .context("programming the kernel")?;
    if !report.refused.is_empty() {
        let names: Vec<String> = report.refused.iter().map(|(k, e)| format!("{k}: {e}")).collect();
        bail!("the kernel refused the rules of {} Service(s):\n{}", names.len(), names.join("\n"));
    }
    Ok(())
}

/// Watch mode: the rate-limited sync loop, serving health and metrics (see [`serve`]) and the
/// Services' health-check node ports (see [`crate::healthcheck`]).
fn run_watching(args: &ProxyArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Signals are caught from the start: a SIGTERM during the first sync still stops cleanly.
    let (mut sigterm, mut sigint) = {
        let _context = runtime.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?)
    };
    // Watch before reading, so that no edit between the first read and the watch goes unseen.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _watcher = watch(&args.manifests, WATCH_DEBOUNCE, move |paths| {
        let _ = tx.send(paths);
    })
    .with_context(|| format!("watching {}", args.manifests.display()))?;
    let (mut source, cfg, mut node) = load(args)?;
    // Bound before the first sync: a bad address fails before the kernel is touched.
    let healthz = serve::bind("--healthz-bind-address", &cfg.healthz_bind_address)?;
    let metrics = serve::bind("--metrics-bind-address", &cfg.metrics_bind_address)?;
    let metrics = metrics.map(|listener| serve::install_metrics().map(|handle| (listener, handle))).transpose()?;
    let (sync_period, min_sync_period) = (cfg.sync_period, cfg.min_sync_period);
    // kube-proxy's health timeout: a queued change older than two sync periods is unhealthy.
    let health: SharedHealth = Arc::new(Mutex::new(ProxyHealth::new(2 * sync_period)));
    let mut proxier = kernel_proxier(&cfg, node.clone(), source.store());
    health_of(&health).queued(Instant::now());
    let first = sync_changes(proxier.as_mut(), source.store(), &cfg, &mut node, &Changes::default());
    record(&health, &first);
    if let Err(err) = &first {
        tracing::error!("first sync failed, retrying in {sync_period:?}: {err:#}");
    }

    runtime.block_on(async move {
        if let Some(listener) = healthz {
            serve::spawn_health(listener, health.clone())?;
        }
        if let Some((listener, handle)) = metrics {
            serve::spawn_metrics(listener, handle)?;
        }
        let mut health_checks = HealthCheckServers::new(health.clone());
        health_checks.reconcile(proxier.table());
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
                Some(paths) = rx.recv() => {
                    let (changes, errors) = source.reload(&paths);
                    log_manifest_errors(&errors);
                    pending.merge(changes);
                }
                _ = tokio::time::sleep_until(due), if work => {
                    last_sync = Instant::now();
                    let changes = std::mem::take(&mut pending);
                    let result = sync_changes(proxier.as_mut(), source.store(), &cfg, &mut node, &changes);
                    record(&health, &result);
                    health_checks.reconcile(proxier.table());
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
                    if !proxier.healthy() {
                        tracing::warn!("our nftables tables were removed or flushed by someone else; full resync");
                        proxier.force_full_sync();
                        sync_due = true;
                    }
                    // Services the kernel refused are retried every syncPeriod, and so are
                    // health-check ports that could not be bound.
                    sync_due |= proxier.has_refused();
                    health_checks.reconcile(proxier.table());
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
    })
}
