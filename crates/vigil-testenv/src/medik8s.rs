//! medik8s' NodeHealthCheck operator next to a [`TestEnv`]: the manager of
//! `github.com/medik8s/node-healthcheck-operator` v0.12.0 as published (its `cmd` main, built by
//! `scripts/medik8s-nhc.sh`), the reference of the differential test and the contender of
//! `vigil-bench --against medik8s`.
//!
//! ```no_run
//! # async fn demo(env: &vigil_testenv::TestEnv) -> vigil_testenv::Result<()> {
//! use vigil_testenv::medik8s::NhcOperator;
//! env.install_crds(&[vigil_testenv::medik8s::nhc_crd()?]).await?;
//! let nhc = NhcOperator::start(env).await?;
//! # Ok(()) }
//! ```
//!
//! How it runs here (read from the module's `cmd/main.go` and what it calls):
//! - **No OpenShift.** The operator asks discovery for `config.openshift.io/v1` and
//!   `machine.openshift.io/v1`; a bare API server has neither, so it skips the console plugin, the
//!   ServiceMonitor, the cluster-upgrade check, the etcd-quorum check and the MachineHealthCheck
//!   controller, as on any Kubernetes.
//! - **No webhooks.** Its validating webhook is not registered with the API server (that needs
//!   OLM or cert-manager to inject a CA), so a NodeHealthCheck it would refuse is stored. The
//!   manager still starts its webhook server, which cannot be turned off, on the fixed port
//!   9443, with the certificate it looks for under `$TMPDIR/k8s-webhook-server/serving-certs`:
//!   a self-signed one is made per run, and only one operator runs on a host at a time (a
//!   host-wide lock, as the Cluster API managers take).
//! - **Environment:** `DEPLOYMENT_NAMESPACE` (its start-up creates the
//!   `node-healthcheck-operator-aggregation` ClusterRole and binding for a ServiceAccount there,
//!   and exits without it); `LEASE_NAMESPACE` unset, so node Leases go to `medik8s-leases`, as
//!   shipped.
//! - **Flags:** leader election off (one replica, as every contender of the benchmark runs),
//!   metrics off (they are served with bearer-token authentication on a fixed port otherwise),
//!   the health probe on a free loopback port (its `/readyz` says the manager started). Logging,
//!   requeues, the client's rate limits and the controller's concurrency are as shipped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::process::{self, Proc};
use crate::{Result, TestEnv, wait_for};

/// The operator's version (`bench/medik8s-nhc/go.mod`).
pub const NHC_VERSION: &str = "v0.12.0";

/// The namespace the operator is told it is deployed in (`DEPLOYMENT_NAMESPACE`).
pub const DEPLOYMENT_NAMESPACE: &str = "medik8s-nhc";

/// Where the operator keeps its node Leases (medik8s' default, `LEASE_NAMESPACE` unset).
pub const LEASE_NAMESPACE: &str = "medik8s-leases";

/// The CRD file, as committed under `upstream-crds/medik8s` and as the module publishes it.
pub const NHC_CRD_FILE: &str = "remediation.medik8s.io_nodehealthchecks.yaml";

/// The host-wide lock file: the operator's webhook port is fixed.
const HOST_LOCK: &str = "/tmp/vigil-medik8s-nhc.lock";

/// How long the manager gets to answer on `/readyz`.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// The directory with `nhc-manager` and the module's CRD: `VIGIL_MEDIK8S_NHC_DIR`, else the
/// output of `scripts/medik8s-nhc.sh` (run once per test process; it locks and caches).
pub async fn nhc_operator_dir() -> Result<PathBuf> {
    static DIR: OnceCell<PathBuf> = OnceCell::const_new();
    DIR.get_or_try_init(|| async {
        let dir = match std::env::var_os("VIGIL_MEDIK8S_NHC_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => crate::run_dir_script("medik8s-nhc.sh").await?,
        };
        for f in ["nhc-manager", NHC_CRD_FILE] {
            if !dir.join(f).is_file() {
                bail!(
                    "{} has no {f}: run scripts/medik8s-nhc.sh and point VIGIL_MEDIK8S_NHC_DIR at the directory it prints",
                    dir.display()
                );
            }
        }
        Ok(dir)
    })
    .await
    .cloned()
}

/// The NodeHealthCheck CRD (`remediation.medik8s.io/v1alpha1`) committed in the project, as
/// JSON for [`TestEnv::install_crds`].
pub fn nhc_crd() -> Result<Value> {
    let path = crate::medik8s_crds_dir().join(NHC_CRD_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{}: invalid YAML", path.display()))?;
    docs.into_iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .with_context(|| format!("{}: no CustomResourceDefinition", path.display()))
}

/// Everything a run of the operator needs before it starts: the host lock, a temp dir with its
/// kubeconfig and webhook certificate, and the command line. The benchmark spawns
/// [`NhcSetup::command`] itself (to measure it); [`NhcOperator`] spawns it for tests.
pub struct NhcSetup {
    bin: PathBuf,
    args: Vec<String>,
    dir: Option<TempDir>,
    /// Held while the operator runs: its webhook port is fixed.
    _host_lock: std::fs::File,
}

impl std::fmt::Debug for NhcSetup {
    /// Shows where the files are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NhcSetup").field("dir", &self.dir()).field("args", &self.args).finish_non_exhaustive()
    }
}

impl NhcSetup {
    /// Takes the host-wide lock (waiting for another run to finish) and prepares a run against
    /// the API server `kubeconfig_yaml` names (e.g. [`TestEnv::audited_kubeconfig_yaml`], so its
    /// requests are audited).
    pub async fn prepare(kubeconfig_yaml: &str) -> Result<NhcSetup> {
        NhcSetup::prepare_in(&nhc_operator_dir().await?, kubeconfig_yaml).await
    }

    /// As [`NhcSetup::prepare`] with the operator taken from `dir` (holding `nhc-manager`).
    pub async fn prepare_in(bin_dir: &Path, kubeconfig_yaml: &str) -> Result<NhcSetup> {
        let bin = bin_dir.join("nhc-manager");
        let lock = tokio::task::spawn_blocking(|| -> Result<std::fs::File> {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(HOST_LOCK)
                .with_context(|| format!("cannot open {HOST_LOCK}"))?;
            f.lock().with_context(|| format!("cannot lock {HOST_LOCK}"))?;
            Ok(f)
        })
        .await
        .context("the lock task failed")??;
        let dir =
            tempfile::Builder::new().prefix("vigil-medik8s-nhc-").tempdir().context("cannot create the temp dir")?;
        let d = dir.path();
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml)
            .with_context(|| format!("cannot write {}", kubeconfig.display()))?;
        webhook_certificate(&d.join("k8s-webhook-server").join("serving-certs")).await?;
        let probe = crate::free_ports()?[0];
        let args = vec![
            format!("--kubeconfig={}", crate::path_arg(&kubeconfig)?),
            "--leader-elect=false".to_string(),
            "--metrics-bind-address=0".to_string(),
            format!("--health-probe-bind-address=127.0.0.1:{probe}"),
        ];
        Ok(NhcSetup { bin, args, dir: Some(dir), _host_lock: lock })
    }

    /// The operator's environment: `TMPDIR` (where its webhook certificate is) and
    /// `DEPLOYMENT_NAMESPACE`.
    fn vars(&self) -> Result<Vec<(&'static str, String)>> {
        let dir = self.dir().context("the temp dir was kept and is gone")?;
        Ok(vec![("TMPDIR", crate::path_arg(dir)?), ("DEPLOYMENT_NAMESPACE", DEPLOYMENT_NAMESPACE.to_string())])
    }

    /// The operator's command line and environment, to spawn (`LEASE_NAMESPACE` removed, so
    /// its Leases go where they go when shipped).
    pub fn command(&self) -> Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(&self.args).envs(self.vars()?).env_remove("LEASE_NAMESPACE");
        Ok(cmd)
    }

    /// The health probe's address (`/readyz` answers 200 once the manager runs).
    pub fn probe_addr(&self) -> Result<std::net::SocketAddr> {
        let arg = self
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--health-probe-bind-address="))
            .context("no probe address")?;
        arg.parse().with_context(|| format!("bad probe address {arg}"))
    }

    /// The temp dir (kubeconfig, certificate, and the log when [`NhcOperator`] runs it).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(TempDir::path)
    }

    /// Waits until the manager answers 200 on `/readyz`.
    pub async fn wait_ready(&self) -> Result<()> {
        let addr = self.probe_addr()?;
        wait_for("the NodeHealthCheck operator's /readyz", READY_LIMIT, || async move {
            Ok(readyz(addr).await.then_some(()))
        })
        .await
    }
}

/// One `GET /readyz` on the probe port; false while nothing listens or it is not 200.
async fn readyz(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        anyhow::Ok(buf)
    };
    match tokio::time::timeout(Duration::from_secs(2), io).await {
        Ok(Ok(answer)) => answer.lines().next().is_some_and(|l| l.split(' ').nth(1) == Some("200")),
        _ => false,
    }
}

/// A self-signed serving certificate (`tls.crt`, `tls.key`) in `dir`, for the webhook server
/// the manager always starts.
async fn webhook_certificate(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (key, crt) = (crate::path_arg(&dir.join("tls.key"))?, crate::path_arg(&dir.join("tls.crt"))?);
    process::openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &crt,
        "-subj",
        "/CN=localhost",
        "-days",
        "2",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
    ])
    .await
}

/// The operator running against one [`TestEnv`] (admin identity); killed when dropped.
pub struct NhcOperator {
    proc: Proc,
    setup: NhcSetup,
}

impl std::fmt::Debug for NhcOperator {
    /// Shows where the log is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NhcOperator").field("setup", &self.setup).finish_non_exhaustive()
    }
}

impl NhcOperator {
    /// Starts the operator against `env` as its admin (after taking the host-wide lock) and
    /// waits until it is ready. The NodeHealthCheck CRD must be installed ([`nhc_crd`]).
    pub async fn start(env: &TestEnv) -> Result<NhcOperator> {
        let setup = NhcSetup::prepare(&env.kubeconfig_yaml()).await?;
        let dir = setup.dir().context("no temp dir")?.to_path_buf();
        let vars = setup.vars()?;
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let log = dir.join("nhc-manager.log");
        let mut proc = Proc::spawn_with_env("nhc-manager", &setup.bin, &setup.args, &vars, log).await?;
        let ready = setup.wait_ready().await;
        proc.check_running()?;
        ready.with_context(|| format!("log tail:\n{}", proc.log_tail(crate::process::LOG_TAIL_LINES)))?;
        Ok(NhcOperator { proc, setup })
    }

    /// Fails (quoting the log) when the operator has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }

    /// The operator's process id, to measure it.
    pub fn pid(&self) -> Option<u32> {
        self.proc.child.id()
    }

    /// The last `n` lines of its log, for an error message.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc.log_tail(n)
    }

    /// Keeps the temp dir (the log) after the operator stops, for a post-mortem; returns its path.
    pub fn keep_logs(&mut self) -> Option<PathBuf> {
        self.setup.dir.take().map(TempDir::keep)
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) -> Result<()> {
        self.proc.terminate(Duration::from_secs(10)).await
    }
}
