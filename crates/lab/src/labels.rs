//! `lab label` (pure): label changes read as `kubectl label` reads them (`KEY=VALUE` sets,
//! `KEY-` removes, a value checked as a label value), the keys checked as the API server checks
//! the object's labels (qualified names: an optional DNS-1123 subdomain prefix and `/`, and a
//! name of at most 63 characters), with the messages of both; and their effect on a pod's labels.
//! The checks are `roadkeeper_cluster`'s, the ones every reader of the lab's state applies: a
//! label that passed here can never make a reader drop the pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// What one `lab label` changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Changes {
    /// Labels set.
    pub set: BTreeMap<String, String>,
    /// Labels removed.
    pub remove: Vec<String>,
}

/// Reads the changes of `lab label pod POD SPEC...` and checks them.
pub fn parse(pod: &str, specs: &[String]) -> Result<Changes> {
    let mut changes = Changes::default();
    for spec in specs {
        if spec.contains('=') {
            let [key, value] = spec.split('=').collect::<Vec<_>>()[..] else {
                return Err(Error::Invalid(format!("invalid label spec: {spec}")));
            };
            roadkeeper_cluster::label_value(value)
                .map_err(|why| Error::Invalid(format!("invalid label value: {spec:?}: {why}")))?;
            changes.set.insert(key.to_owned(), value.to_owned());
        } else if let Some(key) = spec.strip_suffix('-') {
            changes.remove.push(key.to_owned());
        } else {
            return Err(Error::Invalid(format!("unknown label spec: {spec}")));
        }
    }
    check(pod, &changes)?;
    Ok(changes)
}

/// Checks `changes` to pod `pod` as the API server checks the labels they make.
pub fn check(pod: &str, changes: &Changes) -> Result<()> {
    if changes.remove.iter().any(|key| changes.set.contains_key(key)) {
        return Err(Error::Invalid("can not both modify and remove a label in the same command".into()));
    }
    for (key, value) in &changes.set {
        let invalid = |value: &str, why: String| {
            Error::Invalid(format!("The Pod {pod:?} is invalid: metadata.labels: Invalid value: {value:?}: {why}"))
        };
        roadkeeper_cluster::qualified_name(key).map_err(|why| invalid(key, why))?;
        roadkeeper_cluster::label_value(value).map_err(|why| invalid(value, why))?;
    }
    Ok(())
}

/// Applies `changes` to `labels`; whether they changed. Changing a label that has another value
/// needs `overwrite`, as in kubectl.
pub fn apply(labels: &mut BTreeMap<String, String>, changes: &Changes, overwrite: bool) -> Result<bool> {
    for (key, value) in &changes.set {
        if let Some(old) = labels.get(key).filter(|old| *old != value && !overwrite) {
            return Err(Error::Invalid(format!("'{key}' already has a value ({old}), and --overwrite is false")));
        }
    }
    let before = labels.clone();
    labels.extend(changes.set.clone());
    changes.remove.iter().for_each(|key| drop(labels.remove(key)));
    Ok(*labels != before)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(spec: &str) -> String {
        parse("web-1", &[spec.to_owned()]).unwrap_err().to_string()
    }

    #[test]
    fn what_kubectl_and_the_api_server_refuse_is_refused_naming_it() {
        let name_part = "name part must consist of letters, digits, '-', '_' or '.', starting and ending with a \
                         letter or digit";
        let invalid = "The Pod \"web-1\" is invalid: metadata.labels: Invalid value:";
        assert_eq!(refused("Bad_Key!=x"), format!("{invalid} \"Bad_Key!\": {name_part}"));
        assert_eq!(refused("a b=c"), format!("{invalid} \"a b\": {name_part}"));
        assert_eq!(refused("=c"), format!("{invalid} \"\": name part must not be empty"));
        let long = "x".repeat(64);
        assert_eq!(
            refused(&format!("app={long}")),
            format!("invalid label value: \"app={long}\": must be no more than 63 characters")
        );
        assert_eq!(refused("app=-x"), format!("invalid label value: \"app=-x\": {}", &name_part["name part ".len()..]));
        assert_eq!(
            refused(&format!("{long}=v")),
            format!("{invalid} \"{long}\": name part must be no more than 63 characters")
        );
        let prefix = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(63)].join(".");
        assert!(refused(&format!("{prefix}/k=v")).ends_with("prefix part must be no more than 253 characters"));
        assert!(
            refused("Bad.Prefix/k=v").contains("\"Bad.Prefix/k\": prefix part must be a lowercase RFC 1123 subdomain")
        );
        assert_eq!(refused("/k=v"), format!("{invalid} \"/k\": prefix part must not be empty"));
        assert_eq!(refused("a=b=c"), "invalid label spec: a=b=c");
        assert_eq!(refused("app"), "unknown label spec: app");
        let both = parse("p", &["a=1".into(), "a-".into()]).unwrap_err();
        assert_eq!(both.to_string(), "can not both modify and remove a label in the same command");
    }

    #[test]
    fn valid_changes_apply_as_kubectl_applies_them() {
        let longest = format!("{}/{}", "a".repeat(253), "n".repeat(63));
        let specs = ["example.com/tier=web", "empty=", "app-", &format!("{longest}=v")].map(String::from);
        let changes = parse("web-1", &specs).unwrap();
        let mut labels = BTreeMap::from([("app".to_owned(), "web".to_owned()), ("tier".to_owned(), "x".to_owned())]);
        assert!(apply(&mut labels, &changes, false).unwrap());
        assert_eq!(labels.keys().collect::<Vec<_>>(), [&longest, "empty", "example.com/tier", "tier"]);
        assert!(!apply(&mut labels, &changes, false).unwrap(), "nothing changes the second time");
        let overwrite = parse("web-1", &["tier=y".into()]).unwrap();
        let refused = apply(&mut labels, &overwrite, false).unwrap_err();
        assert_eq!(refused.to_string(), "'tier' already has a value (x), and --overwrite is false");
        assert!(apply(&mut labels, &overwrite, true).unwrap());
    }
}
