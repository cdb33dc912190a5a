//! The admission rules that Cluster API's and medik8s' webhooks enforce, checked by a real API
//! server against the generated CRDs (their CEL rules), each refusal naming the field.

use serde_json::{Value, json};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_testenv::{Result, TestEnv};

use kube::CustomResourceExt as _;

fn mhc(spec: Value) -> Value {
    let mut base = json!({"clusterName": "prod", "selector": {"matchLabels": {"pool": "workers"}}});
    merge(&mut base, spec);
    json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
           "metadata": {"name": "bad", "namespace": "default"}, "spec": base})
}

fn nhc(spec: Value) -> Value {
    let mut base = json!({
        "selector": {"matchLabels": {"role": "worker"}},
        "minHealthy": "51%",
        "remediationTemplate": template("SelfNodeRemediationTemplate"),
    });
    merge(&mut base, spec);
    json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "bad"}, "spec": base})
}

fn template(kind: &str) -> Value {
    json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": kind, "name": "t", "namespace": "medik8s"})
}

/// Sets each key of `extra` on `base`; a null removes it.
fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            if v.is_null() {
                b.remove(k);
            } else {
                b.insert(k.clone(), v.clone());
            }
        }
    }
}

#[tokio::test]
async fn upstream_webhook_rules_are_refused_by_the_api_server_naming_the_field() -> Result<()> {
    let env = TestEnv::start().await?;
    env.install_crds(&[
        serde_json::to_value(MachineHealthCheck::crd())?,
        serde_json::to_value(NodeHealthCheck::crd())?,
    ])
    .await?;
    // (manifest, the field the message must name, words the message must contain)
    let cases = [
        (mhc(json!({"maxUnhealthy": "10"})), "spec.maxUnhealthy", "must be a percentage such as 40%"),
        (
            mhc(json!({"selector": {"matchLabels": {"pool": "workers", "cluster.x-k8s.io/cluster-name": "staging"}}})),
            "spec.selector",
            "cluster.x-k8s.io/cluster-name staging must equal spec.clusterName prod",
        ),
        (mhc(json!({"selector": {"matchLabels": {"node pool": "workers"}}})), "spec.selector.matchLabels", "label key"),
        (
            mhc(json!({"selector": {"matchLabels": {"pool": "workers/a"}}})),
            "spec.selector.matchLabels[pool]",
            "label value",
        ),
        (
            nhc(json!({"selector": {"matchExpressions": [{"key": "-role", "operator": "Exists"}]}})),
            "spec.selector.matchExpressions[0].key",
            "label key",
        ),
        (
            nhc(json!({"selector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["a b"]}]}})),
            "spec.selector.matchExpressions[0].values[0]",
            "label value",
        ),
        (
            nhc(json!({"minHealthy": null, "maxUnhealthy": 1,
                        "remediationTemplate": template("MachineDeletionRemediationTemplate")})),
            "spec.maxUnhealthy",
            "MachineDeletionRemediationTemplate",
        ),
        (
            nhc(json!({"minHealthy": null, "maxUnhealthy": "10%", "remediationTemplate": null,
                        "escalatingRemediations": [
                            {"remediationTemplate": template("SelfNodeRemediationTemplate"), "order": 0, "timeout": "5m"},
                            {"remediationTemplate": template("MachineDeletionRemediationTemplate"), "order": 1, "timeout": "5m"}]})),
            "spec.maxUnhealthy",
            "MachineDeletionRemediationTemplate",
        ),
    ];
    let mut problems = Vec::new();
    for (manifest, field, words) in cases {
        match env.apply(manifest.clone()).await {
            Ok(_) => problems.push(format!("admitted: {}", manifest["spec"])),
            Err(e) => {
                let message = format!("{e:#}");
                if !message.contains(field) || !message.contains(words) {
                    problems.push(format!(
                        "{}: message does not name {field:?} / say {words:?}: {message}",
                        manifest["spec"]
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The same shapes done right are admitted.
    env.apply(mhc(json!({"maxUnhealthy": "10%", "selector": {"matchLabels": {
        "pool": "workers", "cluster.x-k8s.io/cluster-name": "prod", "example.com/tier": ""}}})))
        .await?;
    env.apply(nhc(json!({"minHealthy": 2, "remediationTemplate": template("MachineDeletionRemediationTemplate")})))
        .await?;
    Ok(())
}
