//! `roadkeeper proxy`, `rules` and `cleanup`: wiring the manifest source to the nftables proxier.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use roadkeeper_cluster::{Changes, ManifestError, ManifestSource, Store, watch};
use roadkeeper_proxy::config::{NodePortAddresses, ProxyConfig, ProxyMode, parse_cidrs};
use roadkeeper_proxy::nft::apply::{NftBinary, NftRunner, Recorder};
use roadkeeper_proxy::nft::transaction;
use roadkeeper_proxy::node::{host_addresses, hostname, node_info};
use roadkeeper_proxy::nft::proxier::NftProxier;
use roadkeeper_proxy::proxier::{Proxier, SyncReport, service_cidrs};
use roadkeeper_proxy::table::NodeInfo;

use crate::cli::ProxyArgs;

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
    if let Some(mode) = &args.proxy_mode {
        cfg.mode = mode.parse()?;
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
fn kernel_proxier(cfg: &ProxyConfig, node: NodeInfo, store: &Store) -> Box<dyn Proxier> {
    let mut proxier: Box<dyn Proxier> = match cfg.mode {
        ProxyMode::Nftables => Box::new(NftProxier::new(cfg.clone(), node, NftBinary)),
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
    }
    Ok(())
}

/// `roadkeeper cleanup`: deletes our tables.
pub fn cleanup() -> anyhow::Result<()> {
    NftBinary.apply(&transaction::cleanup()).context("removing nftables tables")?;
    Ok(())
}

/// Applies pending changes from the store to the proxier.
fn sync_changes(proxier: &mut dyn Proxier, store: &Store, hostname: &str, changes: &Changes) -> anyhow::Result<SyncReport> {
    if changes.nodes.contains(hostname) {
        proxier.set_node(node_info(hostname, store, &host_addresses()));
    }
    if changes.service_cidrs {
        proxier.set_service_cidrs(service_cidrs(store));
    }
    let report = proxier.sync(store, &changes.services)?;
    log_sync(&report);
    Ok(report)
}

/// `roadkeeper proxy`: first sync, then (unless `--once`) watch and re-sync until SIGTERM/SIGINT,
/// leaving the rules in place on exit.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let (mut source, cfg, node) = load(&args)?;
    let mut proxier = kernel_proxier(&cfg, node, source.store());
    let ProxyConfig { hostname, sync_period, min_sync_period, .. } = cfg;
    let first = sync_changes(proxier.as_mut(), source.store(), &hostname, &Changes::default());
    if args.once {
        let report = first.context("programming the kernel")?;
        if !report.refused.is_empty() {
            let names: Vec<String> = report.refused.iter().map(|(k, e)| format!("{k}: {e}")).collect();
            bail!("the kernel refused the rules of {} Service(s):\n{}", names.len(), names.join("\n"));
        }
        return Ok(());
    }
    if let Err(err) = &first {
        tracing::error!("first sync failed, retrying in {sync_period:?}: {err:#}");
    }

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _watcher = watch(source.dir(), WATCH_DEBOUNCE, move |paths| {
            let _ = tx.send(paths);
        })?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
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
            tokio::select! {
                Some(paths) = rx.recv() => {
                    let (changes, errors) = source.reload(&paths);
                    log_manifest_errors(&errors);
                    pending.merge(changes);
                }
                _ = tokio::time::sleep_until(due), if work => {
                    last_sync = Instant::now();
                    let changes = std::mem::take(&mut pending);
                    match sync_changes(proxier.as_mut(), source.store(), &hostname, &changes) {
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
                    // Services the kernel refused are retried every syncPeriod.
                    sync_due |= proxier.has_refused();
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
