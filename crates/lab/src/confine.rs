//! What a manifest may make a container do (pure). Containers run as root in namespaces of this
//! machine, so the lab, not the manifest, decides what they run:
//!
//! - a container of image `roadkeeper` runs the roadkeeper binary with the container's
//!   arguments, which must name a subcommand a pod runs ([`POD_SUBCOMMANDS`]); never `lab`
//!   (which enters the lab's hosts and runs any program there), `cleanup`, `trace` or `bench`;
//! - any other image is served by the lab's web server, whose document root must lie inside a
//!   volume the container mounts ([`below`]); it is served from the lab's own folder of that
//!   volume, never from this machine's files;
//! - the environment variables that change what a program of this machine loads or runs
//!   (those glibc removes for set-user-ID programs, `PATH`) and the lab's own (`ROADKEEPER_*`)
//!   are not passed ([`passes_env`]).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use roadkeeper_cluster::Object;
use roadkeeper_cluster::k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::system::ROADKEEPER_IMAGE;

/// The annotation naming the folder the lab's web server serves in a pod's containers.
pub const DOCUMENT_ROOT_ANNOTATION: &str = "lab.roadkeeper.dev/document-root";
/// The document root without that annotation: nginx's.
pub const DEFAULT_DOCUMENT_ROOT: &str = "/usr/share/nginx/html";
/// The subcommands a container of image `roadkeeper` may run.
pub const POD_SUBCOMMANDS: &[&str] = &["proxy", "rules", "dns", "ingress", "gateway", "echo"];

/// Environment variables glibc removes from the environment of set-user-ID programs
/// (`UNSECURE_ENVVARS`, with every `LD_*`): they make a program load or read files it names.
const LOADER_ENV: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
];

/// Whether a container runs the roadkeeper binary (image `roadkeeper`, any registry and tag).
pub fn is_roadkeeper(container: &Container) -> bool {
    let image = container.image.as_deref().unwrap_or_default();
    let repository = image.rsplit('/').next().unwrap_or_default().split([':', '@']).next().unwrap_or_default();
    repository == ROADKEEPER_IMAGE
}

/// The roadkeeper binary's arguments for a container of image `roadkeeper`: its `command`
/// without the first word (the binary), then its `args`.
pub fn roadkeeper_args(container: &Container) -> Vec<String> {
    let command = container.command.iter().flatten().skip(1);
    command.chain(container.args.iter().flatten()).cloned().collect()
}

/// Checks roadkeeper's arguments: `-v` flags, then one of [`POD_SUBCOMMANDS`]. Refused: the
/// index of the word refused (`args.len()` when none names a subcommand) and why.
pub fn check_args(args: &[String]) -> Result<(), (usize, String)> {
    let verbose = |word: &str| {
        word == "--verbose" || word.strip_prefix('-').is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b == b'v'))
    };
    let allowed = POD_SUBCOMMANDS.join(", ");
    match args.iter().position(|word| !verbose(word)) {
        Some(i) if POD_SUBCOMMANDS.contains(&args[i].as_str()) => Ok(()),
        Some(i) => Err((
            i,
            format!("{:?} is not run in a lab container: a container of image roadkeeper runs {allowed}", args[i]),
        )),
        None => Err((args.len(), format!("names no subcommand: a container of image roadkeeper runs {allowed}"))),
    }
}

/// Whether a manifest's environment variable `name` is passed to its container.
pub fn passes_env(name: &str) -> bool {
    !(name.starts_with("LD_") || name.starts_with("ROADKEEPER_") || name == "PATH" || LOADER_ENV.contains(&name))
}

/// The mount point holding `root` (an absolute path without `.` or `..`), the deepest of
/// `mount_points` (the last of equal ones, which the container sees), and the path below it;
/// `None` when none holds it or `root` is not such a path.
pub fn below(root: &str, mount_points: &[&Path]) -> Option<(usize, PathBuf)> {
    let root = Path::new(root);
    let plain = root.is_absolute() && root.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain {
        return None;
    }
    let holding = mount_points.iter().enumerate().filter_map(|(i, point)| Some((i, root.strip_prefix(point).ok()?)));
    let (i, rest) = holding.rev().min_by_key(|(_, rest)| rest.components().count())?;
    Some((i, rest.to_owned()))
}

/// What the lab refuses of a Pod or a Deployment's pod template: each a field and why.
pub fn problems(object: &Object) -> Vec<(String, String)> {
    let (meta, at, metadata, spec) = match object {
        Object::Pod(pod) => ("metadata", "spec", Some(&pod.metadata), pod.spec.as_ref()),
        Object::Deployment(deployment) => {
            let template = deployment.spec.as_ref().map(|spec| &spec.template);
            let metadata = template.and_then(|t| t.metadata.as_ref());
            ("spec.template.metadata", "spec.template.spec", metadata, template.and_then(|t| t.spec.as_ref()))
        }
        _ => return Vec::new(),
    };
    let annotations = metadata.and_then(|m| m.annotations.as_ref());
    spec.map_or_else(Vec::new, |spec| pod_problems(meta, annotations, at, spec))
}

/// [`problems`] of a pod's metadata (at `meta`) and spec (at `at`).
fn pod_problems(
    meta: &str,
    annotations: Option<&BTreeMap<String, String>>,
    at: &str,
    spec: &PodSpec,
) -> Vec<(String, String)> {
    let root = annotations.and_then(|a| a.get(DOCUMENT_ROOT_ANNOTATION));
    let mut found = Vec::new();
    for (i, container) in spec.containers.iter().enumerate() {
        let at = format!("{at}.containers[{i}]");
        if is_roadkeeper(container) {
            if let Err((word, message)) = check_args(&roadkeeper_args(container)) {
                let command_words = container.command.as_ref().map_or(0, |c| c.len().saturating_sub(1));
                found.push((format!("{at}.{}", if word < command_words { "command" } else { "args" }), message));
            }
        } else if let Some(root) = root.filter(|_| serves_http(container)) {
            let points: Vec<&Path> =
                container.volume_mounts.iter().flatten().map(|m| Path::new(m.mount_path.as_str())).collect();
            if below(root, &points).is_none() {
                found.push((
                    format!("{meta}.annotations[{DOCUMENT_ROOT_ANNOTATION}]"),
                    format!(
                        "{root:?} is not inside a volume mounted in container {}: the lab serves only a \
                         container's volumes (never this machine's files), so it serves nothing",
                        container.name
                    ),
                ));
            }
        }
        for (j, var) in container.env.iter().flatten().enumerate().filter(|(_, var)| !passes_env(&var.name)) {
            found.push((
                format!("{at}.env[{j}].name"),
                format!(
                    "{:?} is not passed to lab containers (it changes what this machine's programs load)",
                    var.name
                ),
            ));
        }
    }
    found
}

/// Whether the lab's web server runs for a container (a TCP port).
fn serves_http(container: &Container) -> bool {
    container.ports.iter().flatten().any(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn only_the_subcommands_a_pod_runs() {
        for ok in [&["dns", "--manifests", "/x"][..], &["-vv", "proxy"], &["--verbose", "-v", "ingress"], &["echo"]] {
            assert_eq!(check_args(&args(ok)), Ok(()), "{ok:?}");
        }
        let refused = |words: &[&str]| check_args(&args(words)).unwrap_err();
        assert_eq!(refused(&["lab", "exec", "client", "--", "sh"]).0, 0);
        assert!(refused(&["lab"]).1.starts_with("\"lab\" is not run in a lab container: a container of image"));
        assert_eq!(refused(&["-v", "cleanup"]).0, 1);
        for words in
            [&["trace", "http://x"][..], &["bench", "proxy"], &["-vh", "dns"], &["--verbose=2", "dns"], &["help"]]
        {
            assert_eq!(refused(words).0, 0, "{words:?}");
        }
        let runs = "a container of image roadkeeper runs proxy, rules, dns, ingress, gateway, echo";
        assert_eq!(refused(&["-v"]), (1, format!("names no subcommand: {runs}")));
    }

    #[test]
    fn the_environment_that_changes_what_programs_load_is_not_passed() {
        for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "GCONV_PATH", "PATH", "ROADKEEPER_LAB_ID", "GLIBC_TUNABLES"] {
            assert!(!passes_env(name), "{name}");
        }
        for name in ["RUST_LOG", "GREETING", "KUBECONFIG", "LDAP"] {
            assert!(passes_env(name), "{name}");
        }
    }

    #[test]
    fn document_roots_lie_below_a_mount_point() {
        let points =
            [Path::new("/usr/share/nginx/html"), Path::new("/srv"), Path::new("/srv/site/"), Path::new("/srv")];
        assert_eq!(below("/usr/share/nginx/html", &points), Some((0, "".into())));
        assert_eq!(below("/srv/site/a/b", &points), Some((2, "a/b".into())));
        assert_eq!(below("/srv/other", &points), Some((3, "other".into())), "the last of equal mount points");
        for outside in ["/etc", "/usr/share/nginx", "/usr/share/nginx/html2", "/", "relative", "/srv/../etc"] {
            assert_eq!(below(outside, &points), None, "{outside}");
        }
        assert_eq!(below("/srv", &[]), None);
    }

    #[test]
    fn problems_name_their_field() {
        let deployment: roadkeeper_cluster::k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "d"}, "spec": {"selector": {}, "template": {
                "metadata": {"annotations": {DOCUMENT_ROOT_ANNOTATION: "/etc"}},
                "spec": {"containers": [
                    {"name": "web", "image": "nginx", "ports": [{"containerPort": 80}],
                        "volumeMounts": [{"name": "v", "mountPath": "/etc/x"}],
                        "env": [{"name": "LD_PRELOAD", "value": "/v/x.so"}]},
                    {"name": "udp", "image": "nginx", "ports": [{"containerPort": 53, "protocol": "UDP"}]},
                    {"name": "own", "image": "ghcr.io/x/roadkeeper:1", "command": ["roadkeeper", "-v"],
                        "args": ["cleanup"]},
                    {"name": "dns", "image": "roadkeeper", "args": ["dns"]}]}}}}))
        .unwrap();
        let fields: Vec<String> =
            problems(&Object::Deployment(Arc::new(deployment))).into_iter().map(|(field, _)| field).collect();
        assert_eq!(
            fields,
            [
                "spec.template.metadata.annotations[lab.roadkeeper.dev/document-root]",
                "spec.template.spec.containers[0].env[0].name",
                "spec.template.spec.containers[2].args"
            ]
        );
        let pod: roadkeeper_cluster::k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {DOCUMENT_ROOT_ANNOTATION: "/etc/x/site"}},
            "spec": {"containers": [
                {"name": "web", "image": "nginx", "ports": [{"containerPort": 80}],
                    "volumeMounts": [{"name": "v", "mountPath": "/etc/x"}]},
                {"name": "own", "image": "roadkeeper", "command": ["roadkeeper", "lab", "exec"]}]}}))
        .unwrap();
        let refused = problems(&Object::Pod(Arc::new(pod)));
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "spec.containers[1].command");
        assert!(refused[0].1.starts_with("\"lab\" is not run in a lab container"), "{refused:?}");
    }
}
