//! `roadkeeper ingress`: publishing the Ingresses' `status.loadBalancer` (thin). The writes
//! [`StatusPlanner`] decides go to the API server's `status` subresource from a background task,
//! so that route updates never wait on the API; with `--manifests` there is no API to write to,
//! and they are logged instead.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use roadkeeper_cluster::k8s_openapi::api::networking::v1::Ingress;
use roadkeeper_cluster::kube::api::{Api, Patch, PatchParams};
use roadkeeper_cluster::kube::{self, Client};
use roadkeeper_cluster::{Changes, NamespacedName, SourceSpec, Store};
use roadkeeper_ingress::routes::RouteTable;
use roadkeeper_ingress::status::{Address, StatusPlanner, StatusUpdate, service_addresses};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cli::IngressArgs;

/// Delay before retrying a failed write, doubled after each failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest delay between two attempts of a failing write.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps the `status.loadBalancer` of the Ingresses we serve equal to our addresses.
pub struct StatusPublisher {
    planner: StatusPlanner,
    /// `--publish-service`: the Service whose addresses are ours, followed as it changes.
    service: Option<NamespacedName>,
    /// The writer task's queue; `None` when the cluster state comes from manifests (log only).
    writes: Option<mpsc::UnboundedSender<StatusUpdate>>,
}

impl StatusPublisher {
    /// A publisher of the addresses of `args` (those of `--publish-service` as `store` holds it)
    /// to the cluster of `spec`, or `None` (logged once, naming the flag) when there are none.
    /// With an API server, connects a client as the [`Feed`](roadkeeper_cluster::Feed) of `spec`
    /// does and starts the writer task on the current tokio runtime.
    pub async fn start(args: &IngressArgs, spec: &SourceSpec, store: &Store) -> anyhow::Result<Option<Self>> {
        let service = args.publish_service.clone();
        let addresses = match &service {
            Some(service) => published_by(store, service),
            None => match addresses(args) {
                Some(addresses) => addresses,
                None => {
                    tracing::info!(
                        "no Ingress status is published: --http and --https name no specific IP address; \
                         set --publish-service or --publish-status-address to where clients reach this controller"
                    );
                    return Ok(None);
                }
            },
        };
        let writes = match spec {
            SourceSpec::Manifests(_) => None,
            SourceSpec::Kubernetes(kubeconfig) => {
                let client = roadkeeper_cluster::client(kubeconfig.as_deref()).await?;
                let (writes, queue) = mpsc::unbounded_channel();
                tokio::spawn(write(client, queue));
                Some(writes)
            }
        };
        match &service {
            Some(service) => {
                tracing::info!(service = %service, addresses = %list(&addresses), "publishing the Service's addresses as the status of the Ingresses served")
            }
            None => tracing::info!(addresses = %list(&addresses), "publishing the status of the Ingresses served"),
        }
        Ok(Some(Self { planner: StatusPlanner::new(addresses), service, writes }))
    }

    /// Publishes the status of every Ingress of `store` that needs it, given the Ingresses
    /// `table` serves: after the first table.
    pub fn publish_all(&mut self, store: &Store, table: &RouteTable) {
        let updates = self.planner.plan_all(store, table);
        self.send(updates);
    }

    /// Publishes the status of the Ingresses `changes` touched (all after an IngressClass
    /// change, or after the addresses of the `--publish-service` Service changed), once `table`
    /// has applied them.
    pub fn publish(&mut self, store: &Store, table: &RouteTable, changes: &Changes) {
        if let Some(service) = self.service.as_ref().filter(|service| changes.services.contains(*service)) {
            let addresses = published_by(store, service);
            let text = list(&addresses);
            if self.planner.set_addresses(addresses) {
                tracing::info!(service = %service, addresses = %text, "the published Service's addresses changed");
                let updates = self.planner.plan_all(store, table);
                return self.send(updates);
            }
        }
        let updates = self.planner.plan(store, table, changes);
        self.send(updates);
    }

    fn send(&self, updates: Vec<StatusUpdate>) {
        for update in updates {
            let Some(writes) = &self.writes else {
                tracing::info!(
                    "Ingress {}: status.loadBalancer.ingress: [{}] (not written: the cluster state comes from \
                     --manifests)",
                    update.ingress,
                    list(&update.addresses)
                );
                continue;
            };
            if let Err(lost) = writes.send(update) {
                tracing::error!("Ingress {}: the status writer has stopped; status not written", lost.0.ingress);
            }
        }
    }
}

/// The addresses Service `service` of `store` publishes (none while it does not exist).
fn published_by(store: &Store, service: &NamespacedName) -> Vec<Address> {
    store.service(service).map(|service| service_addresses(service)).unwrap_or_default()
}

/// `--publish-status-address`, else the IP `--http` listens on if it is a specific one, else
/// that of `--https`.
fn addresses(args: &IngressArgs) -> Option<Vec<Address>> {
    if !args.publish_status_address.is_empty() {
        return Some(args.publish_status_address.clone());
    }
    [&args.http, &args.https]
        .into_iter()
        .filter_map(|listen| listen.parse::<SocketAddr>().ok())
        .map(|listen| listen.ip())
        .find(|ip| !ip.is_unspecified())
        .map(|ip| vec![Address::Ip(ip)])
}

fn list(addresses: &[Address]) -> String {
    addresses.iter().map(Address::to_string).collect::<Vec<_>>().join(", ")
}

/// The writer task: patches each queued status in turn, retrying failures with backoff; a later
/// update of the same Ingress replaces one still queued. Ends when the publisher is dropped.
async fn write(client: Client, mut updates: mpsc::UnboundedReceiver<StatusUpdate>) {
    let mut queue = Queue::default();
    loop {
        let due = queue.next_due();
        tokio::select! {
            update = updates.recv() => match update {
                Some(update) => queue.push(update, 0, Instant::now()),
                None => return,
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let Some((update, failures)) = queue.pop() else { continue };
                let result = patch(&client, &update).await;
                // Updates sent meanwhile supersede this one, should it have failed.
                while let Ok(newer) = updates.try_recv() {
                    queue.push(newer, 0, Instant::now());
                }
                match result {
                    Ok(()) => tracing::debug!("Ingress {}: status written", update.ingress),
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        tracing::debug!("Ingress {}: deleted before its status was written", update.ingress);
                    }
                    Err(err) if queue.contains(&update.ingress) => {
                        tracing::warn!("Ingress {}: writing status.loadBalancer: {err}; superseded", update.ingress);
                    }
                    Err(err) => {
                        let delay = RETRY_MIN.saturating_mul(1 << failures.min(16)).min(RETRY_MAX);
                        tracing::warn!(
                            "Ingress {}: writing status.loadBalancer: {err}; retrying in {delay:?}",
                            update.ingress
                        );
                        queue.push(update, failures + 1, Instant::now() + delay);
                    }
                }
            }
        }
    }
}

/// A merge patch of `status.loadBalancer.ingress` through the `status` subresource.
async fn patch(client: &Client, update: &StatusUpdate) -> Result<(), kube::Error> {
    let api: Api<Ingress> = Api::namespaced(client.clone(), &update.ingress.namespace);
    let patch = json!({"status": {"loadBalancer": {"ingress": update.entries()}}});
    api.patch_status(&update.ingress.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

/// Writes waiting for their turn, at most one per Ingress, taken in order of due time.
#[derive(Default)]
struct Queue {
    /// Per Ingress: when, the update, and how many attempts of it failed.
    pending: BTreeMap<NamespacedName, (Instant, StatusUpdate, u32)>,
    by_due: BTreeSet<(Instant, NamespacedName)>,
}

impl Queue {
    /// Queues `update` (after `failures` failed attempts) for `due`, replacing the queued update
    /// of the same Ingress.
    fn push(&mut self, update: StatusUpdate, failures: u32, due: Instant) {
        let key = update.ingress.clone();
        if let Some((old, ..)) = self.pending.insert(key.clone(), (due, update, failures)) {
            self.by_due.remove(&(old, key.clone()));
        }
        self.by_due.insert((due, key));
    }

    /// When the first queued update is due.
    fn next_due(&self) -> Option<Instant> {
        self.by_due.first().map(|(due, _)| *due)
    }

    /// Takes the first update due, with its failure count.
    fn pop(&mut self) -> Option<(StatusUpdate, u32)> {
        let (_, key) = self.by_due.pop_first()?;
        let (_, update, failures) = self.pending.remove(&key)?;
        Some((update, failures))
    }

    fn contains(&self, key: &NamespacedName) -> bool {
        self.pending.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(flags: &[&str]) -> Option<String> {
        addresses(&IngressArgs::parse_for_test(flags).unwrap()).map(|addresses| list(&addresses))
    }

    #[test]
    fn addresses_come_from_the_flag_else_from_a_specific_listen_address() {
        let flag = ["--publish-status-address", "192.0.2.10,lb.example.com", "--http", "10.0.0.1:80"];
        assert_eq!(published(&flag).as_deref(), Some("192.0.2.10, lb.example.com"));
        assert_eq!(published(&["--http", "10.0.0.1:80", "--https", "10.0.0.2:443"]).as_deref(), Some("10.0.0.1"));
        assert_eq!(published(&["--http", "[::]:80", "--https", "[fd00::2]:443"]).as_deref(), Some("fd00::2"));
        assert_eq!(published(&["--http", "", "--https", "10.0.0.2:443"]).as_deref(), Some("10.0.0.2"));
        assert_eq!(published(&[]), None, "0.0.0.0 by default");
        assert_eq!(published(&["--http", "[::]:80", "--https", ""]), None);
    }

    #[test]
    fn a_bad_address_is_refused_at_start_naming_the_flag_and_the_value() {
        let err = IngressArgs::parse_for_test(&["--publish-status-address", "192.0.2.10,LB_1.example"]).unwrap_err();
        assert!(err.contains("--publish-status-address") && err.contains("LB_1.example"), "{err}");
    }

    #[test]
    fn a_later_update_replaces_the_queued_one_of_the_same_ingress() {
        let update = |name: &str, addresses: &str| StatusUpdate {
            ingress: NamespacedName::new("ns", name),
            addresses: addresses.split(',').filter(|a| !a.is_empty()).map(|a| a.parse().unwrap()).collect(),
        };
        let now = Instant::now();
        let mut queue = Queue::default();
        queue.push(update("a", "192.0.2.1"), 2, now + Duration::from_secs(4));
        queue.push(update("b", "192.0.2.1"), 0, now + Duration::from_secs(1));
        queue.push(update("a", ""), 0, now);
        assert_eq!(queue.next_due(), Some(now));
        assert_eq!(queue.pop(), Some((update("a", ""), 0)));
        assert_eq!(queue.pop(), Some((update("b", "192.0.2.1"), 0)));
        assert_eq!((queue.pop(), queue.next_due()), (None, None));
    }
}
