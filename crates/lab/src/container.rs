//! Containers: what each one runs, the files it sees, and the runner that starts it.
//!
//! A container is one process in its pod's network namespace, with mount and UTS namespaces of
//! its own (so `hostname` is the pod's name, and its mounts are invisible to the host and to the
//! other containers). The runner (`roadkeeper lab container SPEC`) enters the pod's network,
//! unshares those two, makes every mount a slave of the host's (nothing propagates back), mounts
//! the pod's volumes (ConfigMaps as files, emptyDirs), binds the pod's `resolv.conf` over
//! `/etc/resolv.conf`, mounts a `/sys` of the pod's network, and executes the program. A mount
//! point missing on the host (such as `/usr/share/nginx/html`) is made inside an overlay of its
//! nearest existing folder whose upper layer is a tmpfs of the container's own: the host's
//! folders are never written.
//!
//! What a container runs ([`crate::confine`] decides what it may): the `roadkeeper` image runs
//! the roadkeeper binary with the container's `command` (its first word replaced by the binary)
//! and `args`, if they name a subcommand a pod runs; any other image is served by the lab's web
//! server ([`roadkeeper_netlab::web`]) on its TCP ports and by the echo server on its UDP ports.
//! The web server serves the pod's document root (annotation `lab.roadkeeper.dev/document-root`,
//! default nginx's `/usr/share/nginx/html`) from the lab's folder of the volume mounted there,
//! and an empty folder when no volume of the container holds it: never this machine's files.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use roadkeeper_cluster::k8s_openapi::api::core::v1::{ConfigMap, Container as ContainerSpecObject};
use roadkeeper_cluster::{NamespacedName, Store};
use serde::{Deserialize, Serialize};

use crate::confine::{self, DEFAULT_DOCUMENT_ROOT, DOCUMENT_ROOT_ANNOTATION};
use crate::state::{LabDir, Pod};
use crate::system::{CLUSTER_DOMAIN, DNS_IP};
use crate::{Error, Result};

/// Everything the runner needs to start one container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Spec {
    /// The pod's network namespace file.
    pub netns: PathBuf,
    /// The host name (the pod's name).
    pub hostname: String,
    /// Bind mounts, in order.
    pub mounts: Vec<Mount>,
    /// The file bound over `/etc/resolv.conf`, if any.
    pub resolv_conf: Option<PathBuf>,
    /// A folder of the pod's, where the runner mounts its tmpfs.
    pub scratch: PathBuf,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Environment variables added.
    pub env: BTreeMap<String, String>,
}

/// A bind mount of a container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Mount {
    /// What is mounted (a file or folder of the pod's in the lab directory).
    pub source: PathBuf,
    /// Where, inside the container.
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The program a container runs (pure), its web server serving `root` (a folder of the lab's);
/// refused when a container of image roadkeeper names no subcommand a pod runs.
pub fn argv(
    binary: &Path,
    pod: &Pod,
    container: &ContainerSpecObject,
    root: &Path,
) -> std::result::Result<Vec<String>, String> {
    let binary = binary.display().to_string();
    if confine::is_roadkeeper(container) {
        let args = confine::roadkeeper_args(container);
        confine::check_args(&args).map_err(|(_, why)| why)?;
        return Ok(std::iter::once(binary).chain(args).collect());
    }
    let root = root.display().to_string();
    let mut argv = vec![binary, "lab".into(), "serve".into(), "--name".into(), pod.name.clone(), "--root".into(), root];
    let ports = container.ports.iter().flatten();
    let tcp: Vec<i32> =
        ports.clone().filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP").map(|p| p.container_port).collect();
    for port in ports {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if protocol == "TCP" {
            argv.extend(["--tcp".into(), port.container_port.to_string()]);
        } else if protocol == "UDP" && !tcp.contains(&port.container_port) {
            argv.extend(["--udp".into(), port.container_port.to_string()]);
        }
    }
    Ok(argv)
}

/// The folder of the pod's that is a container's document root (the pod's annotation, else
/// nginx's): below the deepest of its volume `mounts` holding it, in the lab's folder of that
/// volume; `None` when no volume holds it, or it is missing or leads (through a link) out of the
/// pod's `volumes`.
fn document_root(pod: &Pod, mounts: &[Mount], volumes: &Path) -> Option<PathBuf> {
    let root = pod.annotations.get(DOCUMENT_ROOT_ANNOTATION).map_or(DEFAULT_DOCUMENT_ROOT, String::as_str);
    let points: Vec<&Path> = mounts.iter().map(|m| m.target.as_path()).collect();
    let (i, rest) = confine::below(root, &points)?;
    let source = &mounts[i].source;
    let folder = if rest.as_os_str().is_empty() { source.clone() } else { source.join(rest) };
    folder.canonicalize().ok()?.starts_with(volumes.canonicalize().ok()?).then_some(folder)
}

/// The pod's `resolv.conf` for `dnsPolicy: ClusterFirst` (the default): the cluster DNS and the
/// usual search path; `None` for `Default` (the node's).
pub fn resolv_conf(pod: &Pod) -> Option<String> {
    let policy = pod.spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    (policy != "Default").then(|| {
        let ns = &pod.namespace;
        format!("search {ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\nnameserver {DNS_IP}\noptions ndots:5\n")
    })
}

/// Writes the pod's files (volumes, `resolv.conf`, each container's [`Spec`]) into its folder
/// and returns the path of each container's spec, in spec order. ConfigMaps come from
/// `manifests`; a missing one is a problem, and its volume stays empty. Fails for a container
/// [`argv`] refuses; environment variables [`confine::passes_env`] refuses are left out.
pub fn prepare(lab: &LabDir, binary: &Path, pod: &Pod, manifests: &Store) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let dir = lab.pod_dir(&pod.uid);
    fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let mut problems = Vec::new();
    let mut volumes = BTreeMap::new();
    for volume in pod.spec.volumes.iter().flatten() {
        let path = dir.join("volumes").join(&volume.name);
        fs::create_dir_all(&path).map_err(Error::io(&path))?;
        if let Some(source) = &volume.config_map {
            let key = NamespacedName::new(pod.namespace.as_str(), source.name.as_str());
            match manifests.config_map(&key) {
                Some(config_map) => write_config_map(&path, config_map, source.items.as_deref())?,
                None if source.optional == Some(true) => {}
                None => problems.push(format!(
                    "Pod {}/{}: ConfigMap {key} not found; volume {} is empty",
                    pod.namespace, pod.name, volume.name
                )),
            }
        } else if volume.empty_dir.is_none() {
            problems.push(format!(
                "Pod {}/{}: volume {}: only configMap and emptyDir volumes are supported by the lab; it is empty",
                pod.namespace, pod.name, volume.name
            ));
        }
        volumes.insert(volume.name.clone(), (path, volume.config_map.is_some()));
    }
    let resolv = match resolv_conf(pod) {
        Some(text) => {
            let path = dir.join("resolv.conf");
            fs::write(&path, text).map_err(Error::io(&path))?;
            Some(path)
        }
        None => None,
    };
    let empty = dir.join("empty");
    fs::create_dir_all(&empty).map_err(Error::io(&empty))?;
    let mut specs = Vec::new();
    for container in &pod.spec.containers {
        let mounts = container
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                let (path, config_map) = volumes.get(&m.name)?;
                let source = match m.sub_path.as_deref().filter(|p| !p.is_empty()) {
                    Some(sub) => path.join(sub),
                    None => path.clone(),
                };
                Some(Mount {
                    source,
                    target: m.mount_path.clone().into(),
                    read_only: *config_map || m.read_only == Some(true),
                })
            })
            .collect::<Vec<_>>();
        let root = document_root(pod, &mounts, &dir.join("volumes")).unwrap_or_else(|| empty.clone());
        let argv = argv(binary, pod, container, &root)
            .map_err(|why| Error::Invalid(format!("container {}: {why}", container.name)))?;
        let env = container.env.iter().flatten().filter(|var| confine::passes_env(&var.name));
        let env = env.filter_map(|var| Some((var.name.clone(), var.value.clone()?))).collect();
        let spec = Spec {
            netns: roadkeeper_netlab::netns::path_of(&pod.netns),
            hostname: pod.name.clone(),
            mounts,
            resolv_conf: resolv.clone(),
            scratch: dir.join(format!("scratch-{}", container.name)),
            argv,
            env,
        };
        fs::create_dir_all(&spec.scratch).map_err(Error::io(&spec.scratch))?;
        let path = dir.join(format!("{}.json", container.name));
        let text = serde_json::to_vec_pretty(&spec).map_err(|err| Error::Invalid(err.to_string()))?;
        fs::write(&path, text).map_err(Error::io(&path))?;
        specs.push(path);
    }
    Ok((specs, problems))
}

/// A ConfigMap's keys as files (all of them, or the `items` chosen, at their paths).
fn write_config_map(
    dir: &Path,
    config_map: &ConfigMap,
    items: Option<&[roadkeeper_cluster::k8s_openapi::api::core::v1::KeyToPath]>,
) -> Result<()> {
    let data = config_map.data.clone().unwrap_or_default();
    let binary = config_map.binary_data.clone().unwrap_or_default();
    let content =
        |key: &str| data.get(key).map(|text| text.as_bytes().to_vec()).or_else(|| binary.get(key).map(|b| b.0.clone()));
    let files: Vec<(String, Vec<u8>)> = match items {
        Some(items) => items.iter().filter_map(|item| Some((item.path.clone(), content(&item.key)?))).collect(),
        None => data.keys().chain(binary.keys()).filter_map(|key| Some((key.clone(), content(key)?))).collect(),
    };
    for (relative, bytes) in files {
        if Path::new(&relative).components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(Error::Invalid(format!(
                "ConfigMap {}: item path {relative:?} must be relative and not climb",
                config_map.metadata.name.as_deref().unwrap_or_default()
            )));
        }
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        fs::write(&path, bytes).map_err(Error::io(&path))?;
    }
    Ok(())
}

/// `roadkeeper lab container SPEC`: sets up the container's namespaces and mounts and executes
/// its program; returns only on failure.
pub fn run(spec: &Path) -> Result<std::convert::Infallible> {
    let text = fs::read(spec).map_err(Error::io(spec))?;
    let spec: Spec =
        serde_json::from_slice(&text).map_err(|err| Error::Invalid(format!("{}: {err}", spec.display())))?;
    fn host(what: &str) -> impl FnOnce(nix::Error) -> Error + '_ {
        move |err| Error::Invalid(format!("{what}: {err}"))
    }
    let netns = fs::File::open(&spec.netns).map_err(Error::io(&spec.netns))?;
    setns(&netns, CloneFlags::CLONE_NEWNET).map_err(host("entering the pod's network"))?;
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS).map_err(host("unsharing mounts and host name"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
        .map_err(host("making mounts slaves"))?;
    nix::unistd::sethostname(&spec.hostname).map_err(host("setting the host name"))?;
    mount(Some("tmpfs"), &spec.scratch, Some("tmpfs"), MsFlags::empty(), Some("mode=0755"))
        .map_err(host("mounting the scratch tmpfs"))?;
    let mut overlays = 0;
    let mut binds: Vec<(&Path, &Path, bool)> =
        spec.mounts.iter().map(|m| (m.source.as_path(), m.target.as_path(), m.read_only)).collect();
    if let Some(resolv) = &spec.resolv_conf {
        binds.push((resolv, Path::new("/etc/resolv.conf"), true));
    }
    for (source, target, read_only) in binds {
        ensure_mount_point(target, source.is_dir(), &spec.scratch, &mut overlays)?;
        let what = format!("binding {} on {}", source.display(), target.display());
        mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(host(&what))?;
        if read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(host(&what))?;
        }
    }
    // A /sys of the pod's network (as `ip netns exec` mounts one); not fatal where refused.
    if umount2("/sys", MntFlags::MNT_DETACH).is_ok() {
        let _ = mount(Some("sysfs"), "/sys", Some("sysfs"), MsFlags::empty(), None::<&str>);
    }
    std::env::set_current_dir("/").map_err(Error::io("/"))?;
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|err| Error::Invalid(err.to_string()))?;
    let program = argv.first().ok_or_else(|| Error::Invalid("the container has no program".into()))?;
    for (key, value) in &spec.env {
        // SAFETY: single-threaded here (the runner starts no threads before exec).
        unsafe { std::env::set_var(key, value) };
    }
    let err = nix::unistd::execvp(program, &argv).unwrap_err();
    Err(Error::Invalid(format!("cannot run {}: {err}", spec.argv[0])))
}

/// Makes `target` exist (a folder when `dir`, else a file), creating what is missing inside an
/// overlay of its nearest existing folder whose upper layer lives in the scratch tmpfs.
fn ensure_mount_point(target: &Path, dir: bool, scratch: &Path, overlays: &mut usize) -> Result<()> {
    if target.exists() {
        return Ok(());
    }
    let existing = target.ancestors().skip(1).find(|a| a.is_dir()).unwrap_or(Path::new("/"));
    if existing == Path::new("/") {
        return Err(Error::Invalid(format!(
            "mount point {}: its first folder does not exist on this machine",
            target.display()
        )));
    }
    let layer = scratch.join(overlays.to_string());
    *overlays += 1;
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    for folder in [&upper, &work] {
        fs::create_dir_all(folder).map_err(Error::io(folder))?;
    }
    let options = format!("lowerdir={},upperdir={},workdir={}", existing.display(), upper.display(), work.display());
    mount(Some("overlay"), existing, Some("overlay"), MsFlags::empty(), Some(options.as_str())).map_err(|err| {
        Error::Invalid(format!("overlaying {} to make {}: {err}", existing.display(), target.display()))
    })?;
    if dir {
        fs::create_dir_all(target).map_err(Error::io(target))
    } else {
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        fs::File::create(target).map(drop).map_err(Error::io(target))
    }
}

/// `roadkeeper lab serve`: the lab's web server on TCP `tcp` ports (files below `root`, or
/// when `root` is `None` a line naming server and client) and the echo server on UDP `udp`
/// ports, answering as `name`, until killed.
pub fn serve(name: &str, root: Option<PathBuf>, tcp: &[u16], udp: &[u16]) -> Result<()> {
    let any = |port: u16| SocketAddr::from(([0, 0, 0, 0], port));
    let _echo = if udp.is_empty() {
        None
    } else {
        Some(roadkeeper_netlab::echo::serve(&udp.iter().map(|&p| any(p)).collect::<Vec<_>>(), name)?)
    };
    let listen: Vec<SocketAddr> = tcp.iter().map(|&p| any(p)).collect();
    if listen.is_empty() {
        loop {
            std::thread::park();
        }
    }
    roadkeeper_netlab::web::run_forever(&listen, roadkeeper_netlab::web::Site { name: name.to_owned(), root })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(value: serde_json::Value) -> ContainerSpecObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn what_containers_run() {
        let pod = crate::testing::pod("hello-abc", "node-1", [10, 244, 1, 2], &[]);
        let web = container(json!({"name": "nginx", "image": "nginx:1.27", "ports": [{"containerPort": 80},
            {"containerPort": 53, "protocol": "UDP"}, {"containerPort": 80, "protocol": "UDP"}]}));
        let root = Path::new("/lab/pods/u/volumes/html");
        assert_eq!(
            argv(Path::new("/rk"), &pod, &web, root).unwrap(),
            [
                "/rk",
                "lab",
                "serve",
                "--name",
                "hello-abc",
                "--root",
                "/lab/pods/u/volumes/html",
                "--tcp",
                "80",
                "--udp",
                "53"
            ]
        );
        let own = container(
            json!({"name": "dns", "image": "ghcr.io/x/roadkeeper:0.1", "command": ["roadkeeper", "dns"], "args": ["--ttl", "1"]}),
        );
        assert_eq!(argv(Path::new("/rk"), &pod, &own, root).unwrap(), ["/rk", "dns", "--ttl", "1"]);
        let escape = container(json!({"name": "c", "image": "roadkeeper", "command": ["roadkeeper", "lab", "exec"]}));
        assert!(argv(Path::new("/rk"), &pod, &escape, root).unwrap_err().starts_with("\"lab\" is not run in a lab"));
        assert_eq!(
            resolv_conf(&pod).unwrap(),
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn config_maps_become_files() {
        let dir = tempfile::tempdir().unwrap();
        let lab = LabDir::resolve(Some(dir.path()));
        let mut pod = crate::testing::pod("p", "node-1", [10, 244, 1, 2], &[]);
        pod.netns = "rkl-x-pod-0".into();
        pod.spec = serde_json::from_value(json!({"volumes": [{"name": "html", "configMap": {"name": "site",
            "items": [{"key": "index.html", "path": "index.html"}, {"key": "index.html", "path": "hello/index.html"}]}},
            {"name": "missing", "configMap": {"name": "nope"}}],
            "containers": [{"name": "nginx", "image": "nginx", "volumeMounts": [{"name": "html", "mountPath": "/usr/share/nginx/html"}]}]})).unwrap();
        let site: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": "site", "namespace": "default"}, "data": {"index.html": "<h1>hi</h1>"}}),
        )
        .unwrap();
        let store = Store::from_objects([roadkeeper_cluster::Object::ConfigMap(site.into())]);
        let (specs, problems) = prepare(&lab, Path::new("/rk"), &pod, &store).unwrap();
        assert_eq!(problems, ["Pod default/p: ConfigMap default/nope not found; volume missing is empty"]);
        let volume = lab.pod_dir(&pod.uid).join("volumes/html");
        assert_eq!(fs::read_to_string(volume.join("hello/index.html")).unwrap(), "<h1>hi</h1>");
        let spec: Spec = serde_json::from_slice(&fs::read(&specs[0]).unwrap()).unwrap();
        assert_eq!(
            spec.mounts,
            [Mount { source: volume.clone(), target: "/usr/share/nginx/html".into(), read_only: true }]
        );
        assert_eq!(spec.netns, Path::new("/var/run/netns/rkl-x-pod-0"));
        assert_eq!(spec.argv[5..7], ["--root".to_owned(), volume.display().to_string()]);
    }

    /// A pod of `spec` with `annotations`, prepared in a scratch lab: its folder and its first
    /// container's spec, or why not.
    fn prepared(spec: serde_json::Value, annotations: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf, Result<Spec>) {
        let dir = tempfile::tempdir().unwrap();
        let lab = LabDir::resolve(Some(dir.path()));
        let mut pod = crate::testing::pod("p", "node-1", [10, 244, 1, 2], &[]);
        pod.spec = serde_json::from_value(spec).unwrap();
        pod.annotations = annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let spec = prepare(&lab, Path::new("/rk"), &pod, &Store::default())
            .map(|(specs, _)| serde_json::from_slice(&fs::read(&specs[0]).unwrap()).unwrap());
        (dir, lab.pod_dir(&pod.uid), spec)
    }

    #[test]
    fn document_roots_are_folders_of_the_pods_volumes() {
        // The folder served (below the pod's) for a document root and the volume's mount point.
        let served = |root: &str, mount: &str| {
            let spec = json!({"volumes": [{"name": "site", "emptyDir": {}}], "containers": [{"name": "web",
                "image": "nginx", "ports": [{"containerPort": 80}],
                "volumeMounts": [{"name": "site", "mountPath": mount}]}]});
            let (_dir, pod_dir, spec) = prepared(spec, &[(DOCUMENT_ROOT_ANNOTATION, root)]);
            PathBuf::from(&spec.unwrap().argv[6]).strip_prefix(pod_dir).unwrap().to_owned()
        };
        assert_eq!(served("/srv/site", "/srv/site"), Path::new("volumes/site"));
        assert_eq!(served("/srv/site/a", "/srv"), Path::new("empty"), "a missing folder of the volume");
        for outside in ["/etc", "/srv/site/../../etc", "/srv"] {
            assert_eq!(served(outside, "/srv/site"), Path::new("empty"), "{outside}");
        }
        assert_eq!(served(DEFAULT_DOCUMENT_ROOT, "/srv/site"), Path::new("empty"), "nginx's, without a volume");
    }

    #[test]
    fn what_a_manifest_may_not_pass() {
        let (_dir, _, spec) = prepared(
            json!({"containers": [{"name": "c", "image": "nginx", "env": [{"name": "LD_PRELOAD", "value": "/x.so"},
                {"name": "PATH", "value": "/x"}, {"name": "ROADKEEPER_LAB_ID", "value": "other"},
                {"name": "GREETING", "value": "hi"}]}]}),
            &[],
        );
        assert_eq!(spec.unwrap().env, BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]));
        let (_dir, _, refused) =
            prepared(json!({"containers": [{"name": "c", "image": "roadkeeper", "args": ["-v", "cleanup"]}]}), &[]);
        assert!(refused.unwrap_err().to_string().starts_with("container c: \"cleanup\" is not run in a lab container"));
    }
}
