//! Label selectors as `kubectl -l` takes them (pure): `key=value`, `key==value`, `key!=value`,
//! `key in (a,b)`, `key notin (a,b)`, `key` and `!key`, comma-separated, all required.

use std::collections::BTreeMap;

use roadkeeper_cluster::k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use roadkeeper_cluster::selector_matches;

use crate::{Error, Result};

/// A parsed selector.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(LabelSelector);

impl Selector {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut expressions = Vec::new();
        for part in split(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            expressions.push(requirement(part).ok_or_else(|| {
                Error::Invalid(format!("unable to parse requirement {part:?} of the selector {text:?}"))
            })?);
        }
        Ok(Self(LabelSelector { match_expressions: Some(expressions), match_labels: None }))
    }

    /// Whether the selector selects `labels`.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        selector_matches(&self.0, labels.unwrap_or(&BTreeMap::new()))
    }
}

/// Splits at commas outside parentheses.
fn split(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn requirement(part: &str) -> Option<LabelSelectorRequirement> {
    let make = |key: &str, operator: &str, values: Vec<String>| {
        let key = key.trim();
        let valid = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        valid.then(|| LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then_some(values),
        })
    };
    if let Some(key) = part.strip_prefix('!') {
        return make(key, "DoesNotExist", Vec::new());
    }
    for (separator, operator) in [("!=", "NotIn"), ("==", "In"), ("=", "In")] {
        if let Some((key, value)) = part.split_once(separator) {
            return make(key, operator, vec![value.trim().to_owned()]);
        }
    }
    for (word, operator) in [(" notin ", "NotIn"), (" in ", "In")] {
        if let Some((key, values)) = part.split_once(word) {
            let values = values.trim().strip_prefix('(')?.strip_suffix(')')?;
            return make(key, operator, values.split(',').map(|v| v.trim().to_owned()).collect());
        }
    }
    make(part, "Exists", Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_selectors() {
        let labels: BTreeMap<String, String> =
            [("app", "hello"), ("tier", "web")].map(|(k, v)| (k.into(), v.into())).into();
        let matches = |text: &str| Selector::parse(text).unwrap().matches(Some(&labels));
        assert!(matches("app=hello"));
        assert!(matches("app==hello,tier"));
        assert!(matches("app in (hello, other),!missing"));
        assert!(matches("app notin (x),tier!=db"));
        assert!(!matches("app=removed"));
        assert!(!matches("!tier"));
        assert!(matches(""));
        assert!(Selector::parse("app in hello").is_err());
        assert!(Selector::parse("a b=c").is_err());
    }
}
