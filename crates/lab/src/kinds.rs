//! The kinds of the manifests the lab runs (pure), and a notice for every object of another kind
//! (a StatefulSet, a DaemonSet, a Job, a Gateway...), which the lab ignores: named by file and
//! object in `lab status` and at `lab up`, never silently dropped.

use std::path::Path;

use roadkeeper_cluster::{ManifestSource, Object};

/// What the lab runs and uses, for the notices.
pub const RUNS: &str = "it runs Deployments and Pods, with Services, EndpointSlices, Ingresses, IngressClasses, \
                        ConfigMaps, Secrets and Namespaces";

/// Kinds without a namespace among the ones a manifest folder commonly holds (for naming them).
const CLUSTER_SCOPED: &[&str] = &[
    "PersistentVolume",
    "StorageClass",
    "CustomResourceDefinition",
    "PriorityClass",
    "RuntimeClass",
    "APIService",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
];

/// A notice for every object of `source` the lab does not run: `FILE: Kind ns/name: kind Kind is
/// not run by the lab (...); ignored`.
pub fn not_run(source: &ManifestSource) -> Vec<String> {
    let notice = |file: &Path, kind: &str, object: &str| {
        format!("{}: {kind} {object}: kind {kind} is not run by the lab ({RUNS}); ignored", file.display())
    };
    let mut notices: Vec<String> = source
        .unsupported()
        .map(|u| {
            let name = u.name.as_deref().unwrap_or("<no name>");
            let object = match u.namespace.as_deref() {
                Some(namespace) => format!("{namespace}/{name}"),
                None if u.kind.starts_with("Cluster") || CLUSTER_SCOPED.contains(&u.kind.as_str()) => name.to_owned(),
                None => format!("default/{name}"),
            };
            notice(&u.file, &u.kind, &object)
        })
        .collect();
    // Kinds the manifest reader knows but the lab has its own of, or does not serve.
    let store = source.store();
    let objects: Vec<(&str, String, Object)> = (store.nodes().map(|n| ("Node", name(&n.metadata), n.clone().into())))
        .chain(store.service_cidrs().map(|c| ("ServiceCIDR", name(&c.metadata), c.clone().into())))
        .chain(store.gateway_classes().map(|c| ("GatewayClass", name(&c.metadata), c.clone().into())))
        .chain(store.gateways().map(|(k, g)| ("Gateway", k.to_string(), g.clone().into())))
        .chain(store.http_routes().map(|(k, r)| ("HTTPRoute", k.to_string(), r.clone().into())))
        .chain(store.grpc_routes().map(|(k, r)| ("GRPCRoute", k.to_string(), r.clone().into())))
        .chain(store.reference_grants().map(|(k, g)| ("ReferenceGrant", k.to_string(), g.clone().into())))
        .collect();
    for (kind, object, value) in objects {
        notices.push(notice(source.file_of(&value).unwrap_or(source.dir()), kind, &object));
    }
    notices
}

fn name(meta: &roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_of_a_kind_the_lab_does_not_run_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let apps = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\n---\n\
            apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: ops}\n---\n\
            apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly}\n---\n\
            apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\n---\n\
            apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {selector: {matchLabels: {a: b}}, \
            template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: nginx}]}}}\n";
        std::fs::write(tmp.path().join("apps.yaml"), apps).unwrap();
        std::fs::write(
            tmp.path().join("gw.yaml"),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: gc}\n\
             spec: {controllerName: example.com/gc}\n",
        )
        .unwrap();
        let (source, errors) = ManifestSource::load(tmp.path()).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let dir = source.dir().display().to_string();
        let notices = not_run(&source);
        let expected = [
            format!(
                "{dir}/apps.yaml: StatefulSet default/db: kind StatefulSet is not run by the lab ({RUNS}); ignored"
            ),
            format!("{dir}/apps.yaml: DaemonSet ops/agent: kind DaemonSet is not run by the lab ({RUNS}); ignored"),
            format!("{dir}/apps.yaml: CronJob default/nightly: kind CronJob is not run by the lab ({RUNS}); ignored"),
            format!("{dir}/apps.yaml: ClusterRole reader: kind ClusterRole is not run by the lab ({RUNS}); ignored"),
            format!("{dir}/gw.yaml: GatewayClass gc: kind GatewayClass is not run by the lab ({RUNS}); ignored"),
        ];
        assert_eq!(notices, expected);
    }
}
