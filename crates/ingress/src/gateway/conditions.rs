//! Status conditions as the Gateway API writes them (`metav1.Condition`), and merging a desired
//! set into what an object's status holds: a condition whose status did not change keeps its
//! `lastTransitionTime`, so writing the same status twice changes nothing.

use serde_json::{Value, json};

/// One condition we decide: type, status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`, ...
    pub kind: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Condition {
    /// A `True` condition.
    pub fn yes(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind, status: true, reason, message: message.into() }
    }

    /// A `False` condition.
    pub fn no(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind, status: false, reason, message: message.into() }
    }
}

/// The conditions `desired` as JSON for a status at `generation`, each keeping the
/// `lastTransitionTime` of the condition of the same type in `current` when its status is the
/// same, else taking `now` (RFC 3339). Conditions of other types in `current` are kept after ours.
pub fn merge(current: Option<&Value>, desired: &[Condition], generation: Option<i64>, now: &str) -> Value {
    let current = current.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let find = |kind: &str| current.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(kind));
    let mut merged: Vec<Value> = desired
        .iter()
        .map(|condition| {
            let status = if condition.status { "True" } else { "False" };
            let since = find(condition.kind)
                .filter(|old| old.get("status").and_then(Value::as_str) == Some(status))
                .and_then(|old| old.get("lastTransitionTime").cloned())
                .unwrap_or_else(|| Value::from(now));
            let mut value = json!({
                "type": condition.kind,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
            });
            if let Some(generation) = generation {
                value["observedGeneration"] = generation.into();
            }
            value
        })
        .collect();
    let ours = |c: &Value| desired.iter().any(|d| c.get("type").and_then(Value::as_str) == Some(d.kind));
    merged.extend(current.iter().filter(|c| !ours(c)).cloned());
    Value::Array(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let current = json!([
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
            {"type": "Programmed", "status": "False", "reason": "Pending", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Custom", "status": "True", "reason": "Theirs", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        ]);
        let desired = [
            Condition::yes("Accepted", "Accepted", "ok"),
            Condition::yes("Programmed", "Programmed", "ok"),
            Condition::no("ResolvedRefs", "InvalidCertificateRef", "no Secret"),
        ];
        let merged = merge(Some(&current), &desired, Some(2), "2026-12-02T00:00:00Z");
        let merged = merged.as_array().unwrap();
        let field = |i: usize, f: &str| merged[i][f].clone();
        assert_eq!(field(0, "lastTransitionTime"), "2026-01-01T00:00:00Z", "same status: time kept");
        assert_eq!(field(0, "observedGeneration"), 2);
        assert_eq!(field(0, "message"), "ok");
        assert_eq!(field(1, "lastTransitionTime"), "2026-12-02T00:00:00Z", "status changed");
        assert_eq!(field(2, "status"), "False");
        assert_eq!(field(2, "reason"), "InvalidCertificateRef");
        assert_eq!(field(3, "type"), "Custom", "others' conditions are kept");
        assert_eq!(merged.len(), 4);
        let fresh = merge(None, &desired[..1], None, "now");
        assert_eq!(
            fresh,
            json!([{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok", "lastTransitionTime": "now"}])
        );
    }
}
