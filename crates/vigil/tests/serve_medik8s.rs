//! `vigil run --serve-medik8s` as a user starts it, against a real kube-apiserver and etcd with
//! medik8s' NodeHealthCheck CRD: it exits with an error naming the operator's Lease while the
//! NodeHealthCheck operator holds it, and once the Lease is released it starts and decides the
//! medik8s checks in place.

mod support;

use jiff::Timestamp;
use serde_json::{Value, json};
use std::time::Duration;
use support::{MEDIK8S, Replica, Result, WAIT, anyhow_msg, install_basics, tempfile_dir};
use vigil_testenv::{Identity, TestEnv, wait_for};

const OPERATOR_NS: &str = "openshift-workload-availability";
const HOLDER: &str = "node-healthcheck-controller-manager-6c9f7d9b8-x2x4q_1f0c3c5e";

async fn operator_lease(env: &TestEnv, holder: &str) -> Result<()> {
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    env.apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": vigil_controller::medik8s::OPERATOR_LEASE, "namespace": OPERATOR_NS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": now, "renewTime": now}}))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_medik8s_refuses_to_start_while_the_operator_runs_then_serves_its_checks() -> Result<()> {
    let env = TestEnv::start().await?;
    install_basics(&env).await?;
    env.install_crds(&[vigil_testenv::medik8s_nhc_crd()?]).await?;
    let dir = tempfile_dir("vigil-serve-medik8s")?;

    operator_lease(&env, HOLDER).await?;
    let mut refused =
        Replica::start(&env, "refused", Identity::Admin, env.server_url(), &dir, &["--serve-medik8s"]).await?;
    let status = tokio::time::timeout(Duration::from_secs(30), refused.child.wait()).await.map_err(|_| {
        anyhow_msg("vigil run --serve-medik8s kept running while the operator's Lease was held".into())
    })??;
    assert!(!status.success(), "{status}");
    let log = std::fs::read_to_string(dir.join("refused.log"))?;
    let said =
        format!("the NodeHealthCheck operator is running (Lease {OPERATOR_NS}/e1f13584.medik8s.io held by {HOLDER:?}");
    assert!(log.contains(&said), "{log}");

    // The operator scaled down, its Lease released: Vigil starts and decides the medik8s check.
    operator_lease(&env, "").await?;
    env.apply(json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": "51%", "maxUnhealthy": 1,
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                    "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": MEDIK8S}}}))
        .await?;
    let _serving =
        Replica::start(&env, "serving", Identity::Admin, env.server_url(), &dir, &["--serve-medik8s"]).await?;
    let reason = wait_for("the medik8s check refused for its thresholds", WAIT, || async {
        let check = env.get_json("remediation.medik8s.io/v1alpha1", "NodeHealthCheck", None, "workers").await?;
        let status = check.and_then(|c| c.get("status").cloned()).unwrap_or(Value::Null);
        let disabled =
            status["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Disabled")).cloned();
        Ok(disabled.filter(|c| c["reason"] == "InvalidSpec").map(|c| c["message"].as_str().unwrap_or("").to_string()))
    })
    .await?;
    assert!(reason.contains("spec.minHealthy"), "{reason}");
    env.stop().await?;
    Ok(())
}
