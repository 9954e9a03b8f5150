//! The Kubernetes API source: kube-rs watchers feeding the [`Store`].
//!
//! One watcher task per kind (list, then watch from the list's resourceVersion with bookmarks;
//! a relist on `410 Gone`; reconnects with kube-runtime's exponential backoff) sends its events
//! to [`ApiSource`], which applies them to the store on the caller's task. The store plays the
//! part of kube-rs' reflector (a second, reflector-owned copy of every object would only double
//! the memory): a relist is buffered from `Init` to `InitDone` and then swapped in, so objects
//! that vanished while the watch was down are deleted and nothing is flushed in between. A kind
//! the server does not serve (the Gateway API's before their CRDs are installed) counts as listed
//! and empty until it is served.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, ServiceCIDR};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::{self, error::SendError};
use tokio::task::JoinHandle;

use crate::gateway_api::gatewayclasses::GatewayClass;
use crate::gateway_api::gateways::Gateway;
use crate::gateway_api::grpcroutes::GRPCRoute;
use crate::gateway_api::httproutes::HTTPRoute;
use crate::gateway_api::referencegrants::ReferenceGrant;
use crate::object::{Kind, ObjectKey};
use crate::store::Batch;
use crate::validate::validate;
use crate::{Changes, Error, Interest, Object, Store};

/// One watcher event, typed as an [`Object`].
type Update = (Kind, Event<Object>);

/// Cluster state from a Kubernetes API server.
#[derive(Debug)]
pub(crate) struct ApiSource {
    store: Store,
    updates: mpsc::UnboundedReceiver<Update>,
    /// Objects listed since a kind's `Init`, swapped in at its `InitDone`.
    relists: BTreeMap<Kind, BTreeMap<ObjectKey, Object>>,
    /// Kinds whose first list has not completed yet.
    unsynced: BTreeSet<Kind>,
    /// The watcher tasks, aborted on drop.
    tasks: Vec<JoinHandle<()>>,
    /// The API server's URL, for logs.
    server: String,
}

impl Drop for ApiSource {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl ApiSource {
    /// Connects as kube-proxy does (`kubeconfig`, else `KUBECONFIG` or `~/.kube/config`, else the
    /// in-cluster service account) and starts watching the kinds of `interest`. Must run inside a
    /// tokio runtime.
    pub(crate) async fn connect(kubeconfig: Option<&Path>, interest: &Interest) -> Result<Self, Error> {
        let config = config(kubeconfig).await?;
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(Error::kube)?;
        let (tx, updates) = mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for &kind in &interest.kinds {
            let task = match kind {
                Kind::Service => spawn::<Service>(&client, kind, watcher::Config::default(), &tx),
                Kind::EndpointSlice => spawn::<EndpointSlice>(&client, kind, watcher::Config::default(), &tx),
                Kind::Node => {
                    let mut config = watcher::Config::default();
                    if let Some(node) = &interest.node {
                        config = config.fields(&format!("metadata.name={node}"));
                    }
                    spawn::<Node>(&client, kind, config, &tx)
                }
                Kind::ServiceCidr => spawn::<ServiceCIDR>(&client, kind, watcher::Config::default(), &tx),
                Kind::Pod => spawn::<Pod>(&client, kind, watcher::Config::default(), &tx),
                Kind::Namespace => spawn::<Namespace>(&client, kind, watcher::Config::default(), &tx),
                Kind::Ingress => spawn::<Ingress>(&client, kind, watcher::Config::default(), &tx),
                Kind::IngressClass => spawn::<IngressClass>(&client, kind, watcher::Config::default(), &tx),
                Kind::Deployment => spawn::<Deployment>(&client, kind, watcher::Config::default(), &tx),
                Kind::ConfigMap => spawn::<ConfigMap>(&client, kind, watcher::Config::default(), &tx),
                Kind::GatewayClass => spawn::<GatewayClass>(&client, kind, watcher::Config::default(), &tx),
                Kind::Gateway => spawn::<Gateway>(&client, kind, watcher::Config::default(), &tx),
                Kind::HttpRoute => spawn::<HTTPRoute>(&client, kind, watcher::Config::default(), &tx),
                Kind::ReferenceGrant => spawn::<ReferenceGrant>(&client, kind, watcher::Config::default(), &tx),
                Kind::GrpcRoute => spawn::<GRPCRoute>(&client, kind, watcher::Config::default(), &tx),
                // Only TLS Secrets are read (certificates for Ingresses): the field selector keeps the
                // others out of memory and off the wire.
                Kind::Secret => {
                    spawn::<Secret>(&client, kind, watcher::Config::default().fields("type=kubernetes.io/tls"), &tx)
                }
            };
            tasks.push(task);
        }
        let unsynced = interest.kinds.clone();
        Ok(Self { store: Store::without_derived_slices(), updates, relists: BTreeMap::new(), unsynced, tasks, server })
    }

    /// The current objects.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The API server's URL.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// Whether every kind has been listed once.
    pub(crate) fn synced(&self) -> bool {
        self.unsynced.is_empty()
    }

    /// Kinds not listed yet, for logs.
    pub(crate) fn unsynced(&self) -> impl Iterator<Item = Kind> + '_ {
        self.unsynced.iter().copied()
    }

    /// Waits for the next events and applies them, with every event already queued behind them.
    /// Cancel-safe: nothing is lost when the future is dropped while waiting.
    pub(crate) async fn next(&mut self) -> Changes {
        let Some(first) = self.updates.recv().await else {
            // Every watcher task ended: only happens when they were aborted.
            return std::future::pending().await;
        };
        let mut batch = Batch::default();
        self.apply(first, &mut batch);
        while let Ok(update) = self.updates.try_recv() {
            self.apply(update, &mut batch);
        }
        self.store.finish(batch)
    }

    fn apply(&mut self, (kind, event): Update, batch: &mut Batch) {
        match event {
            Event::Apply(object) => {
                if let Some(object) = self.checked(object) {
                    self.store.set(&object.key(), Some(&object), batch);
                }
            }
            Event::Delete(object) => self.store.set(&object.key(), None, batch),
            Event::Init => {
                self.relists.insert(kind, BTreeMap::new());
            }
            Event::InitApply(object) => {
                let key = object.key();
                let object = self.checked(object).or_else(|| self.store.get(&key));
                if let (Some(object), Some(relist)) = (object, self.relists.get_mut(&kind)) {
                    relist.insert(key, object);
                }
            }
            Event::InitDone => {
                let listed = self.relists.remove(&kind).unwrap_or_default();
                for key in self.store.keys(kind) {
                    if !listed.contains_key(&key) {
                        self.store.set(&key, None, batch);
                    }
                }
                for (key, object) in &listed {
                    self.store.set(key, Some(object), batch);
                }
                // A relist after the first means the watch could not resume (e.g. 410 Gone).
                let what = if self.unsynced.remove(&kind) { "listed" } else { "relisted" };
                tracing::info!(kind = kind.as_str(), objects = listed.len(), server = %self.server, "{what}");
            }
        }
    }

    /// The object if it is valid; otherwise logs why and returns `None` (its previous version,
    /// if any, stays).
    fn checked(&self, object: Object) -> Option<Object> {
        let errors = validate(&object, None);
        if errors.is_empty() {
            return Some(object);
        }
        let key = object.key();
        for error in errors {
            let field = error.field.map(|f| format!("{f}: ")).unwrap_or_default();
            tracing::error!("{key}: {field}{}; keeping its previous version", error.message);
        }
        None
    }
}

/// A client of the API server found as kube-proxy finds it: `kubeconfig`, else `KUBECONFIG` or
/// `~/.kube/config`, else the in-cluster service account (the one [`Feed`](crate::Feed) reads
/// from with [`SourceSpec::Kubernetes`](crate::SourceSpec::Kubernetes)), for components that
/// write to the API. Must run inside a tokio runtime.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, Error> {
    Client::try_from(config(kubeconfig).await?).map_err(Error::kube)
}

/// The client configuration of [`client`].
async fn config(kubeconfig: Option<&Path>) -> Result<Config, Error> {
    match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| Error::Kube(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(Error::kube)
        }
        None => Config::infer().await.map_err(Error::kube),
    }
}

/// Starts the watcher task of one kind, sending its events to `tx` through a [`Relay`] and
/// logging its errors (the watcher retries them with backoff).
fn spawn<K>(client: &Client, kind: Kind, config: watcher::Config, tx: &mpsc::UnboundedSender<Update>) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Object: From<Arc<K>>,
{
    let api: Api<K> = Api::all(client.clone());
    let mut relay = Relay::new::<K>(kind, tx.clone());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watch_stream(api, config).default_backoff());
        while let Some(event) = events.next().await {
            if relay.relay(event).is_err() {
                return;
            }
        }
    })
}

/// The API group of the Gateway API, whose kinds are served only once its CRDs are installed.
const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

/// Passes one watcher's events on to the [`ApiSource`]. A kind the server does not serve (404,
/// e.g. ServiceCIDRs before Kubernetes 1.33, or the Gateway API kinds before their CRDs are
/// installed) is reported once as listed and empty, so that it never holds up
/// [`Feed::open`](crate::Feed::open); the watcher keeps retrying with backoff and the kind is
/// listed as soon as it is served. The watcher's `Init` is held back until what follows it, so
/// that those retries wake nobody.
struct Relay {
    kind: Kind,
    /// The resource as the CRD names it (`httproutes.gateway.networking.k8s.io`), for logs.
    resource: String,
    /// Whether it belongs to the Gateway API.
    gateway_api: bool,
    tx: mpsc::UnboundedSender<Update>,
    /// A list started (`Init`) and not passed on yet.
    init: bool,
    /// Whether the server answered the last list with 404.
    missing: bool,
}

impl Relay {
    fn new<K: Resource<DynamicType = ()>>(kind: Kind, tx: mpsc::UnboundedSender<Update>) -> Self {
        let (group, plural) = (K::group(&()), K::plural(&()));
        let resource = if group.is_empty() { plural.into_owned() } else { format!("{plural}.{group}") };
        Self { kind, resource, gateway_api: group == GATEWAY_API_GROUP, tx, init: false, missing: false }
    }

    /// Passes on one item of the watcher's stream; `Err` once the source is gone.
    fn relay<K>(&mut self, item: Result<Event<K>, watcher::Error>) -> Result<(), SendError<Update>>
    where
        K: Resource,
        Object: From<Arc<K>>,
    {
        match item {
            Ok(Event::Init) => self.init = true,
            Ok(event) => {
                if std::mem::take(&mut self.missing) {
                    tracing::info!(kind = self.kind.as_str(), resource = self.resource, "now served");
                }
                if std::mem::take(&mut self.init) {
                    self.tx.send((self.kind, Event::Init))?;
                }
                self.tx.send((self.kind, typed(event)))?;
            }
            Err(err) if not_served(&err) => {
                self.init = false;
                if !std::mem::replace(&mut self.missing, true) {
                    self.log_missing();
                    self.tx.send((self.kind, Event::Init))?;
                    self.tx.send((self.kind, Event::InitDone))?;
                }
            }
            Err(err) => tracing::warn!(kind = self.kind.as_str(), "watching the API server: {err}; retrying"),
        }
        Ok(())
    }

    fn log_missing(&self) {
        let (kind, resource) = (self.kind.as_str(), self.resource.as_str());
        if self.gateway_api {
            tracing::warn!(
                kind,
                resource,
                "not served by the API server: install the Gateway API CRDs (standard channel) to use {kind}s; \
                 none used until then, retrying"
            );
        } else {
            tracing::info!(kind, resource, "not served by this API server; none used until it is");
        }
    }
}

/// Whether the server answered that it does not serve the resource at all.
fn not_served(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

/// The event with its object typed as an [`Object`], [slimmed](crate::object::slim).
fn typed<K>(event: Event<K>) -> Event<Object>
where
    K: Resource,
    Object: From<Arc<K>>,
{
    let object = |mut o: K| {
        crate::object::slim(&mut o);
        Object::from(Arc::new(o))
    };
    match event {
        Event::Apply(o) => Event::Apply(object(o)),
        Event::Delete(o) => Event::Delete(object(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(object(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NamespacedName;

    fn service(name: &str, port: i32) -> Object {
        let value =
            serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"ports": [{"port": port}]}});
        Object::Service(Arc::new(serde_json::from_value(value).unwrap()))
    }

    fn source() -> (ApiSource, mpsc::UnboundedSender<Update>) {
        let (tx, updates) = mpsc::unbounded_channel();
        let unsynced = [Kind::Service].into();
        let source = ApiSource {
            store: Store::default(),
            updates,
            relists: BTreeMap::new(),
            unsynced,
            tasks: Vec::new(),
            server: "test".into(),
        };
        (source, tx)
    }

    fn names(source: &ApiSource) -> Vec<String> {
        source.store().services().map(|(k, _)| k.name.clone()).collect()
    }

    fn send(tx: &mpsc::UnboundedSender<Update>, events: Vec<Event<Object>>) {
        events.into_iter().for_each(|e| tx.send((Kind::Service, e)).unwrap());
    }

    #[tokio::test]
    async fn relist_replaces_the_kind_atomically_and_deletes_what_vanished() {
        let (mut source, tx) = source();
        send(&tx, vec![Event::Init, Event::InitApply(service("a", 80)), Event::InitApply(service("b", 80))]);
        // Queued events are applied together; the list is not complete yet, so nothing shows.
        let changes = source.next().await;
        assert!(changes.is_empty() && !source.synced());
        send(&tx, vec![Event::InitDone]);
        assert_eq!(source.next().await.services.len(), 2);
        assert!(source.synced());
        assert_eq!(names(&source), ["a", "b"]);

        // A watch event, then a relist (as after 410 Gone) in which b is gone and c appeared.
        send(&tx, vec![Event::Apply(service("a", 81))]);
        assert_eq!(source.next().await.services, [NamespacedName::new("ns", "a")].into());
        send(&tx, vec![Event::Init, Event::InitApply(service("a", 81)), Event::InitApply(service("c", 80))]);
        assert!(source.next().await.is_empty());
        assert_eq!(names(&source), ["a", "b"], "nothing is flushed during a relist");
        send(&tx, vec![Event::InitDone]);
        let changes = source.next().await;
        assert_eq!(changes.services, [NamespacedName::new("ns", "b"), NamespacedName::new("ns", "c")].into());
        assert_eq!(names(&source), ["a", "c"]);

        send(&tx, vec![Event::Delete(service("a", 81))]);
        source.next().await;
        assert_eq!(names(&source), ["c"]);
    }

    #[test]
    fn objects_from_the_server_arrive_without_managed_fields() {
        let value = serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "managedFields": [{"manager": "kube-controller-manager"}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.1"]}],
        });
        let slice: EndpointSlice = serde_json::from_value(value).unwrap();
        assert!(slice.metadata.managed_fields.is_some());
        let Event::InitApply(Object::EndpointSlice(slice)) = typed(Event::InitApply(slice)) else { panic!() };
        assert_eq!(slice.metadata.managed_fields, None);
    }

    /// The events `rx` holds, by name.
    fn received(rx: &mut mpsc::UnboundedReceiver<Update>) -> Vec<&'static str> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|(_, event)| match event {
                Event::Init => "Init",
                Event::InitApply(_) => "InitApply",
                Event::InitDone => "InitDone",
                Event::Apply(_) => "Apply",
                Event::Delete(_) => "Delete",
            })
            .collect()
    }

    fn not_found() -> watcher::Error {
        let status = kube::core::Status::failure("the server could not find the requested resource", "NotFound");
        watcher::Error::InitialListFailed(kube::Error::Api(status.with_code(404).boxed()))
    }

    #[tokio::test]
    async fn a_kind_not_served_is_listed_empty_once_then_listed_when_served() {
        let (mut source, tx) = source();
        source.unsynced = [Kind::HttpRoute].into();
        let mut relay = Relay::new::<HTTPRoute>(Kind::HttpRoute, tx);
        assert_eq!(relay.resource, "httproutes.gateway.networking.k8s.io");
        // The watcher starts a list (Init) that fails, again and again with backoff.
        for _ in 0..3 {
            relay.relay::<HTTPRoute>(Ok(Event::Init)).unwrap();
            relay.relay::<HTTPRoute>(Err(not_found())).unwrap();
        }
        let changes = source.next().await;
        assert!(changes.is_empty() && source.synced(), "the first 404 completes the kind's list");
        assert!(source.updates.is_empty(), "retries pass nothing on");

        // The CRD is installed: the next list succeeds.
        let mut route = HTTPRoute::new("web", Default::default());
        route.metadata.namespace = Some("ns".into());
        relay.relay::<HTTPRoute>(Ok(Event::Init)).unwrap();
        relay.relay(Ok(Event::InitApply(route))).unwrap();
        relay.relay::<HTTPRoute>(Ok(Event::InitDone)).unwrap();
        assert_eq!(source.next().await.http_routes, [NamespacedName::new("ns", "web")].into());
        assert!(source.store().http_route(&NamespacedName::new("ns", "web")).is_some());

        // Removed again (the CRD deleted): the kind is empty, and said so once.
        relay.relay::<HTTPRoute>(Err(not_found())).unwrap();
        relay.relay::<HTTPRoute>(Err(not_found())).unwrap();
        assert_eq!(source.next().await.http_routes, [NamespacedName::new("ns", "web")].into());
        assert_eq!(source.store().http_routes().count(), 0);
    }

    #[test]
    fn relay_holds_init_back_until_what_follows_it() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut relay = Relay::new::<Service>(Kind::Service, tx);
        assert_eq!(relay.resource, "services");
        relay.relay::<Service>(Ok(Event::Init)).unwrap();
        assert!(received(&mut rx).is_empty());
        let failed = watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure("etcd is down", "InternalError").with_code(500).boxed(),
        ));
        relay.relay::<Service>(Err(failed)).unwrap();
        relay.relay::<Service>(Ok(Event::Init)).unwrap();
        relay.relay::<Service>(Ok(Event::InitDone)).unwrap();
        assert_eq!(received(&mut rx), ["Init", "InitDone"]);
        drop(rx);
        assert!(relay.relay::<Service>(Ok(Event::InitDone)).is_err(), "the source is gone");
    }

    #[tokio::test]
    async fn invalid_objects_keep_their_previous_version() {
        let (mut source, tx) = source();
        send(&tx, vec![Event::Apply(service("a", 80)), Event::Apply(service("a", 70000))]);
        source.next().await;
        let port = |s: &ApiSource| {
            s.store().service(&NamespacedName::new("ns", "a")).unwrap().spec.as_ref().unwrap().ports.as_ref().unwrap()
                [0]
            .port
        };
        assert_eq!(port(&source), 80);
        // Also through a relist: the invalid version is not listed, the old one stays.
        send(&tx, vec![Event::Init, Event::InitApply(service("a", 70000)), Event::InitDone]);
        source.next().await;
        assert_eq!(port(&source), 80);
    }
}
