//! Manifest files to typed objects: YAML/JSON documents, `List` expansion, dispatch on
//! `apiVersion`/`kind`, unknown-field detection and validation.

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::object::{Kind, ObjectKey};
use crate::validate::{FieldError, validate};
use crate::{ManifestError, NamespacedName, NodePortRange, Object, Unsupported};

/// One supported object found in a file.
#[allow(clippy::large_enum_variant, reason = "short-lived while a file is read")]
#[derive(Debug)]
pub(crate) enum Entry {
    /// A valid object.
    Valid(ObjectKey, Object),
    /// An invalid object, with its identity when known.
    Invalid(Option<ObjectKey>, Vec<ManifestError>),
    /// An object of a kind this crate does not read (a StatefulSet, a Job...), skipped.
    Unsupported(Unsupported),
}

/// YAML limits for manifest files: serde-saphyr's defaults (1,024 documents, 250k nodes) are
/// sized for config files, while one manifest file may hold a whole cluster dump. Alias and
/// anchor limits stay at their defaults, which is what guards against "billion laughs".
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = 1 << 20;
    budget.max_nodes = 1 << 28;
    budget.max_events = 1 << 30;
    budget.max_reader_input_bytes = None;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Parses a whole manifest file. A YAML file is cut into its `---`-separated documents first
/// (see [`yaml_documents`]), so a document that is not valid YAML is one invalid entry, naming its
/// position, and the others still count. Documents are typed right away, so a file holding a whole
/// cluster never exists as untyped values all at once. `node_ports`: the range a Service's
/// NodePorts must be in.
pub(crate) fn parse_file(file: &Path, text: &str, node_ports: NodePortRange) -> Vec<Entry> {
    let mut entries = Vec::new();
    if file.extension().is_some_and(|e| e == "json") {
        match serde_json::from_str::<Value>(text) {
            Ok(document) => collect(file, document, node_ports, &mut entries),
            Err(e) => entries.push(unreadable(ManifestError::file(file, format!("invalid JSON: {e}")))),
        }
        return entries;
    }
    for (index, (first_line, document)) in yaml_documents(text).into_iter().enumerate() {
        let mut reader = document.as_bytes();
        for value in serde_saphyr::read_with_options::<_, Value>(&mut reader, yaml_options()) {
            match value {
                Ok(value) => collect(file, value, node_ports, &mut entries),
                Err(e) => {
                    let message = format!("invalid YAML: {}", yaml_error(&e, first_line - 1));
                    let error = ManifestError { document: Some(index + 1), ..ManifestError::file(file, message) };
                    entries.push(unreadable(error));
                    break;
                }
            }
        }
    }
    entries
}

/// A document that could not be read: it may have defined any object of its file.
fn unreadable(error: ManifestError) -> Entry {
    Entry::Invalid(None, vec![error])
}

/// The documents of a YAML stream with the line each starts on (1-based): the text is cut before
/// every line that starts with the `---` marker. YAML forbids that marker at the start of a line
/// inside a document, so a broken document cannot hide where the next one starts. Text before the
/// first marker that holds no content (only comments, blank lines and directives) goes with the
/// first document.
fn yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let mut documents = Vec::new();
    let (mut start, mut start_line, mut content) = (0, 1, false);
    let mut offset = 0;
    for (number, line) in text.split_inclusive('\n').enumerate() {
        let marker =
            line.strip_prefix("---").is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']));
        if marker && (content || !documents.is_empty()) {
            documents.push((start_line, &text[start..offset]));
            (start, start_line) = (offset, number + 1);
        }
        if marker {
            content = true;
        } else if !content {
            let line = line.trim();
            content = !(line.is_empty() || line.starts_with('#') || line.starts_with('%'));
        }
        offset += line.len();
    }
    if content || documents.is_empty() {
        documents.push((start_line, &text[start..]));
    }
    documents
}

/// A YAML error as one line, `line L column C: cause`, its line counted from the file's start
/// (`lines_before`: the lines of the file before the document). (The error renders a multi-line
/// source snippet whose first line holds the cause, with the position in a suffix when streaming.)
fn yaml_error(e: &serde_saphyr::Error, lines_before: usize) -> String {
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or_default().trim_start_matches("error: ");
    match e.location() {
        Some(at) => {
            let suffix = format!(" at line {}, column {}", at.line(), at.column());
            let prefix = format!("line {} column {}: ", at.line(), at.column());
            let cause = first.strip_suffix(&suffix).unwrap_or(first);
            let cause = cause.strip_prefix(&prefix).unwrap_or(cause);
            format!("line {} column {}: {cause}", at.line() as usize + lines_before, at.column())
        }
        None => first.to_string(),
    }
}

fn collect(file: &Path, document: Value, node_ports: NodePortRange, entries: &mut Vec<Entry>) {
    let mut map = match document {
        Value::Null => return,
        Value::Object(map) => map,
        other => {
            let message = format!("expected an object, found {}", type_name(&other));
            entries.push(Entry::Invalid(None, vec![ManifestError::file(file, message)]));
            return;
        }
    };
    let (Some(api_version), Some(kind)) = (str_field(&map, "apiVersion"), str_field(&map, "kind")) else {
        let message = "apiVersion and kind are required";
        entries.push(Entry::Invalid(None, vec![ManifestError::file(file, message)]));
        return;
    };
    if (api_version, kind) == ("v1", "List") {
        if let Some(Value::Array(items)) = map.remove("items") {
            for item in items {
                collect(file, item, node_ports, entries);
            }
        }
        return;
    }
    let Some(kind) = Kind::from_type(api_version, kind) else {
        tracing::debug!(file = %file.display(), api_version, kind, "ignoring unsupported object");
        let metadata = map.get("metadata").and_then(Value::as_object);
        let text = |field| metadata.and_then(|m| str_field(m, field)).map(str::to_owned);
        entries.push(Entry::Unsupported(Unsupported {
            file: file.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: text("namespace"),
            name: text("name"),
        }));
        return;
    };
    let Some(key) = identify(kind, &mut map) else {
        let error = ManifestError { field: Some("metadata.name".into()), ..ManifestError::file(file, "is required") };
        entries.push(Entry::Invalid(None, vec![error]));
        return;
    };
    let errors = match typed(kind, Value::Object(map)) {
        Ok(object) => match validate(&object, Some(node_ports)) {
            errors if errors.is_empty() => return entries.push(Entry::Valid(key, object)),
            errors => errors,
        },
        Err(errors) => errors,
    };
    let object = Some(key.to_string());
    let errors = errors
        .into_iter()
        .map(|e| ManifestError { object: object.clone(), field: e.field, ..ManifestError::file(file, e.message) })
        .collect();
    entries.push(Entry::Invalid(Some(key), errors));
}

/// Reads the object's identity, defaulting `metadata.namespace` to `default` for namespaced kinds.
fn identify(kind: Kind, map: &mut Map<String, Value>) -> Option<ObjectKey> {
    let metadata = map.get_mut("metadata")?.as_object_mut()?;
    let name = str_field(metadata, "name")?.to_owned();
    let namespace = if kind.namespaced() {
        let namespace = metadata.entry("namespace").or_insert_with(|| Value::from("default"));
        namespace.as_str()?.to_owned()
    } else {
        String::new()
    };
    Some(ObjectKey { kind, name: NamespacedName { namespace, name } })
}

fn typed(kind: Kind, value: Value) -> Result<Object, Vec<FieldError>> {
    Ok(match kind {
        Kind::Service => Object::Service(Arc::new(strict(value)?)),
        Kind::EndpointSlice => Object::EndpointSlice(Arc::new(strict(value)?)),
        Kind::Pod => Object::Pod(Arc::new(strict(value)?)),
        Kind::Node => Object::Node(Arc::new(strict(value)?)),
        Kind::ServiceCidr => Object::ServiceCidr(Arc::new(strict(value)?)),
        Kind::Namespace => Object::Namespace(Arc::new(strict(value)?)),
        Kind::Ingress => Object::Ingress(Arc::new(strict(value)?)),
        Kind::IngressClass => Object::IngressClass(Arc::new(strict(value)?)),
        Kind::Secret => Object::Secret(Arc::new(strict(value)?)),
        Kind::Deployment => Object::Deployment(Arc::new(strict(value)?)),
        Kind::ConfigMap => Object::ConfigMap(Arc::new(strict(value)?)),
        Kind::GatewayClass => Object::GatewayClass(Arc::new(custom(value)?)),
        Kind::Gateway => Object::Gateway(Arc::new(custom(value)?)),
        Kind::HttpRoute => Object::HttpRoute(Arc::new(custom(value)?)),
        Kind::ReferenceGrant => Object::ReferenceGrant(Arc::new(custom(value)?)),
        Kind::GrpcRoute => Object::GrpcRoute(Arc::new(custom(value)?)),
    })
}

/// [`strict`] for a custom resource, whose type holds neither `apiVersion` nor `kind` (they were
/// read to pick the type).
fn custom<T: DeserializeOwned + kube::Resource>(mut value: Value) -> Result<T, Vec<FieldError>> {
    if let Value::Object(map) = &mut value {
        map.remove("apiVersion");
        map.remove("kind");
    }
    strict(value)
}

/// Deserializes `value`, turning every unknown field into an error naming its path (as is a
/// value of the wrong type), and [slims](crate::object::slim) it.
fn strict<T: DeserializeOwned + kube::Resource>(value: Value) -> Result<T, Vec<FieldError>> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    let result = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut note));
    match result {
        Err(e) => {
            let field = Some(e.path().to_string()).filter(|path| path != ".");
            Err(vec![FieldError { field, message: e.into_inner().to_string() }])
        }
        Ok(mut object) if unknown.is_empty() => {
            crate::object::slim(&mut object);
            Ok(object)
        }
        Ok(_) => Err(unknown
            .into_iter()
            .map(|field| FieldError { field: Some(field), message: "unknown field".into() })
            .collect()),
    }
}

/// Formats a path as `spec.ports[0].name`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

fn str_field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key)?.as_str()
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: NodePortRange = NodePortRange::DEFAULT;

    fn parse(text: &str) -> Vec<Entry> {
        parse_file(Path::new("m/a.yaml"), text, RANGE)
    }

    fn messages(entry: &Entry) -> Vec<String> {
        let Entry::Invalid(_, errors) = entry else { panic!("{entry:?}") };
        errors.iter().map(ToString::to_string).collect()
    }

    fn key(entry: &Entry) -> Option<String> {
        match entry {
            Entry::Valid(key, _) | Entry::Invalid(Some(key), _) => Some(key.to_string()),
            Entry::Invalid(None, _) | Entry::Unsupported(_) => None,
        }
    }

    #[test]
    fn multi_document_with_defaults_and_empty_documents() {
        let entries = parse(
            "---\napiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n---\n---\n\
             apiVersion: v1\nkind: Node\nmetadata: {name: n1, namespace: ignored}\n",
        );
        assert_eq!(entries.len(), 2);
        assert_eq!(key(&entries[0]).unwrap(), "Service default/a");
        let Entry::Valid(_, Object::Service(svc)) = &entries[0] else { panic!("{entries:?}") };
        assert_eq!(svc.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(key(&entries[1]).unwrap(), "Node n1");
    }

    #[test]
    fn list_items_and_unknown_kinds() {
        let entries = parse(
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: x}}\n\
             - {apiVersion: apps/v1beta1, kind: Deployment, metadata: {name: d}}\n---\n\
             apiVersion: v1\nkind: Endpoints\nmetadata: {name: c}\n",
        );
        assert_eq!(entries.len(), 3);
        assert_eq!(key(&entries[0]).unwrap(), "Pod x/p");
        // Unknown kinds give no object, only a note of what was skipped.
        let skipped: Vec<(&str, &str, Option<&str>)> = entries[1..]
            .iter()
            .map(|e| {
                let Entry::Unsupported(u) = e else { panic!("{e:?}") };
                (u.api_version.as_str(), u.kind.as_str(), u.name.as_deref())
            })
            .collect();
        assert_eq!(skipped, [("apps/v1beta1", "Deployment", Some("d")), ("v1", "Endpoints", Some("c"))]);
    }

    #[test]
    fn json_files() {
        let text = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "c"}, "spec": {"cidrs": ["10.96.0.0/12"]}}"#;
        let entries = parse_file(Path::new("c.json"), text, RANGE);
        assert!(matches!(entries[0], Entry::Valid(_, Object::ServiceCidr(_))));
        let entries = parse_file(Path::new("c.json"), "{", RANGE);
        assert!(messages(&entries[0])[0].starts_with("c.json: invalid JSON"), "{entries:?}");
    }

    #[test]
    fn unknown_fields_name_their_path() {
        let entries = parse(
            "apiVersion: v1\nkind: Service\nmetadata: {name: hello}\nspec:\n  portz: []\n  ports: [{port: 80, nmae: x}]\n",
        );
        assert_eq!(
            messages(&entries[0]),
            [
                "m/a.yaml: Service default/hello: spec.ports[0].nmae: unknown field",
                "m/a.yaml: Service default/hello: spec.portz: unknown field",
            ]
        );
    }

    #[test]
    fn validation_and_type_errors_name_the_object() {
        let entries = parse(
            "apiVersion: v1\nkind: Service\nmetadata: {name: hello}\nspec: {ports: [{port: 70000}]}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {name: typed}\nspec: {ports: [{port: eighty}]}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {namespace: x}\n---\n[1]\n---\nkind: Service\n",
        );
        assert_eq!(
            messages(&entries[0]),
            ["m/a.yaml: Service default/hello: spec.ports[0].port: 70000 is out of range 1-65535"]
        );
        assert!(
            messages(&entries[1])[0].starts_with("m/a.yaml: Service default/typed: spec.ports[0].port: invalid type"),
            "{:?}",
            messages(&entries[1])
        );
        assert_eq!(key(&entries[2]), None);
        assert_eq!(messages(&entries[2]), ["m/a.yaml: metadata.name: is required"]);
        assert_eq!(messages(&entries[3]), ["m/a.yaml: expected an object, found a list"]);
        assert_eq!(messages(&entries[4]), ["m/a.yaml: apiVersion and kind are required"]);
    }

    const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web}\nspec:\n  \
        gatewayClassName: roadkeeper\n  listeners:\n  - {name: http, port: 80, protocol: HTTP, hostname: '*.example.com'}\n  \
        - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: web-tls}]}, \
        allowedRoutes: {namespaces: {from: All}}}\n";

    #[test]
    fn gateway_api_manifests() {
        use crate::gateway_api::gateways::GatewayListenersAllowedRoutesNamespacesFrom;
        use crate::gateway_api::httproutes::{HTTPRouteRulesFiltersType, HTTPRouteRulesMatchesPathType};
        let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: web, namespace: team}\n\
            spec:\n  parentRefs: [{name: web, namespace: default, sectionName: http}]\n  hostnames: [app.example.com]\n  \
            rules:\n  - matches: [{path: {type: PathPrefix, value: /app}, headers: [{name: x-env, value: canary}]}]\n    \
            filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-via, value: rk}]}}]\n    \
            backendRefs: [{name: web, port: 8080, weight: 3}]\n";
        let entries = parse(&format!("{GATEWAY}---\n{route}"));
        assert_eq!(
            entries.iter().map(|e| key(e).unwrap()).collect::<Vec<_>>(),
            ["Gateway default/web", "HTTPRoute team/web"]
        );
        let Entry::Valid(_, Object::Gateway(gateway)) = &entries[0] else { panic!("{entries:?}") };
        assert_eq!(gateway.metadata.namespace.as_deref(), Some("default"));
        let [http, https] = &gateway.spec.listeners[..] else { panic!("{gateway:?}") };
        assert_eq!((http.name.as_str(), http.port, http.hostname.as_deref()), ("http", 80, Some("*.example.com")));
        let from = https.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref()?.from.clone());
        assert_eq!(from, Some(GatewayListenersAllowedRoutesNamespacesFrom::All));
        assert_eq!(https.tls.as_ref().unwrap().certificate_refs.as_ref().unwrap()[0].name, "web-tls");

        let Entry::Valid(_, Object::HttpRoute(route)) = &entries[1] else { panic!("{entries:?}") };
        let parent = &route.spec.parent_refs.as_ref().unwrap()[0];
        assert_eq!((parent.namespace.as_deref(), parent.section_name.as_deref()), (Some("default"), Some("http")));
        let rule = &route.spec.rules.as_ref().unwrap()[0];
        let path = rule.matches.as_ref().unwrap()[0].path.as_ref().unwrap();
        assert_eq!(
            (&path.r#type, path.value.as_deref()),
            (&Some(HTTPRouteRulesMatchesPathType::PathPrefix), Some("/app"))
        );
        assert_eq!(rule.filters.as_ref().unwrap()[0].r#type, HTTPRouteRulesFiltersType::RequestHeaderModifier);
        let backend = &rule.backend_refs.as_ref().unwrap()[0];
        assert_eq!((backend.name.as_str(), backend.port, backend.weight), ("web", Some(8080), Some(3)));
    }

    #[test]
    fn gateway_api_errors_name_the_field() {
        let route = |name: &str, spec: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}}}\nspec: {spec}\n"
            )
        };
        let text = [
            route("regex", "{rules: [{matches: [{path: {type: Regex, value: /}}]}]}"),
            route("typo", "{rules: [{backendRef: [{name: web, port: 80}]}]}"),
            route("noport", "{rules: [{backendRefs: [{name: web}]}]}"),
            GATEWAY.replace("name: web}", "name: bad}").replace("name: http,", "name: Http,").replace("port: 80,", "port: 70000,"),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: empty}\nspec: {gatewayClassName: a}\n".into(),
            GATEWAY.replace("/v1\n", "/v1beta1\n"),
        ];
        let mut entries = parse(&text.join("---\n"));
        // The v1beta1 Gateway is of a kind not read: skipped, not an error.
        assert!(matches!(entries.pop(), Some(Entry::Unsupported(u)) if u.api_version.ends_with("/v1beta1")));
        let all: Vec<Vec<String>> = entries.iter().map(messages).collect();
        assert_eq!(
            all,
            [
                vec![
                    "m/a.yaml: HTTPRoute default/regex: spec.rules[0].matches[0].path.type: unknown variant `Regex`, \
                     expected one of `Exact`, `PathPrefix`, `RegularExpression`"
                ],
                vec!["m/a.yaml: HTTPRoute default/typo: spec.rules[0].backendRef: unknown field"],
                vec![
                    "m/a.yaml: HTTPRoute default/noport: spec.rules[0].backendRefs[0].port: is required for a Service"
                ],
                vec![
                    "m/a.yaml: Gateway default/bad: spec.listeners[0].name: \"Http\" must be a lowercase RFC 1123 subdomain: \
                     dot-separated labels of lowercase letters, digits and '-', each starting and ending with a letter or digit",
                    "m/a.yaml: Gateway default/bad: spec.listeners[0].port: 70000 is out of range 1-65535",
                ],
                vec!["m/a.yaml: Gateway default/empty: spec: missing field `listeners`"],
            ],
            "the v1beta1 Gateway is not read"
        );
    }

    #[test]
    fn yaml_syntax_error_names_file_document_and_line() {
        let entries = parse_file(Path::new("m/bad.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: [\n", RANGE);
        let [entry] = &entries[..] else { panic!("{entries:?}") };
        assert_eq!(messages(entry), ["m/bad.yaml: document 1: invalid YAML: line 3 column 18: unclosed bracket '['"]);
    }

    #[test]
    fn a_broken_document_leaves_the_others_of_its_file() {
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: 80}}]}}\n")
        };
        let text = format!(
            "# comment\n{}---\n{}--- # second\napiVersion: v1\nkind: Service\nmetadata: {{name: [\n---\n\
             metadata:\n  name: x\n bad: indent\n---\n{}...\n",
            service("a"),
            service("b"),
            service("c")
        );
        let entries = parse(&text);
        assert_eq!(
            entries.iter().map(|e| key(e).unwrap_or_else(|| messages(e).join("; "))).collect::<Vec<_>>(),
            [
                "Service default/a",
                "Service default/b",
                "m/a.yaml: document 3: invalid YAML: line 14 column 18: unclosed bracket '['",
                "m/a.yaml: document 4: invalid YAML: line 18 column 2: while parsing a block mapping, did not find expected key",
                "Service default/c",
            ]
        );
    }

    #[test]
    fn node_ports_outside_the_range_are_refused() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: ssh}\n\
            spec: {type: NodePort, ports: [{port: 22, nodePort: 22}]}\n";
        let entries = parse(text);
        assert_eq!(
            messages(&entries[0]),
            ["m/a.yaml: Service default/ssh: spec.ports[0].nodePort: 22 is not in the NodePort range 30000-32767 \
              (--service-node-port-range)"]
        );
        let entries = parse_file(Path::new("m/a.yaml"), text, "1-1024".parse().unwrap());
        assert!(matches!(entries[..], [Entry::Valid(..)]), "{entries:?}");
    }
}
