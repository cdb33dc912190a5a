//! Helpers shared by the end-to-end suites: a controller in the test process, fixtures
//! (Cluster, Machines, Nodes, checks, templates) written through the API, and bounded waits.

#![allow(dead_code)]

use anyhow::{Result, bail};
use jiff::{SignedDuration, Timestamp};
use kube::CustomResourceExt;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_controller::Options;
use vigil_testenv::{TestEnv, wait_for};

pub const NS: &str = "default";
pub const CLUSTER: &str = "prod";
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Controller {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    pub fn start(env: &TestEnv) -> Controller {
        Controller::start_with(env.client(), Options { workers: 2, metrics_addr: None, ..Default::default() })
    }

    /// A controller with its own client (e.g. through a fault proxy) and options.
    pub fn start_with(client: kube::Client, options: Options) -> Controller {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            vigil_controller::run(client, options, async {
                let _ = stopped.await;
            })
            .await;
        });
        Controller { stop: Some(stop), task }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn env() -> Result<TestEnv> {
    // The controller's own log, in the test's output, when RUST_LOG asks for it (a failing run
    // then says what the controller saw and did).
    if std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::from_default_env();
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    let ours = [serde_json::to_value(MachineHealthCheck::crd())?, serde_json::to_value(NodeHealthCheck::crd())?];
    env.install_crds(&ours).await?;
    Ok(env)
}

pub fn secs_ago(s: i64) -> String {
    // metav1.Time has second precision: round down so the expiry we compute is the server's.
    let t = Timestamp::now().checked_sub(SignedDuration::from_secs(s)).expect("time");
    Timestamp::from_second(t.as_second()).expect("time").to_string()
}

pub async fn cluster(env: &TestEnv, paused: bool) -> Result<()> {
    env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS}, "spec": {"paused": paused}}))
        .await?;
    env.apply_status(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS},
        "status": {"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                   "conditions": [
                       {"type": "InfrastructureReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": secs_ago(3600)},
                       {"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized", "message": "", "lastTransitionTime": secs_ago(3600)}]}}))
    .await?;
    Ok(())
}

/// The workload cluster is this same API server (self-hosted), reached through the Secret.
pub async fn self_hosted(env: &TestEnv) -> Result<()> {
    env.apply(env.kubeconfig_secret(NS, CLUSTER)).await?;
    Ok(())
}

pub async fn machine(env: &TestEnv, name: &str, node: Option<&str>, annotations: Value) -> Result<()> {
    machine_in_pool(env, name, node, annotations, "workers").await
}

/// A Machine labelled `pool: <pool>` (checks select Machines by that label).
pub async fn machine_in_pool(
    env: &TestEnv,
    name: &str,
    node: Option<&str>,
    annotations: Value,
    pool: &str,
) -> Result<()> {
    env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations,
                     "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER, "pool": pool}},
        "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": name},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}}))
    .await?;
    if let Some(node) = node {
        env.apply_status(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": NS}, "status": {"nodeRef": {"name": node}}}))
            .await?;
    }
    Ok(())
}

pub async fn node(env: &TestEnv, name: &str, labels: Value) -> Result<()> {
    env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})).await?;
    set_ready(env, name, "True", &secs_ago(3600)).await
}

pub async fn set_ready(env: &TestEnv, name: &str, status: &str, since: &str) -> Result<()> {
    env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test", "message": "",
                                   "lastHeartbeatTime": Timestamp::now().to_string(), "lastTransitionTime": since}]}}))
        .await?;
    Ok(())
}

pub async fn mhc(env: &TestEnv, name: &str, extra: Value) -> Result<()> {
    let mut spec = json!({"clusterName": CLUSTER, "selector": {"matchLabels": {"pool": "workers"}},
        "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "3s"},
                                {"type": "Ready", "status": "Unknown", "timeout": "3s"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS}, "spec": spec}))
        .await?;
    Ok(())
}

pub async fn get(env: &TestEnv, api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> Result<Option<Value>> {
    env.get_json(api_version, kind, ns, name).await
}

pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

/// (status, reason) of a Machine condition.
pub async fn machine_condition(env: &TestEnv, name: &str, type_: &str) -> Result<Option<(String, String)>> {
    let m = get(env, "cluster.x-k8s.io/v1beta2", "Machine", Some(NS), name).await?;
    Ok(m.as_ref()
        .and_then(|m| condition(m, type_))
        .map(|c| (c["status"].as_str().unwrap_or("").to_string(), c["reason"].as_str().unwrap_or("").to_string())))
}

pub async fn wait_machine_condition(
    env: &TestEnv,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Result<Instant> {
    wait_for(&format!("{name} {type_}={status}/{reason}"), WAIT, || async {
        Ok(machine_condition(env, name, type_)
            .await?
            .filter(|(s, r)| s == status && r == reason)
            .map(|_| Instant::now()))
    })
    .await
}

pub async fn check_status(env: &TestEnv, kind: &str, name: &str) -> Result<Value> {
    let ns = if kind == "MachineHealthCheck" { Some(NS) } else { None };
    Ok(get(env, "vigil.dev/v1alpha1", kind, ns, name)
        .await?
        .and_then(|o| o.get("status").cloned())
        .unwrap_or(Value::Null))
}

pub async fn wait_check_condition(
    env: &TestEnv,
    kind: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Result<Value> {
    wait_for(&format!("{kind} {name} {type_}={status}/{reason}"), WAIT, || async {
        let s = check_status(env, kind, name).await?;
        let hit = s["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == status && c["reason"] == reason));
        Ok(hit.then_some(s))
    })
    .await
}

/// Asserts that nothing matching `bad` shows up for `period`.
pub async fn stays<F, Fut>(what: &str, period: Duration, mut bad: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let end = Instant::now() + period;
    while Instant::now() < end {
        if bad().await? {
            bail!("{what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Records one detection delay (ms from the timeout's expiry to the write being visible) for
/// the suite's report (`target/tmp/vigil-detection-delays.txt`).
pub fn record_delay(test: &str, expiry: Timestamp, seen_at: Instant) {
    let seen = Timestamp::now()
        .checked_sub(SignedDuration::try_from(seen_at.elapsed()).unwrap_or_default())
        .unwrap_or(Timestamp::now());
    let ms = seen.duration_since(expiry).as_secs_f64() * 1000.0;
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("vigil-detection-delays.txt");
    let line = format!("{test} {ms:.1}\n");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
    eprintln!("detection delay {test}: {ms:.1} ms");
}

pub async fn healthy_fleet(env: &TestEnv, n: usize) -> Result<()> {
    cluster(env, false).await?;
    self_hosted(env).await?;
    for i in 1..=n {
        node(env, &format!("n{i}"), json!({})).await?;
        machine(env, &format!("m{i}"), Some(&format!("n{i}")), json!({})).await?;
    }
    Ok(())
}

pub fn snr_template(name: &str, ns: &str, multiple: bool) -> Value {
    let annotations =
        if multiple { json!({"remediation.medik8s.io/multiple-templates-support": "true"}) } else { json!({}) };
    json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}})
}

pub async fn list_snr(env: &TestEnv, ns: &str) -> Result<Vec<Value>> {
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "self-node-remediation.medik8s.io",
        "v1alpha1",
        "SelfNodeRemediation",
    ));
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(env.client(), ns, &ar);
    let list = api.list(&Default::default()).await?;
    Ok(list.items.into_iter().map(|o| serde_json::to_value(o).unwrap_or(Value::Null)).collect())
}

pub const MEDIK8S: &str = "medik8s";

pub async fn nhc(env: &TestEnv, name: &str, extra: Value) -> Result<()> {
    let mut spec = json!({"selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": name}, "spec": spec})).await?;
    Ok(())
}

pub fn reboot_ref(name: &str) -> Value {
    json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": name, "namespace": MEDIK8S})
}

pub async fn workers(env: &TestEnv, n: usize) -> Result<()> {
    for i in 1..=n {
        node(env, &format!("w{i}"), json!({"role": "worker"})).await?;
    }
    Ok(())
}

pub fn for_node<'a>(objects: &'a [Value], node: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["metadata"]["annotations"]["remediation.medik8s.io/node-name"] == node).collect()
}
