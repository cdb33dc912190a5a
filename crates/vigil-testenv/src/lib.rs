//! A real etcd + kube-apiserver on loopback for Vigil's integration tests (test-only).
//!
//! ```no_run
//! # async fn demo() -> vigil_testenv::Result<()> {
//! let env = vigil_testenv::TestEnv::start().await?;
//! env.install_upstream_crds().await?;
//! env.apply(serde_json::json!({
//!     "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}
//! })).await?;
//! # Ok(()) }
//! ```
//!
//! Each [`TestEnv`] has its own processes, ports and temp dir, so tests run in parallel. The
//! binaries come from `VIGIL_KUBE_BIN_DIR` or from `scripts/kube-binaries.sh` (built once and
//! cached). Only etcd and the API server run: no controller-manager, scheduler or garbage
//! collection (see `scripts/README-kube-binaries.md`).
//!
//! A `TestEnv` belongs to the test (the thread) that started it: its processes are killed when
//! it is dropped (also on panic) and, where util-linux `setpriv` exists, when the thread that
//! started it exits — so a test binary killed outright leaves no process behind.
//!
//! Environment variables:
//! - `VIGIL_KUBE_BIN_DIR`: where `etcd` and `kube-apiserver` are (else the script is run);
//! - `VIGIL_CAPI_CRD_DIR`: where the Cluster API CRDs are (else `scripts/capi-crds.sh` is run);
//! - `VIGIL_OPENSHIFT_CRD_DIR`: where OpenShift's ClusterVersion and Machine CRDs are (else
//!   `scripts/openshift-crds.sh` is run);
//! - `VIGIL_MEDIK8S_NHC_DIR`: where medik8s' NodeHealthCheck operator is (else
//!   `scripts/medik8s-nhc.sh` is run; see [`medik8s`]);
//! - `VIGIL_TESTENV_KEEP=1`: keep the temp dir (logs, etcd data) for a post-mortem;
//! - `VIGIL_TESTENV_PARALLEL_STARTS=N`: let N envs start at once (default: one per two cores;
//!   waiting for a turn does not count against the readiness limits);
//! - `VIGIL_TESTENV_READY_TIMEOUT_SECS=N`: wait N s instead of 90 s for etcd, and again for the
//!   API server (a machine busy with other builds can need it).

#![warn(missing_docs)]

pub mod capi;
mod crds;
mod framing;
mod hold;
pub mod medik8s;
mod process;
mod proxy;
pub mod standins;

pub use framing::WatchFramingProxy;
pub use hold::{Delivered, WriteHold};
pub use proxy::{FaultProxy, Mode};

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiResource, Scope};
use kube::{Client, Config};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{OnceCell, Semaphore};

pub use crds::{
    CapiVersion, capi_crds_dir, medik8s_crds_dir, medik8s_nhc_crd, openshift_crds, openshift_crds_dir,
    reduce_to_version, standin_crds, standin_crds_dir, upstream_crds,
};

use process::{LOG_TAIL_LINES, Proc};

/// The harness's result type: errors carry context chains that name what failed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The harness's error type (anyhow's), so tests can name it without depending on anyhow.
pub type Error = anyhow::Error;

/// The field manager of every apply, so tests can tell their writes from the controller's.
pub const FIELD_MANAGER: &str = "vigil-test";

/// The user of [`TestEnv::audited_kubeconfig_yaml`]: the only user whose requests the API server
/// writes to its audit log, so a benchmark can count exactly the controller's requests.
pub const AUDITED_USER: &str = "vigil-controller";

/// A user with no group: it may do only what RBAC grants it, so a test can take a permission
/// away from the code under test and give it back ([`TestEnv::limited_kubeconfig_yaml`]).
pub const LIMITED_USER: &str = "vigil-limited";

/// Audit policy: metadata of every request by [`AUDITED_USER`] (one event per request once it
/// completes, and one when a watch starts), nothing for anyone else.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["vigil-controller", "vigil-limited"]
  - level: None
"#;

/// Time limit for etcd to be healthy, and again for the API server to be ready, unless
/// `VIGIL_TESTENV_READY_TIMEOUT_SECS` says otherwise (see [`ready_limit`]).
const READY_LIMIT: Duration = Duration::from_secs(90);
/// Time limit for installed CRDs to be Established and served.
const CRD_LIMIT: Duration = Duration::from_secs(30);
/// Time limit for one request made by a convenience method (not for `client()`'s own use).
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// How often `wait_for` polls.
const POLL: Duration = Duration::from_millis(50);
/// Whole-start attempts when another test took one of our ports between pick and bind.
const START_ATTEMPTS: usize = 3;
/// Time limit for a `scripts/` build ([`run_dir_script`]; a cold Go build takes minutes on 2 busy cores).
const BUILD_LIMIT: Duration = Duration::from_secs(40 * 60);

/// The workspace root (`crates/vigil-testenv/../..`), where `scripts/` lives.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

/// A running etcd + kube-apiserver pair with an admin client; everything stops when dropped.
pub struct TestEnv {
    client: Client,
    kubeconfig: Kubeconfig,
    kubeconfig_yaml: String,
    audited_kubeconfig_yaml: String,
    server: String,
    /// The CA, admin token, audited token and limited token, to build clients at other URLs.
    ca: Vec<u8>,
    tokens: [String; 3],
    etcd_port: u16,
    /// Discovery results per (apiVersion, kind): the resource and whether it is namespaced.
    resources: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
    apiserver: Option<Proc>,
    etcd: Option<Proc>,
    dir: Option<TempDir>,
}

impl std::fmt::Debug for TestEnv {
    /// Shows the server and temp dir, so a failed assertion on a `Result<TestEnv>` is readable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv").field("server", &self.server).field("dir", &self.dir()).finish_non_exhaustive()
    }
}

/// Why one start attempt failed: a lost port race is worth another attempt, the rest is not.
enum StartError {
    PortRace(anyhow::Error),
    Fatal(anyhow::Error),
}

impl From<anyhow::Error> for StartError {
    fn from(e: anyhow::Error) -> Self {
        StartError::Fatal(e)
    }
}

/// Sorts a process failure: retry when its log shows a taken port.
fn classify(p: &Proc, e: anyhow::Error) -> StartError {
    if p.lost_a_port_race() { StartError::PortRace(e) } else { StartError::Fatal(e) }
}

impl TestEnv {
    /// Starts etcd and kube-apiserver on free loopback ports and waits until both are ready,
    /// so a test gets a real API server of its own (measured on 2 cores: median 10 s when
    /// quiet, mostly the API server's RBAC bootstrap; 10–17 s while other builds ran).
    pub async fn start() -> Result<TestEnv> {
        Self::start_with_binaries(&kube_bin_dir().await?).await
    }

    /// As [`TestEnv::start`] with `etcd` and `kube-apiserver` taken from `bin`, for binaries
    /// built another way (and for the harness's own tests of failing binaries).
    pub async fn start_with_binaries(bin: &Path) -> Result<TestEnv> {
        Self::start_with_limit(bin, ready_limit()).await
    }

    /// Like [`TestEnv::start_with_binaries`] with an explicit readiness time limit (for tests of
    /// the harness itself, which must not wait the default limit out).
    pub async fn start_with_limit(bin: &Path, limit: Duration) -> Result<TestEnv> {
        // Starting is CPU-bound: few starts at a time, so parallel tests queue here (untimed)
        // instead of all missing their readiness time limits together.
        let _slot = start_slots().acquire().await.map_err(|e| anyhow!("start queue closed: {e}"))?;
        let mut attempt = 1;
        loop {
            match start_once(bin, limit).await {
                Ok(env) => return Ok(env),
                Err(StartError::PortRace(e)) if attempt < START_ATTEMPTS => {
                    eprintln!("vigil-testenv: attempt {attempt} lost a port race, retrying: {e:#}");
                    attempt += 1;
                }
                Err(StartError::PortRace(e) | StartError::Fatal(e)) => return Err(e),
            }
        }
    }

    /// An admin client (member of `system:masters`) for the test and for the code under test.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A kubeconfig for this env (embedded CA data and token), for code that loads one.
    pub fn kubeconfig(&self) -> Kubeconfig {
        self.kubeconfig.clone()
    }

    /// The kubeconfig as YAML, as Cluster API stores it in a `<cluster>-kubeconfig` Secret.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_yaml.clone()
    }

    /// Writes the kubeconfig YAML to `path`, for code under test that reads a kubeconfig file.
    pub async fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        tokio::fs::write(path, &self.kubeconfig_yaml)
            .await
            .with_context(|| format!("cannot write the kubeconfig to {}", path.display()))
    }

    /// A kubeconfig for [`AUDITED_USER`] (also in `system:masters`), whose every request the
    /// API server records in [`TestEnv::audit_log_path`]: give it to the process being measured.
    pub fn audited_kubeconfig_yaml(&self) -> String {
        self.audited_kubeconfig_yaml.clone()
    }

    /// The API server's audit log (JSON lines, one event per stage of each request by
    /// [`AUDITED_USER`]), to count the measured process's requests by verb and resource.
    pub fn audit_log_path(&self) -> Option<PathBuf> {
        self.dir().map(|d| d.join("audit.log"))
    }

    /// A Cluster API kubeconfig Secret (`<cluster>-kubeconfig`, key `value`) pointing at this
    /// env, so a management cluster in another env can reach this one as a workload cluster.
    pub fn kubeconfig_secret(&self, namespace: &str, cluster: &str) -> Value {
        kubeconfig_secret(namespace, cluster, &self.kubeconfig_yaml)
    }

    /// As [`TestEnv::kubeconfig_secret`] with the audited user's kubeconfig, so the requests a
    /// controller makes to this env as a workload cluster are counted too.
    pub fn audited_kubeconfig_secret(&self, namespace: &str, cluster: &str) -> Value {
        kubeconfig_secret(namespace, cluster, &self.audited_kubeconfig_yaml)
    }

    /// The API server URL (`https://127.0.0.1:PORT`), to tell envs apart or build raw requests.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The temp dir with `etcd.log` and `kube-apiserver.log`, to read the logs when debugging.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(TempDir::path)
    }

    /// The kube-apiserver's process id, so a test can measure it or simulate a crash.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().and_then(|p| p.child.id())
    }

    /// etcd's process id, so a test can measure it or simulate a crash.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().and_then(|p| p.child.id())
    }

    /// A kubeconfig YAML for `who` that reaches the API server at `server` (e.g. a
    /// [`FaultProxy`]'s URL: the certificate is valid for every 127.0.0.1 port).
    pub fn kubeconfig_yaml_at(&self, server: &str, who: Identity) -> Result<String> {
        kubeconfig_to_yaml(&kubeconfig_value(server, &self.ca, &self.tokens[who as usize]))
    }

    /// A client for `who` that reaches the API server at `server` (see [`TestEnv::kubeconfig_yaml_at`]).
    pub async fn client_at(&self, server: &str, who: Identity) -> Result<Client> {
        let kubeconfig: Kubeconfig =
            serde_json::from_value(kubeconfig_value(server, &self.ca, &self.tokens[who as usize]))?;
        client_from(kubeconfig).await
    }

    /// A kubeconfig YAML that authenticates with `token` (e.g. a ServiceAccount token from the
    /// TokenRequest API) and whose context's namespace is `namespace`, for code that must hold
    /// only what RBAC grants that identity.
    pub fn kubeconfig_yaml_with_token(&self, token: &str, namespace: &str) -> Result<String> {
        let mut kubeconfig = kubeconfig_value(&self.server, &self.ca, token);
        kubeconfig["contexts"][0]["context"]["namespace"] = json!(namespace);
        kubeconfig_to_yaml(&kubeconfig)
    }

    /// A client that authenticates with `token` (see [`TestEnv::kubeconfig_yaml_with_token`]).
    pub async fn client_with_token(&self, token: &str, namespace: &str) -> Result<Client> {
        let mut kubeconfig = kubeconfig_value(&self.server, &self.ca, token);
        kubeconfig["contexts"][0]["context"]["namespace"] = json!(namespace);
        client_from(serde_json::from_value(kubeconfig)?).await
    }

    /// A loopback [`FaultProxy`] in front of this API server.
    pub async fn proxy(&self) -> Result<FaultProxy> {
        let addr = self.server.trim_start_matches("https://").parse().context("the server URL is not ip:port")?;
        FaultProxy::start(addr).await
    }

    /// Kills the API server (SIGKILL) and starts it again; returns once it is ready.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        let proc = self.apiserver.as_mut().context("the API server is not running")?;
        proc.restart().await?;
        self.wait_ready(ready_limit()).await
    }

    /// Kills etcd (SIGKILL) and starts it again on the same data; returns once the API server
    /// is ready again.
    pub async fn restart_etcd(&mut self) -> Result<()> {
        let etcd = self.etcd.as_mut().context("etcd is not running")?;
        etcd.restart().await?;
        wait_etcd(etcd, self.etcd_port, ready_limit()).await.map_err(|e| match e {
            StartError::PortRace(e) | StartError::Fatal(e) => e,
        })?;
        self.wait_ready(ready_limit()).await
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the API server: connections stay open, nothing answers.
    pub fn freeze_apiserver(&self, frozen: bool) -> Result<()> {
        let proc = self.apiserver.as_ref().context("the API server is not running")?;
        proc.signal(if frozen { rustix::process::Signal::STOP } else { rustix::process::Signal::CONT })
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) etcd: the API server stays up but cannot read or write.
    pub fn freeze_etcd(&self, frozen: bool) -> Result<()> {
        let proc = self.etcd.as_ref().context("etcd is not running")?;
        proc.signal(if frozen { rustix::process::Signal::STOP } else { rustix::process::Signal::CONT })
    }

    /// Compacts etcd's history up to its current revision, so a watch that resumes from an older
    /// resourceVersion gets 410 Gone and must list again. Returns the revision compacted to.
    pub async fn compact_etcd(&self) -> Result<u64> {
        let range = etcd_post(self.etcd_port, "/v3/kv/range", r#"{"key":"AA==","limit":1}"#).await?;
        let revision: u64 = range
            .pointer("/header/revision")
            .and_then(|v| v.as_str().and_then(|s| s.parse().ok()).or(v.as_u64()))
            .with_context(|| format!("no revision in etcd's answer: {range}"))?;
        etcd_post(self.etcd_port, "/v3/kv/compaction", &format!(r#"{{"revision":"{revision}","physical":true}}"#))
            .await?;
        Ok(revision)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let dir = self.dir.as_ref().context("no temp dir")?.path().to_path_buf();
        let (apiserver, etcd) = match (self.apiserver.as_mut(), self.etcd.as_mut()) {
            (Some(a), Some(e)) => (a, e),
            _ => bail!("the API server or etcd is not running"),
        };
        wait_apiserver(apiserver, etcd, &dir.join("certs").join("apiserver.crt"), &self.server, &self.tokens[0], limit)
            .await
            .map_err(|e| match e {
                StartError::PortRace(e) | StartError::Fatal(e) => e,
            })
    }

    /// Stops the API server, then etcd, with SIGTERM (SIGKILL after 10 s), for tests that want
    /// a clean shutdown; dropping the env instead kills both at once.
    pub async fn stop(mut self) -> Result<()> {
        for proc in [self.apiserver.as_mut(), self.etcd.as_mut()].into_iter().flatten() {
            proc.terminate(Duration::from_secs(10)).await?;
        }
        Ok(())
    }

    /// Creates or updates CRDs (server-side apply) and waits until each is Established and its
    /// kinds are served, so the test can create objects right after.
    pub async fn install_crds(&self, docs: &[Value]) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        for doc in docs {
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("a CRD document without metadata.name"))?;
            bounded(&format!("apply CRD {name}"), api.patch(name, &apply_params(), &Patch::Apply(doc)))
                .await?
                .with_context(|| format!("cannot apply CRD {name}"))?;
            names.push(name.to_string());
        }
        // A reinstalled CRD may have changed versions or scope.
        self.lock_resources().clear();
        let pending = &Mutex::new(names);
        let api = &api;
        let what = format!("CRDs to be Established and served: {}", list(pending));
        wait_for(&what, CRD_LIMIT, || async move {
            // A copy: if the time limit cuts this check short, `pending` still names what is left.
            let todo = pending.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let mut left = Vec::new();
            for name in todo {
                if !self.crd_ready(api, &name).await? {
                    left.push(name);
                }
            }
            let done = left.is_empty();
            *pending.lock().unwrap_or_else(PoisonError::into_inner) = left;
            Ok(done.then_some(()))
        })
        .await
        .with_context(|| format!("still pending: {}", list(pending)))
    }

    /// Whether a CRD is Established and discovery serves each of its served versions.
    async fn crd_ready(&self, api: &Api<CustomResourceDefinition>, name: &str) -> Result<bool> {
        let Some(crd) = bounded(&format!("get CRD {name}"), api.get_opt(name)).await?? else {
            return Ok(false);
        };
        let established = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if !established {
            return Ok(false);
        }
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let api_version = format!("{}/{}", crd.spec.group, version.name);
            if self.resource(&api_version, &crd.spec.names.kind).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Installs the upstream Cluster API CRDs (Cluster, Machine, MachineSet) reduced to
    /// `v1beta2`, and medik8s SelfNodeRemediation(+Template): what the e2e tests act on.
    pub async fn install_upstream_crds(&self) -> Result<()> {
        self.install_crds(&upstream_crds(CapiVersion::V1Beta2)?).await
    }

    /// Installs OpenShift's ClusterVersion (`config.openshift.io/v1`) and Machine API Machine
    /// (`machine.openshift.io/v1beta1`) CRDs from the `github.com/openshift/api` module.
    pub async fn install_openshift_crds(&self) -> Result<()> {
        self.install_crds(&openshift_crds()?).await
    }

    /// Installs the stand-in remediators' CRDs ([`standins`]): FenceAgentsRemediation,
    /// MachineDeletionRemediation (with their templates) and NodeMaintenance.
    pub async fn install_standin_crds(&self) -> Result<()> {
        self.install_crds(&standin_crds()?).await
    }

    /// As [`TestEnv::install_upstream_crds`] but with Cluster API reduced to `v1beta1`, to
    /// test against v1beta1 Machines.
    pub async fn install_upstream_crds_v1beta1(&self) -> Result<()> {
        self.install_crds(&upstream_crds(CapiVersion::V1Beta1)?).await
    }

    /// Creates or updates any object (server-side apply, manager `vigil-test`, forced),
    /// creating its namespace if missing (`default` when unset), so tests set up state in one line.
    /// A `status` in the manifest is ignored where the kind has a status subresource: use
    /// [`TestEnv::apply_status`] after this.
    pub async fn apply(&self, manifest: Value) -> Result<DynamicObject> {
        let target = self.target(&manifest).await?;
        if let Some(ns) = &target.namespace {
            self.ensure_namespace(ns).await?;
        }
        bounded(
            &format!("apply {}", target.what),
            target.api.patch(&target.name, &apply_params(), &Patch::Apply(&manifest)),
        )
        .await?
        .with_context(|| format!("cannot apply {}", target.what))
    }

    /// Server-side applies `manifest`'s `status` to the status subresource (forced), since the
    /// e2e tests play the kubelet and Cluster API: Node conditions, Machine/Cluster status.
    pub async fn apply_status(&self, manifest: Value) -> Result<DynamicObject> {
        let target = self.target(&manifest).await?;
        bounded(
            &format!("apply the status of {}", target.what),
            target.api.patch_status(&target.name, &apply_params(), &Patch::Apply(&manifest)),
        )
        .await?
        .with_context(|| format!("cannot apply the status of {}", target.what))
    }

    /// Deletes an object; `Ok(false)` when it did not exist, so clean-up steps can be idempotent.
    pub async fn delete(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Result<bool> {
        let (api, what) = self.api_for(api_version, kind, namespace, name).await?;
        match bounded(&format!("delete {what}"), api.delete(name, &DeleteParams::default())).await? {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
            Err(e) => Err(e).with_context(|| format!("cannot delete {what}")),
        }
    }

    /// Reads an object as JSON (`None` when absent), so assertions can look at any field.
    pub async fn get_json(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>> {
        let (api, what) = self.api_for(api_version, kind, namespace, name).await?;
        let object =
            bounded(&format!("get {what}"), api.get_opt(name)).await?.with_context(|| format!("cannot get {what}"))?;
        object.map(|o| serde_json::to_value(o).with_context(|| format!("cannot encode {what}"))).transpose()
    }

    /// Lists objects of a kind as JSON, filtered by a label selector (`""`: all), in one
    /// namespace (or cluster-wide with `None` for a namespaced kind), so tests can count them.
    pub async fn list_json(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
    ) -> Result<Vec<Value>> {
        let (ar, namespaced) = self.resource(api_version, kind).await?;
        let (api, what): (Api<DynamicObject>, String) = match (namespaced, namespace) {
            (true, Some(ns)) => (Api::namespaced_with(self.client(), ns, &ar), format!("{kind} in {ns}")),
            (_, _) => (Api::all_with(self.client(), &ar), kind.to_string()),
        };
        let params = kube::api::ListParams::default().labels(label_selector);
        let list = bounded(&format!("list {what}"), api.list(&params))
            .await?
            .with_context(|| format!("cannot list {what}"))?;
        list.items
            .into_iter()
            .map(|o| serde_json::to_value(o).with_context(|| format!("cannot encode a {kind}")))
            .collect()
    }

    /// Resolves a manifest's apiVersion/kind/name/namespace into an API handle.
    async fn target(&self, manifest: &Value) -> Result<Target> {
        let field = |path: &str| manifest.pointer(path).and_then(Value::as_str);
        let api_version = field("/apiVersion").ok_or_else(|| anyhow!("manifest without apiVersion"))?;
        let kind = field("/kind").ok_or_else(|| anyhow!("manifest without kind"))?;
        let name = field("/metadata/name").ok_or_else(|| anyhow!("{kind} manifest without metadata.name"))?;
        let (ar, namespaced) = self.resource(api_version, kind).await?;
        let namespace = match (namespaced, field("/metadata/namespace")) {
            (true, ns) => Some(ns.unwrap_or("default").to_string()),
            (false, None) => None,
            (false, Some(ns)) => {
                bail!("{kind} {name} is cluster-scoped but the manifest sets metadata.namespace {ns:?}")
            }
        };
        let (api, what) = match &namespace {
            Some(ns) => (Api::namespaced_with(self.client(), ns, &ar), format!("{kind} {ns}/{name}")),
            None => (Api::all_with(self.client(), &ar), format!("{kind} {name}")),
        };
        Ok(Target { api, name: name.to_string(), namespace: namespace.filter(|_| kind != "Namespace"), what })
    }

    /// An API handle for a kind, checking that a namespace is given exactly when it is namespaced.
    async fn api_for(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(Api<DynamicObject>, String)> {
        let (ar, namespaced) = self.resource(api_version, kind).await?;
        match (namespaced, namespace) {
            (true, Some(ns)) => Ok((Api::namespaced_with(self.client(), ns, &ar), format!("{kind} {ns}/{name}"))),
            (false, None) => Ok((Api::all_with(self.client(), &ar), format!("{kind} {name}"))),
            (true, None) => bail!("{kind} is namespaced: give the namespace of {name}"),
            (false, Some(ns)) => bail!("{kind} is cluster-scoped: no namespace ({ns:?}) for {name}"),
        }
    }

    /// The API resource for apiVersion + kind (via discovery, cached) and whether it is namespaced.
    async fn resource(&self, api_version: &str, kind: &str) -> Result<(ApiResource, bool)> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(hit) = self.lock_resources().get(&key) {
            return Ok(hit.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let what = format!("discovery of {kind} in {api_version}");
        let (ar, caps) = bounded(&what, kube::discovery::pinned_kind(&self.client, &gvk))
            .await?
            .with_context(|| format!("the API server serves no {kind} in {api_version} (is its CRD installed?)"))?;
        let found = (ar, caps.scope == Scope::Namespaced);
        self.lock_resources().insert(key, found.clone());
        Ok(found)
    }

    /// Creates a namespace unless it exists (there is no controller-manager to do it).
    async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client());
        let existing = bounded(&format!("get Namespace {ns}"), api.get_opt(ns))
            .await?
            .with_context(|| format!("cannot get Namespace {ns}"))?;
        if existing.is_some() {
            return Ok(());
        }
        let namespace = Namespace {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(ns.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match bounded(&format!("create Namespace {ns}"), api.create(&PostParams::default(), &namespace)).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot create Namespace {ns}")),
        }
    }

    fn lock_resources(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (ApiResource, bool)>> {
        self.resources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // API server first, then etcd; each is SIGKILLed and reaped before the dir goes.
        drop(self.apiserver.take());
        drop(self.etcd.take());
        if std::env::var_os("VIGIL_TESTENV_KEEP").is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("vigil-testenv: kept {}", dir.keep().display());
        }
    }
}

/// An object's API handle, name, namespace to create if missing, and description for errors.
struct Target {
    api: Api<DynamicObject>,
    name: String,
    namespace: Option<String>,
    what: String,
}

/// Polls `probe` every ~50 ms until it yields `Some`, failing after `timeout` with an error
/// naming `what`, so every wait in a test is bounded and says what it waited for.
///
/// An error from `probe` ends the wait at once (map transient errors to `Ok(None)` to retry).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, probe()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => return Err(e.context(format!("while waiting for {what}"))),
            Err(_) => bail!("timed out after {timeout:?} waiting for {what} (the last check did not finish)"),
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL.min(remaining)).await;
    }
}

/// The readiness time limit: `VIGIL_TESTENV_READY_TIMEOUT_SECS` when set (a developer machine
/// busy with other builds can need more: one start took 69 s there), else 30 s.
fn ready_limit() -> Duration {
    std::env::var("VIGIL_TESTENV_READY_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(READY_LIMIT, Duration::from_secs)
}

/// Runs one request with the convenience methods' time limit.
async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(REQUEST_LIMIT, fut).await.map_err(|_| anyhow!("timed out after {REQUEST_LIMIT:?}: {what}"))
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn list(names: &Mutex<Vec<String>>) -> String {
    names.lock().unwrap_or_else(PoisonError::into_inner).join(", ")
}

/// Start permits: `VIGIL_TESTENV_PARALLEL_STARTS`, else one per two cores (at least one).
/// A start is CPU-bound: on 2 cores two at once took 22–23 s each instead of 10–13 s, close
/// to the 30 s limit, for little more throughput.
fn start_slots() -> &'static Semaphore {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let configured = std::env::var("VIGIL_TESTENV_PARALLEL_STARTS").ok().and_then(|v| v.parse().ok());
        let half_the_cores = std::thread::available_parallelism().map_or(1, |n| usize::from(n) / 2);
        Semaphore::new(configured.unwrap_or(half_the_cores).max(1))
    })
}

/// The directory with `etcd` and `kube-apiserver`: `VIGIL_KUBE_BIN_DIR`, else the output of
/// `scripts/kube-binaries.sh` (run once per test process; the script itself locks and caches),
/// for tests that run the binaries themselves.
pub async fn kube_bin_dir() -> Result<PathBuf> {
    static DIR: OnceCell<PathBuf> = OnceCell::const_new();
    DIR.get_or_try_init(|| async {
        let dir = match std::env::var_os("VIGIL_KUBE_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => run_dir_script("kube-binaries.sh").await?,
        };
        for bin in ["etcd", "kube-apiserver"] {
            if !dir.join(bin).is_file() {
                bail!(
                    "{} has no {bin}: run scripts/kube-binaries.sh (it builds both) and point \
                     VIGIL_KUBE_BIN_DIR at the directory it prints",
                    dir.display()
                );
            }
        }
        Ok(dir)
    })
    .await
    .cloned()
}

/// Runs `scripts/<name>` (a cached build) and returns the directory it prints last on stdout;
/// its progress goes to this process's stderr.
pub(crate) async fn run_dir_script(name: &str) -> Result<PathBuf> {
    let script = workspace_root().join("scripts").join(name);
    let run = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(BUILD_LIMIT, run)
        .await
        .map_err(|_| anyhow!("{} did not finish within {BUILD_LIMIT:?}", script.display()))?
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}); its progress is on stderr above", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().rev().find(|l| !l.trim().is_empty()).map(str::trim);
    dir.map(PathBuf::from).ok_or_else(|| anyhow!("{} printed no directory", script.display()))
}

/// Who a client or kubeconfig acts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// `vigil-admin`, in `system:masters`.
    Admin = 0,
    /// [`AUDITED_USER`], in `system:masters`, every request audited.
    Audited = 1,
    /// [`LIMITED_USER`]: only what RBAC grants, every request audited.
    Limited = 2,
}

/// One JSON POST to etcd's gRPC gateway (plain HTTP on loopback).
async fn etcd_post(port: u16, path: &str, body: &str) -> Result<Value> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    bounded(&format!("etcd {path}"), stream.read_to_end(&mut response)).await??;
    let text = String::from_utf8_lossy(&response);
    let ok = text.lines().next().is_some_and(|l| l.split(' ').nth(1) == Some("200"));
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    if !ok {
        bail!("etcd {path} failed: {}", text.lines().next().unwrap_or(""));
    }
    serde_json::from_str(json.trim()).with_context(|| format!("etcd {path}: not JSON: {json}"))
}

/// A `<cluster>-kubeconfig` Secret (key `value`) holding `kubeconfig_yaml`.
fn kubeconfig_secret(namespace: &str, cluster: &str, kubeconfig_yaml: &str) -> Value {
    let value = base64::engine::general_purpose::STANDARD.encode(kubeconfig_yaml);
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("{cluster}-kubeconfig"),
            "namespace": namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
        },
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": value},
    })
}

/// Three distinct free loopback ports (etcd client, etcd peer, API server). They are released
/// before use, so another test may take one first: the start then fails and is retried.
fn free_ports() -> Result<[u16; 3]> {
    let listeners = [
        std::net::TcpListener::bind("127.0.0.1:0"),
        std::net::TcpListener::bind("127.0.0.1:0"),
        std::net::TcpListener::bind("127.0.0.1:0"),
    ];
    let mut ports = [0u16; 3];
    for (port, listener) in ports.iter_mut().zip(listeners) {
        *port = listener.and_then(|l| l.local_addr()).context("cannot pick a free loopback port")?.port();
    }
    Ok(ports)
}

/// A random hex string (`bytes` random bytes), for the bearer token and the etcd prefix.
fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow!("no randomness for the token: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn path_arg(p: &Path) -> Result<String> {
    p.to_str().map(str::to_string).ok_or_else(|| anyhow!("path is not UTF-8: {}", p.display()))
}

/// One attempt: temp dir, ports, keys, token, etcd, API server, client.
async fn start_once(bin: &Path, limit: Duration) -> Result<TestEnv, StartError> {
    let dir = tempfile::Builder::new().prefix("vigil-testenv-").tempdir().context("cannot create the temp dir")?;
    let d = dir.path();
    let [etcd_port, peer_port, api_port] = free_ports()?;
    let token = random_hex(24)?;
    let audited_token = random_hex(24)?;
    let limited_token = random_hex(24)?;
    let tokens = format!(
        "{token},vigil-admin,vigil-admin,\"system:masters\"\n\
         {audited_token},{AUDITED_USER},{AUDITED_USER},\"system:masters\"\n\
         {limited_token},{LIMITED_USER},{LIMITED_USER}\n"
    );
    tokio::fs::write(d.join("tokens.csv"), tokens).await.context("cannot write tokens.csv")?;
    tokio::fs::write(d.join("audit-policy.yaml"), AUDIT_POLICY).await.context("cannot write audit-policy.yaml")?;
    let (sa_key, sa_pub) = (d.join("sa.key"), d.join("sa.pub"));
    let (sa_key_s, sa_pub_s) = (path_arg(&sa_key)?, path_arg(&sa_pub)?);
    process::openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &sa_key_s]).await?;
    process::openssl(&["ec", "-in", &sa_key_s, "-pubout", "-out", &sa_pub_s]).await?;

    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let etcd_args = etcd_args(d, &etcd_url, peer_port)?;
    let mut etcd = Proc::spawn("etcd", &bin.join("etcd"), &etcd_args, d.join("etcd.log")).await?;
    wait_etcd(&mut etcd, etcd_port, limit).await?;

    let server = format!("https://127.0.0.1:{api_port}");
    let cert_dir = d.join("certs");
    let api_args = apiserver_args(d, &etcd_url, api_port, &server, (&sa_key_s, &sa_pub_s))?;
    let mut apiserver =
        Proc::spawn("kube-apiserver", &bin.join("kube-apiserver"), &api_args, d.join("kube-apiserver.log")).await?;
    let cert = cert_dir.join("apiserver.crt");
    wait_apiserver(&mut apiserver, &mut etcd, &cert, &server, &token, limit).await?;
    // The certificate file is complete now: build the kubeconfig and client from it.
    let ca = tokio::fs::read(&cert).await.with_context(|| format!("cannot read {}", cert.display()))?;
    let kubeconfig_json = kubeconfig_value(&server, &ca, &token);
    let kubeconfig: Kubeconfig =
        serde_json::from_value(kubeconfig_json.clone()).context("cannot build the kubeconfig")?;
    let kubeconfig_yaml = kubeconfig_to_yaml(&kubeconfig_json)?;
    let audited_kubeconfig_yaml = kubeconfig_to_yaml(&kubeconfig_value(&server, &ca, &audited_token))?;
    let client = client_from(kubeconfig.clone()).await?;
    Ok(TestEnv {
        client,
        kubeconfig,
        kubeconfig_yaml,
        audited_kubeconfig_yaml,
        server,
        ca,
        tokens: [token, audited_token, limited_token],
        etcd_port,
        resources: Mutex::new(HashMap::new()),
        apiserver: Some(apiserver),
        etcd: Some(etcd),
        dir: Some(dir),
    })
}

/// etcd's flags: one member in `d/etcd`, its client URL `etcd_url`, without fsync (a test's
/// data need not survive a crash).
fn etcd_args(d: &Path, etcd_url: &str, peer_port: u16) -> Result<Vec<String>> {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    Ok(vec![
        "--name=vigil".to_string(),
        format!("--data-dir={}", path_arg(&d.join("etcd"))?),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=vigil={peer_url}"),
        "--initial-cluster-state=new".to_string(),
        "--unsafe-no-fsync".to_string(),
        "--log-level=warn".to_string(),
    ])
}

/// The API server's flags: its certificates in `d/certs`, the tokens and audit policy written
/// in `d`, the service account key pair `(key, public key)`.
fn apiserver_args(d: &Path, etcd_url: &str, api_port: u16, server: &str, sa: (&str, &str)) -> Result<Vec<String>> {
    let (sa_key_s, sa_pub_s) = sa;
    Ok(vec![
        format!("--etcd-servers={etcd_url}"),
        // Unique per env: even if a port race made two API servers share an etcd, they would
        // not see each other's objects before the race is detected.
        format!("--etcd-prefix=/registry-{}", random_hex(8)?),
        "--bind-address=127.0.0.1".to_string(),
        "--advertise-address=127.0.0.1".to_string(),
        format!("--secure-port={api_port}"),
        format!("--cert-dir={}", path_arg(&d.join("certs"))?),
        format!("--token-auth-file={}", path_arg(&d.join("tokens.csv"))?),
        "--authorization-mode=RBAC".to_string(),
        format!("--service-account-issuer={server}"),
        format!("--service-account-key-file={sa_pub_s}"),
        format!("--service-account-signing-key-file={sa_key_s}"),
        "--service-cluster-ip-range=10.0.0.0/24".to_string(),
        "--disable-admission-plugins=ServiceAccount".to_string(),
        "--endpoint-reconciler-type=none".to_string(),
        "--allow-privileged=true".to_string(),
        format!("--audit-policy-file={}", path_arg(&d.join("audit-policy.yaml"))?),
        format!("--audit-log-path={}", path_arg(&d.join("audit.log"))?),
        "--audit-log-format=json".to_string(),
    ])
}

/// Waits for etcd's `/health` to report healthy (30 s limit).
async fn wait_etcd(etcd: &mut Proc, port: u16, limit: Duration) -> Result<(), StartError> {
    let deadline = Instant::now() + limit;
    let mut last: String;
    loop {
        if let Err(e) = etcd.check_running() {
            return Err(classify(etcd, e));
        }
        match tokio::time::timeout(Duration::from_secs(2), etcd_health(port)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "the probe timed out".to_string(),
        }
        if Instant::now() >= deadline {
            let e = anyhow!(
                "etcd was not healthy within {:?} (last probe of http://127.0.0.1:{port}/health: \
                 {last}); last {LOG_TAIL_LINES} lines of its log:\n{}",
                limit,
                etcd.log_tail(LOG_TAIL_LINES)
            );
            return Err(classify(etcd, e));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One plain-HTTP `GET /health` against etcd.
async fn etcd_health(port: u16) -> Result<()> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let status_ok = response.lines().next().is_some_and(|l| l.split(' ').nth(1) == Some("200"));
    if status_ok && response.contains(r#""health":"true""#) {
        Ok(())
    } else {
        bail!("not healthy: {}", response.lines().last().unwrap_or(""))
    }
}

/// Waits until the API server's `/readyz` says `ok` over verified TLS with the token (90 s by default),
/// and checks that etcd still runs (it may have lost a port race to another test's etcd).
async fn wait_apiserver(
    apiserver: &mut Proc,
    etcd: &mut Proc,
    cert: &Path,
    server: &str,
    token: &str,
    limit: Duration,
) -> Result<(), StartError> {
    let deadline = Instant::now() + limit;
    let mut last: String;
    let mut probe = None;
    loop {
        if let Err(e) = apiserver.check_running() {
            return Err(classify(apiserver, e));
        }
        if let Err(e) = etcd.check_running() {
            return Err(classify(etcd, e));
        }
        match tokio::time::timeout(Duration::from_secs(2), readyz(&mut probe, cert, server, token)).await {
            Ok(Ok(())) => {
                etcd.check_running().map_err(|e| classify(etcd, e))?;
                return Ok(());
            }
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "the probe timed out".to_string(),
        }
        if Instant::now() >= deadline {
            let e = anyhow!(
                "kube-apiserver was not ready within {:?} (last probe of {server}/readyz: {last}); \
                 last {LOG_TAIL_LINES} lines of its log:\n{}",
                limit,
                apiserver.log_tail(LOG_TAIL_LINES)
            );
            return Err(classify(apiserver, e));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One `/readyz` probe; the certificate file appears shortly before the server is ready.
/// The probe client is kept while the file is unchanged, so its connection (and TLS
/// handshake) is reused instead of competing with the starting server for CPU.
async fn readyz(probe: &mut Option<(Vec<u8>, Client)>, cert: &Path, server: &str, token: &str) -> Result<()> {
    let ca = match tokio::fs::read(cert).await {
        Ok(ca) => ca,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("{} not written yet", cert.display()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", cert.display())),
    };
    let client = match probe {
        Some((known, client)) if *known == ca => client.clone(),
        _ => {
            let kubeconfig: Kubeconfig = serde_json::from_value(kubeconfig_value(server, &ca, token))?;
            let client = client_from(kubeconfig).await?;
            *probe = Some((ca, client.clone()));
            client
        }
    };
    let request = http::Request::get("/readyz").body(Vec::new())?;
    match client.request_text(request).await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => bail!("not ready: {}", body.trim()),
        // The body of a 500 lists every check; the failing ones are those that matter.
        Err(kube::Error::Api(status)) => {
            let failing: Vec<&str> = status.message.lines().filter(|l| l.starts_with("[-]")).collect();
            if failing.is_empty() {
                bail!("HTTP {}: {}", status.code, status.message.trim())
            }
            bail!("not ready: {}", failing.join("; "))
        }
        Err(e) => Err(e.into()),
    }
}

/// The kubeconfig as JSON: one cluster with the CA inline, one token user, one context.
fn kubeconfig_value(server: &str, ca_pem: &[u8], token: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "vigil-test",
            "cluster": {
                "server": server,
                "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
        }],
        "users": [{"name": "vigil-admin", "user": {"token": token}}],
        "contexts": [{"name": "vigil-test", "context": {"cluster": "vigil-test", "user": "vigil-admin"}}],
        "current-context": "vigil-test",
    })
}

/// Renders the kubeconfig with plain scalars (no `>-` folding of the long CA data), as
/// kubectl writes kubeconfigs, so any YAML reader takes it.
fn kubeconfig_to_yaml(kubeconfig: &Value) -> Result<String> {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.prefer_block_scalars = false;
    serde_saphyr::to_string_with_options(kubeconfig, options).context("cannot render the kubeconfig as YAML")
}

async fn client_from(kubeconfig: Kubeconfig) -> Result<Client> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("cannot load the kubeconfig")?;
    Client::try_from(config).context("cannot build the client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_for_names_what_timed_out() {
        let err = wait_for("the moon", Duration::from_millis(120), || async { Ok(None::<()>) })
            .await
            .expect_err("must time out");
        assert_eq!(err.to_string(), "timed out after 120ms waiting for the moon");
    }

    #[tokio::test]
    async fn wait_for_returns_the_first_value() {
        let mut calls = 0;
        let got = wait_for("three calls", Duration::from_secs(5), || {
            calls += 1;
            let n = calls;
            async move { Ok((n >= 3).then_some(n)) }
        })
        .await
        .expect("value");
        assert_eq!(got, 3);
    }

    #[tokio::test]
    async fn wait_for_stops_on_an_error() {
        let err = wait_for("x", Duration::from_secs(5), || async { Err::<Option<()>, _>(anyhow!("boom")) })
            .await
            .expect_err("error");
        assert_eq!(format!("{err:#}"), "while waiting for x: boom");
    }

    #[test]
    fn kubeconfig_value_parses_as_a_kubeconfig() {
        let kc: Kubeconfig =
            serde_json::from_value(kubeconfig_value("https://127.0.0.1:1", b"pem", "tok")).expect("parse");
        assert_eq!(kc.current_context.as_deref(), Some("vigil-test"));
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.token.is_some());
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("cGVt"));
    }

    #[test]
    fn kubeconfig_yaml_keeps_the_ca_data_on_one_plain_line() {
        let ca = "x".repeat(3000);
        let yaml = kubeconfig_to_yaml(&kubeconfig_value("https://127.0.0.1:1", ca.as_bytes(), "tok")).expect("yaml");
        let b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
        assert!(yaml.contains(&format!("    certificate-authority-data: {b64}\n")), "{yaml}");
        let back = Kubeconfig::from_yaml(&yaml).expect("parse");
        let cluster = back.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some(b64.as_str()));
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports().expect("ports");
        assert!(a != b && b != c && a != c);
    }
}
