//! Tests of the manifests in `deploy/` (`roadkeeper.yaml`, the node proxy; `dns.yaml`, the
//! cluster DNS; `ingress.yaml`, the Ingress controller; `gateway.yaml`, the Gateway API
//! implementation): real Kubernetes objects that run this binary with flags it accepts.
//! `tests/node` applies them to a real node.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::SocketAddr;
    use std::path::{Path, PathBuf};

    use clap::Parser;
    use roadkeeper_cluster::k8s_openapi;
    use roadkeeper_rules::config::{ProxyConfig, ProxyMode};
    use serde_json::Value;

    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe, Service, ServiceAccount, ServicePort};
    use k8s_openapi::api::networking::v1::IngressClass;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use k8s_openapi::serde::Serialize;
    use k8s_openapi::serde::de::DeserializeOwned;

    use roadkeeper_ingress::routes::ClassConfig;

    use roadkeeper_cluster::gateway_api::gatewayclasses::GatewayClass;

    use crate::cli::{Cli, Command, DnsArgs, GatewayArgs, IngressArgs, ProxyArgs};

    /// The node name the downward API gives `NODE_NAME` in these tests.
    const NODE: &str = "node-a";

    /// The node proxy's file.
    const PROXY: &str = "roadkeeper.yaml";
    /// The Ingress controller's file.
    const INGRESS: &str = "ingress.yaml";
    /// The cluster DNS's file.
    const DNS: &str = "dns.yaml";
    /// The Gateway API implementation's file.
    const GATEWAY: &str = "gateway.yaml";

    /// The ConfigMap the node proxy takes the API server's address from.
    const API_SERVER_CONFIG_MAP: &str = "kubernetes-services-endpoint";

    /// What `roadkeeper dns --pods=insecure` reads from the API, each with exactly `list` and `watch`.
    const DNS_READS: [(&str, &str); 3] = [("", "services"), ("", "namespaces"), ("discovery.k8s.io", "endpointslices")];

    /// What roadkeeper reads from the API, each with exactly `list` and `watch`.
    const READS: [(&str, &str); 4] = [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "servicecidrs"),
    ];

    /// What `roadkeeper ingress` reads from the API (with `list` and `watch`) and writes (`patch`).
    const INGRESS_GRANTS: [(&str, &str, &[&str]); 6] = [
        ("", "services", &["list", "watch"]),
        ("", "secrets", &["list", "watch"]),
        ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
        ("networking.k8s.io", "ingresses", &["list", "watch"]),
        ("networking.k8s.io", "ingressclasses", &["list", "watch"]),
        ("networking.k8s.io", "ingresses/status", &["patch"]),
    ];

    /// What `roadkeeper gateway` reads from the API (with `list` and `watch`) and writes (`patch`).
    const GATEWAY_GRANTS: [(&str, &str, &[&str]); 11] = [
        ("", "services", &["list", "watch"]),
        ("", "secrets", &["list", "watch"]),
        ("", "namespaces", &["list", "watch"]),
        ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
        ("gateway.networking.k8s.io", "gatewayclasses", &["list", "watch"]),
        ("gateway.networking.k8s.io", "gateways", &["list", "watch"]),
        ("gateway.networking.k8s.io", "httproutes", &["list", "watch"]),
        ("gateway.networking.k8s.io", "referencegrants", &["list", "watch"]),
        ("gateway.networking.k8s.io", "gatewayclasses/status", &["patch"]),
        ("gateway.networking.k8s.io", "gateways/status", &["patch"]),
        ("gateway.networking.k8s.io", "httproutes/status", &["patch"]),
    ];

    fn deploy_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
    }

    /// Every object of one file of `deploy/`, typed.
    #[derive(Default)]
    struct Deploy {
        service_accounts: Vec<ServiceAccount>,
        cluster_roles: Vec<ClusterRole>,
        bindings: Vec<ClusterRoleBinding>,
        config_maps: Vec<ConfigMap>,
        daemon_sets: Vec<DaemonSet>,
        deployments: Vec<Deployment>,
        services: Vec<Service>,
        ingress_classes: Vec<IngressClass>,
        gateway_classes: Vec<GatewayClass>,
    }

    /// The names of the `*.yaml` files of `deploy/`, sorted.
    fn yaml_files() -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(deploy_dir())
            .expect("deploy/ exists")
            .map(|entry| entry.expect("deploy/ is readable").file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".yaml"))
            .collect();
        files.sort();
        files
    }

    /// Reads every YAML document of `deploy/<name>` into its k8s-openapi type; panics on any other
    /// kind and on any field the type does not know.
    fn load(file_name: &str) -> Deploy {
        load_file(&deploy_dir().join(file_name), &format!("deploy/{file_name}"))
    }

    /// As [`load`], for `file`, named `file_name` in messages.
    fn load_file(file: &Path, file_name: &str) -> Deploy {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut deploy = Deploy::default();
        for (index, document) in documents.into_iter().enumerate() {
            let api_version = document["apiVersion"].as_str().unwrap_or_default().to_owned();
            let kind = document["kind"].as_str().unwrap_or_default().to_owned();
            let name = document["metadata"]["name"].as_str().unwrap_or_default();
            let what = format!("{file_name}, object {} ({kind} {name})", index + 1);
            match (api_version.as_str(), kind.as_str()) {
                ("v1", "ServiceAccount") => deploy.service_accounts.push(strict(&what, document)),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => deploy.cluster_roles.push(strict(&what, document)),
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => deploy.bindings.push(strict(&what, document)),
                ("v1", "ConfigMap") => deploy.config_maps.push(strict(&what, document)),
                ("apps/v1", "DaemonSet") => deploy.daemon_sets.push(strict(&what, document)),
                ("apps/v1", "Deployment") => deploy.deployments.push(strict(&what, document)),
                ("v1", "Service") => deploy.services.push(strict(&what, document)),
                ("networking.k8s.io/v1", "IngressClass") => deploy.ingress_classes.push(strict(&what, document)),
                ("gateway.networking.k8s.io/v1", "GatewayClass") => {
                    deploy.gateway_classes.push(strict(&what, document))
                }
                _ => panic!(
                    "{what}: {api_version:?} {kind:?} is not a kind deploy/ should hold (ServiceAccount, \
                     ClusterRole, ClusterRoleBinding, ConfigMap, DaemonSet, Deployment, Service, IngressClass, \
                     GatewayClass)"
                ),
            }
        }
        deploy
    }

    /// Deserializes `document` into `T` and serializes it back: whatever does not come back
    /// unchanged is a field `T` does not know (a typo, a wrong indentation) or a mistyped value.
    fn strict<T: DeserializeOwned + Serialize>(what: &str, document: Value) -> T {
        let typed: T = serde_json::from_value(document.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let again = serde_json::to_value(&typed).expect("typed objects serialize");
        let mut differences = Vec::new();
        diff("", &document, &again, &mut differences);
        assert!(
            differences.is_empty(),
            "{what}: fields the API would not take as written:\n{}",
            differences.join("\n")
        );
        typed
    }

    /// The verbs `role` grants per (API group, resource); panics on aggregation, resource names and
    /// non-resource URLs.
    fn grants(role: &ClusterRole) -> BTreeMap<(String, String), BTreeSet<String>> {
        assert!(role.aggregation_rule.is_none(), "no aggregation");
        let mut granted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for rule in role.rules.iter().flatten() {
            assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none(), "{rule:?}");
            let groups = rule.api_groups.as_deref().unwrap_or_default();
            let resources = rule.resources.as_deref().unwrap_or_default();
            assert!(!groups.is_empty() && !resources.is_empty(), "a rule names groups and resources: {rule:?}");
            for group in groups {
                for resource in resources {
                    granted.entry((group.clone(), resource.clone())).or_default().extend(rule.verbs.iter().cloned());
                }
            }
        }
        granted
    }

    /// `(group, resource, verbs)` as [`grants`] returns them.
    fn grant_map<'a>(
        wanted: impl IntoIterator<Item = (&'a str, &'a str, &'a [&'a str])>,
    ) -> BTreeMap<(String, String), BTreeSet<String>> {
        let verbs = |verbs: &[&str]| verbs.iter().map(|verb| verb.to_string()).collect();
        wanted.into_iter().map(|(group, resource, v)| ((group.into(), resource.into()), verbs(v))).collect()
    }

    /// Collects the paths where `written` and its typed round trip differ.
    fn diff(path: &str, written: &Value, typed: &Value, out: &mut Vec<String>) {
        let child = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
        match (written, typed) {
            (Value::Object(written), Value::Object(typed)) => {
                for (key, value) in written {
                    match typed.get(key) {
                        Some(other) => diff(&child(key), value, other, out),
                        None => out.push(format!("{}: unknown field", child(key))),
                    }
                }
                for key in typed.keys().filter(|key| !written.contains_key(*key)) {
                    out.push(format!("{}: missing as written", child(key)));
                }
            }
            (Value::Array(written), Value::Array(typed)) if written.len() == typed.len() => {
                for (index, (value, other)) in written.iter().zip(typed).enumerate() {
                    diff(&format!("{path}[{index}]"), value, other, out);
                }
            }
            (written, typed) if written == typed => {}
            (written, typed) => out.push(format!("{path}: written {written}, read as {typed}")),
        }
    }

    fn only<'a, T>(what: &str, objects: &'a [T]) -> &'a T {
        assert_eq!(objects.len(), 1, "each file of deploy/ must hold exactly one {what}");
        &objects[0]
    }

    fn pod_spec(ds: &DaemonSet) -> &PodSpec {
        ds.spec.as_ref().and_then(|spec| spec.template.spec.as_ref()).expect("DaemonSet has a pod template spec")
    }

    fn container(ds: &DaemonSet) -> &Container {
        let pod = pod_spec(ds);
        assert_eq!(pod.containers.len(), 1, "one container");
        &pod.containers[0]
    }

    fn only_container(pod: &PodSpec) -> &Container {
        assert_eq!(pod.containers.len(), 1, "one container");
        assert!(pod.init_containers.is_none(), "no init containers");
        &pod.containers[0]
    }

    fn deployment_pod_spec(deployment: &Deployment) -> &PodSpec {
        let spec = deployment.spec.as_ref().and_then(|spec| spec.template.spec.as_ref());
        spec.expect("Deployment has a pod template spec")
    }

    /// The container's environment as the kubelet would set it on node [`NODE`].
    fn env(container: &Container) -> BTreeMap<String, String> {
        container
            .env
            .iter()
            .flatten()
            .map(|var| {
                let field = var.value_from.as_ref().and_then(|from| from.field_ref.as_ref());
                let value = match (&var.value, field) {
                    (Some(value), None) => value.clone(),
                    (None, Some(field)) if field.field_path == "spec.nodeName" => NODE.to_owned(),
                    _ => panic!("env {}: only literal values and spec.nodeName are expected", var.name),
                };
                (var.name.clone(), value)
            })
            .collect()
    }

    /// The command line as the kubelet runs it: command + args, `$(VAR)` replaced from the env
    /// (an unknown variable would be passed literally, so it is an error here).
    fn command_line(container: &Container) -> Vec<String> {
        let env = env(container);
        let expand = |arg: &String| {
            let (mut out, mut rest) = (String::new(), arg.as_str());
            while let Some(start) = rest.find("$(") {
                out.push_str(&rest[..start]);
                let end = rest[start..].find(')').map(|end| start + end).unwrap_or_else(|| panic!("{arg}: open $("));
                let name = &rest[start + 2..end];
                out.push_str(env.get(name).unwrap_or_else(|| panic!("{arg}: $({name}) is not in the container's env")));
                rest = &rest[end + 1..];
            }
            out + rest
        };
        container.command.iter().chain(container.args.iter()).flatten().map(expand).collect()
    }

    /// The DaemonSet's command line, parsed by roadkeeper's own flag parser.
    fn proxy_args(container: &Container) -> ProxyArgs {
        let argv = command_line(container);
        assert!(
            matches!(argv.first().map(String::as_str), Some("roadkeeper" | "/usr/local/bin/roadkeeper")),
            "the command runs the roadkeeper binary of the image: {argv:?}"
        );
        let cli = Cli::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("roadkeeper rejects the DaemonSet's command line {argv:?}:\n{e}"));
        match cli.command {
            Command::Proxy(args) => args,
            other => panic!("the DaemonSet must run `roadkeeper proxy`, not {other:?}"),
        }
    }

    /// The text of the file at `path` in the container: a key of a ConfigMap of deploy/ mounted
    /// there (a whole-ConfigMap directory mount, with or without `items`, or a `subPath`).
    fn mounted_file(deploy: &Deploy, ds: &DaemonSet, path: &Path) -> String {
        let container = container(ds);
        let (mount, relative) = container
            .volume_mounts
            .iter()
            .flatten()
            .find_map(|mount| Some((mount, path.strip_prefix(&mount.mount_path).ok()?)))
            .unwrap_or_else(|| panic!("{} is not on a volume mount of the container", path.display()));
        let volume = pod_spec(ds)
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .unwrap_or_else(|| panic!("volume {} is not defined", mount.name));
        let source = volume.config_map.as_ref().unwrap_or_else(|| panic!("volume {} is not a ConfigMap", volume.name));
        let file_name = match mount.sub_path.as_deref().filter(|sub| !sub.is_empty()) {
            Some(sub_path) => {
                assert_eq!(relative, Path::new(""), "a subPath mount is the file itself");
                sub_path.to_owned()
            }
            None => relative.to_str().expect("UTF-8 path").to_owned(),
        };
        let key = match &source.items {
            Some(items) => items
                .iter()
                .find(|item| item.path == file_name)
                .map(|item| item.key.clone())
                .unwrap_or_else(|| panic!("no item of volume {} is mounted as {file_name}", volume.name)),
            None => file_name,
        };
        let config_map = deploy
            .config_maps
            .iter()
            .find(|cm| cm.metadata.name.as_deref() == Some(source.name.as_str()))
            .unwrap_or_else(|| panic!("ConfigMap {} is not in deploy/", source.name));
        assert_eq!(config_map.metadata.namespace, ds.metadata.namespace, "ConfigMap {} namespace", source.name);
        config_map
            .data
            .as_ref()
            .and_then(|data| data.get(&key))
            .unwrap_or_else(|| panic!("ConfigMap {} has no key {key}", source.name))
            .clone()
    }

    /// The settings the proxy starts with, for the fields checked here: the `--config` file as
    /// mounted from the ConfigMap, then the flags (the order of `proxy_cmd::build_config`).
    fn effective_config(deploy: &Deploy, ds: &DaemonSet, args: &ProxyArgs) -> ProxyConfig {
        let mut cfg = ProxyConfig::default();
        if let Some(path) = &args.rules.config {
            let text = mounted_file(deploy, ds, path);
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("config.yaml");
            std::fs::write(&file, text).expect("write config");
            cfg.apply_file(&file, None).unwrap_or_else(|e| panic!("--config {}: {e}", path.display()));
        }
        if let Some(address) = &args.healthz_bind_address {
            cfg.healthz_bind_address = address.clone();
        }
        if let Some(mode) = &args.rules.proxy_mode {
            cfg.mode = mode.parse().unwrap_or_else(|e| panic!("--proxy-mode: {e}"));
        }
        if cfg.mode == ProxyMode::Iptables
            && let Some(on) = args.rules.iptables_localhost_nodeports
        {
            cfg.localhost_nodeports = on;
        }
        cfg
    }

    #[test]
    fn every_document_is_a_known_kind_without_unknown_fields() {
        assert_eq!(yaml_files(), [DNS, GATEWAY, INGRESS, PROXY], "a new file in deploy/ needs its checks here");
        let deploy = load(DNS);
        only("ServiceAccount", &deploy.service_accounts);
        only("ClusterRole", &deploy.cluster_roles);
        only("ClusterRoleBinding", &deploy.bindings);
        only("Deployment", &deploy.deployments);
        only("Service", &deploy.services);
        assert!(deploy.config_maps.is_empty() && deploy.daemon_sets.is_empty() && deploy.ingress_classes.is_empty());
        let deploy = load(PROXY);
        only("ServiceAccount", &deploy.service_accounts);
        only("ClusterRole", &deploy.cluster_roles);
        only("ClusterRoleBinding", &deploy.bindings);
        only("DaemonSet", &deploy.daemon_sets);
        assert!(deploy.config_maps.len() <= 1, "at most one ConfigMap");
        assert!(deploy.deployments.is_empty() && deploy.services.is_empty() && deploy.ingress_classes.is_empty());
        let deploy = load(INGRESS);
        only("ServiceAccount", &deploy.service_accounts);
        only("ClusterRole", &deploy.cluster_roles);
        only("ClusterRoleBinding", &deploy.bindings);
        only("Deployment", &deploy.deployments);
        only("Service", &deploy.services);
        only("IngressClass", &deploy.ingress_classes);
        assert!(deploy.config_maps.is_empty() && deploy.daemon_sets.is_empty());
        let deploy = load(GATEWAY);
        only("ServiceAccount", &deploy.service_accounts);
        only("ClusterRole", &deploy.cluster_roles);
        only("ClusterRoleBinding", &deploy.bindings);
        only("Deployment", &deploy.deployments);
        only("GatewayClass", &deploy.gateway_classes);
        assert!(deploy.config_maps.is_empty() && deploy.daemon_sets.is_empty() && deploy.services.is_empty());
    }

    #[test]
    fn command_line_is_accepted_by_roadkeeper_proxy() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        let argv = command_line(container(ds));
        assert!(
            !argv.iter().any(|arg| arg.starts_with("--manifests") || arg.starts_with("--kubeconfig")),
            "cluster state comes from the API through the in-cluster config: {argv:?}"
        );
        assert!(!argv.iter().any(|arg| arg == "--once"), "the proxy must keep running: {argv:?}");
        let args = proxy_args(container(ds));
        assert_eq!(args.hostname_override.as_deref(), Some(NODE), "--hostname-override=$(NODE_NAME)");
    }

    /// The node's conntrack settings need a writable `/proc/sys`: a privileged init container
    /// writes them (`proxy --init-only`, kube-proxy's answer) from the same config file, so
    /// that the proxy itself keeps only its capabilities.
    #[test]
    fn a_privileged_init_container_writes_the_conntrack_settings_from_the_same_config() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        let init = pod_spec(ds).init_containers.as_deref().unwrap_or_default();
        assert_eq!(init.len(), 1, "one init container");
        let (init, main) = (&init[0], container(ds));
        let (init_args, main_args) = (proxy_args(init), proxy_args(main));
        assert!(init_args.init_only && !main_args.init_only, "--init-only in the init container only");
        assert_eq!(init_args.rules.config, main_args.rules.config, "the same --config");
        assert_eq!(init.image, main.image, "the same image");
        let config_mount = |container: &Container| {
            let path = main_args.rules.config.as_deref().expect("--config");
            container
                .volume_mounts
                .iter()
                .flatten()
                .find(|mount| path.starts_with(&mount.mount_path))
                .map(|mount| (mount.name.clone(), mount.mount_path.clone()))
        };
        assert!(config_mount(init).is_some() && config_mount(init) == config_mount(main), "the same config volume");
        let privileged = |container: &Container| container.security_context.as_ref().and_then(|s| s.privileged);
        assert_eq!(privileged(init), Some(true), "/proc/sys is writable only in a privileged container");
        assert_ne!(privileged(main), Some(true), "the proxy itself is not privileged");
    }

    #[test]
    fn probes_use_the_health_server() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        let container = container(ds);
        let cfg = effective_config(&deploy, ds, &proxy_args(container));
        let address: SocketAddr = cfg
            .healthz_bind_address
            .parse()
            .unwrap_or_else(|e| panic!("healthz bind address {:?}: {e}", cfg.healthz_bind_address));
        assert!(
            address.ip().is_unspecified(),
            "the kubelet probes the pod IP (the node's IP, host network): {address} must be 0.0.0.0 or [::]"
        );
        let probes: [(&str, Option<&Probe>, &str); 2] = [
            ("livenessProbe", container.liveness_probe.as_ref(), "/livez"),
            ("readinessProbe", container.readiness_probe.as_ref(), "/healthz"),
        ];
        for (name, probe, path) in probes {
            let http = probe.and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("{name}: httpGet expected"));
            assert_eq!(http.path.as_deref(), Some(path), "{name}.httpGet.path");
            assert_eq!(http.port, IntOrString::Int(address.port().into()), "{name}.httpGet.port vs {address}");
            assert_eq!(http.host, None, "{name}.httpGet.host: the pod IP");
            assert!(http.scheme.as_deref().is_none_or(|s| s == "HTTP"), "{name}.httpGet.scheme: HTTP");
        }
    }

    #[test]
    fn cluster_role_grants_only_list_and_watch_on_what_is_read() {
        let deploy = load(PROXY);
        let wanted = READS.iter().map(|&(group, resource)| (group, resource, &["list", "watch"][..]));
        assert_eq!(grants(only("ClusterRole", &deploy.cluster_roles)), grant_map(wanted));
    }

    /// The file's one ClusterRoleBinding ties its one ServiceAccount to its one ClusterRole, and
    /// the workload `kind` (in `namespace`, running `pod`) runs as that account, in its namespace.
    fn assert_bound(deploy: &Deploy, kind: &str, namespace: Option<&String>, pod: &PodSpec) {
        let account = only("ServiceAccount", &deploy.service_accounts);
        let role = only("ClusterRole", &deploy.cluster_roles);
        let binding = only("ClusterRoleBinding", &deploy.bindings);
        let role_ref = &binding.role_ref;
        assert_eq!(
            (role_ref.api_group.as_str(), role_ref.kind.as_str(), Some(role_ref.name.as_str())),
            ("rbac.authorization.k8s.io", "ClusterRole", role.metadata.name.as_deref())
        );
        let subjects = binding.subjects.as_deref().unwrap_or_default();
        let expected =
            (Some("ServiceAccount"), account.metadata.name.as_deref(), account.metadata.namespace.as_deref());
        let subject = subjects.first().map(|s| (Some(s.kind.as_str()), Some(s.name.as_str()), s.namespace.as_deref()));
        assert_eq!((subjects.len(), subject), (1, Some(expected)), "one subject: {subjects:?}");
        assert_eq!(pod.service_account_name.as_deref(), account.metadata.name.as_deref());
        assert_eq!(namespace, account.metadata.namespace.as_ref(), "{kind} and ServiceAccount namespace");
    }

    #[test]
    fn binding_ties_the_service_account_of_the_daemon_set_to_the_role() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        assert_bound(&deploy, "DaemonSet", ds.metadata.namespace.as_ref(), pod_spec(ds));
    }

    #[test]
    fn config_file_loads_and_is_mounted_at_the_config_path() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        let args = proxy_args(container(ds));
        match &args.rules.config {
            // Reads the file through the mount and loads it as the proxy does.
            Some(_) => {
                effective_config(&deploy, ds, &args);
            }
            None => assert!(deploy.config_maps.is_empty(), "a ConfigMap but no --config"),
        }
        for config_map in &deploy.config_maps {
            let name = config_map.metadata.name.as_deref();
            let used =
                pod_spec(ds).volumes.iter().flatten().any(|v| v.config_map.as_ref().map(|c| c.name.as_str()) == name);
            assert!(used, "ConfigMap {name:?} is not mounted");
        }
    }

    #[test]
    fn pod_runs_on_the_host_network_unprivileged_with_only_the_capabilities_it_needs() {
        let deploy = load(PROXY);
        let ds = only("DaemonSet", &deploy.daemon_sets);
        let pod = pod_spec(ds);
        let container = container(ds);
        let cfg = effective_config(&deploy, ds, &proxy_args(container));
        assert_eq!(pod.host_network, Some(true), "hostNetwork: the rules are the node's");
        assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
        assert_eq!(
            pod.node_selector.as_ref().and_then(|s| s.get("kubernetes.io/os")).map(String::as_str),
            Some("linux")
        );
        let tolerates_all = pod
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none());
        assert!(tolerates_all, "tolerates every taint, as kube-proxy");

        let security = container.security_context.as_ref().expect("securityContext");
        assert_ne!(security.privileged, Some(true), "not privileged");
        let capabilities = security.capabilities.as_ref().expect("capabilities");
        let dropped: BTreeSet<&str> = capabilities.drop.iter().flatten().map(String::as_str).collect();
        assert!(dropped.contains("ALL"), "drop ALL: {dropped:?}");
        let added: BTreeSet<&str> = capabilities.add.iter().flatten().map(String::as_str).collect();
        let mut needed = BTreeSet::from(["NET_ADMIN"]);
        if cfg.mode == ProxyMode::Iptables {
            // Legacy iptables uses a raw socket, and detecting the flavour lists the legacy tables.
            needed.insert("NET_RAW");
            // route_localnet is a sysctl, read-only for a non-privileged container.
            assert!(!cfg.localhost_nodeports, "iptables mode: localhost NodePorts need privileges");
            let lock = container.volume_mounts.iter().flatten().any(|m| m.mount_path == "/run/xtables.lock");
            assert!(lock, "iptables mode: the host's /run/xtables.lock must be mounted");
        }
        // NET_BIND_SERVICE only matters to a cluster whose NodePort range reaches below 1024.
        let allowed: BTreeSet<&str> = needed.iter().copied().chain(["NET_BIND_SERVICE"]).collect();
        assert!(
            needed.is_subset(&added) && added.is_subset(&allowed),
            "capabilities.add for {:?} mode: {added:?}, needed {needed:?}",
            cfg.mode
        );

        // The API server is reached directly (its Service's ClusterIP is what this pod programs),
        // at the address the cluster's ConfigMap gives: both variables come from it, and no
        // literal value in the manifest overrides them.
        let env = env(container);
        assert!(
            !env.contains_key("KUBERNETES_SERVICE_HOST") && !env.contains_key("KUBERNETES_SERVICE_PORT"),
            "{env:?}"
        );
        let from: Vec<_> =
            container.env_from.iter().flatten().filter_map(|from| from.config_map_ref.as_ref()).collect();
        assert!(
            from.iter().any(|c| c.name == API_SERVER_CONFIG_MAP && c.optional != Some(true)),
            "envFrom: the ConfigMap {API_SERVER_CONFIG_MAP}, not optional: {from:?}"
        );
    }

    /// The one Deployment of `deploy` and its command line, parsed by roadkeeper's own flag parser.
    fn deployment_command(deploy: &Deploy) -> (&Deployment, Command) {
        let deployment = only("Deployment", &deploy.deployments);
        let pod = deployment_pod_spec(deployment);
        assert_eq!(pod.containers.len(), 1, "one container");
        let argv = command_line(&pod.containers[0]);
        assert!(
            matches!(argv.first().map(String::as_str), Some("roadkeeper" | "/usr/local/bin/roadkeeper")),
            "the command runs the roadkeeper binary of the image: {argv:?}"
        );
        assert!(
            !argv.iter().any(|arg| arg.starts_with("--manifests") || arg.starts_with("--kubeconfig")),
            "cluster state comes from the API through the in-cluster config: {argv:?}"
        );
        let cli = Cli::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("roadkeeper rejects the Deployment's command line {argv:?}:\n{e}"));
        (deployment, cli.command)
    }

    /// The Deployment of `deploy/ingress.yaml` and its `roadkeeper ingress` arguments.
    fn ingress_args(deploy: &Deploy) -> (&Deployment, IngressArgs) {
        match deployment_command(deploy) {
            (deployment, Command::Ingress(args)) => (deployment, args),
            (_, other) => panic!("the Deployment must run `roadkeeper ingress`, not {other:?}"),
        }
    }

    /// The container port a Service port sends to: its number, or the container port of its name.
    fn target_port(port: &ServicePort, container: &Container) -> i32 {
        match port.target_port.as_ref().expect("targetPort") {
            IntOrString::Int(number) => *number,
            IntOrString::String(name) => {
                let named = container.ports.iter().flatten().find(|p| p.name.as_ref() == Some(name));
                named.unwrap_or_else(|| panic!("no container port named {name}")).container_port
            }
        }
    }

    /// The port of `--http` or `--https` (`IP:PORT`), which must listen on every address (the pod
    /// IP is what the Service and the kubelet reach).
    fn listen_port(flag: &str, address: &str) -> i32 {
        let address: SocketAddr = address.parse().unwrap_or_else(|e| panic!("{flag} {address:?}: {e}"));
        assert!(address.ip().is_unspecified(), "{flag} {address} must listen on 0.0.0.0 or [::]");
        address.port().into()
    }

    #[test]
    fn ingress_command_line_is_accepted_and_publishes_a_status_for_the_deployed_class() {
        let deploy = load(INGRESS);
        let (_, args) = ingress_args(&deploy);
        let service = only("Service", &deploy.services);
        let name = service.metadata.namespace.clone().zip(service.metadata.name.clone());
        let published = args.publish_service.as_ref().map(|s| (s.namespace.clone(), s.name.clone()));
        assert_eq!(published, name, "--publish-service: the file's Service, whose addresses clients reach");
        let class = only("IngressClass", &deploy.ingress_classes);
        assert_eq!(class.metadata.name.as_deref(), Some(args.class.as_str()), "IngressClass name vs --class");
        let controller = class.spec.as_ref().and_then(|spec| spec.controller.as_deref());
        assert_eq!(controller, Some(ClassConfig::default().controller.as_str()));
    }

    #[test]
    fn ingress_cluster_role_grants_exactly_what_roadkeeper_ingress_uses() {
        let deploy = load(INGRESS);
        assert_eq!(grants(only("ClusterRole", &deploy.cluster_roles)), grant_map(INGRESS_GRANTS));
    }

    #[test]
    fn binding_ties_the_service_account_of_each_deployment_to_its_role() {
        for file in [INGRESS, DNS, GATEWAY] {
            let deploy = load(file);
            let deployment = only("Deployment", &deploy.deployments);
            assert_bound(&deploy, file, deployment.metadata.namespace.as_ref(), deployment_pod_spec(deployment));
        }
    }

    #[test]
    fn every_container_has_a_memory_request_and_limit() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mebibytes = |q: &Quantity| -> u64 {
            let (number, unit) = q.0.split_at(q.0.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.0.len()));
            let factor = match unit {
                "Mi" => 1,
                "Gi" => 1024,
                other => panic!("memory in Mi or Gi, not {other:?}"),
            };
            number.parse::<u64>().expect("a whole number") * factor
        };
        for file in yaml_files() {
            let deploy = load(&file);
            let pods =
                deploy.daemon_sets.iter().map(pod_spec).chain(deploy.deployments.iter().map(deployment_pod_spec));
            for pod in pods {
                for container in pod.containers.iter().chain(pod.init_containers.iter().flatten()) {
                    let resources = container.resources.as_ref();
                    let memory =
                        |list: Option<&BTreeMap<String, Quantity>>| list.and_then(|l| l.get("memory")).map(mebibytes);
                    let request = memory(resources.and_then(|r| r.requests.as_ref()));
                    let limit = memory(resources.and_then(|r| r.limits.as_ref()));
                    let what = format!("deploy/{file}: container {}", container.name);
                    assert!(
                        matches!((request, limit), (Some(r), Some(l)) if r <= l),
                        "{what}: memory {request:?} / {limit:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ingress_service_and_probes_reach_the_ports_roadkeeper_ingress_listens_on() {
        let deploy = load(INGRESS);
        let (deployment, args) = ingress_args(&deploy);
        let pod = deployment.spec.as_ref().map(|spec| &spec.template).expect("pod template");
        let container = only_container(deployment_pod_spec(deployment));
        let (http, https) = (listen_port("--http", &args.http), listen_port("--https", &args.https));

        let service = only("Service", &deploy.services);
        assert_eq!(service.metadata.namespace, deployment.metadata.namespace, "Service and Deployment namespace");
        let spec = service.spec.as_ref().expect("Service spec");
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        let labels = pod.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        let selector = spec.selector.clone().unwrap_or_default();
        assert!(!selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "{selector:?}");
        let target = |number: i32| {
            let port = spec.ports.iter().flatten().find(|p| p.port == number);
            target_port(port.unwrap_or_else(|| panic!("port {number}")), container)
        };
        assert_eq!((target(80), target(443)), (http, https), "Service ports 80 and 443 vs --http and --https");

        for (name, probe) in
            [("readinessProbe", &container.readiness_probe), ("livenessProbe", &container.liveness_probe)]
        {
            let tcp = probe.as_ref().and_then(|p| p.tcp_socket.as_ref());
            let port = tcp.map(|tcp| &tcp.port).unwrap_or_else(|| panic!("{name}: tcpSocket expected"));
            assert_eq!(port, &IntOrString::Int(http), "{name} vs --http");
        }
    }

    /// The Deployment of `deploy/gateway.yaml` and its `roadkeeper gateway` arguments.
    fn gateway_args(deploy: &Deploy) -> (&Deployment, GatewayArgs) {
        match deployment_command(deploy) {
            (deployment, Command::Gateway(args)) => (deployment, args),
            (_, other) => panic!("the Deployment must run `roadkeeper gateway`, not {other:?}"),
        }
    }

    #[test]
    fn gateway_class_pool_route_and_grants_match_roadkeeper_gateway() {
        let deploy = load(GATEWAY);
        let (deployment, args) = gateway_args(&deploy);
        let class = only("GatewayClass", &deploy.gateway_classes);
        assert_eq!(
            class.spec.controller_name, args.controller_name,
            "GatewayClass controllerName vs --controller-name"
        );
        assert_eq!(grants(only("ClusterRole", &deploy.cluster_roles)), grant_map(GATEWAY_GRANTS));
        let pod = deployment_pod_spec(deployment);
        assert_eq!(pod.host_network, Some(true), "listeners are told apart by the address reached: host network");
        let init = pod.init_containers.as_deref().unwrap_or_default();
        let route = init.iter().map(command_line).find(|argv| argv.first().map(String::as_str) == Some("ip"));
        let pool = args.address_pool.to_string();
        assert_eq!(
            route,
            Some(["ip", "route", "replace", "local", &pool, "dev", "lo"].map(String::from).to_vec()),
            "an init container makes --address-pool local"
        );
        let container = &pod.containers[0];
        let caps = container.security_context.as_ref().and_then(|c| c.capabilities.as_ref()).expect("capabilities");
        assert_eq!(caps.add.as_deref(), Some(&["NET_BIND_SERVICE".to_owned()][..]), "only binding low ports");
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
        let metrics = listen_port("--metrics-bind-address", &args.metrics_bind_address);
        let probe =
            container.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("readinessProbe httpGet");
        assert_eq!((probe.path.as_deref(), &probe.port), (Some("/metrics"), &IntOrString::Int(metrics)));
    }

    /// The Deployment of `deploy/dns.yaml` and its `roadkeeper dns` arguments.
    fn dns_args(deploy: &Deploy) -> (&Deployment, DnsArgs) {
        match deployment_command(deploy) {
            (deployment, Command::Dns(args)) => (deployment, args),
            (_, other) => panic!("the Deployment must run `roadkeeper dns`, not {other:?}"),
        }
    }

    #[test]
    fn dns_takes_the_place_of_kube_dns_as_kubeadm_installs_it() {
        let deploy = load(DNS);
        let (deployment, args) = dns_args(&deploy);
        assert_eq!(args.pods, "insecure", "pod records as kubeadm's Corefile (`pods insecure`)");
        assert_eq!(args.zone.first().map(String::as_str), Some("cluster.local"));
        let service = only("Service", &deploy.services);
        assert_eq!(
            (service.metadata.namespace.as_deref(), service.metadata.name.as_deref()),
            (Some("kube-system"), Some("kube-dns"))
        );
        assert_eq!(deployment.metadata.namespace.as_deref(), Some("kube-system"));
        let spec = service.spec.as_ref().expect("Service spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"), "kubeadm's clusterDNS for 10.96.0.0/12");
        let pod = deployment.spec.as_ref().map(|spec| &spec.template).expect("pod template");
        let labels = pod.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        assert_eq!(labels.get("k8s-app").map(String::as_str), Some("kube-dns"), "CoreDNS's label, which tools select");
        let selector = spec.selector.clone().unwrap_or_default();
        assert!(!selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "{selector:?}");

        // Port 53 over UDP and TCP, to the port --listen binds on every address.
        let [listen] = args.listen.as_slice() else { panic!("one --listen: {:?}", args.listen) };
        assert!(listen.ip().is_unspecified(), "--listen {listen}: the pod IP is what the Service reaches");
        let container = only_container(deployment_pod_spec(deployment));
        for protocol in ["UDP", "TCP"] {
            let port = spec.ports.iter().flatten().find(|p| p.port == 53 && p.protocol.as_deref() == Some(protocol));
            let port = port.unwrap_or_else(|| panic!("Service port 53/{protocol}"));
            assert_eq!(target_port(port, container), i32::from(listen.port()), "53/{protocol} vs --listen");
        }
        // Below 1024 without a capability: the pod's own sysctl.
        if listen.port() < 1024 {
            let sysctls = deployment_pod_spec(deployment).security_context.as_ref().and_then(|s| s.sysctls.clone());
            let start = sysctls.iter().flatten().find(|s| s.name == "net.ipv4.ip_unprivileged_port_start");
            let start: u16 = start.map(|s| s.value.parse().expect("a port")).unwrap_or(1024);
            assert!(start <= listen.port(), "port {} needs net.ipv4.ip_unprivileged_port_start", listen.port());
        }

        let health: SocketAddr = args.health_bind_address.parse().expect("--health-bind-address");
        assert!(health.ip().is_unspecified(), "the kubelet probes the pod IP: {health}");
        let probes = [
            ("livenessProbe", &container.liveness_probe, "/health"),
            ("readinessProbe", &container.readiness_probe, "/ready"),
        ];
        for (name, probe, path) in probes {
            let http = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("{name}: httpGet"));
            assert_eq!(http.path.as_deref(), Some(path), "{name}.httpGet.path");
            assert_eq!(http.port, IntOrString::Int(health.port().into()), "{name}.httpGet.port vs {health}");
        }
    }

    /// docs/replacing-coredns.md runs `deploy/dns.yaml` beside CoreDNS as kubeadm installs it
    /// (`tests/node/coredns.yaml`, on which `tests/node` proves the procedure): applying it leaves
    /// the `kube-dns` Service's ports and selector as they were, its Deployment neither selects
    /// CoreDNS's pods nor is a second `k8s-app=kube-dns` Deployment (which `kubeadm upgrade apply`
    /// refuses: "multiple DNS addon deployments found"), and a stopping pod answers on (lameduck)
    /// while its endpoint leaves the rules, within its grace period.
    #[test]
    fn dns_joins_kubeadms_coredns_behind_kube_dns_without_touching_it() {
        let deploy = load(DNS);
        let coredns_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/node/coredns.yaml");
        let coredns = load_file(&coredns_file, "tests/node/coredns.yaml");
        let (ours, theirs) = (only("Service", &deploy.services), only("Service", &coredns.services));
        let (ours, theirs) = (ours.spec.as_ref().expect("spec"), theirs.spec.as_ref().expect("spec"));
        assert_eq!(ours.selector, theirs.selector, "the kube-dns Service's selector");
        assert_eq!(ours.ports, theirs.ports, "the kube-dns Service's ports, target ports included");

        let (deployment, args) = dns_args(&deploy);
        let coredns_deployment = only("Deployment", &coredns.deployments);
        let labels = |meta: Option<&ObjectMeta>| meta.and_then(|m| m.labels.clone()).unwrap_or_default();
        let selects = |selector: &LabelSelector, labels: &BTreeMap<String, String>| {
            assert!(selector.match_expressions.is_none(), "matchLabels only: {selector:?}");
            selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
        };
        let spec = deployment.spec.as_ref().expect("spec");
        let coredns_pods = labels(coredns_deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref()));
        assert!(!selects(&spec.selector, &coredns_pods), "the Deployment's selector takes CoreDNS's pods");
        let kubeadm = coredns_deployment.metadata.labels.clone().unwrap_or_default();
        let (key, value) = kubeadm.iter().next().expect("kubeadm's Deployment label");
        assert_ne!(
            labels(Some(&deployment.metadata)).get(key),
            Some(value),
            "kubeadm finds its DNS Deployment by {key}={value}: ours must not be a second one"
        );
        let grace = deployment_pod_spec(deployment).termination_grace_period_seconds.unwrap_or(30);
        let lameduck = args.lameduck.as_secs();
        assert!(lameduck >= 5, "--lameduck {lameduck}s: at least CoreDNS's 5s, the time the rules take to follow");
        assert!(lameduck + 5 <= grace as u64, "--lameduck {lameduck}s within terminationGracePeriodSeconds {grace}");
    }

    #[test]
    fn dns_cluster_role_grants_only_list_and_watch_on_what_is_read() {
        let deploy = load(DNS);
        let wanted = DNS_READS.iter().map(|&(group, resource)| (group, resource, &["list", "watch"][..]));
        assert_eq!(grants(only("ClusterRole", &deploy.cluster_roles)), grant_map(wanted));
    }
}
