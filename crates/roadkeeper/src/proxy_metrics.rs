//! The proxy's Prometheus metrics, named as kube-proxy's (plus `roadkeeper_*` where they add
//! information), and how the sync loop records them. Rendering is [`crate::serve`]'s job.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use roadkeeper_cluster::{Changes, NamespacedName};
use roadkeeper_proxy::proxier::SyncReport;
use roadkeeper_rules::table::ServicePort;

use crate::serve::{HEALTHZ, LIVEZ};

const SYNC_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
const SYNC_FULL_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
const SYNC_PARTIAL_DURATION: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
const SYNC_LAST_TIMESTAMP: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const SYNC_LAST_QUEUED: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
const NETWORK_PROGRAMMING: &str = "kubeproxy_network_programming_duration_seconds";
const SERVICE_CHANGES: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
const ENDPOINT_CHANGES: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
const SERVICE_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_service_changes_pending";
const ENDPOINT_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
const NO_LOCAL_ENDPOINTS: &str = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
const CONNTRACK_DELETED: &str = "kubeproxy_conntrack_reconciler_deleted_entries_total";
const KERNEL_DURATION: &str = "roadkeeper_sync_kernel_seconds";
const SERVICES_SYNCED: &str = "roadkeeper_sync_services_changed";
const FRONTEND_CONFLICTS: &str = "roadkeeper_sync_proxy_rules_frontend_conflicts";
const REFUSED: &str = "roadkeeper_sync_proxy_rules_refused_services";

/// Installs the global Prometheus recorder and describes every metric, so that they are listed
/// from the start. Histogram buckets are kube-proxy's: 1 ms doubling to about 16 s for sync
/// durations; 0.25 s to 5 min for network programming latency.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let sync_buckets = crate::serve::doubling_buckets(0.001, 15);
    let programming_buckets: Vec<f64> = [0.25, 0.5]
        .into_iter()
        .chain((1..60).map(f64::from))
        .chain((0..12).map(|i| 60.0 + 5.0 * f64::from(i)))
        .chain((0..7).map(|i| 120.0 + 30.0 * f64::from(i)))
        .collect();
    let handle = crate::serve::install(
        PrometheusBuilder::new()
            .set_buckets(&sync_buckets)?
            .set_buckets_for_metric(Matcher::Full(NETWORK_PROGRAMMING.into()), &programming_buckets)?,
    )?;
    describe_histogram!(SYNC_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds");
    describe_histogram!(SYNC_FULL_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds for full resyncs");
    describe_histogram!(SYNC_PARTIAL_DURATION, Unit::Seconds, "SyncProxyRules latency in seconds for partial resyncs");
    describe_gauge!(SYNC_LAST_TIMESTAMP, Unit::Seconds, "The last time proxy rules were successfully synced");
    describe_gauge!(SYNC_LAST_QUEUED, Unit::Seconds, "The last time a sync of proxy rules was queued");
    describe_histogram!(
        NETWORK_PROGRAMMING,
        Unit::Seconds,
        "In Cluster Network Programming Latency in seconds (from an EndpointSlice's last-change-trigger-time)"
    );
    describe_counter!(SERVICE_CHANGES, "Cumulative proxy rules Service changes");
    describe_counter!(ENDPOINT_CHANGES, "Cumulative proxy rules EndpointSlice changes");
    describe_gauge!(SERVICE_CHANGES_PENDING, "Pending proxy rules Service changes");
    describe_gauge!(ENDPOINT_CHANGES_PENDING, "Pending proxy rules EndpointSlice changes");
    describe_gauge!(
        NO_LOCAL_ENDPOINTS,
        "Number of Service ports with a Local traffic policy and no local endpoints, by traffic_policy"
    );
    describe_counter!(CONNTRACK_DELETED, "Cumulative conntrack flows deleted by conntrack reconciliation");
    describe_counter!(HEALTHZ, "Cumulative proxy healthz HTTP status");
    describe_counter!(LIVEZ, "Cumulative proxy livez HTTP status");
    describe_histogram!(KERNEL_DURATION, Unit::Seconds, "Part of each sync spent in the kernel and its tools");
    describe_histogram!(SERVICES_SYNCED, "Number of Services whose rules each sync rewrote");
    describe_gauge!(
        FRONTEND_CONFLICTS,
        "Frontends (IP, protocol, port) claimed by a Service but held by an older one, skipped for it"
    );
    describe_gauge!(
        REFUSED,
        "Services the kernel (or eBPF mode's map sizes) refused at the last sync: they keep their last good rules"
    );
    gauge!(FRONTEND_CONFLICTS).set(0.0);
    gauge!(REFUSED).set(0.0);
    for name in [SERVICE_CHANGES, ENDPOINT_CHANGES, CONNTRACK_DELETED] {
        counter!(name).absolute(0);
    }
    // Registered now so that it is listed (empty) before the first EndpointSlice change.
    let _ = histogram!(NETWORK_PROGRAMMING);
    record_pending(&Changes::default());
    Ok(handle)
}

/// Records the changes waiting for the next sync.
/// Records that changes arrived: a sync is queued for them.
pub fn record_queued() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    gauge!(SYNC_LAST_QUEUED).set(now.as_secs_f64());
}

/// Records the changes not yet synced.
pub fn record_pending(pending: &Changes) {
    gauge!(SERVICE_CHANGES_PENDING).set(pending.service_updates as f64);
    gauge!(ENDPOINT_CHANGES_PENDING).set(pending.endpoint_updates as f64);
}

/// Records a successful sync of `applied`. Network programming latency is observed for trigger
/// times after `since` (the proxy's start: older ones measure the proxy's downtime, not the
/// network's programming).
pub fn record_sync(report: &SyncReport, applied: &Changes, since: SystemTime) {
    let seconds = report.duration.as_secs_f64();
    histogram!(SYNC_DURATION).record(seconds);
    histogram!(if report.full { SYNC_FULL_DURATION } else { SYNC_PARTIAL_DURATION }).record(seconds);
    histogram!(KERNEL_DURATION).record(report.kernel.as_secs_f64());
    histogram!(SERVICES_SYNCED).record(report.services_changed as f64);
    let now = SystemTime::now();
    gauge!(SYNC_LAST_TIMESTAMP).set(now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64());
    for trigger in applied.trigger_times.iter().filter(|&&t| t >= since) {
        histogram!(NETWORK_PROGRAMMING).record(now.duration_since(*trigger).unwrap_or_default().as_secs_f64());
    }
    counter!(SERVICE_CHANGES).increment(applied.service_updates as u64);
    counter!(ENDPOINT_CHANGES).increment(applied.endpoint_updates as u64);
    counter!(CONNTRACK_DELETED).increment(report.conntrack_deleted);
    gauge!(FRONTEND_CONFLICTS).set(report.frontend_conflicts as f64);
    // A partial sync retries every Service refused before, so its report lists all of them.
    gauge!(REFUSED).set(report.refused.len() as f64);
    record_pending(&Changes::default());
}

/// kube-proxy's `no_local_endpoints_total{traffic_policy}` gauges, kept per Service so that a
/// sync updates them in O(changed Services).
#[derive(Debug, Default)]
pub struct NoLocalEndpoints {
    /// Per Service: its ports lacking local endpoints for (internal, external) traffic.
    per_service: BTreeMap<NamespacedName, (u64, u64)>,
    internal: u64,
    external: u64,
}

impl NoLocalEndpoints {
    /// Recounts `services` (every Service in `table` when `None`) and sets the gauges.
    pub fn update<'a>(
        &mut self,
        table: &BTreeMap<NamespacedName, Vec<ServicePort>>,
        services: Option<impl Iterator<Item = &'a NamespacedName>>,
    ) {
        match services {
            Some(services) => services.for_each(|name| self.recount(name, table.get(name))),
            None => {
                *self = Self::default();
                table.iter().for_each(|(name, ports)| self.recount(name, Some(ports)));
            }
        }
        gauge!(NO_LOCAL_ENDPOINTS, "traffic_policy" => "internal").set(self.internal as f64);
        gauge!(NO_LOCAL_ENDPOINTS, "traffic_policy" => "external").set(self.external as f64);
    }

    fn recount(&mut self, name: &NamespacedName, ports: Option<&Vec<ServicePort>>) {
        let (old_internal, old_external) = self.per_service.remove(name).unwrap_or_default();
        self.internal -= old_internal;
        self.external -= old_external;
        let (internal, external) = ports
            .into_iter()
            .flatten()
            .map(ServicePort::lacks_local_endpoints)
            .fold((0, 0), |(i, e), (lacks_internal, lacks_external)| {
                (i + u64::from(lacks_internal), e + u64::from(lacks_external))
            });
        if (internal, external) != (0, 0) {
            self.per_service.insert(name.clone(), (internal, external));
            self.internal += internal;
            self.external += external;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roadkeeper_rules::table::{Endpoint, Protocol};

    fn port(internal_local: bool, local_endpoints: usize) -> ServicePort {
        let endpoint = Endpoint { ip: "10.244.1.5".parse().unwrap(), port: 80, is_local: true };
        let service = NamespacedName::new("ns", "a");
        let mut port = ServicePort::for_test(service, Protocol::Tcp, "10.96.0.1".parse().unwrap(), 80, vec![endpoint]);
        port.internal_policy_local = internal_local;
        port.local_endpoints = vec![port.cluster_endpoints[0].clone(); local_endpoints];
        port
    }

    #[test]
    fn counts_are_updated_per_changed_service() {
        let (a, b) = (NamespacedName::new("ns", "a"), NamespacedName::new("ns", "b"));
        let mut table =
            BTreeMap::from([(a.clone(), vec![port(true, 0), port(true, 0)]), (b.clone(), vec![port(false, 0)])]);
        let mut gauges = NoLocalEndpoints::default();
        gauges.update(&table, None::<std::iter::Empty<&NamespacedName>>);
        assert_eq!((gauges.internal, gauges.external), (2, 0));
        table.insert(a.clone(), vec![port(true, 1)]);
        table.insert(b.clone(), vec![port(true, 0)]);
        gauges.update(&table, Some([&b].into_iter()));
        assert_eq!((gauges.internal, gauges.external), (3, 0), "only b was recounted");
        gauges.update(&table, Some([&a].into_iter()));
        assert_eq!((gauges.internal, gauges.external), (1, 0));
        table.remove(&b);
        gauges.update(&table, Some([&b].into_iter()));
        assert_eq!((gauges.internal, gauges.external), (0, 0));
    }
}
