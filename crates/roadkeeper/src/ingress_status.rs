//! `roadkeeper ingress`: publishing the Ingresses' `status.loadBalancer` (thin). The writes
//! [`StatusPlanner`] decides go to the API server's `status` subresource from a background task,
//! so that route updates never wait on the API; with `--manifests` there is no API to write to,
//! and they are logged instead.

use std::net::SocketAddr;

use roadkeeper_cluster::k8s_openapi::api::networking::v1::Ingress;
use roadkeeper_cluster::kube::api::{Api, Patch, PatchParams};
use roadkeeper_cluster::kube::{self, Client};
use roadkeeper_cluster::{Changes, NamespacedName, SourceSpec, Store};
use roadkeeper_ingress::routes::RouteTable;
use roadkeeper_ingress::status::{Address, StatusPlanner, StatusUpdate, service_addresses};
use serde_json::json;
use tokio::sync::mpsc;

use crate::cli::IngressArgs;
use crate::status_writer;

/// Keeps the `status.loadBalancer` of the Ingresses we serve equal to our addresses.
pub struct StatusPublisher {
    planner: StatusPlanner,
    /// `--publish-service`: the Service whose addresses are ours, followed as it changes.
    service: Option<NamespacedName>,
    /// The writer task's queue; `None` when the cluster state comes from manifests (log only).
    writes: Option<mpsc::UnboundedSender<(NamespacedName, StatusUpdate)>>,
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
                tokio::spawn(status_writer::run("the Ingress's status.loadBalancer", queue, move |_, update| {
                    patch(client.clone(), update)
                }));
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
            if let Err(lost) = writes.send((update.ingress.clone(), update)) {
                tracing::error!("Ingress {}: the status writer has stopped; status not written", (lost.0).0);
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

/// A merge patch of `status.loadBalancer.ingress` through the `status` subresource.
async fn patch(client: Client, update: StatusUpdate) -> Result<(), kube::Error> {
    let api: Api<Ingress> = Api::namespaced(client, &update.ingress.namespace);
    let patch = json!({"status": {"loadBalancer": {"ingress": update.entries()}}});
    api.patch_status(&update.ingress.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
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
}
