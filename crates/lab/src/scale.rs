//! `lab scale` (pure): sets `spec.replicas` of a Deployment in the manifest file that defines it,
//! as `kubectl scale` changes the object, touching nothing else of the file (comments, order
//! and other documents stay as they are).

use serde_json::Value;

use crate::{Error, Result};

/// `text` (a manifest file; `json` when it is JSON) with `spec.replicas` of Deployment
/// `namespace/name` set to `replicas`; `None` when the file does not define it.
pub fn set_replicas(text: &str, json: bool, namespace: &str, name: &str, replicas: i32) -> Result<Option<String>> {
    if json {
        let mut value: Value =
            serde_json::from_str(text).map_err(|err| Error::Invalid(format!("invalid JSON: {err}")))?;
        if !is_deployment(&value, namespace, name) {
            return Ok(None);
        }
        value["spec"]["replicas"] = replicas.into();
        let text = serde_json::to_string_pretty(&value).map_err(|err| Error::Invalid(err.to_string()))?;
        return Ok(Some(text + "\n"));
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut start = 0;
    for end in (0..=lines.len()).filter(|&i| i == lines.len() || is_separator(lines[i])) {
        let document: String = lines[start..end].concat();
        let value: Option<Value> = serde_saphyr::from_str(&document).ok();
        if value.as_ref().is_some_and(|v| v["kind"] == "List") && document.contains(name) {
            return Err(Error::Invalid(format!(
                "Deployment {namespace}/{name} may be inside a List: set its replicas there"
            )));
        }
        if value.is_some_and(|v| is_deployment(&v, namespace, name)) {
            let edited = edit_block(&lines[start..end], replicas)?;
            return Ok(Some(lines[..start].concat() + &edited + &lines[end..].concat()));
        }
        start = end;
    }
    Ok(None)
}

fn is_separator(line: &str) -> bool {
    line.strip_prefix("---").is_some_and(|rest| rest.trim().is_empty() || rest.starts_with([' ', '\t', '#']))
}

fn is_deployment(value: &Value, namespace: &str, name: &str) -> bool {
    value["apiVersion"] == "apps/v1"
        && value["kind"] == "Deployment"
        && value["metadata"]["name"] == name
        && value["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_content(line: &str) -> bool {
    let trimmed = line.trim();
    !trimmed.is_empty() && !trimmed.starts_with('#')
}

/// The document's lines with the block-style `spec:` holding `replicas: <replicas>`.
fn edit_block(lines: &[&str], replicas: i32) -> Result<String> {
    let refuse = |why: &str| {
        Error::Invalid(format!("cannot set replicas: {why}; write `spec:` as a block with `replicas:` in it"))
    };
    let spec = lines
        .iter()
        .position(|line| line.starts_with("spec:"))
        .ok_or_else(|| refuse("no `spec:` at the start of a line"))?;
    let rest = lines[spec]["spec:".len()..].trim();
    if !(rest.is_empty() || rest.starts_with('#')) {
        return Err(refuse("`spec:` is written in flow style"));
    }
    let body: Vec<usize> =
        (spec + 1..lines.len()).take_while(|&i| !is_content(lines[i]) || indent(lines[i]) > 0).collect();
    let child = body
        .iter()
        .find(|&&i| is_content(lines[i]))
        .map(|&i| indent(lines[i]))
        .ok_or_else(|| refuse("`spec:` is empty"))?;
    let mut out: Vec<String> = lines.iter().map(|line| line.to_string()).collect();
    let found = body.iter().find(|&&i| indent(lines[i]) == child && lines[i].trim_start().starts_with("replicas:"));
    match found {
        Some(&i) => {
            let line = lines[i];
            let comment = line.find(" #").map(|at| line[at..].trim_end_matches('\n').to_owned()).unwrap_or_default();
            let newline = if line.ends_with('\n') { "\n" } else { "" };
            out[i] = format!("{}replicas: {replicas}{comment}{newline}", " ".repeat(child));
        }
        None => out.insert(spec + 1, format!("{}replicas: {replicas}\n", " ".repeat(child))),
    }
    Ok(out.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# the app\napiVersion: v1\nkind: Service\nmetadata: {name: hello}\nspec: {ports: [{port: 80}]}\n---\n\
        apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: hello\nspec:\n  # how many\n  replicas: 3 # three\n  selector: {}\n";

    #[test]
    fn replicas_change_in_place() {
        let out = set_replicas(FILE, false, "default", "hello", 5).unwrap().unwrap();
        assert_eq!(out, FILE.replace("replicas: 3 # three", "replicas: 5 # three"));
        assert_eq!(set_replicas(FILE, false, "other", "hello", 5).unwrap(), None);
        assert_eq!(set_replicas(FILE, false, "default", "nope", 5).unwrap(), None);
    }

    #[test]
    fn replicas_are_added_where_missing_and_flow_style_is_refused() {
        let without = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n    selector: {}\n";
        let out = set_replicas(without, false, "default", "d", 2).unwrap().unwrap();
        assert_eq!(
            out,
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n    replicas: 2\n    selector: {}\n"
        );
        let flow = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n";
        assert!(set_replicas(flow, false, "default", "d", 2).unwrap_err().to_string().contains("flow style"));
        let json =
            r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}"#;
        assert!(set_replicas(json, true, "default", "d", 4).unwrap().unwrap().contains("\"replicas\": 4"));
    }
}
