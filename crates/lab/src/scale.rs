//! `lab scale` (pure): the replicas the lab runs a Deployment with. As `kubectl scale` changes
//! the live object and not the manifest, the lab keeps the replicas asked for in its state
//! ([`crate::state::State::scaled`]), with the manifest's own `spec.replicas` of that moment. An
//! edit of `replicas` in the manifest wins again (the override is dropped), as `kubectl apply`
//! of the edited manifest would set it; other edits keep it, as `apply` leaves a field it did not
//! change.

use std::collections::BTreeMap;
use std::sync::Arc;

use roadkeeper_cluster::k8s_openapi::api::apps::v1::Deployment;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A Deployment's replicas as `lab scale` set them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scaled {
    /// The replicas asked for.
    pub replicas: i32,
    /// The manifest's `spec.replicas` when they were asked for.
    pub manifest: Option<i32>,
}

/// The name of the Deployment `target` names: `deployment/NAME` (or `deployments/`, `deploy/`,
/// `deployment.apps/`).
pub fn deployment_name(target: &str) -> Result<&str> {
    ["deployment/", "deployments/", "deploy/", "deployment.apps/"]
        .iter()
        .find_map(|prefix| target.strip_prefix(prefix))
        .filter(|name| !name.is_empty())
        .ok_or_else(|| Error::Invalid(format!("cannot scale {target:?}: the lab scales deployment/NAME")))
}

/// The key of a Deployment in [`crate::state::State::scaled`]: `namespace/name`.
pub fn key(deployment: &Deployment) -> String {
    let meta = &deployment.metadata;
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

/// The override `lab scale` records for `deployment` (as its manifest now has it).
pub fn scaled(deployment: &Deployment, replicas: i32) -> Scaled {
    Scaled { replicas, manifest: deployment.spec.as_ref().and_then(|s| s.replicas) }
}

/// Forgets the overrides of Deployments that went, or whose manifest's replicas changed since.
pub fn prune<'a>(scaled: &mut BTreeMap<String, Scaled>, deployments: impl IntoIterator<Item = &'a Deployment>) {
    let manifests: BTreeMap<String, Option<i32>> =
        deployments.into_iter().map(|d| (key(d), d.spec.as_ref().and_then(|s| s.replicas))).collect();
    scaled.retain(|key, s| manifests.get(key) == Some(&s.manifest));
}

/// `deployment` as the lab runs it: with the replicas of its override, if it has one.
pub fn apply(deployment: &Arc<Deployment>, scaled: &BTreeMap<String, Scaled>) -> Arc<Deployment> {
    let Some(s) = scaled.get(&key(deployment)) else { return deployment.clone() };
    let mut scaled = (**deployment).clone();
    scaled.spec.get_or_insert_with(Default::default).replicas = Some(s.replicas);
    Arc::new(scaled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(name: &str, replicas: Option<i32>) -> Arc<Deployment> {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        d.spec = Some(Default::default());
        d.spec.as_mut().unwrap().replicas = replicas;
        Arc::new(d)
    }

    fn replicas(d: &Deployment) -> Option<i32> {
        d.spec.as_ref()?.replicas
    }

    #[test]
    fn an_override_holds_until_the_manifest_changes_replicas_or_the_deployment_goes() {
        let hello = deployment("hello", Some(3));
        let mut overrides = BTreeMap::from([("default/hello".to_owned(), scaled(&hello, 5))]);
        assert_eq!(replicas(&apply(&hello, &overrides)), Some(5));
        assert_eq!(replicas(&hello), Some(3), "the manifest's object is not changed");
        // Another edit of the manifest (same replicas) keeps it.
        prune(&mut overrides, [&*hello]);
        assert_eq!(overrides.len(), 1);
        // An edit of replicas in the manifest wins.
        let edited = deployment("hello", Some(2));
        prune(&mut overrides, [&*edited]);
        assert!(overrides.is_empty());
        assert_eq!(replicas(&apply(&edited, &overrides)), Some(2));
        // Replicas written where there were none count as an edit; a Deployment gone takes its
        // override along.
        let unset = deployment("web", None);
        let mut overrides = BTreeMap::from([("default/web".to_owned(), scaled(&unset, 4))]);
        prune(&mut overrides, [&*unset]);
        assert_eq!(replicas(&apply(&unset, &overrides)), Some(4));
        prune(&mut overrides, [&*deployment("web", Some(1))]);
        assert!(overrides.is_empty());
        let mut overrides = BTreeMap::from([("default/web".to_owned(), scaled(&unset, 4))]);
        prune(&mut overrides, []);
        assert!(overrides.is_empty());
    }

    #[test]
    fn targets_name_a_deployment() {
        assert_eq!(deployment_name("deployment/hello").unwrap(), "hello");
        assert_eq!(deployment_name("deploy/hello").unwrap(), "hello");
        assert!(deployment_name("statefulset/db").is_err());
        assert!(deployment_name("deployment/").is_err());
    }
}
