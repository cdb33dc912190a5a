//! The real Cluster API controllers next to a [`TestEnv`], so Vigil's marks are acted on by
//! Cluster API's own MachineSet: `capi-core` (our main in `bench/capi-managers`: the Cluster,
//! Machine, MachineSet and MachineDeployment reconcilers of the pinned `sigs.k8s.io/cluster-api`,
//! without its MachineHealthCheck) and `capi-infra` (the published in-memory infrastructure
//! provider, `DevCluster`/`DevMachine`, which serves each workload cluster's API server itself).
//! On request ([`CapiManagers::start_with_kubeadm`]) also `capi-kcp` and `capi-cabpk`, the
//! published KubeadmControlPlane and kubeadm bootstrap managers, for clusters whose control plane
//! is a `KubeadmControlPlane` ([`KubeadmCluster`]), as Cluster API's own scale tests run them
//! on the in-memory backend.
//!
//! ```no_run
//! # async fn demo(env: &vigil_testenv::TestEnv) -> vigil_testenv::Result<()> {
//! use vigil_testenv::capi::{CapiManagers, WorkloadCluster};
//! let capi = CapiManagers::start(env).await?;
//! let c1 = WorkloadCluster::new("default", "c1", 3);
//! capi.create_cluster(env, &c1).await?;
//! capi.wait_cluster(env, &c1, std::time::Duration::from_secs(120)).await?;
//! # Ok(()) }
//! ```
//!
//! The provider listens on fixed ports (19000, and 20000 upward, one per workload cluster), so
//! only one [`CapiManagers`] may run on a host at a time: [`CapiManagers::start`] takes a
//! host-wide file lock first and holds it until dropped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::process::{self, Proc};
use crate::{Result, TestEnv, reduce_to_version, wait_for};

/// The Cluster API version the managers are built from (`bench/capi-managers/go.mod`).
pub const CAPI_MANAGERS_VERSION: &str = "v1.14.2";

/// The Kubernetes version written on Machines (the in-memory provider reports it on its Nodes).
pub const KUBERNETES_VERSION: &str = "v1.34.1";

/// Label Cluster API puts on every object of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Label that makes a Machine part of the control plane.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Label Cluster API puts on the Machines of a MachineDeployment (its name).
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";

/// How often [`CapiManagers::wait_cluster`] looks at a cluster's Machines.
const PROVISION_POLL: Duration = Duration::from_millis(500);

/// How long the managers get to fail at start-up before [`CapiManagers::start`] returns.
const STARTUP_GRACE: Duration = Duration::from_secs(2);

/// API groups of the kubeadm control-plane and bootstrap managers, installed only with them.
const KUBEADM_GROUPS: [&str; 2] = ["controlplane.cluster.x-k8s.io", "bootstrap.cluster.x-k8s.io"];

/// The host-wide lock file: the provider's ports are fixed, so one set of managers per host.
const HOST_LOCK: &str = "/tmp/vigil-capi-managers.lock";

/// The directory with `capi-core`, `capi-infra` and `crds/`: `VIGIL_CAPI_MANAGERS_DIR`, else the
/// output of `scripts/capi-managers.sh` (run once per test process; it locks and caches).
pub async fn capi_managers_dir() -> Result<PathBuf> {
    static DIR: OnceCell<PathBuf> = OnceCell::const_new();
    DIR.get_or_try_init(|| async {
        let dir = match std::env::var_os("VIGIL_CAPI_MANAGERS_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => crate::run_dir_script("capi-managers.sh").await?,
        };
        for f in [
            "capi-core",
            "capi-infra",
            "capi-kcp",
            "capi-cabpk",
            "crds/cluster.x-k8s.io_machinedeployments.yaml",
            "crds/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
        ] {
            if !dir.join(f).is_file() {
                bail!(
                    "{} has no {f}: run scripts/capi-managers.sh (it builds all four managers) and point \
                     VIGIL_CAPI_MANAGERS_DIR at the directory it prints",
                    dir.display()
                );
            }
        }
        Ok(dir)
    })
    .await
    .cloned()
}

/// The CRDs the managers need, as they would be installed by Cluster API's own manifests: the
/// core `cluster.x-k8s.io` kinds and the provider's `infrastructure.cluster.x-k8s.io` kinds
/// (with `kubeadm`, also the `controlplane.` and `bootstrap.cluster.x-k8s.io` kinds), each
/// reduced to `v1beta2` (a bare API server has no conversion webhook), the providers' labelled
/// with the contract version as kustomize labels them upstream.
pub async fn capi_crds(kubeadm: bool) -> Result<Vec<Value>> {
    let dir = capi_managers_dir().await?.join("crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("{}: invalid YAML", path.display()))?;
        for mut crd in docs.into_iter().filter(|d| d["kind"] == "CustomResourceDefinition") {
            let group = crd["spec"]["group"].as_str().unwrap_or_default().to_string();
            if !kubeadm && KUBEADM_GROUPS.contains(&group.as_str()) {
                continue;
            }
            let has_v1beta2 =
                crd["spec"]["versions"].as_array().is_some_and(|vs| vs.iter().any(|v| v["name"] == "v1beta2"));
            if !has_v1beta2 {
                continue;
            }
            reduce_to_version(&mut crd, "v1beta2").with_context(|| path.display().to_string())?;
            if group != "cluster.x-k8s.io" {
                crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] = json!("v1beta2");
            }
            out.push(crd);
        }
    }
    if out.is_empty() {
        bail!("no v1beta2 CRD in {}", dir.display());
    }
    Ok(out)
}

/// One workload cluster made of the in-memory provider: a `DevCluster`, a `Cluster` without a
/// control-plane provider, one control-plane Machine and a MachineDeployment of `workers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadCluster {
    /// Namespace of every object of the cluster.
    pub namespace: String,
    /// The Cluster's name; the other objects are named after it.
    pub name: String,
    /// Replicas of the worker MachineDeployment.
    pub workers: u32,
}

impl WorkloadCluster {
    /// A cluster `name` in `namespace` with `workers` worker Machines.
    pub fn new(namespace: &str, name: &str, workers: u32) -> WorkloadCluster {
        WorkloadCluster { namespace: namespace.to_string(), name: name.to_string(), workers }
    }

    /// The worker MachineDeployment's name, which Vigil's checks select by.
    pub fn deployment(&self) -> String {
        format!("{}-md-0", self.name)
    }

    /// The control-plane Machine's name.
    pub fn control_plane_machine(&self) -> String {
        format!("{}-cp-0", self.name)
    }

    /// The worker DevMachineTemplate's name (a rollout points the deployment at another one).
    pub fn worker_template(&self) -> String {
        format!("{}-workers", self.name)
    }

    /// The objects to create, in order (Secrets, infrastructure, Cluster, Machines).
    pub fn manifests(&self, ca: &ClusterCa) -> Vec<Value> {
        let (ns, c) = (self.namespace.as_str(), self.name.as_str());
        let labels = json!({CLUSTER_NAME_LABEL: c});
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let bootstrap = format!("{c}-bootstrap");
        let md = self.deployment();
        let cp = self.control_plane_machine();
        let mut all = cluster_secrets_and_infra(ns, c, ca);
        all.extend([
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": bootstrap, "namespace": ns, "labels": labels},
                "type": "cluster.x-k8s.io/secret",
                "data": {"value": b64("#cloud-config\n"), "format": b64("cloud-config")}}),
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachineTemplate",
                "metadata": {"name": self.worker_template(), "namespace": ns, "labels": labels},
                "spec": {"template": {"spec": dev_machine_spec()}}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": c, "namespace": ns, "labels": labels},
                "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevCluster", "name": c}}}),
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachine",
                "metadata": {"name": cp, "namespace": ns, "labels": {CLUSTER_NAME_LABEL: c, CONTROL_PLANE_LABEL: ""}},
                "spec": dev_machine_spec()}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": cp, "namespace": ns, "labels": {CLUSTER_NAME_LABEL: c, CONTROL_PLANE_LABEL: ""}},
                "spec": {"clusterName": c, "version": KUBERNETES_VERSION,
                         "bootstrap": {"dataSecretName": bootstrap},
                         "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": cp}}}),
            // What the MachineDeployment webhook would default: cluster-name labels on the
            // object, selector and template, the rollout strategy.
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": md, "namespace": ns, "labels": labels},
                "spec": {"clusterName": c, "replicas": self.workers,
                    "selector": {"matchLabels": {CLUSTER_NAME_LABEL: c, DEPLOYMENT_NAME_LABEL: md}},
                    "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                    "template": {"metadata": {"labels": {CLUSTER_NAME_LABEL: c, DEPLOYMENT_NAME_LABEL: md}},
                        "spec": {"clusterName": c, "version": KUBERNETES_VERSION,
                                 "bootstrap": {"dataSecretName": bootstrap},
                                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                       "kind": "DevMachineTemplate", "name": self.worker_template()}}}}}),
        ]);
        all
    }
}

/// A workload cluster whose control plane is a `KubeadmControlPlane` of in-memory DevMachines
/// (no workers): the shape of Cluster API's own in-memory scale tests, without a ClusterClass
/// (no topology controller runs here). Needs [`CapiManagers::start_with_kubeadm`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeadmCluster {
    /// Namespace of every object of the cluster.
    pub namespace: String,
    /// The Cluster's name; the other objects are named after it.
    pub name: String,
    /// Replicas of the KubeadmControlPlane.
    pub replicas: u32,
}

impl KubeadmCluster {
    /// A cluster `name` in `namespace` with a control plane of `replicas` Machines.
    pub fn new(namespace: &str, name: &str, replicas: u32) -> KubeadmCluster {
        KubeadmCluster { namespace: namespace.to_string(), name: name.to_string(), replicas }
    }

    /// The KubeadmControlPlane's name (and its DevMachineTemplate's).
    pub fn control_plane(&self) -> String {
        format!("{}-control-plane", self.name)
    }

    /// The objects to create, in order. The `<cluster>-ca` and `<cluster>-etcd` Secrets are
    /// created up front as for [`WorkloadCluster`] (KubeadmControlPlane finds and uses them and
    /// generates the other certificates); what the KubeadmControlPlane webhook would default is
    /// written out (rollout strategy); the kubeadm configuration is the one of Cluster API's
    /// in-memory cluster class (`test/infrastructure/docker/templates/clusterclass-in-memory.yaml`).
    pub fn manifests(&self, ca: &ClusterCa) -> Vec<Value> {
        let (ns, c) = (self.namespace.as_str(), self.name.as_str());
        let labels = json!({CLUSTER_NAME_LABEL: c});
        let kcp = self.control_plane();
        let node_registration =
            json!({"nodeRegistration": {"criSocket": "unix:///var/run/containerd/containerd.sock"}});
        let mut all = cluster_secrets_and_infra(ns, c, ca);
        all.extend([
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachineTemplate",
                "metadata": {"name": kcp, "namespace": ns, "labels": labels},
                "spec": {"template": {"spec": dev_machine_spec()}}}),
            json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
                "metadata": {"name": kcp, "namespace": ns, "labels": labels},
                "spec": {"replicas": self.replicas, "version": KUBERNETES_VERSION,
                    "machineTemplate": {"spec": {"infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachineTemplate", "name": kcp}}},
                    "kubeadmConfigSpec": {
                        "clusterConfiguration": {"apiServer": {"certSANs": ["localhost", "127.0.0.1"]}},
                        "initConfiguration": node_registration, "joinConfiguration": node_registration},
                    "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": c, "namespace": ns, "labels": labels},
                "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevCluster", "name": c},
                         "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": kcp}}}),
        ]);
        all
    }
}

/// What every in-memory workload cluster starts with: its `<cluster>-ca` and `<cluster>-etcd`
/// Secrets (both signed by `ca`, which the harness keeps to reach the cluster) and its DevCluster.
fn cluster_secrets_and_infra(ns: &str, c: &str, ca: &ClusterCa) -> Vec<Value> {
    let labels = json!({CLUSTER_NAME_LABEL: c});
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let tls = json!({"tls.crt": b64(&ca.cert_pem), "tls.key": b64(&ca.key_pem)});
    let secret = |suffix: &str| {
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{c}-{suffix}"), "namespace": ns, "labels": labels},
            "type": "cluster.x-k8s.io/secret", "data": tls})
    };
    vec![
        secret("ca"),
        secret("etcd"),
        // The provider panics on a DevCluster without any annotation (it writes into a nil map).
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevCluster",
            "metadata": {"name": c, "namespace": ns, "labels": labels,
                         "annotations": {"vigil.dev/created-by": "vigil-testenv"}},
            "spec": {"backend": {"inMemory": {}}}}),
    ]
}

/// The in-memory backend of a DevMachine: a "VM" that boots in 1 s and a Node (and, on a
/// control-plane Machine, etcd and an API server) that start 0.5 s later, without jitter, so
/// the times a test reports are the controllers' and not the simulated boot's.
pub fn dev_machine_spec() -> Value {
    let quick = |d: &str| json!({"provisioning": {"startupDuration": d, "startupJitter": "0"}});
    json!({"backend": {"inMemory": {"vm": quick("1s"), "node": quick("500ms"), "apiServer": quick("500ms"), "etcd": quick("500ms")}}})
}

/// A self-signed RSA CA, stored as each cluster's `<cluster>-ca` and `<cluster>-etcd` Secrets
/// (what kubeadm's bootstrap would otherwise generate); one is shared by all clusters.
#[derive(Debug, Clone)]
pub struct ClusterCa {
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM PKCS#1 RSA key.
    pub key_pem: String,
}

impl ClusterCa {
    /// Generates one with the `openssl` CLI in `dir`.
    pub async fn generate(dir: &Path) -> Result<ClusterCa> {
        let (key, cert) = (dir.join("cluster-ca.key"), dir.join("cluster-ca.crt"));
        let (key_s, cert_s) = (crate::path_arg(&key)?, crate::path_arg(&cert)?);
        process::openssl(&["genrsa", "-traditional", "-out", &key_s, "2048"]).await?;
        process::openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &key_s,
            "-subj",
            "/CN=kubernetes",
            "-days",
            "3650",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature,keyEncipherment",
            "-out",
            &cert_s,
        ])
        .await?;
        Ok(ClusterCa {
            cert_pem: std::fs::read_to_string(&cert).with_context(|| format!("cannot read {}", cert.display()))?,
            key_pem: std::fs::read_to_string(&key).with_context(|| format!("cannot read {}", key.display()))?,
        })
    }
}

/// Takes the host-wide lock (the provider's ports are fixed), waiting for another run to finish.
async fn host_lock() -> Result<std::fs::File> {
    tokio::task::spawn_blocking(|| -> Result<std::fs::File> {
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
    .context("the lock task failed")?
}

/// Writes `tls.key` and `tls.crt` into `certs`: a self-signed loopback certificate for the
/// webhook servers, which cannot be turned off.
async fn webhook_certificate(certs: &Path) -> Result<()> {
    let (tls_key, tls_crt) = (crate::path_arg(&certs.join("tls.key"))?, crate::path_arg(&certs.join("tls.crt"))?);
    process::openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &tls_key,
        "-out",
        &tls_crt,
        "-subj",
        "/CN=localhost",
        "-days",
        "2",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
    ])
    .await?;
    Ok(())
}

/// The managers, running against one [`TestEnv`]; all are killed when this is dropped.
pub struct CapiManagers {
    core: Proc,
    infra: Proc,
    /// `capi-kcp` and `capi-cabpk`, when started with [`CapiManagers::start_with_kubeadm`].
    kubeadm: Vec<Proc>,
    ca: ClusterCa,
    /// One per workload cluster ([`CapiManagers::wait_cluster`]), by `namespace/name`.
    proxies: std::sync::Mutex<std::collections::BTreeMap<String, crate::WatchFramingProxy>>,
    dir: Option<TempDir>,
    /// Held while the managers run: the provider's ports are fixed.
    _host_lock: std::fs::File,
}

impl std::fmt::Debug for CapiManagers {
    /// Shows where the logs are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapiManagers").field("dir", &self.dir()).finish_non_exhaustive()
    }
}

impl CapiManagers {
    /// Installs the CRDs ([`capi_crds`]) into `env` and starts `capi-core` and `capi-infra`
    /// against it, after taking the host-wide lock (waiting for another run to finish).
    pub async fn start(env: &TestEnv) -> Result<CapiManagers> {
        CapiManagers::start_managers(env, false).await
    }

    /// As [`CapiManagers::start`], and also the KubeadmControlPlane and kubeadm bootstrap
    /// managers (`capi-kcp`, `capi-cabpk`) with their CRDs, for [`KubeadmCluster`]s.
    pub async fn start_with_kubeadm(env: &TestEnv) -> Result<CapiManagers> {
        CapiManagers::start_managers(env, true).await
    }

    async fn start_managers(env: &TestEnv, kubeadm: bool) -> Result<CapiManagers> {
        let bin = capi_managers_dir().await?;
        let lock = host_lock().await?;
        env.install_crds(&capi_crds(kubeadm).await?).await?;
        let dir = tempfile::Builder::new().prefix("vigil-capi-").tempdir().context("cannot create the temp dir")?;
        let d = dir.path().to_path_buf();
        let kubeconfig = d.join("kubeconfig");
        env.write_kubeconfig(&kubeconfig).await?;
        let kubeconfig = crate::path_arg(&kubeconfig)?;
        // The provider's webhook server cannot be turned off and wants a certificate.
        let certs = d.join("webhook-certs");
        std::fs::create_dir_all(&certs).with_context(|| format!("cannot create {}", certs.display()))?;
        webhook_certificate(&certs).await?;
        let ca = ClusterCa::generate(&d).await?;
        let ports = crate::free_ports()?;
        let core_args = vec![format!("--kubeconfig={kubeconfig}"), "--v=1".to_string()];
        // The stock mains (provider, KubeadmControlPlane, bootstrap) share these flags; each
        // gets its own webhook port.
        let stock_args = |webhook_port: u16| -> Result<Vec<String>> {
            Ok(vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--webhook-port={webhook_port}"),
                format!("--webhook-cert-dir={}", crate::path_arg(&certs)?),
                "--health-addr=0".to_string(),
                "--diagnostics-address=0".to_string(),
                "--v=1".to_string(),
            ])
        };
        let infra_args = stock_args(ports[0])?;
        let env_vars = [("POD_IP", "127.0.0.1")];
        let mut core =
            Proc::spawn_with_env("capi-core", &bin.join("capi-core"), &core_args, &[], d.join("capi-core.log")).await?;
        let mut infra = Proc::spawn_with_env(
            "capi-infra",
            &bin.join("capi-infra"),
            &infra_args,
            &env_vars,
            d.join("capi-infra.log"),
        )
        .await?;
        let mut kubeadm_procs = Vec::new();
        if kubeadm {
            for (name, port) in [("capi-kcp", ports[1]), ("capi-cabpk", ports[2])] {
                let log = d.join(format!("{name}.log"));
                kubeadm_procs.push(Proc::spawn_with_env(name, &bin.join(name), &stock_args(port)?, &[], log).await?);
            }
        }
        tokio::time::sleep(STARTUP_GRACE).await;
        core.check_running()?;
        infra.check_running()?;
        for p in &mut kubeadm_procs {
            p.check_running()?;
        }
        Ok(CapiManagers {
            core,
            infra,
            kubeadm: kubeadm_procs,
            ca,
            proxies: Default::default(),
            dir: Some(dir),
            _host_lock: lock,
        })
    }

    /// The temp dir with `capi-core.log` and `capi-infra.log`, to read when a test fails.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(TempDir::path)
    }

    /// Keeps the temp dir (logs) after the managers stop, for a post-mortem; returns its path.
    pub fn keep_logs(&mut self) -> Option<PathBuf> {
        self.dir.take().map(TempDir::keep)
    }

    /// Fails (quoting the log) when any manager has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.core.check_running()?;
        self.infra.check_running()?;
        for p in &mut self.kubeadm {
            p.check_running()?;
        }
        Ok(())
    }

    /// The core manager's process id, to measure it.
    pub fn core_pid(&self) -> Option<u32> {
        self.core.child.id()
    }

    /// The provider's process id, to measure it.
    pub fn infra_pid(&self) -> Option<u32> {
        self.infra.child.id()
    }

    /// The CA stored in every cluster's Secrets.
    pub fn ca(&self) -> &ClusterCa {
        &self.ca
    }

    /// Creates the objects of `cluster` ([`WorkloadCluster::manifests`]).
    pub async fn create_cluster(&self, env: &TestEnv, cluster: &WorkloadCluster) -> Result<()> {
        for manifest in cluster.manifests(&self.ca) {
            env.apply(manifest).await?;
        }
        Ok(())
    }

    /// Creates the objects of a [`KubeadmCluster`].
    pub async fn create_kubeadm_cluster(&self, env: &TestEnv, cluster: &KubeadmCluster) -> Result<()> {
        for manifest in cluster.manifests(&self.ca) {
            env.apply(manifest).await?;
        }
        Ok(())
    }

    /// Waits until the KubeadmControlPlane of `cluster` has `replicas` Machines with Nodes, all
    /// ready (`status.readyReplicas`). The `<cluster>-kubeconfig` Secret (written by
    /// KubeadmControlPlane) is pointed at a [`crate::WatchFramingProxy`] as soon as it exists,
    /// before the first API server answers, so KubeadmControlPlane's own connections (its
    /// etcd port-forwards included) go through the proxy from the start.
    pub async fn wait_kubeadm_cluster(&self, env: &TestEnv, cluster: &KubeadmCluster, limit: Duration) -> Result<()> {
        let what = format!(
            "cluster {}/{}: {} ready control-plane Machines with Nodes",
            cluster.namespace, cluster.name, cluster.replicas
        );
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.kubeadm_progress(env, cluster).await {
                Ok(s) if s.is_empty() => return Ok(()),
                Ok(s) => s,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("timed out after {limit:?} waiting for {what}: {last}\n{}", self.log_tails());
            }
            tokio::time::sleep(PROVISION_POLL).await;
        }
    }

    /// One look at a [`KubeadmCluster`] coming up: frames its kubeconfig once it exists, then
    /// says what is missing (empty when it is up).
    async fn kubeadm_progress(&self, env: &TestEnv, cluster: &KubeadmCluster) -> Result<String> {
        let key = format!("{}/{}", cluster.namespace, cluster.name);
        let framed = self.proxies.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(&key);
        if !framed {
            let secret = format!("{}-kubeconfig", cluster.name);
            if env.get_json("v1", "Secret", Some(&cluster.namespace), &secret).await?.is_none() {
                return Ok(format!("no Secret {secret} yet"));
            }
            self.frame(env, &cluster.namespace, &cluster.name).await?;
        }
        let machines = cluster_machines(env, &cluster.namespace, &cluster.name).await?;
        let with_nodes = machines
            .iter()
            .filter(|m| m.pointer("/metadata/deletionTimestamp").is_none())
            .filter(|m| m.pointer("/status/nodeRef/name").is_some())
            .count();
        let kcp = env
            .get_json(
                "controlplane.cluster.x-k8s.io/v1beta2",
                "KubeadmControlPlane",
                Some(&cluster.namespace),
                &cluster.control_plane(),
            )
            .await?;
        let ready = kcp.as_ref().and_then(|k| k.pointer("/status/readyReplicas")).and_then(Value::as_u64);
        let want = u64::from(cluster.replicas);
        Ok(if u64::try_from(with_nodes).is_ok_and(|n| n == want) && ready == Some(want) {
            String::new()
        } else {
            format!("{with_nodes} of {want} Machines have Nodes, readyReplicas {ready:?}")
        })
    }

    /// How many upgraded connections (port-forwards) the framing proxy of a cluster has
    /// tunnelled so far.
    pub fn workload_upgrades(&self, namespace: &str, cluster: &str) -> Result<usize> {
        let proxies = self.proxies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let proxy = proxies
            .get(&format!("{namespace}/{cluster}"))
            .with_context(|| format!("no workload cluster {namespace}/{cluster} was waited for"))?;
        Ok(proxy.upgrades())
    }

    /// Waits until every Machine of `cluster` has a Node (`status.nodeRef`) and the core
    /// Cluster controller wrote `<cluster>-kubeconfig`, then puts a [`crate::WatchFramingProxy`]
    /// between that kubeconfig's users and the provider's API server (see there why).
    pub async fn wait_cluster(&self, env: &TestEnv, cluster: &WorkloadCluster, limit: Duration) -> Result<()> {
        self.wait_provisioned(env, cluster, limit).await?;
        self.frame(env, &cluster.namespace, &cluster.name).await
    }

    /// Starts the framing proxy of `cluster` and points its `<cluster>-kubeconfig` Secret at it
    /// (same credentials; the Secret is otherwise as Cluster API wrote it).
    async fn frame(&self, env: &TestEnv, namespace: &str, cluster: &str) -> Result<()> {
        let key = format!("{namespace}/{cluster}");
        let name = format!("{cluster}-kubeconfig");
        let secret = env
            .get_json("v1", "Secret", Some(namespace), &name)
            .await?
            .with_context(|| format!("Secret {key}-kubeconfig does not exist"))?;
        let yaml = secret_value(&secret).with_context(|| format!("Secret {namespace}/{name}"))?;
        let mut kubeconfig: Value =
            serde_saphyr::from_str(&yaml).with_context(|| format!("Secret {namespace}/{name}: not YAML"))?;
        let servers = kubeconfig["clusters"].as_array().map(Vec::len).unwrap_or(0);
        if servers == 0 {
            bail!("Secret {namespace}/{name}: a kubeconfig without clusters");
        }
        if kubeconfig["clusters"][0]["cluster"]["server"].as_str().is_some_and(|s| s.starts_with("http://")) {
            return Ok(());
        }
        let upstream = client_from_yaml(&yaml).await.with_context(|| format!("Secret {namespace}/{name}"))?;
        let proxy = crate::WatchFramingProxy::start(upstream).await?;
        for i in 0..servers {
            kubeconfig["clusters"][i]["cluster"]["server"] = json!(proxy.url());
        }
        // JSON is YAML: every kubeconfig reader (client-go, kube-rs) takes it.
        let text = serde_json::to_string(&kubeconfig)?;
        env.apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"value": base64::engine::general_purpose::STANDARD.encode(text)}}))
            .await?;
        self.proxies.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, proxy);
        Ok(())
    }

    /// Makes one workload cluster's API server hang or refuse (or pass again), as seen by every
    /// user of its kubeconfig Secret (Vigil and Cluster API's controllers).
    pub fn set_workload_mode(&self, namespace: &str, cluster: &str, mode: crate::Mode) -> Result<()> {
        let proxies = self.proxies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let proxy = proxies
            .get(&format!("{namespace}/{cluster}"))
            .with_context(|| format!("no workload cluster {namespace}/{cluster} was waited for"))?;
        proxy.set_mode(mode);
        Ok(())
    }

    /// As [`CapiManagers::wait_cluster`] without the proxy.
    async fn wait_provisioned(&self, env: &TestEnv, cluster: &WorkloadCluster, limit: Duration) -> Result<()> {
        let want = usize::try_from(cluster.workers).unwrap_or(usize::MAX).saturating_add(1);
        let what = format!("cluster {}/{} with {want} Machines that have Nodes", cluster.namespace, cluster.name);
        let deadline = Instant::now() + limit;
        // Polled every PROVISION_POLL, and a failed read is only noted: many clusters are
        // waited for at once, and the API server is busy creating them.
        loop {
            let probe = async {
                let machines = cluster_machines(env, &cluster.namespace, &cluster.name).await?;
                let with_nodes = machines.iter().filter(|m| m.pointer("/status/nodeRef/name").is_some()).count();
                if with_nodes < want {
                    return Ok::<_, anyhow::Error>(format!("{with_nodes} of {want} Machines have Nodes"));
                }
                let name = format!("{}-kubeconfig", cluster.name);
                Ok(match env.get_json("v1", "Secret", Some(&cluster.namespace), &name).await? {
                    Some(_) => String::new(),
                    None => format!("no Secret {name} yet"),
                })
            };
            let last = match probe.await {
                Ok(s) if s.is_empty() => return Ok(()),
                Ok(s) => s,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("timed out after {limit:?} waiting for {what}: {last}\n{}", self.log_tails());
            }
            tokio::time::sleep(PROVISION_POLL).await;
        }
    }

    /// The last lines of the managers' logs, for an error message.
    pub fn log_tails(&self) -> String {
        let mut out = format!(
            "capi-core log tail:\n{}\ncapi-infra log tail:\n{}",
            self.core.log_tail(20),
            self.infra.log_tail(20)
        );
        for p in &self.kubeadm {
            out.push_str(&format!("\n{} log tail:\n{}", p.name, p.log_tail(20)));
        }
        out
    }
}

/// The Machines of a cluster (label `cluster.x-k8s.io/cluster-name`), as JSON.
pub async fn cluster_machines(env: &TestEnv, namespace: &str, cluster: &str) -> Result<Vec<Value>> {
    env.list_json("cluster.x-k8s.io/v1beta2", "Machine", Some(namespace), &format!("{CLUSTER_NAME_LABEL}={cluster}"))
        .await
}

/// The names of the Machines of a MachineDeployment (label `cluster.x-k8s.io/deployment-name`)
/// that are not being deleted, with their Nodes (`status.nodeRef.name`, when set).
pub async fn deployment_machines(
    env: &TestEnv,
    namespace: &str,
    deployment: &str,
) -> Result<BTreeSet<(String, Option<String>)>> {
    live_machines(env, namespace, &format!("{DEPLOYMENT_NAME_LABEL}={deployment}")).await
}

/// The names of a cluster's control-plane Machines (label `cluster.x-k8s.io/control-plane`) that
/// are not being deleted, with their Nodes.
pub async fn control_plane_machines(
    env: &TestEnv,
    namespace: &str,
    cluster: &str,
) -> Result<BTreeSet<(String, Option<String>)>> {
    live_machines(env, namespace, &format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}")).await
}

/// The Machines a label selector finds that are not being deleted, by name, with their Nodes.
async fn live_machines(env: &TestEnv, namespace: &str, selector: &str) -> Result<BTreeSet<(String, Option<String>)>> {
    let machines = env.list_json("cluster.x-k8s.io/v1beta2", "Machine", Some(namespace), selector).await?;
    Ok(machines
        .iter()
        .filter(|m| m.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|m| {
            let name = m.pointer("/metadata/name")?.as_str()?.to_string();
            let node = m.pointer("/status/nodeRef/name").and_then(Value::as_str).map(str::to_string);
            Some((name, node))
        })
        .collect())
}

/// A client for a workload cluster, from the `<cluster>-kubeconfig` Secret (the provider serves
/// that cluster's API server; Nodes can be listed, watched and merge-patched).
pub async fn workload_client(env: &TestEnv, namespace: &str, cluster: &str) -> Result<Client> {
    let name = format!("{cluster}-kubeconfig");
    let secret = env
        .get_json("v1", "Secret", Some(namespace), &name)
        .await?
        .with_context(|| format!("Secret {namespace}/{name} does not exist"))?;
    let yaml = secret_value(&secret).with_context(|| format!("Secret {namespace}/{name}"))?;
    client_from_yaml(&yaml).await.with_context(|| format!("cluster {namespace}/{cluster}"))
}

/// The decoded `data.value` of a kubeconfig Secret.
fn secret_value(secret: &Value) -> Result<String> {
    let data = secret.pointer("/data/value").and_then(Value::as_str).context("no data.value")?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(data).context("data.value is not base64")?;
    String::from_utf8(bytes).context("data.value is not UTF-8")
}

async fn client_from_yaml(yaml: &str) -> Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).context("bad kubeconfig")?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("unusable kubeconfig")?;
    Client::try_from(config).context("cannot build a client")
}

/// Sets a workload Node's `Ready` condition (as a kubelet would report it), with a merge patch
/// on the Node itself: the provider's API server has no `/status` subresource. Returns the
/// `lastTransitionTime` written, from which the checks' timeouts run.
pub async fn set_node_ready(client: &Client, node: &str, status: &str) -> Result<k8s_openapi::jiff::Timestamp> {
    let api: Api<Node> = Api::all(client.clone());
    let current = api.get(node).await.with_context(|| format!("cannot get workload Node {node}"))?;
    let at = now_seconds();
    let now = at.to_string();
    let mut conditions: Vec<Value> = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "Ready")
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .filter(|c| !c.is_null())
        .collect();
    conditions.push(json!({"type": "Ready", "status": status, "reason": "VigilTest",
        "message": format!("set to {status} by the test"), "lastHeartbeatTime": now, "lastTransitionTime": now}));
    let patch = json!({"status": {"conditions": conditions}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot patch workload Node {node}"))?;
    Ok(at)
}

/// Now with second precision (as `metav1.Time` stores it).
fn now_seconds() -> k8s_openapi::jiff::Timestamp {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// Waits until `probe` holds, returning the instant it was first seen (for timings).
pub async fn wait_instant<F, Fut>(what: &str, limit: Duration, mut probe: F) -> Result<Instant>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    wait_for(what, limit, || {
        let fut = probe();
        async move { Ok(fut.await?.then(Instant::now)) }
    })
    .await
}
