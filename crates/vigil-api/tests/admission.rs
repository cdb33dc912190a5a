//! The admission rules that Cluster API's and medik8s' webhooks enforce, checked by a real API
//! server against the generated CRDs (their CEL rules), each refusal naming the field.

use serde_json::{Value, json};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_testenv::{Error, Result, TestEnv};

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

// Over 80 lines on purpose: one API server for a table of refused manifests, one row each;
// starting etcd and kube-apiserver per group of rows would cost seconds each.
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
            mhc(json!({"unhealthyMachineConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]})),
            "spec.unhealthyMachineConditions[0].type",
            "must not be one of Ready, Available",
        ),
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
        (
            mhc(json!({"backoff": {"maxRemediations": 2, "window": "30m", "poolLabel": "karpenter.sh/nodepool"}})),
            "spec.backoff.poolLabel",
            "must not be set on a MachineHealthCheck",
        ),
        (
            mhc(json!({"backoff": {"maxRemediations": 0, "window": "30m"}})),
            "spec.backoff.maxRemediations",
            "at least 1",
        ),
        (mhc(json!({"backoff": {"maxRemediations": 2, "window": "0s"}})), "spec.backoff.window", "greater than zero"),
        (
            nhc(json!({"unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "duration": "5m",
                        "reasons": (0..33).map(|i| format!("Reason{i}")).collect::<Vec<_>>()}]})),
            "spec.unhealthyConditions[0].reasons",
            "must have at most 32 items",
        ),
        (
            nhc(json!({"unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "duration": "5m",
                        "reasons": ["R".repeat(257)]}]})),
            "spec.unhealthyConditions[0].reasons[0]",
            "may not be more than 256",
        ),
        (nhc(json!({"plannedMaintenance": {"grace": "25h"}})), "spec.plannedMaintenance.grace", "at most 24h"),
        (nhc(json!({"plannedMaintenance": {"grace": "-1m"}})), "spec.plannedMaintenance.grace", "must not be negative"),
        (nhc(json!({"backoff": {"maxRemediations": 2, "window": "30m"}})), "spec.backoff.poolLabel", "must be set"),
        (
            nhc(json!({"backoff": {"maxRemediations": 101, "window": "30m", "poolLabel": "pool"}})),
            "spec.backoff.maxRemediations",
            "at most 100",
        ),
        (
            nhc(json!({"backoff": {"maxRemediations": 1, "window": "-5m", "poolLabel": "pool"}})),
            "spec.backoff.window",
            "greater than zero",
        ),
        (
            nhc(json!({"backoff": {"maxRemediations": 1, "window": "5m", "poolLabel": "bad key/x"}})),
            "spec.backoff.poolLabel",
            "label key",
        ),
        (
            nhc(json!({"failureDomains": {"key": "spec.failureDomain", "maxUnhealthy": 1}})),
            "spec.failureDomains.key",
            "spec.failureDomain is a Machine field",
        ),
        (nhc(json!({"failureDomains": {"key": "zone a", "maxUnhealthy": 1}})), "spec.failureDomains.key", "label key"),
        (
            mhc(json!({"failureDomains": {"key": "spec.failureDomain", "maxUnhealthy": "10"}})),
            "spec.failureDomains.maxUnhealthy",
            "must be a percentage such as 40%",
        ),
        (
            nhc(json!({"failureDomains": {"key": "zone", "maxUnhealthy": "120%"}})),
            "spec.failureDomains.maxUnhealthy",
            "between 0% and 100%",
        ),
        (
            mhc(json!({"failureDomains": {"key": "zone", "maxUnhealthy": 1, "minAllowed": -1}})),
            "spec.failureDomains.minAllowed",
            "must not be negative",
        ),
        // Reason-aware rules.
        (
            mhc(
                json!({"unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "timeout": "5m", "reasons": []}]}),
            ),
            "spec.unhealthyConditions[0].reasons",
            "must not be empty: leave reasons out",
        ),
        (
            nhc(json!({"unhealthyConditions": [{"type": "DiskFailing", "status": "True", "duration": "5m",
                        "reasons": ["SmartError", "SmartError"]}]})),
            // A `set` list: server-side apply refuses the repeat while building its patch (a
            // create says `reasons[1]: Duplicate value: "SmartError"`).
            "spec.unhealthyConditions[0].reasons",
            "duplicate entries for key [=\"SmartError\"]",
        ),
        (
            mhc(
                json!({"unhealthyMachineConditions": [{"type": "NodeHealthy", "status": "False", "timeout": "5m", "reasons": [" "]}]}),
            ),
            "spec.unhealthyMachineConditions[0].reasons[0]",
            "must not be empty: name a condition reason",
        ),
        // Remediation per condition.
        (
            nhc(json!({"unhealthyConditions": [{"type": "DiskFailing", "status": "True", "duration": "5m",
                        "remediationTemplate": template("SelfNodeRemediationTemplate"),
                        "escalatingRemediations": [{"remediationTemplate": template("MachineDeletionRemediationTemplate"), "order": 0, "timeout": "5m"}]}]})),
            "spec.unhealthyConditions[0].remediationTemplate",
            "only one of remediationTemplate and escalatingRemediations may be set on a rule",
        ),
        (
            nhc(json!({"unhealthyConditions": [{"type": "DiskFailing", "status": "True", "duration": "5m",
                        "remediationTemplate": {"apiVersion": "a.io/v1", "kind": "RebootTemplate", "name": "r"}}]})),
            "spec.unhealthyConditions[0].remediationTemplate.namespace",
            "must not be empty: a NodeHealthCheck is cluster-scoped",
        ),
        (
            nhc(json!({"unhealthyConditions": [{"type": "DiskFailing", "status": "True", "duration": "5m",
                        "escalatingRemediations": [
                            {"remediationTemplate": template("SelfNodeRemediationTemplate"), "order": 1, "timeout": "5m"},
                            {"remediationTemplate": template("MachineDeletionRemediationTemplate"), "order": 1, "timeout": "5m"}]}]})),
            "spec.unhealthyConditions[0].escalatingRemediations",
            "order must be unique",
        ),
        (
            nhc(
                json!({"minHealthy": null, "maxUnhealthy": 1, "unhealthyConditions": [{"type": "DiskFailing", "status": "True",
                        "duration": "5m", "remediationTemplate": template("MachineDeletionRemediationTemplate")}]}),
            ),
            "spec.maxUnhealthy",
            "MachineDeletionRemediationTemplate",
        ),
        (
            mhc(json!({"unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m",
                        "remediationTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Remediation", "name": "m3"}}]})),
            "spec.unhealthyConditions[0].remediationTemplate.kind",
            "must name a template kind ending in Template",
        ),
        (mhc(json!({"maxInFlight": 0})), "spec.maxInFlight", "must be at least 1 (or 1%)"),
        (nhc(json!({"maxInFlight": "0%"})), "spec.maxInFlight", "must be at least 1 (or 1%)"),
        (nhc(json!({"maxInFlight": -2})), "spec.maxInFlight", "must not be negative"),
        (mhc(json!({"maxInFlight": "150%"})), "spec.maxInFlight", "between 0% and 100%"),
        (mhc(json!({"maxInFlight": "2"})), "spec.maxInFlight", "must be a percentage such as 40%"),
        (nhc(json!({"maxInFlight": "lots"})), "spec.maxInFlight", "a whole number or a percentage"),
        (
            mhc(json!({"voluntaryDisruptions": "Sometimes"})),
            "spec.voluntaryDisruptions",
            "must be one of Ignore, Count",
        ),
        (nhc(json!({"voluntaryDisruptions": "count"})), "spec.voluntaryDisruptions", "must be one of Ignore, Count"),
        (
            nhc(json!({"flapping": {"episodes": 1, "window": "1h"}})),
            "spec.flapping.episodes",
            "at least 2 and at most 20",
        ),
        (
            nhc(json!({"flapping": {"episodes": 21, "window": "1h"}})),
            "spec.flapping.episodes",
            "at least 2 and at most 20",
        ),
        (
            nhc(json!({"flapping": {"episodes": 3, "window": "30s"}})),
            "spec.flapping.window",
            "at least 1m and at most 24h",
        ),
        (
            nhc(json!({"flapping": {"episodes": 3, "window": "25h"}})),
            "spec.flapping.window",
            "at least 1m and at most 24h",
        ),
        (
            nhc(json!({
                "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "10m"}],
                "flapping": {"episodes": 3, "window": "5m"},
            })),
            "spec.flapping",
            "window must not be shorter than the longest rule duration",
        ),
        (
            nhc(json!({
                "unhealthyExpressions": [{"expression": "node.unschedulable", "duration": "10m"}],
                "flapping": {"episodes": 3, "window": "5m"},
            })),
            "spec.flapping",
            "window must not be shorter than the longest rule duration",
        ),
        (
            mhc(json!({
                "unhealthyExpressions": [{"expression": "node.unschedulable", "timeout": "10m"}],
                "flapping": {"episodes": 3, "window": "5m"},
            })),
            "spec.flapping",
            "window must not be shorter than the longest rule duration",
        ),
        (
            mhc(json!({
                "unhealthyMachineConditions": [{"type": "Stuck", "status": "True", "timeout": "10m"}],
                "flapping": {"episodes": 3, "window": "5m"},
            })),
            "spec.flapping",
            "window must not be shorter than the longest rule duration",
        ),
        (
            mhc(json!({"flapping": {"episodes": 1, "window": "1h"}})),
            "spec.flapping.episodes",
            "at least 2 and at most 20",
        ),
        (
            mhc(json!({"unhealthyExpressions": [{"expression": "node.unschedulable", "timeout": "-5m"}]})),
            "spec.unhealthyExpressions[0].timeout",
            "must not be negative",
        ),
        (
            nhc(json!({"maxUnhealthy": 1, "minHealthy": null, "unhealthyExpressions": [{
                "expression": "node.unschedulable", "duration": "5m",
                "remediationTemplate": template("MachineDeletionRemediationTemplate")}]})),
            "spec.maxUnhealthy",
            "cannot be combined with a MachineDeletionRemediationTemplate",
        ),
        (
            nhc(json!({"unhealthyExpressions": [{"expression": "", "duration": "5m"}]})),
            "spec.unhealthyExpressions[0].expression",
            "at least 1 chars long",
        ),
        (
            nhc(json!({"unhealthyExpressions": [{"expression": "node.unschedulable", "duration": "-5m"}]})),
            "spec.unhealthyExpressions[0].duration",
            "must not be negative",
        ),
        (
            nhc(json!({"unhealthyExpressions": (0..17)
                .map(|_| json!({"expression": "node.unschedulable", "duration": "5m"}))
                .collect::<Vec<_>>()})),
            "spec.unhealthyExpressions",
            "must have at most 16 items",
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
    env.apply(mhc(json!({"backoff": {"maxRemediations": 2, "window": "30m"}}))).await?;
    env.apply(mhc(json!({
        "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}],
        "unhealthyExpressions": [{"expression": "node.unschedulable", "timeout": "10m",
            "remediationTemplate": {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "r"}}],
        "flapping": {"episodes": 3, "window": "10m"},
    })))
    .await?;
    env.apply(nhc(json!({"backoff": {"maxRemediations": 2, "window": "30m", "poolLabel": "karpenter.sh/nodepool"}})))
        .await?;
    let mut good = nhc(json!({"failureDomains": {"key": "topology.kubernetes.io/zone", "maxUnhealthy": "30%"}}));
    good["metadata"]["name"] = json!("zones");
    env.apply(good).await?;
    let mut good = mhc(json!({"failureDomains": {"key": "spec.failureDomain", "maxUnhealthy": 1, "minAllowed": 0}}));
    good["metadata"]["name"] = json!("zones");
    env.apply(good).await?;
    let mut good = nhc(json!({"unhealthyConditions": [
        {"type": "Ready", "status": "False", "duration": "5m", "reasons": ["KubeletNotReady"]},
        {"type": "KernelDeadlock", "status": "True", "duration": "5m", "remediationTemplate": template("SelfNodeRemediationTemplate")},
        {"type": "DiskFailing", "status": "True", "duration": "5m", "reasons": ["SmartError"], "escalatingRemediations": [
            {"remediationTemplate": template("SelfNodeRemediationTemplate"), "order": 0, "timeout": "5m"},
            {"remediationTemplate": template("MachineDeletionRemediationTemplate"), "order": 1, "timeout": "30m"}]}]}));
    good["metadata"]["name"] = json!("per-rule");
    env.apply(good).await?;
    let mut good = mhc(
        json!({"unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m", "reasons": ["KubeletNotReady"],
        "remediationTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3RemediationTemplate", "name": "m3"}}]}),
    );
    good["metadata"]["name"] = json!("per-rule");
    env.apply(good).await?;
    let mut good = nhc(json!({
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
        "flapping": {"episodes": 3, "window": "1h"},
    }));
    good["metadata"]["name"] = json!("flapping");
    env.apply(good).await?;
    let mut good = nhc(json!({"unhealthyExpressions": [
        {"expression": "node.unschedulable && node.conditions['Ready'].status != 'True'", "duration": "10m"}]}));
    good["metadata"]["name"] = json!("expressions");
    env.apply(good).await?;
    for (name, disruptions) in [("shared-budget", "Count"), ("own-budget", "Ignore")] {
        let mut good = mhc(json!({"voluntaryDisruptions": disruptions}));
        good["metadata"]["name"] = json!(name);
        env.apply(good).await?;
        let mut good = nhc(json!({"voluntaryDisruptions": disruptions}));
        good["metadata"]["name"] = json!(name);
        env.apply(good).await?;
    }
    for (name, limit) in [("paced", json!(2)), ("paced-share", json!("10%"))] {
        let mut good = mhc(json!({"maxInFlight": limit}));
        good["metadata"]["name"] = json!(name);
        env.apply(good).await?;
        let mut good = nhc(json!({"maxInFlight": limit}));
        good["metadata"]["name"] = json!(name);
        env.apply(good).await?;
    }
    Ok(())
}

/// The Cluster API `v1beta2` shape Vigil reads is the real one: a manifest the upstream CRD
/// (from the pinned Go module, reduced to `v1beta2`) admits, read back from the API server,
/// becomes the same policy as its `v1beta1` form.
#[tokio::test]
async fn a_v1beta2_check_the_upstream_crd_admits_reads_as_its_v1beta1_form() -> Result<()> {
    use vigil_api::manifest::{HealthCheck, health_check_from_value};
    let env = TestEnv::start().await?;
    let path = vigil_testenv::capi_crds_dir()?.join("cluster.x-k8s.io_machinehealthchecks.yaml");
    let text = std::fs::read_to_string(&path)?;
    let mut crd: Value = serde_saphyr::from_str(&text)?;
    vigil_testenv::reduce_to_version(&mut crd, "v1beta2")?;
    env.install_crds(&[crd]).await?;

    let v1beta2 = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "default"},
        "spec": {
            "clusterName": "prod",
            "selector": {"matchLabels": {"pool": "a"}},
            "checks": {
                "nodeStartupTimeoutSeconds": 900,
                "unhealthyNodeConditions": [{"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}],
                "unhealthyMachineConditions": [{"type": "NodeHealthy", "status": "False", "timeoutSeconds": 120}]
            },
            "remediation": {
                "triggerIf": {"unhealthyInRange": "[1-3]"},
                "templateRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3RemediationTemplate", "name": "m3"}
            }
        }
    });
    env.apply(v1beta2).await.map_err(|e| Error::msg(format!("{e:#}")))?;
    let stored = env.get_json("cluster.x-k8s.io/v1beta2", "MachineHealthCheck", Some("default"), "workers").await?;
    let stored = stored.ok_or_else(|| Error::msg("the upstream API server lost the check"))?;
    let v1beta1 = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "default"},
        "spec": {
            "clusterName": "prod",
            "selector": {"matchLabels": {"pool": "a"}},
            "nodeStartupTimeout": "15m",
            "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "5m"}],
            "unhealthyMachineConditions": [{"type": "NodeHealthy", "status": "False", "timeout": "2m"}],
            "unhealthyRange": "[1-3]",
            "remediationTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3RemediationTemplate", "name": "m3"}
        }
    });
    let policy = |v: &Value| -> Result<vigil_api::validate::MhcPolicy> {
        match health_check_from_value(v)? {
            HealthCheck::Machine(m) => Ok(vigil_api::validate::machine_health_check(&m)?),
            HealthCheck::Node(_) => Err(Error::msg("not a MachineHealthCheck")),
        }
    };
    assert_eq!(policy(&stored)?, policy(&v1beta1)?);
    Ok(())
}
