//! What the replica tests (`failover.rs`, `shards.rs`) share: a `vigil run` child process with
//! short election durations, Node readiness, the remediation objects per Node, and the CRDs,
//! namespaces and remediation template every scenario starts from.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use vigil_testenv::{Identity, TestEnv, wait_for};

pub type Result<T> = std::result::Result<T, vigil_testenv::Error>;

pub const LEASE_NS: &str = "vigil-system";
pub const MEDIK8S: &str = "medik8s";
/// Short durations for the tests (the defaults are 15 s / 10 s / 2 s); `Replica::start` passes them.
pub const LEASE: Duration = Duration::from_secs(4);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(3);
pub const RETRY: Duration = Duration::from_secs(1);
pub const WAIT: Duration = Duration::from_secs(40);

/// One `vigil run` process; killed when dropped.
pub struct Replica {
    pub name: &'static str,
    pub child: tokio::process::Child,
}

impl Replica {
    /// Starts `vigil run` as `name` (its Pod name) with the short durations and `extra` arguments;
    /// its kubeconfig and log go to `dir`.
    pub async fn start(
        env: &TestEnv,
        name: &'static str,
        who: Identity,
        server: &str,
        dir: &std::path::Path,
        extra: &[&str],
    ) -> Result<Replica> {
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, env.kubeconfig_yaml_at(server, who)?)?;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--workers", "2", "--lease-namespace", LEASE_NS])
            .args(["--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "1s"])
            .args(extra)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()?;
        Ok(Replica { name, child })
    }

    /// Starts `vigil run` as [`Replica::start`] does and waits until its membership Lease
    /// `vigil-member-<name>` exists (the other replicas can count it from then on).
    pub async fn start_member(
        env: &TestEnv,
        name: &'static str,
        who: Identity,
        server: &str,
        dir: &std::path::Path,
        extra: &[&str],
    ) -> Result<Replica> {
        let replica = Replica::start(env, name, who, server, dir, extra).await?;
        wait_for(&format!("{name}'s membership Lease"), WAIT, || async {
            let api: Api<Lease> = Api::namespaced(env.client(), LEASE_NS);
            Ok(api.get_opt(&format!("vigil-member-{name}")).await?.map(|_| ()))
        })
        .await?;
        Ok(replica)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: rustix::process::Signal) -> Result<()> {
        let pid = self
            .child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| anyhow_msg(format!("{} is not running", self.name)))?;
        rustix::process::kill_process(pid, signal).map_err(|e| anyhow_msg(format!("signal {}: {e}", self.name)))
    }
}

pub fn anyhow_msg(m: String) -> vigil_testenv::Error {
    vigil_testenv::Error::msg(m)
}

pub fn secs_ago(s: i64) -> String {
    let t = Timestamp::now() - jiff::SignedDuration::from_secs(s);
    Timestamp::from_second(t.as_second()).map(|t| t.to_string()).unwrap_or_default()
}

/// Sets a Node's Ready condition, changed a minute ago (past every timeout of the tests).
pub async fn set_ready(env: &TestEnv, node: &str, status: &str) -> Result<()> {
    set_ready_since(env, node, status, 60).await
}

pub async fn set_ready_since(env: &TestEnv, node: &str, status: &str, secs: i64) -> Result<()> {
    env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test", "message": "",
                   "lastHeartbeatTime": Timestamp::now().to_string(), "lastTransitionTime": secs_ago(secs)}]}}))
        .await?;
    Ok(())
}

/// Remediation objects per Node (generateName: a duplicate would be a second object).
pub async fn objects_per_node(env: &TestEnv) -> Result<std::collections::BTreeMap<String, usize>> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "self-node-remediation.medik8s.io",
        "v1alpha1",
        "SelfNodeRemediation",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(env.client(), MEDIK8S, &ar);
    let mut out = std::collections::BTreeMap::new();
    for o in api.list(&Default::default()).await?.items {
        let node = o
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("remediation.medik8s.io/node-name"))
            .cloned()
            .unwrap_or_default();
        *out.entry(node).or_insert(0) += 1;
    }
    Ok(out)
}

/// Waits until each of `nodes` has a remediation object.
pub async fn remediated(env: &TestEnv, nodes: &[&str]) -> Result<()> {
    wait_for(&format!("{nodes:?} remediated"), WAIT, || async {
        let per = objects_per_node(env).await?;
        Ok(nodes.iter().all(|n| per.get(*n).copied().unwrap_or(0) > 0).then_some(()))
    })
    .await
}

/// The upstream and Vigil CRDs, the Lease namespace and the SelfNodeRemediationTemplate `reboot`.
pub async fn install_basics(env: &TestEnv) -> Result<()> {
    env.install_upstream_crds().await?;
    let ours = vigil_api::crd::files().map_err(|e| anyhow_msg(e.to_string()))?;
    let docs: Vec<Value> = ours
        .iter()
        .map(|f| serde_saphyr::from_str::<Value>(&f.text))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow_msg(e.to_string()))?;
    env.install_crds(&docs).await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})).await?;
    env.apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "reboot", "namespace": MEDIK8S,
                     "annotations": {"remediation.medik8s.io/multiple-templates-support": "true"}},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
        .await?;
    Ok(())
}

/// Makes [`vigil_testenv::LIMITED_USER`] cluster-admin, so a replica can run as that user and
/// the audit log tells its requests apart from the [`vigil_testenv::AUDITED_USER`] replicas'.
pub async fn limited_user_is_admin(env: &TestEnv) -> Result<()> {
    env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "limited-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": vigil_testenv::LIMITED_USER}]}))
        .await?;
    Ok(())
}

/// One write (create, update, patch, delete) the API server received, from its audit log.
#[derive(Debug, Clone)]
pub struct AuditedWrite {
    pub received: Timestamp,
    pub verb: String,
    /// The resource (`leases`, `selfnoderemediations`, …) and, for a subresource, `/status`.
    pub resource: String,
    pub name: String,
    /// The response code (a late write refused by optimistic concurrency is a 409).
    pub code: i64,
}

impl std::fmt::Display for AuditedWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {} {} -> {}", self.received, self.verb, self.resource, self.name, self.code)
    }
}

impl AuditedWrite {
    /// Whether the API server carried it out.
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// Every write by `user` the API server completed, in the order received.
pub fn audited_writes(env: &TestEnv, user: &str) -> Result<Vec<AuditedWrite>> {
    let path = env.audit_log_path().ok_or_else(|| anyhow_msg("no audit log".into()))?;
    let text = std::fs::read_to_string(path)?;
    let mut out: Vec<AuditedWrite> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .filter_map(|e| {
            let received = e["requestReceivedTimestamp"].as_str()?.parse::<Timestamp>().ok()?;
            let object = &e["objectRef"];
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", object["resource"].as_str().unwrap_or_default()),
                None => object["resource"].as_str().unwrap_or_default().to_string(),
            };
            Some(AuditedWrite {
                received,
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                resource,
                name: object["name"].as_str().unwrap_or_default().to_string(),
                code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            })
        })
        .collect();
    out.sort_by_key(|w| w.received);
    Ok(out)
}

/// A fresh directory for the replicas' kubeconfigs and logs.
pub fn tempfile_dir(prefix: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
