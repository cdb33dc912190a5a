//! The twin test: one scenario run twice, by the simulator (`vigil simulate`'s engine and store)
//! and by the controller (`vigil run`'s, in this process) against a real API server, with the
//! scenario's timeline replayed in real time and its remediator model played by this test as the
//! simulator plays it (a finalizer on each object while it holds deletions, the Node back after
//! `recoverAfter`). Per target, the sequence of decisions — marked unhealthy, remediation
//! requested or created, healthy again, object removed — must be the same, each within
//! [`TOLERANCE`] of the simulator's time, and each check's final counts the same.
//!
//! The scenarios are short (timeouts of seconds) and written with times long past, so both
//! worlds read them alike. New scenarios join [`twin`] with a name; the comparison is generic.

#[path = "../support/mod.rs"]
mod support;
use support::*;

mod examples;
mod owner;
mod scaled;

use anyhow::{Context as _, Result, ensure};
use jiff::Timestamp;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vigil_simulator::scenario::{Change, RemediatorOutcome};
use vigil_simulator::{Scenario, simulate};
use vigil_testenv::TestEnv;

/// How far the controller's time of a decision may be from the simulator's: the controller
/// waits on real requests, its Events go out on their own lane, and this test's remediator
/// looks every 50 ms.
const TOLERANCE: f64 = 2.5;

/// The decisions compared: what a target goes through, as both name them.
const DECISIONS: [&str; 9] = [
    "MachineMarkedUnhealthy",
    "RemediationRequested",
    "RemediationCreated",
    "RemediationRemoved",
    "MachineHealthy",
    "DetectedUnhealthy",
    "NodeHealthy",
    "RemediationTimedOut",
    "NoTemplateLeft",
];

/// One decision about one target, `t` seconds after the timeline began.
#[derive(Debug, Clone)]
struct Decision {
    t: f64,
    event: String,
    target: String,
}

/// Cluster `prod` of namespace `default`, provisioned and initialized (scenario objects).
macro_rules! prod_cluster {
    () => {
        r#"  - apiVersion: cluster.x-k8s.io/v1beta2
    kind: Cluster
    metadata: {name: prod, namespace: default}
    spec: {paused: false}
    status:
      initialization: {infrastructureProvisioned: true, controlPlaneInitialized: true}
      conditions:
        - {type: InfrastructureReady, status: "True", reason: Ready, message: "", lastTransitionTime: "2020-01-01T00:00:00Z"}
        - {type: ControlPlaneInitialized, status: "True", reason: Initialized, message: "", lastTransitionTime: "2020-01-01T00:00:00Z"}
"#
    };
}

/// Cluster `prod` with three Machines m1–m3 (anchor `*machine`) under a MachineHealthCheck
/// `workers` with an external reboot template, `maxUnhealthy: 1` and a 2 s timeout.
macro_rules! prod_workers_max_one {
    () => {
        concat!(
            prod_cluster!(),
            r#"  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: default}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: MachineHealthCheck
    metadata: {name: workers, namespace: default}
    spec:
      clusterName: prod
      selector: {matchLabels: {pool: workers}}
      maxUnhealthy: 1
      unhealthyConditions:
        - {type: Ready, status: "False", timeout: 2s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot}
  - &machine
    apiVersion: cluster.x-k8s.io/v1beta2
    kind: Machine
    metadata: {name: m1, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}
    spec: {clusterName: prod, bootstrap: {dataSecretName: m1}, infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DockerMachine, name: m1}}
    status: {nodeRef: {name: m1}}
  - {<<: *machine, metadata: {name: m2, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}, status: {nodeRef: {name: m2}}}
  - {<<: *machine, metadata: {name: m3, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}, status: {nodeRef: {name: m3}}}
"#
        )
    };
}

/// A MachineHealthCheck with an external template and `maxUnhealthy: 1` over four Machines: m1
/// fails at once, is remediated, comes back 3 s later; its object, deleted, is held by the
/// remediator for 6 s; m2 fails meanwhile and waits until m1's object is gone.
const FINISHING: &str = concat!(
    r#"
name: twin-finishing
duration: 30s
objects:
"#,
    prod_workers_max_one!(),
    r#"  - {<<: *machine, metadata: {name: m4, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}, status: {nodeRef: {name: m4}}}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: m1}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: m2}}
  - {<<: *node, metadata: {name: m3}}
  - {<<: *node, metadata: {name: m4}}
timeline:
  - {at: 0s, setNodeCondition: {node: m1, type: Ready, status: "False", reason: KubeletNotReady}}
  - {at: 6s, setNodeCondition: {node: m2, type: Ready, status: "False", reason: KubeletNotReady}}
models:
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3s, holdsDeletion: 6s}
"#
);

/// The same with a NodeHealthCheck, `minHealthy: 3` over four Nodes: w1 fails, is rebooted,
/// comes back; its object is held 6 s; w2 fails meanwhile and waits until w1's object is gone.
const NODE_FINISHING: &str = r#"
name: twin-node-finishing
duration: 30s
objects:
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 3
      unhealthyConditions:
        - {type: Ready, status: "False", duration: 2s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: w1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: w2, labels: {role: worker}}}
  - {<<: *node, metadata: {name: w3, labels: {role: worker}}}
  - {<<: *node, metadata: {name: w4, labels: {role: worker}}}
timeline:
  - {at: 0s, setNodeCondition: {node: w1, type: Ready, status: "False", reason: KubeletNotReady}}
  - {at: 6s, setNodeCondition: {node: w2, type: Ready, status: "False", reason: KubeletNotReady}}
models:
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3s, holdsDeletion: 6s}
"#;

/// A NodeHealthCheck escalating from a reboot to fencing: the reboot reports `Succeeded=False`
/// after 2 s, the check gives it up (`nhc-timed-out`, written before the next step is made) and
/// escalates; fencing brings the Node back after 3 s.
const ESCALATION: &str = r#"
name: twin-escalation
duration: 25s
objects:
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 2
      escalatingRemediations:
        - remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
          order: 0
          timeout: 60s
        - remediationTemplate: {apiVersion: fence-agents-remediation.medik8s.io/v1alpha1, kind: FenceAgentsRemediationTemplate, name: ipmi, namespace: medik8s}
          order: 1
          timeout: 60s
      unhealthyConditions:
        - {type: Ready, status: "False", duration: 2s}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: fence-agents-remediation.medik8s.io/v1alpha1
    kind: FenceAgentsRemediationTemplate
    metadata: {name: ipmi, namespace: medik8s}
    spec: {template: {spec: {agent: fence_ipmilan, remediationStrategy: ResourceDeletion}}}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: w1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: w2, labels: {role: worker}}}
  - {<<: *node, metadata: {name: w3, labels: {role: worker}}}
timeline:
  - {at: 0s, setNodeCondition: {node: w1, type: Ready, status: "False", reason: KubeletNotReady}}
models:
  remediators:
    - {kind: SelfNodeRemediation, succeeded: false, after: 2s}
    - {kind: FenceAgentsRemediation, recoverAfter: 3s}
"#;

/// A Node whose medik8s node Lease the maintenance operator holds is not remediated, in either
/// world, until the Lease is gone (deleted at 8 s); then it is.
const HELD_BY_MAINTENANCE: &str = r#"
name: twin-held-by-maintenance
start: "{START}"
duration: 20s
objects:
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 2
      unhealthyConditions:
        - {type: Ready, status: "False", duration: 2s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - apiVersion: coordination.k8s.io/v1
    kind: Lease
    metadata: {name: node-w1, namespace: medik8s-leases}
    spec: {holderIdentity: node-maintenance, leaseDurationSeconds: 3600, acquireTime: "{SINCE}", renewTime: "{SINCE}"}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: w1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: w2, labels: {role: worker}}}
  - {<<: *node, metadata: {name: w3, labels: {role: worker}}}
timeline:
  - {at: 0s, setNodeCondition: {node: w1, type: Ready, status: "False", reason: KubeletNotReady}}
  - {at: 8s, delete: {apiVersion: coordination.k8s.io/v1, kind: Lease, namespace: medik8s-leases, name: node-w1}}
models:
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3s}
"#;

/// The cluster upgrade pause: while the ClusterVersion is `Progressing=True` no new
/// remediation starts, in either world; the upgrade ends at 8 s and w1 is remediated.
const UPGRADE: &str = r#"
name: twin-upgrade
start: "{START}"
duration: 20s
objects:
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: workers}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 2
      unhealthyConditions:
        - {type: Ready, status: "False", duration: 2s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - &version
    apiVersion: config.openshift.io/v1
    kind: ClusterVersion
    metadata: {name: version}
    spec: {clusterID: 5b2d2c11-0000-4000-8000-000000000001}
    status:
      desired: {version: 4.19.1, image: "quay.io/openshift-release-dev/ocp-release:4.19.1"}
      observedGeneration: 1
      versionHash: h
      availableUpdates: []
      conditions: [{type: Progressing, status: "True", lastTransitionTime: "{SINCE}", message: "Working towards 4.19.1"}]
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: w1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: w2, labels: {role: worker}}}
  - {<<: *node, metadata: {name: w3, labels: {role: worker}}}
timeline:
  - {at: 0s, setNodeCondition: {node: w1, type: Ready, status: "False", reason: KubeletNotReady}}
  - at: 8s
    apply:
      <<: *version
      status:
        desired: {version: 4.19.1, image: "quay.io/openshift-release-dev/ocp-release:4.19.1"}
        observedGeneration: 1
        versionHash: h
        availableUpdates: []
        conditions: [{type: Progressing, status: "False", lastTransitionTime: "{SINCE}", message: "Cluster version is 4.19.1"}]
models:
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3s}
"#;

/// A MachineHealthCheck and a NodeHealthCheck on the same Node m1: the NodeHealthCheck (2 s)
/// starts first; the MachineHealthCheck (4 s) finds the Machine unhealthy and waits; the reboot
/// reports `Succeeded=False` at 5 s, the NodeHealthCheck has no template left and lets go, and
/// the MachineHealthCheck makes its own object.
const OVERLAP: &str = concat!(
    r#"
name: twin-overlap
duration: 20s
objects:
"#,
    prod_cluster!(),
    r#"  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: default}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    metadata: {name: reboot, namespace: medik8s}
    spec: {template: {spec: {remediationStrategy: Automatic}}}
  - apiVersion: vigil.dev/v1alpha1
    kind: MachineHealthCheck
    metadata: {name: workers, namespace: default}
    spec:
      clusterName: prod
      selector: {matchLabels: {pool: workers}}
      unhealthyConditions:
        - {type: Ready, status: "False", timeout: 4s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot}
  - apiVersion: vigil.dev/v1alpha1
    kind: NodeHealthCheck
    metadata: {name: nodes}
    spec:
      selector: {matchLabels: {role: worker}}
      minHealthy: 1
      unhealthyConditions:
        - {type: Ready, status: "False", duration: 2s}
      remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: reboot, namespace: medik8s}
  - &machine
    apiVersion: cluster.x-k8s.io/v1beta2
    kind: Machine
    metadata: {name: m1, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}
    spec: {clusterName: prod, bootstrap: {dataSecretName: m1}, infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DockerMachine, name: m1}}
    status: {nodeRef: {name: m1}}
  - {<<: *machine, metadata: {name: m2, namespace: default, labels: {cluster.x-k8s.io/cluster-name: prod, pool: workers}}, status: {nodeRef: {name: m2}}}
  - &node
    apiVersion: v1
    kind: Node
    metadata: {name: m1, labels: {role: worker}}
    status:
      conditions:
        - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
  - {<<: *node, metadata: {name: m2, labels: {role: worker}}}
timeline:
  - {at: 0s, setNodeCondition: {node: m1, type: Ready, status: "False", reason: KubeletNotReady}}
models:
  remediators:
    - {kind: SelfNodeRemediation, succeeded: false, after: 3s}
"#
);

/// A MachineHealthCheck of workload cluster `prod`, whose Nodes live in that cluster (reached
/// through its kubeconfig Secret), with an external template and `maxUnhealthy: 1`: m1 fails,
/// is rebooted and comes back 3 s later; m2 fails before m1 is back (two unhealthy: restricted)
/// and is remediated once m1 is back and its own timeout has run.
const WORKLOAD: &str = concat!(
    r#"
name: twin-workload
duration: 24s
objects:
"#,
    prod_workers_max_one!(),
    r#"workloadClusters:
  default/prod:
    - &node
      apiVersion: v1
      kind: Node
      metadata: {name: m1}
      status:
        conditions:
          - {type: Ready, status: "True", reason: KubeletReady, message: "", lastHeartbeatTime: "2020-01-01T00:00:00Z", lastTransitionTime: "2020-01-01T00:00:00Z"}
    - {<<: *node, metadata: {name: m2}}
    - {<<: *node, metadata: {name: m3}}
timeline:
  - {at: 0s, cluster: default/prod, setNodeCondition: {node: m1, type: Ready, status: "False", reason: KubeletNotReady}}
  - {at: 4s, cluster: default/prod, setNodeCondition: {node: m2, type: Ready, status: "False", reason: KubeletNotReady}}
models:
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3s}
"#
);

/// The simulator's decisions (targets `ns/name` for Machines, `name` for Nodes), their times
/// told from `offset` seconds after the start, and its final statuses.
fn simulated(scenario: &Scenario, offset: f64) -> Result<(Vec<Decision>, BTreeMap<String, Value>)> {
    let report = simulate(scenario)?;
    let decisions = report
        .events
        .iter()
        .filter(|e| DECISIONS.contains(&e.event.as_str()))
        .filter_map(|e| Some(Decision { t: e.t - offset, event: e.event.clone(), target: e.target.clone()? }))
        .collect();
    Ok((decisions, report.final_statuses))
}

/// The remediation objects of kind `kind` (a remediator model's; its API group is its template's
/// in the scenario): in every namespace (`None`) or in one.
fn remediation_api(
    env: &TestEnv,
    scenario: &Scenario,
    kind: &str,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let template = format!("{kind}Template");
    let api_version = scenario
        .objects
        .iter()
        .find(|o| o["kind"] == template.as_str())
        .and_then(|o| o["apiVersion"].as_str())
        .with_context(|| format!("no {template} in the scenario"))?;
    let (group, version) = api_version.split_once('/').context("a group/version")?;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Ok(match namespace {
        Some(ns) => Api::namespaced_with(env.client(), ns, &ar),
        None => Api::all_with(env.client(), &ar),
    })
}

/// The Node an object remediates: its `remediation.medik8s.io/node-name` annotation (a
/// NodeHealthCheck's), else its name (a MachineHealthCheck's is its Machine's, whose Node here
/// has the same name).
fn node_of(o: &DynamicObject) -> String {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("remediation.medik8s.io/node-name").cloned())
        .or_else(|| o.metadata.name.clone())
        .unwrap_or_default()
}

/// Writes every object of the scenario. Its one workload cluster, if it has one, is an API
/// server of its own holding that cluster's Nodes, reached through the kubeconfig Secret a
/// Cluster API cluster has; every other Cluster of the scenario is made self-hosted (as a
/// scenario's cluster without workload Nodes is). The API server holding the Nodes is returned.
async fn load(env: &TestEnv, scenario: &Scenario) -> Result<Option<TestEnv>> {
    ensure!(scenario.workload_clusters.len() <= 1, "one workload cluster at most");
    install_missing_kinds(env, scenario).await?;
    let workload = match scenario.workload_clusters.iter().next() {
        Some((key, nodes)) => {
            let (namespace, cluster) = key.split_once('/').context("a workload cluster's namespace/name")?;
            let workload = TestEnv::start().await?;
            for node in nodes {
                apply_object(&workload, node).await?;
            }
            env.apply(workload.kubeconfig_secret(namespace, cluster)).await?;
            Some(workload)
        }
        None => None,
    };
    for cluster in scenario.objects.iter().filter(|o| o["kind"] == "Cluster") {
        let namespace = cluster.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let name = cluster["metadata"]["name"].as_str().context("a Cluster's name")?;
        if !scenario.workload_clusters.contains_key(&format!("{namespace}/{name}")) {
            env.apply(env.kubeconfig_secret(namespace, name)).await?;
        }
    }
    for object in &scenario.objects {
        apply_object(env, &as_stored(object)?).await?;
    }
    Ok(workload)
}

/// An object as the simulator stores it: a health check of an upstream apiVersion in Vigil's
/// own form (what `vigil convert` writes), anything else as it is.
fn as_stored(object: &Value) -> Result<Value> {
    if object["kind"] != "MachineHealthCheck" && object["kind"] != "NodeHealthCheck" {
        return Ok(object.clone());
    }
    let mut typed = match vigil_api::manifest::health_check_from_value(object)? {
        vigil_api::manifest::HealthCheck::Machine(m) => serde_json::to_value(m)?,
        vigil_api::manifest::HealthCheck::Node(n) => serde_json::to_value(n)?,
    };
    if let Some(map) = typed.as_object_mut() {
        map.remove("status");
    }
    Ok(typed)
}

/// The remediation kinds (and their templates) a scenario uses that no installed CRD serves,
/// as CRDs that take any content: the live API server must hold what the simulator's store
/// holds, and these kinds' contents are the remediator's business, not Vigil's.
async fn install_missing_kinds(env: &TestEnv, scenario: &Scenario) -> Result<()> {
    const STANDINS: [(&str, &str); 1] = [("infrastructure.cluster.x-k8s.io", "Metal3Remediation")];
    for (group, kind) in STANDINS {
        let used = scenario.models.remediators.iter().any(|r| r.kind == kind);
        if used {
            env.install_crds(&[any_content_crd(group, kind), any_content_crd(group, &format!("{kind}Template"))])
                .await?;
        }
    }
    Ok(())
}

/// A namespaced `v1beta1` CRD of `group`/`kind` that keeps any spec and status.
fn any_content_crd(group: &str, kind: &str) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": "v1beta1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": open, "status": open}}}}]}})
}

/// Writes one object as the simulator takes it whole: its status through the status
/// subresource.
/// The API server gives each object its uid: a uid the scenario names is left out, and an owner
/// reference's is the live owner's.
async fn apply_object(env: &TestEnv, object: &Value) -> Result<()> {
    let mut spec = object.clone();
    let status = spec.as_object_mut().and_then(|o| o.remove("status"));
    if let Some(metadata) = spec.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("uid");
    }
    let namespace = object.pointer("/metadata/namespace").and_then(Value::as_str);
    if let Some(owners) = spec.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
        for owner in owners {
            let (api_version, kind) =
                (owner["apiVersion"].as_str().unwrap_or("v1"), owner["kind"].as_str().unwrap_or(""));
            let owner_ns = if kind == "Node" { None } else { namespace };
            let name = owner["name"].as_str().unwrap_or_default();
            let live =
                get(env, api_version, kind, owner_ns, name).await?.with_context(|| format!("owner {kind} {name}"))?;
            owner["uid"] = live["metadata"]["uid"].clone();
        }
    }
    env.apply(spec).await?;
    if let Some(status) = status {
        let mut with_status = json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
            "metadata": {"name": object["metadata"]["name"]}, "status": status});
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            with_status["metadata"]["namespace"] = json!(ns);
        }
        env.apply_status(with_status).await?;
    }
    Ok(())
}

/// Sets one Node condition as a kubelet does (and as the simulator's `setNodeCondition`): the
/// transition time moves only with the status.
async fn set_condition(env: &TestEnv, node: &str, type_: &str, status: &str, reason: &str) -> Result<()> {
    let current = get(env, "v1", "Node", None, node).await?.context("the Node")?;
    let now = Timestamp::now().to_string();
    let mut conditions: Vec<Value> =
        current.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let fresh = json!({"type": type_, "status": status, "reason": reason, "message": "",
                       "lastHeartbeatTime": now, "lastTransitionTime": now});
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(c) => {
            let transition = if c["status"] == status { c["lastTransitionTime"].clone() } else { json!(now) };
            *c = fresh;
            c["lastTransitionTime"] = transition;
        }
        None => conditions.push(fresh),
    }
    env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                            "status": {"conditions": conditions}}))
        .await?;
    Ok(())
}

/// What this test's remediator (the scenario's model, played live) knows of each object.
#[derive(Default)]
struct Remediator {
    /// When each object was first seen (its finalizer then put on), by `kind/namespace/name`,
    /// seconds after the start.
    seen: BTreeMap<String, f64>,
    /// Objects whose Node was brought back.
    acted: Vec<String>,
    /// When each object was first seen being deleted.
    deleting: BTreeMap<String, Instant>,
    /// When each object was let go (its finalizer removed), seconds after the start.
    let_go: BTreeMap<String, f64>,
}

impl Remediator {
    /// One look at the objects: a finalizer on new ones, the Node back once `recover` has
    /// passed, the finalizer off once `hold` has passed since the delete.
    async fn look(&mut self, env: &TestEnv, nodes: &TestEnv, scenario: &Scenario, start: Instant) -> Result<()> {
        for model in &scenario.models.remediators {
            let after = match model.outcome {
                RemediatorOutcome::Recovers(d) | RemediatorOutcome::Fails(d) => Duration::try_from(d)?,
            };
            let hold = model.holds_deletion.map(Duration::try_from).transpose()?;
            for o in remediation_api(env, scenario, &model.kind, None)?.list(&Default::default()).await?.items {
                let object = o.metadata.name.clone().unwrap_or_default();
                let name = format!("{}/{}/{object}", model.kind, o.metadata.namespace.as_deref().unwrap_or(""));
                let api = remediation_api(env, scenario, &model.kind, o.metadata.namespace.as_deref())?;
                let params = PatchParams::default();
                if !self.seen.contains_key(&name) {
                    self.seen.insert(name.clone(), start.elapsed().as_secs_f64());
                    if hold.is_some() && o.metadata.deletion_timestamp.is_none() {
                        let patch = json!({"metadata": {"finalizers": ["simulator.vigil.dev/remediator"]}});
                        gone_is_fine(api.patch(&object, &params, &Patch::Merge(&patch)).await)?;
                    }
                }
                let first = self.seen[&name];
                if !self.acted.contains(&name) && start.elapsed().as_secs_f64() - first >= after.as_secs_f64() {
                    self.acted.push(name.clone());
                    act(nodes, &api, &o, model.outcome).await?;
                }
                if o.metadata.deletion_timestamp.is_some() && !self.let_go.contains_key(&name) {
                    let since = *self.deleting.entry(name.clone()).or_insert_with(Instant::now);
                    if hold.is_none_or(|h| since.elapsed() >= h) {
                        let patch = json!({"metadata": {"finalizers": null}});
                        gone_is_fine(api.patch(&object, &params, &Patch::Merge(&patch)).await)?;
                        self.let_go.insert(name.clone(), start.elapsed().as_secs_f64());
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a remediator model does once its time has come, as the simulator's does: the Node
/// Ready again (in `nodes`, the cluster of the Nodes) and the object `Succeeded=True`, or the
/// object `Succeeded=False`.
async fn act(nodes: &TestEnv, api: &Api<DynamicObject>, o: &DynamicObject, outcome: RemediatorOutcome) -> Result<()> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let now = Timestamp::now().to_string();
    let succeeded = match outcome {
        RemediatorOutcome::Recovers(_) => {
            set_condition(nodes, &node_of(o), "Ready", "True", "KubeletReady").await?;
            ("True", "RemediationFinished")
        }
        RemediatorOutcome::Fails(_) => ("False", "RemediationFailed"),
    };
    let status = json!({"status": {"conditions": [{"type": "Succeeded", "status": succeeded.0, "reason": succeeded.1,
                                                   "message": "", "lastTransitionTime": now}]}});
    gone_is_fine(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await)
}

/// A write to an object that is gone meanwhile (the controller deleted it) is no failure.
fn gone_is_fine<T>(written: kube::Result<T>) -> Result<()> {
    match written {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Replays the timeline in real time beside the remediator until the scenario's end; a step in
/// the workload cluster goes to `nodes`.
async fn replay(env: &TestEnv, nodes: &TestEnv, scenario: &Scenario, start: Instant) -> Result<Remediator> {
    let mut remediator = Remediator::default();
    let mut owner = owner::Owner::default();
    let mut heartbeats = owner::Heartbeats::new(scenario)?;
    let mut next = 0;
    let end = Duration::try_from(scenario.duration)?;
    while start.elapsed() < end {
        while let Some(step) =
            scenario.timeline.get(next).filter(|s| Duration::try_from(s.at).is_ok_and(|at| start.elapsed() >= at))
        {
            next += 1;
            let there = if step.cluster.is_some() { nodes } else { env };
            match &step.change {
                Change::SetNodeCondition(c) => {
                    set_condition(there, &c.node, &c.type_, &c.status, c.reason.as_deref().unwrap_or("")).await?
                }
                Change::Apply(object) => apply_object(there, &as_stored(object)?).await?,
                Change::Delete(id) => {
                    there.delete(&id.api_version, &id.kind, id.namespace.as_deref(), &id.name).await?;
                }
            }
        }
        remediator.look(env, nodes, scenario, start).await?;
        owner.look(env, nodes, scenario).await?;
        heartbeats.beat(env, nodes, scenario, start.elapsed()).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(remediator)
}

/// The controller's decisions, read back from its Events (each about its check, `related` to
/// the target or to the target's remediation object, named after it).
async fn decisions_of_events(env: &TestEnv, start: Timestamp) -> Result<Vec<Decision>> {
    let api: Api<K8sEvent> = Api::all(env.client());
    let mut out = Vec::new();
    for e in api.list(&Default::default()).await?.items {
        let reason = e.reason.clone().unwrap_or_default();
        if e.reporting_controller.as_deref() != Some("vigil") || !DECISIONS.contains(&reason.as_str()) {
            continue;
        }
        let Some(related) = &e.related else { continue };
        let name = related.name.clone().unwrap_or_default();
        // A MachineHealthCheck's targets are `ns/name`, a NodeHealthCheck's Node names; each
        // object is named after its target.
        let about_machines = e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("MachineHealthCheck");
        let target = match related.namespace.as_deref() {
            Some(ns) if about_machines => format!("{ns}/{name}"),
            _ => name,
        };
        let at = e.event_time.as_ref().map(|t| t.0).context("an event time")?;
        let t = at.duration_since(start).as_secs_f64();
        let times = 1 + e.series.as_ref().map_or(0, |s| usize::try_from(s.count).unwrap_or(0).saturating_sub(1));
        for _ in 0..times {
            out.push(Decision { t, event: reason.clone(), target: target.clone() });
        }
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(out)
}

/// Each target's decisions, in order.
/// A replacement Machine (`<base>-r<n>`) counts as one target with every other replacement of
/// its base: the owner names them by a counter of its own in each world.
fn by_target(decisions: &[Decision]) -> BTreeMap<String, Vec<Decision>> {
    let mut out: BTreeMap<String, Vec<Decision>> = BTreeMap::new();
    for d in decisions {
        let replacement =
            d.target.rsplit_once("-r").filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let target = replacement.map_or_else(|| d.target.clone(), |(base, _)| format!("{base}-r*"));
        out.entry(target).or_default().push(d.clone());
    }
    out
}

/// How close in time two live decisions about one target must be to count as one step: the
/// notices of one decision go out within milliseconds, but in no fixed order (an object's
/// removal is told by the applier once the delete answered, beside the plan's own notices).
const ONE_STEP: f64 = 0.5;

/// One target's decisions as steps, each the decisions made together (in name order) and when:
/// the simulator's at one instant, the controller's within `gap` of each other.
fn steps(decisions: &[Decision], gap: f64) -> Vec<(f64, Vec<String>)> {
    let mut out: Vec<(f64, f64, Vec<String>)> = Vec::new();
    for d in decisions {
        match out.last_mut() {
            Some((_, last, names)) if d.t - *last <= gap => {
                names.push(d.event.clone());
                *last = d.t;
            }
            _ => out.push((d.t, d.t, vec![d.event.clone()])),
        }
    }
    out.into_iter()
        .map(|(t, _, mut names)| {
            names.sort();
            (t, names)
        })
        .collect()
}

/// Where the two runs differ: per target, a different sequence of steps, or a step further than
/// [`TOLERANCE`] from the simulator's time.
fn differences(simulated: &[Decision], live: &[Decision]) -> Vec<String> {
    let (sim, live) = (by_target(simulated), by_target(live));
    let mut out = Vec::new();
    for target in sim.keys().chain(live.keys()).collect::<std::collections::BTreeSet<_>>() {
        let of = |m: &BTreeMap<String, Vec<Decision>>, gap| steps(m.get(target).map_or(&[][..], Vec::as_slice), gap);
        let (s, l) = (of(&sim, 0.0), of(&live, ONE_STEP));
        let names = |steps: &[(f64, Vec<String>)]| steps.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>();
        if names(&s) != names(&l) {
            out.push(format!("{target}: simulated {:?}, live {:?}", names(&s), names(&l)));
            continue;
        }
        for ((st, step), (lt, _)) in s.iter().zip(&l) {
            if (st - lt).abs() > TOLERANCE {
                out.push(format!("{target}: {step:?} at {st:.1} s simulated, {lt:.1} s live"));
            }
        }
    }
    out
}

#[test]
fn the_decisions_of_one_step_compare_in_any_order_and_steps_in_order() {
    let d = |t: f64, event: &str| Decision { t, event: event.into(), target: "m1".into() };
    let sim = [
        d(2.0, "MachineMarkedUnhealthy"),
        d(2.0, "RemediationCreated"),
        d(5.0, "MachineHealthy"),
        d(5.0, "RemediationRemoved"),
    ];
    let swapped = [
        d(1.7, "MachineMarkedUnhealthy"),
        d(1.7, "RemediationCreated"),
        d(4.85, "RemediationRemoved"),
        d(4.86, "MachineHealthy"),
    ];
    assert!(differences(&sim, &swapped).is_empty(), "{:?}", differences(&sim, &swapped));
    let late = [
        d(1.7, "MachineMarkedUnhealthy"),
        d(1.7, "RemediationCreated"),
        d(8.0, "RemediationRemoved"),
        d(8.0, "MachineHealthy"),
    ];
    assert_eq!(differences(&sim, &late).len(), 1, "a step 3 s late");
    let other_order = [
        d(1.7, "RemediationCreated"),
        d(3.0, "MachineMarkedUnhealthy"),
        d(4.9, "MachineHealthy"),
        d(4.9, "RemediationRemoved"),
    ];
    assert_eq!(differences(&sim, &other_order).len(), 1, "created a step before it was marked");
}

/// Runs `text` both ways and compares; returns the live run's remediator record.
async fn twin(text: &str) -> Result<Remediator> {
    // Both worlds start now: `{START}` is this instant, `{SINCE}` ten seconds before it (for
    // objects whose times must be recent in both, such as a held Lease's renewal).
    let now = Timestamp::now();
    let micro = |t: Timestamp| format!("{}", t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ"));
    let since = now.checked_sub(jiff::SignedDuration::from_secs(10))?;
    let text = text.replace("{START}", &now.to_string()).replace("{SINCE}", &micro(since));
    let mut scenario = Scenario::parse(&text)?;
    scenario.start = now;
    twin_scenario(&scenario).await
}

/// How long after the objects are written the timeline may start at the latest: the API
/// servers start, the objects are written and every check's first decision is made before.
const SET_UP: Duration = Duration::from_secs(60);

/// Runs `scenario` (starting about now) both ways and compares. The live timeline begins once
/// every check has made its first decision, some seconds after the objects were written at the
/// scenario's start; the simulator runs the scenario with its timeline as much later, and its
/// times are told from the timeline's beginning as the live ones are.
async fn twin_scenario(scenario: &Scenario) -> Result<Remediator> {
    let env = env().await?;
    env.install_standin_crds().await?;
    env.install_openshift_crds().await?;
    let workload = load(&env, scenario).await?;
    let nodes = workload.as_ref().unwrap_or(&env);
    let controller = Controller::start(&env);
    let checks =
        scenario.objects.iter().filter(|o| o["kind"] == "MachineHealthCheck" || o["kind"] == "NodeHealthCheck");
    for check in checks {
        let name = check["metadata"]["name"].as_str().context("a check's name")?;
        let namespace = check.pointer("/metadata/namespace").and_then(Value::as_str);
        wait_for_decision(&env, check["kind"].as_str().unwrap_or_default(), namespace, name).await?;
    }
    let (start, started_at) = (Instant::now(), Timestamp::now());
    let late = started_at.duration_since(scenario.start);
    ensure!(late.unsigned_abs() < SET_UP, "{}: the objects took {late:#} to settle", scenario.name);
    let (simulated, final_statuses) = simulated(&scaled::delayed(scenario.clone(), late), late.as_secs_f64())?;
    let remediator = replay(&env, nodes, scenario, start).await?;
    let live = decisions_of_events(&env, started_at).await?;
    controller.stop().await;
    eprintln!("TWIN {}: simulated {simulated:?}\nTWIN live {live:?}", scenario.name);
    let different = differences(&simulated, &live);
    ensure!(different.is_empty(), "{}: the controller decided otherwise:\n{}", scenario.name, different.join("\n"));
    same_statuses(&env, &final_statuses).await?;
    Ok(remediator)
}

/// Each check's final counts are the simulator's.
async fn same_statuses(env: &TestEnv, final_statuses: &BTreeMap<String, Value>) -> Result<()> {
    for (check, sim_status) in final_statuses {
        let (kind, namespace, name) = parts_of(check)?;
        let live_status = status_of(env, kind, namespace, name).await?;
        let fields: &[&str] = match kind {
            "MachineHealthCheck" => &["expectedMachines", "currentHealthy", "remediationsAllowed"],
            _ => &["observedNodes", "healthyNodes", "phase"],
        };
        for field in fields {
            ensure!(
                sim_status[*field] == live_status[*field],
                "{check} {field}: simulated {}, live {}",
                sim_status[*field],
                live_status[*field]
            );
        }
    }
    Ok(())
}

/// `MachineHealthCheck/<ns>/<name>` or `NodeHealthCheck/<name>` as kind, namespace and name.
fn parts_of(check: &str) -> Result<(&str, Option<&str>, &str)> {
    let (kind, rest) = check.split_once('/').context("a check key")?;
    Ok(match rest.split_once('/') {
        Some((namespace, name)) => (kind, Some(namespace), name),
        None => (kind, None, rest),
    })
}

/// A check's status (`null` before the first).
async fn status_of(env: &TestEnv, kind: &str, namespace: Option<&str>, name: &str) -> Result<Value> {
    let check = get(env, "vigil.dev/v1alpha1", kind, namespace, name).await?;
    Ok(check.and_then(|o| o.get("status").cloned()).unwrap_or(Value::Null))
}

/// Waits until the controller has written a status with conditions on the check.
async fn wait_for_decision(env: &TestEnv, kind: &str, namespace: Option<&str>, name: &str) -> Result<()> {
    vigil_testenv::wait_for(&format!("{kind} {name} decided"), WAIT, || async {
        let status = status_of(env, kind, namespace, name).await?;
        Ok(status["conditions"].as_array().is_some_and(|c| !c.is_empty()).then_some(()))
    })
    .await
}

/// Terminating remediation objects count for a MachineHealthCheck in both adapters: m2's
/// object waits until m1's remediator has let m1's object go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_remediator_holds_a_machine_health_checks_budget_in_both_worlds() -> Result<()> {
    let remediator = twin(FINISHING).await?;
    held_until_gone(&remediator, "default/m1", "default/m2")
}

/// The same for a NodeHealthCheck and its Nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_remediator_holds_a_node_health_checks_budget_in_both_worlds() -> Result<()> {
    let remediator = twin(NODE_FINISHING).await?;
    held_until_gone(&remediator, "medik8s/w1", "medik8s/w2")
}

/// A NodeHealthCheck escalates in both worlds: the failed reboot is given up and fencing made
/// only after, then the Node recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_past_a_failing_step_is_the_same_in_both_worlds() -> Result<()> {
    let remediator = twin(ESCALATION).await?;
    let reboot = remediator.seen.get("SelfNodeRemediation/medik8s/w1").copied().context("the reboot made")?;
    let fence = remediator.seen.get("FenceAgentsRemediation/medik8s/w1").copied().context("the fencing made")?;
    ensure!(fence > reboot + 1.5, "fencing at {fence:.1} s, only after the reboot (made at {reboot:.1} s) failed");
    Ok(())
}

/// A node Lease held by maintenance holds the Node's remediation in both worlds until it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lease_held_by_maintenance_holds_the_remediation_in_both_worlds() -> Result<()> {
    let remediator = twin(HELD_BY_MAINTENANCE).await?;
    let made = remediator.seen.get("SelfNodeRemediation/medik8s/w1").copied().context("w1's object made")?;
    ensure!(made >= 7.5, "w1's object made at {made:.1} s, while the maintenance Lease (deleted at 8 s) held it");
    Ok(())
}

/// Overlapping checks hand a target over the same way in both worlds: the MachineHealthCheck's
/// object comes only after the NodeHealthCheck gave its reboot up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_checks_hand_a_target_over_alike_in_both_worlds() -> Result<()> {
    let remediator = twin(OVERLAP).await?;
    let nhc = remediator.seen.get("SelfNodeRemediation/medik8s/m1").copied().context("the NodeHealthCheck's reboot")?;
    let mhc = remediator.seen.get("SelfNodeRemediation/default/m1").copied().context("the MachineHealthCheck's")?;
    ensure!(
        mhc > nhc + 2.5,
        "the MachineHealthCheck's object at {mhc:.1} s, the reboot (made at {nhc:.1} s) failed at +3 s"
    );
    Ok(())
}

/// The upgrade pause holds a new remediation in both worlds until the upgrade ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_pause_holds_a_remediation_in_both_worlds() -> Result<()> {
    let remediator = twin(UPGRADE).await?;
    let made = remediator.seen.get("SelfNodeRemediation/medik8s/w1").copied().context("w1's object made")?;
    ensure!(made >= 7.5, "w1's object made at {made:.1} s, while the cluster upgraded (until 8 s)");
    Ok(())
}

/// A MachineHealthCheck of a workload cluster reads that cluster's Nodes in both worlds: m1 is
/// remediated, m2 waits for m1 under `maxUnhealthy: 1`, and is remediated once m1 is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_clusters_machine_health_check_is_the_same_in_both_worlds() -> Result<()> {
    let remediator = twin(WORKLOAD).await?;
    let first = remediator.seen.get("SelfNodeRemediation/default/m1").copied().context("m1's object made")?;
    let second = remediator.seen.get("SelfNodeRemediation/default/m2").copied().context("m2's object made")?;
    ensure!(second >= first + 2.5, "m2's object at {second:.1} s, before m1 (object at {first:.1} s) was back");
    Ok(())
}

/// `second`'s object was made only after `first`'s was let go, live (`namespace/name`).
fn held_until_gone(remediator: &Remediator, first: &str, second: &str) -> Result<()> {
    let first = format!("SelfNodeRemediation/{first}");
    let second = format!("SelfNodeRemediation/{second}");
    let gone = remediator.let_go.get(&first).copied().context("the first object let go")?;
    let made = remediator.seen.get(&second).copied().context("the second object made")?;
    ensure!(made >= gone, "{second}'s object seen at {made:.1} s, {first}'s let go only at {gone:.1} s");
    Ok(())
}
