//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback,
//! built from the Go module in `tests/k8s`. Each instance has its own certificates, tokens, ports
//! and scratch folder; its processes are killed and the folder removed on drop, also when a test
//! panics.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long each start-up step (kube-apiserver ready, default ServiceAccount made) may take.
/// How long a component may take to start (times [`slowdown`] under emulation).
fn start_timeout() -> Duration {
    Duration::from_secs(90) * slowdown()
}

/// How many times slower than real hardware the tests run here: `ROADKEEPER_TEST_SLOWDOWN` (set
/// by tests/vm under emulation), else 1. The waits on the proxy and on the control plane are
/// multiplied by it.
pub fn slowdown() -> u32 {
    std::env::var("ROADKEEPER_TEST_SLOWDOWN").ok().and_then(|v| v.parse().ok()).filter(|v| *v >= 1).unwrap_or(1)
}
/// How often [`ControlPlane::start`] retries when another process took one of its ports.
const START_ATTEMPTS: usize = 3;
/// The bind error that makes a start worth retrying with fresh ports.
const PORT_TAKEN: &str = "address already in use";
/// Bearer token of the cluster admin (group `system:masters`).
const ADMIN_TOKEN: &str = "roadkeeper-admin-token";
/// Bearer token of kube-controller-manager.
const KCM_TOKEN: &str = "roadkeeper-kcm-token";
/// Service-account token issuer, also the API audience.
const ISSUER: &str = "https://kubernetes.default.svc";
/// Controllers kube-controller-manager runs: the ones Services, EndpointSlices and Pods need.
const CONTROLLERS: &str = "endpointslice-controller,endpointslice-mirroring-controller,garbage-collector-controller,\
    namespace-controller,root-ca-certificate-publisher-controller,serviceaccount-controller,\
    serviceaccount-token-controller";
/// Names of the binaries, also of their log files.
const ETCD: &str = "etcd";
const APISERVER: &str = "kube-apiserver";
const KCM: &str = "kube-controller-manager";
/// Lines of each log that [`ControlPlane::logs`] shows.
const LOG_TAIL: usize = 40;

/// A control plane listening on loopback (of the host, or of a network namespace); the admin
/// authenticates by token (group `system:masters`). It departs from a production cluster twice:
/// kube-apiserver runs without its watch cache, so watches read etcd directly and
/// [`compact_etcd`] makes watches from older resourceVersions fail with `410 Gone` (as after a
/// compaction that outran a disconnected client); and it advertises 127.0.0.1, which Endpoints
/// may not hold, so Service `kubernetes` has no endpoints unless a test writes them.
///
/// [`compact_etcd`]: ControlPlane::compact_etcd
pub struct ControlPlane {
    // Fields drop in declaration order: the daemons, last started first, then the folder.
    kcm: Option<Daemon>,
    apiserver: Option<Daemon>,
    etcd: Option<Daemon>,
    ports: Ports,
    netns: Option<String>,
    admin_kubeconfig: PathBuf,
    dir: TempDir,
}

/// Loopback ports of one control plane.
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
}

/// A control-plane process, killed and reaped on drop.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager, inside network namespace `netns`
    /// if given (else on the host), and waits until the API is ready and Pods can be created in
    /// namespace `default`. Builds the binaries on first use. Panics with the logs on failure.
    pub fn start(netns: Option<&str>) -> ControlPlane {
        let mut attempt = 1;
        loop {
            match ControlPlane::try_start(netns) {
                Ok(control_plane) => return control_plane,
                Err(err) if attempt < START_ATTEMPTS && err.contains(PORT_TAKEN) => attempt += 1,
                Err(err) => panic!("control plane did not start: {err}"),
            }
        }
    }

    /// The kubeconfig of the cluster admin.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Writes a kubeconfig that authenticates with bearer `token` (e.g. from `kubectl create
    /// token`); its path.
    pub fn kubeconfig_with_token(&self, token: &str) -> PathBuf {
        let file = tempfile::Builder::new().prefix("kubeconfig-").tempfile_in(self.dir.path());
        let (_, path) = file.and_then(|file| file.keep().map_err(|err| err.error)).expect("cannot create kubeconfig");
        self.write_kubeconfig(&path, token);
        path
    }

    /// Creates the standard-channel CRDs of the Gateway API release `module` (`module@version`,
    /// from the Go module cache, downloaded if needed) of the kinds `plurals`, and waits until
    /// they are served.
    pub fn install_gateway_api_crds(&self, module: &str, plurals: &[&str]) {
        let output = Command::new("go").args(["mod", "download", "-json", module]).output().expect("cannot run go");
        assert!(output.status.success(), "go mod download {module}: {}", String::from_utf8_lossy(&output.stderr));
        let downloaded: Value = serde_json::from_slice(&output.stdout).expect("go prints JSON");
        let folder = Path::new(downloaded["Dir"].as_str().expect("the module's folder")).join("config/crd/standard");
        let files: Vec<String> = plurals
            .iter()
            .map(|plural| folder.join(format!("gateway.networking.k8s.io_{plural}.yaml")).display().to_string())
            .collect();
        // `create`, not `apply`: the HTTPRoute CRD is too large for kubectl's last-applied annotation.
        let mut args = vec!["create"];
        args.extend(files.iter().flat_map(|file| ["-f", file.as_str()]));
        self.kubectl(&args);
        let names: Vec<String> =
            plurals.iter().map(|plural| format!("crd/{plural}.gateway.networking.k8s.io")).collect();
        let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        args.extend(names.iter().map(String::as_str));
        self.kubectl(&args);
    }

    /// Runs kubectl as the admin (a later `--kubeconfig` in `args` overrides that); its stdout.
    /// Panics with stderr on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None).unwrap_or_else(|err| panic!("kubectl {args:?} failed: {err}"))
    }

    /// Like [`kubectl`](Self::kubectl), with `stdin` as its input (for `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        self.try_kubectl(args, Some(stdin)).unwrap_or_else(|err| panic!("kubectl {args:?} failed: {err}"))
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// Kills kube-apiserver and waits for it to exit (etcd and kube-controller-manager keep
    /// running).
    pub fn stop_apiserver(&mut self) {
        self.apiserver = None;
    }

    /// Starts kube-apiserver (again) with the same flags and port and waits until it is ready.
    pub fn start_apiserver(&mut self) {
        self.try_start_apiserver().unwrap_or_else(|err| panic!("kube-apiserver did not start: {err}"));
    }

    /// Compacts etcd at its current revision, physically, so that reads and watches from older
    /// resourceVersions fail with `410 Gone`.
    pub fn compact_etcd(&self) {
        let status = self.etcd_gateway("range", json!({ "key": "AA==" }));
        let revision = &status["header"]["revision"];
        self.etcd_gateway("compaction", json!({ "revision": revision, "physical": true }));
    }

    /// The last lines of each process's log.
    pub fn logs(&self) -> String {
        [ETCD, APISERVER, KCM]
            .map(|name| {
                let log = fs::read_to_string(self.log_path(name)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!("--- {name} ---\n{}\n", lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n"))
            })
            .concat()
    }

    /// One start attempt; on failure the processes started so far are killed on return.
    fn try_start(netns: Option<&str>) -> Result<ControlPlane, String> {
        let dir = tempfile::Builder::new().prefix("roadkeeper-k8s-").tempdir().expect("cannot create scratch folder");
        let mut control_plane = ControlPlane {
            kcm: None,
            apiserver: None,
            etcd: None,
            ports: Ports::free(),
            netns: netns.map(str::to_owned),
            admin_kubeconfig: dir.path().join("admin.kubeconfig"),
            dir,
        };
        control_plane.write_credentials();
        control_plane.etcd = Some(control_plane.spawn(ETCD, control_plane.etcd_args()));
        control_plane.try_start_apiserver()?;
        control_plane.kcm = Some(control_plane.spawn(KCM, control_plane.kcm_args()));
        control_plane.wait_until("the default ServiceAccount", |cp| {
            cp.get("/api/v1/namespaces/default/serviceaccounts/default").is_ok()
        })?;
        Ok(control_plane)
    }

    fn try_start_apiserver(&mut self) -> Result<(), String> {
        self.apiserver = Some(self.spawn(APISERVER, self.apiserver_args()));
        self.wait_until("/readyz", |cp| cp.get("/readyz").is_ok_and(|body| body == "ok"))
    }

    /// Writes the CA, the API server's serving certificate, the service-account key pair, the
    /// token file and the kubeconfigs of the admin and kube-controller-manager.
    fn write_credentials(&self) {
        let ca_key = KeyPair::generate().expect("cannot generate CA key");
        let ca_params = ca_params();
        self.write("ca.crt", &ca_params.self_signed(&ca_key).expect("cannot sign CA").pem());
        let ca = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().expect("cannot generate serving key");
        let serving = serving_params().signed_by(&serving_key, &ca).expect("cannot sign serving certificate");
        self.write("apiserver.crt", &serving.pem());
        self.write("apiserver.key", &serving_key.serialize_pem());

        let sa_key = KeyPair::generate().expect("cannot generate service-account key");
        self.write("sa.key", &sa_key.serialize_pem());
        self.write("sa.pub", &sa_key.public_key_pem());

        // token,user,uid,"groups": kube-controller-manager uses its own credentials for every
        // controller, which needs more than its bootstrap role grants.
        self.write(
            "tokens.csv",
            &format!(
                "{ADMIN_TOKEN},admin,admin,system:masters\n\
                 {KCM_TOKEN},system:kube-controller-manager,kcm,system:masters\n"
            ),
        );
        self.write_kubeconfig(&self.admin_kubeconfig, ADMIN_TOKEN);
        self.write_kubeconfig(Path::new(&self.file("kcm.kubeconfig")), KCM_TOKEN);
    }

    /// Writes a kubeconfig for this API server and bearer `token` at `path`.
    fn write_kubeconfig(&self, path: &Path, token: &str) {
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "roadkeeper", "cluster": {
                "server": self.server_url(),
                "certificate-authority": self.file("ca.crt"),
            }}],
            "users": [{ "name": "roadkeeper", "user": { "token": token } }],
            "contexts": [{ "name": "roadkeeper", "context": { "cluster": "roadkeeper", "user": "roadkeeper" } }],
            "current-context": "roadkeeper",
        });
        fs::write(path, kubeconfig.to_string()).unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
    }

    fn etcd_args(&self) -> Vec<String> {
        let client = format!("http://127.0.0.1:{}", self.ports.etcd_client);
        let peer = format!("http://127.0.0.1:{}", self.ports.etcd_peer);
        flags([
            ("name", "default".into()),
            ("data-dir", self.file("etcd")),
            ("listen-client-urls", client.clone()),
            ("advertise-client-urls", client),
            ("listen-peer-urls", peer.clone()),
            ("initial-advertise-peer-urls", peer.clone()),
            ("initial-cluster", format!("default={peer}")),
            ("log-level", "warn".into()),
            ("unsafe-no-fsync", "true".into()),
        ])
    }

    fn apiserver_args(&self) -> Vec<String> {
        flags([
            ("etcd-servers", format!("http://127.0.0.1:{}", self.ports.etcd_client)),
            ("secure-port", self.ports.apiserver.to_string()),
            ("bind-address", "127.0.0.1".into()),
            ("advertise-address", "127.0.0.1".into()),
            // Endpoints may not hold loopback addresses: leave those of Service `kubernetes` alone.
            ("endpoint-reconciler-type", "none".into()),
            ("service-cluster-ip-range", "10.96.0.0/16,fd00:96::/112".into()),
            ("authorization-mode", "Node,RBAC".into()),
            ("token-auth-file", self.file("tokens.csv")),
            ("client-ca-file", self.file("ca.crt")),
            ("tls-cert-file", self.file("apiserver.crt")),
            ("tls-private-key-file", self.file("apiserver.key")),
            ("service-account-issuer", ISSUER.into()),
            ("service-account-key-file", self.file("sa.pub")),
            ("service-account-signing-key-file", self.file("sa.key")),
            ("api-audiences", ISSUER.into()),
            ("watch-cache", "false".into()),
            ("enable-priority-and-fairness", "false".into()),
            ("profiling", "false".into()),
        ])
    }

    fn kcm_args(&self) -> Vec<String> {
        flags([
            ("kubeconfig", self.file("kcm.kubeconfig")),
            ("controllers", CONTROLLERS.into()),
            ("service-account-private-key-file", self.file("sa.key")),
            ("root-ca-file", self.file("ca.crt")),
            ("use-service-account-credentials", "false".into()),
            ("leader-elect", "false".into()),
            ("secure-port", "0".into()),
        ])
    }

    /// Starts binary `name` with its output appended to its log file.
    fn spawn(&self, name: &'static str, args: Vec<String>) -> Daemon {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path(name));
        let log = log.unwrap_or_else(|err| panic!("cannot open the log of {name}: {err}"));
        let stderr = log.try_clone().expect("cannot duplicate log handle");
        let mut command = self.command(binaries().join(name));
        let child = command.args(args).stdin(Stdio::null()).stdout(log).stderr(stderr).spawn();
        Daemon { name, child: child.unwrap_or_else(|err| panic!("cannot start {name}: {err}")) }
    }

    /// Polls `ready` until it holds; fails early (with the logs) if a process exits.
    fn wait_until(&mut self, what: &str, ready: impl Fn(&Self) -> bool) -> Result<(), String> {
        let mut exited = None;
        let done = eventually(start_timeout(), || {
            exited = self.exited();
            exited.is_some() || ready(self)
        });
        match exited {
            Some(daemon) => Err(format!("{daemon} while waiting for {what}\n{}", self.logs())),
            None if done => Ok(()),
            None => Err(format!("no {what} after {:?}\n{}", start_timeout(), self.logs())),
        }
    }

    /// Describes the first process that has exited, if any.
    fn exited(&mut self) -> Option<String> {
        [&mut self.etcd, &mut self.apiserver, &mut self.kcm].into_iter().flatten().find_map(|daemon| {
            let status = daemon.child.try_wait().ok().flatten()?;
            Some(format!("{} exited ({status})", daemon.name))
        })
    }

    /// GETs `path` from the API server as the admin; the body of a 2xx answer.
    fn get(&self, path: &str) -> Result<String, String> {
        let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
        self.curl(&["--cacert", &self.file("ca.crt"), "-H", &auth, &format!("{}{path}", self.server_url())])
    }

    /// POSTs `body` to etcd's JSON gateway at `/v3/kv/<endpoint>`; the answer. Panics on failure.
    fn etcd_gateway(&self, endpoint: &str, body: Value) -> Value {
        let url = format!("http://127.0.0.1:{}/v3/kv/{endpoint}", self.ports.etcd_client);
        let answer = self.curl(&["--data", &body.to_string(), &url]);
        let answer = answer.unwrap_or_else(|err| panic!("etcd {endpoint} failed: {err}"));
        serde_json::from_str(&answer).unwrap_or_else(|err| panic!("etcd {endpoint} answered {answer:?}: {err}"))
    }

    fn curl(&self, args: &[&str]) -> Result<String, String> {
        self.run(self.command("curl").args(["--silent", "--show-error", "--fail"]).args(args), None)
    }

    fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut command = self.command(binaries().join("kubectl"));
        command.arg("--kubeconfig").arg(&self.admin_kubeconfig).arg("--cache-dir").arg(self.file("kube-cache"));
        self.run(command.args(args), stdin)
    }

    /// Runs `command` to completion with `stdin` as input; its stdout, or the exit status and
    /// stderr.
    fn run(&self, command: &mut Command, stdin: Option<&str>) -> Result<String, String> {
        let input = if stdin.is_some() { Stdio::piped() } else { Stdio::null() };
        let child = command.stdin(input).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        let mut child = child.map_err(|err| format!("cannot start {command:?}: {err}"))?;
        if let Some(stdin) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(stdin.as_bytes()).map_err(|err| format!("cannot write stdin: {err}"))?;
        }
        let output = child.wait_with_output().map_err(|err| err.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr)))
        }
    }

    /// `program`, run inside the network namespace if there is one.
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// Writes `contents` to file `name` in the scratch folder.
    fn write(&self, name: &str, contents: &str) {
        fs::write(self.file(name), contents).unwrap_or_else(|err| panic!("cannot write {name}: {err}"));
    }

    /// Path of `name` in the scratch folder.
    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn log_path(&self, name: &str) -> String {
        self.file(&format!("{name}.log"))
    }
}

impl Ports {
    /// Three distinct loopback ports that were free a moment ago.
    fn free() -> Ports {
        let listeners = [(); 3].map(|()| TcpListener::bind(("127.0.0.1", 0)).expect("no free loopback port"));
        let [etcd_client, etcd_peer, apiserver] = listeners.map(|listener| listener.local_addr().unwrap().port());
        Ports { etcd_client, etcd_peer, apiserver }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Fails only if the process already exited; it is reaped either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The folder with the control-plane binaries, built (or found in the cache) by `build.sh` once
/// per test process.
fn binaries() -> &'static Path {
    static BINARIES: OnceLock<PathBuf> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/k8s/build.sh");
        let output = Command::new(&script).stderr(Stdio::inherit()).output();
        let output = output.unwrap_or_else(|err| panic!("cannot run {}: {err}", script.display()));
        assert!(output.status.success(), "{} failed: {}", script.display(), output.status);
        let stdout = String::from_utf8_lossy(&output.stdout);
        PathBuf::from(stdout.lines().last().expect("build.sh printed no folder"))
    })
}

/// `--name=value` arguments.
fn flags<const N: usize>(flags: [(&str, String); N]) -> Vec<String> {
    flags.into_iter().map(|(name, value)| format!("--{name}={value}")).collect()
}

/// A CA that may sign certificates.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "roadkeeper test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// The API server's serving certificate, valid for its loopback and in-cluster names.
fn serving_params() -> CertificateParams {
    let names = ["127.0.0.1", "::1", "localhost", "kubernetes.default.svc", "10.96.0.1", "fd00:96::1"];
    let mut params = CertificateParams::new(names.map(String::from)).expect("valid subject alternative names");
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params
}

/// Polls `check` until it holds, for at most `within` (here so that a test of another crate that
/// includes this file alone has it too).
pub fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
