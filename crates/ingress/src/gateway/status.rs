//! What the statuses of our GatewayClasses, Gateways and HTTPRoutes must say, and the merge
//! patches that write it (pure). A patch is `None` when the status already says it, so a
//! status is written only when it changes. HTTPRoute `status.parents` entries of other
//! controllers are kept.

use std::collections::BTreeMap;
use std::net::IpAddr;

use roadkeeper_cluster::NamespacedName;
use serde_json::{Value, json};

use super::conditions::{Condition, merge};
use super::refs::GROUP;

/// Every status we own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Statuses {
    /// Our GatewayClasses, with their `metadata.generation`.
    pub classes: BTreeMap<String, Option<i64>>,
    /// Our Gateways.
    pub gateways: BTreeMap<NamespacedName, GatewayStatus>,
    /// HTTPRoutes with a parent that is one of our Gateways.
    pub routes: BTreeMap<NamespacedName, RouteStatus>,
}

/// A Gateway's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GatewayStatus {
    pub generation: Option<i64>,
    pub addresses: Vec<IpAddr>,
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
}

/// One listener's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListenerStatus {
    pub name: String,
    /// Route kinds it takes.
    pub kinds: Vec<&'static str>,
    /// Routes attached.
    pub attached: i32,
    pub conditions: Vec<Condition>,
}

/// An HTTPRoute's status, for the parents that are ours.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteStatus {
    pub generation: Option<i64>,
    pub parents: Vec<ParentStatus>,
}

/// An HTTPRoute's status for one parent reference.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParentStatus {
    /// The parent reference as written in the spec.
    pub parent_ref: Value,
    pub conditions: Vec<Condition>,
}

/// The merge patch for a GatewayClass of ours (`current`: its `status` as JSON), naming
/// `features` as supported; `None` when nothing changes.
pub fn class_patch(generation: Option<i64>, current: Option<&Value>, features: &[&str], now: &str) -> Option<Value> {
    let accepted = [
        Condition::yes("Accepted", "Accepted", "roadkeeper serves this class"),
        Condition::yes("SupportedVersion", "SupportedVersion", "Gateway API v1.6"),
    ];
    let mut features: Vec<&str> = features.to_vec();
    features.sort_unstable();
    let status = json!({
        "conditions": merge(current.and_then(|c| c.get("conditions")), &accepted, generation, now),
        "supportedFeatures": features.iter().map(|name| json!({"name": name})).collect::<Vec<_>>(),
    });
    changed(current, status)
}

/// The merge patch for a Gateway of ours.
pub fn gateway_patch(status: &GatewayStatus, current: Option<&Value>, now: &str) -> Option<Value> {
    let current_listeners = current.and_then(|c| c.get("listeners")).and_then(Value::as_array);
    let listeners: Vec<Value> = status
        .listeners
        .iter()
        .map(|listener| {
            let old = current_listeners
                .into_iter()
                .flatten()
                .find(|l| l.get("name").and_then(Value::as_str) == Some(&listener.name));
            json!({
                "name": listener.name,
                "supportedKinds": listener.kinds.iter().map(|kind| json!({"group": GROUP, "kind": kind})).collect::<Vec<_>>(),
                "attachedRoutes": listener.attached,
                "conditions": merge(old.and_then(|l| l.get("conditions")), &listener.conditions, status.generation, now),
            })
        })
        .collect();
    let new = json!({
        "addresses": status.addresses.iter().map(|ip| json!({"type": "IPAddress", "value": ip.to_string()})).collect::<Vec<_>>(),
        "conditions": merge(current.and_then(|c| c.get("conditions")), &status.conditions, status.generation, now),
        "listeners": listeners,
    });
    changed(current, new)
}

/// The merge patch for an HTTPRoute with parents of ours: our entries of `status.parents`
/// (controller `controller`) replaced, the others' kept. With no parents of ours (a route
/// detached from our Gateways) our entries are removed, if it has any.
pub fn route_patch(status: &RouteStatus, controller: &str, current: Option<&Value>, now: &str) -> Option<Value> {
    let current_parents =
        current.and_then(|c| c.get("parents")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let ours = |p: &Value| p.get("controllerName").and_then(Value::as_str) == Some(controller);
    if status.parents.is_empty() && !current_parents.iter().any(ours) {
        return None;
    }
    let mut parents: Vec<Value> = status
        .parents
        .iter()
        .map(|parent| {
            let old = current_parents.iter().find(|p| ours(p) && p.get("parentRef") == Some(&parent.parent_ref));
            json!({
                "parentRef": parent.parent_ref,
                "controllerName": controller,
                "conditions": merge(old.and_then(|p| p.get("conditions")), &parent.conditions, status.generation, now),
            })
        })
        .collect();
    parents.extend(current_parents.iter().filter(|p| !ours(p)).cloned());
    changed(current, json!({"parents": parents}))
}

/// `{"status": new}` when `new` differs from `current` in the fields it sets.
fn changed(current: Option<&Value>, new: Value) -> Option<Value> {
    let same = current.is_some_and(|current| {
        new.as_object().into_iter().flatten().all(|(field, value)| current.get(field) == Some(value))
    });
    (!same).then(|| json!({"status": new}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_keeps_other_controllers_parents_and_writes_only_changes() {
        let parent_ref = json!({"name": "gw", "namespace": "infra"});
        let theirs = json!({"parentRef": {"name": "other"}, "controllerName": "example.com/other", "conditions": []});
        let status = RouteStatus {
            generation: Some(3),
            parents: vec![ParentStatus {
                parent_ref: parent_ref.clone(),
                conditions: vec![Condition::yes("Accepted", "Accepted", "ok")],
            }],
        };
        let current = json!({"parents": [theirs.clone()]});
        let patch = route_patch(&status, "roadkeeper.dev/gateway", Some(&current), "t1").unwrap();
        let parents = patch["status"]["parents"].as_array().unwrap();
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0]["controllerName"], "roadkeeper.dev/gateway");
        assert_eq!(parents[0]["parentRef"], parent_ref);
        assert_eq!(parents[0]["conditions"][0]["observedGeneration"], 3);
        assert_eq!(parents[1], theirs);
        let written = patch["status"].clone();
        assert_eq!(route_patch(&status, "roadkeeper.dev/gateway", Some(&written), "t2"), None, "already written");
        // Detached from our Gateways: our entry goes, theirs stays; nothing of ours, nothing to write.
        let detached = route_patch(&RouteStatus::default(), "roadkeeper.dev/gateway", Some(&written), "t3").unwrap();
        assert_eq!(detached["status"]["parents"], json!([theirs]));
        assert_eq!(route_patch(&RouteStatus::default(), "roadkeeper.dev/gateway", Some(&current), "t4"), None);
        assert_eq!(route_patch(&RouteStatus::default(), "roadkeeper.dev/gateway", None, "t5"), None);
    }

    #[test]
    fn gateway_status_lists_addresses_listeners_and_conditions() {
        let status = GatewayStatus {
            generation: Some(1),
            addresses: vec!["192.168.235.1".parse().unwrap()],
            conditions: vec![
                Condition::yes("Accepted", "Accepted", ""),
                Condition::yes("Programmed", "Programmed", ""),
            ],
            listeners: vec![ListenerStatus {
                name: "http".into(),
                kinds: vec!["HTTPRoute"],
                attached: 2,
                conditions: vec![Condition::yes("Accepted", "Accepted", "")],
            }],
        };
        let patch = gateway_patch(&status, None, "t").unwrap();
        assert_eq!(patch["status"]["addresses"], json!([{"type": "IPAddress", "value": "192.168.235.1"}]));
        let listener = &patch["status"]["listeners"][0];
        assert_eq!(listener["supportedKinds"], json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]));
        assert_eq!(listener["attachedRoutes"], 2);
        assert_eq!(listener["conditions"][0]["observedGeneration"], 1);
        assert_eq!(gateway_patch(&status, Some(&patch["status"]), "later"), None);
        let class = class_patch(Some(4), None, &["HTTPRoute", "Gateway"], "t").unwrap();
        assert_eq!(class["status"]["supportedFeatures"], json!([{"name": "Gateway"}, {"name": "HTTPRoute"}]));
        assert_eq!(class["status"]["conditions"][0]["observedGeneration"], 4);
    }
}
