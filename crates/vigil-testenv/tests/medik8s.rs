//! medik8s' NodeHealthCheck operator (v0.12.0, built by scripts/medik8s-nhc.sh) runs against the
//! test API server without webhooks or OpenShift, and does its work: a status for its check, a
//! remediation object and a node Lease for a node that stays unhealthy.

use std::time::Duration;

use serde_json::{Value, json};
use vigil_testenv::medik8s::{LEASE_NAMESPACE, NHC_CRD_FILE, NhcOperator, nhc_crd, nhc_operator_dir};
use vigil_testenv::{Result, TestEnv, medik8s_crds_dir, wait_for};

const NS: &str = "medik8s";
const WAIT: Duration = Duration::from_secs(60);

/// The CRD the project installs is the one the pinned module publishes, byte for byte.
#[tokio::test]
async fn committed_crd_is_the_modules() -> Result<()> {
    let built = std::fs::read_to_string(nhc_operator_dir().await?.join(NHC_CRD_FILE))?;
    let committed = std::fs::read_to_string(medik8s_crds_dir().join(NHC_CRD_FILE))?;
    assert!(
        built == committed,
        "crates/vigil-testenv/upstream-crds/medik8s/{NHC_CRD_FILE} differs from the module's: copy it again"
    );
    Ok(())
}

fn node(name: &str, ready: &str, since: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Test", "message": "",
            "lastHeartbeatTime": since, "lastTransitionTime": since}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_starts_and_reconciles_a_node_health_check() -> Result<()> {
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    env.install_crds(&[nhc_crd()?]).await?;
    let long_ago = "2030-01-01T00:00:00Z";
    for (name, ready) in [("w1", "True"), ("w2", "True"), ("w3", "True")] {
        let n = node(name, ready, long_ago);
        env.apply(n.clone()).await?;
        env.apply_status(n).await?;
    }
    env.apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "reboot", "namespace": NS},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
        .await?;
    env.apply(json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "workers"},
        "spec": {"selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
                 "minHealthy": "51%",
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}],
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                     "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": NS}}}))
        .await?;

    let mut nhc = NhcOperator::start(&env).await?;
    let status = || async {
        let check = env.get_json("remediation.medik8s.io/v1alpha1", "NodeHealthCheck", None, "workers").await?;
        Ok::<_, vigil_testenv::Error>(check.map(|c| c["status"].clone()).unwrap_or(Value::Null))
    };
    let enabled = wait_for("the operator's first status", WAIT, || async {
        let s = status().await?;
        Ok((s["observedNodes"] == 3 && s["healthyNodes"] == 3).then_some(s))
    })
    .await;
    let enabled = enabled.map_err(|e| e.context(nhc.log_tail(40)))?;
    assert_eq!(enabled["phase"], "Enabled", "{enabled}");
    let disabled = enabled["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Disabled"));
    assert_eq!(disabled.map(|c| &c["status"]), Some(&json!("False")), "{enabled}");

    // w2 goes Ready=False: after 2 s a SelfNodeRemediation named after it, a Lease for it, and
    // the status says so.
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string();
    env.apply_status(node("w2", "False", &now)).await?;
    let snr = wait_for("a SelfNodeRemediation for w2", WAIT, || async {
        env.get_json("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediation", Some(NS), "w2").await
    })
    .await
    .map_err(|e| e.context(nhc.log_tail(40)))?;
    assert_eq!(snr.pointer("/metadata/ownerReferences/0/kind"), Some(&json!("NodeHealthCheck")), "{snr}");
    assert_eq!(snr.pointer("/metadata/annotations/remediation.medik8s.io~1node-name"), Some(&json!("w2")), "{snr}");
    let lease = env.get_json("coordination.k8s.io/v1", "Lease", Some(LEASE_NAMESPACE), "node-w2").await?;
    let holder = lease.as_ref().and_then(|l| l.pointer("/spec/holderIdentity"));
    assert_eq!(holder, Some(&json!("NodeHealthCheck-workers")), "{lease:?}");
    let remediating = wait_for("status phase Remediating", WAIT, || async {
        let s = status().await?;
        Ok((s["phase"] == "Remediating").then_some(s))
    })
    .await?;
    assert_eq!(remediating["healthyNodes"], 2, "{remediating}");
    assert_eq!(remediating.pointer("/unhealthyNodes/0/name"), Some(&json!("w2")), "{remediating}");
    nhc.check_running()?;
    nhc.stop().await?;
    env.stop().await?;
    Ok(())
}
