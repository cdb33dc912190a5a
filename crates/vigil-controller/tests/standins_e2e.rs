//! The controller with medik8s-like remediators at work, on a real API server: vigil-testenv's
//! stand-ins (reboot-like, fence-like, deletion-like, node maintenance; `vigil_testenv::standins`)
//! act on the objects Vigil makes as the real ones do, and OpenShift's own ClusterVersion and
//! Machine CRDs are installed from the `github.com/openshift/api` module. Each test is a story of
//! a few seconds: the remediation object's whole contract, field by field; escalation on
//! `Succeeded=False` within a second; a deleted Node's object kept while its remediator expects the
//! Node gone; a Node under planned maintenance; the cluster upgrade pause.

mod support;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::*;
use vigil_testenv::standins::{self, fence, maintenance, reboot, replace};
use vigil_testenv::{TestEnv, wait_for};

const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";
const MDR_API: &str = "machine-deletion-remediation.medik8s.io/v1alpha1";
const MACHINE_API: &str = "machine.openshift.io/v1beta1";
const LEASES: &str = "medik8s-leases";
const MACHINES_NS: &str = "openshift-machine-api";

/// An API server with Vigil's, the upstream, OpenShift's and the stand-ins' CRDs.
async fn standin_env() -> Result<TestEnv> {
    let env = env().await?;
    env.install_openshift_crds().await?;
    env.install_standin_crds().await?;
    Ok(env)
}

async fn list(env: &TestEnv, api_version: &str, kind: &str, ns: &str) -> Result<Vec<Value>> {
    env.list_json(api_version, kind, Some(ns), "").await
}

async fn object_for(env: &TestEnv, api_version: &str, kind: &str, node: &str) -> Result<Option<Value>> {
    Ok(for_node(&list(env, api_version, kind, MEDIK8S).await?, node).first().map(|o| (*o).clone()))
}

fn condition_of(o: &Value, type_: &str) -> Option<(String, String)> {
    condition(o, type_).map(|c| (c["status"].as_str().unwrap_or("").into(), c["reason"].as_str().unwrap_or("").into()))
}

fn template(api_version: &str, kind: &str, name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns},
           "spec": {"template": {"spec": spec}}})
}

fn step(api_version: &str, kind: &str, name: &str, order: u32, timeout: &str) -> Value {
    json!({"remediationTemplate": {"apiVersion": api_version, "kind": kind, "name": name, "namespace": MEDIK8S},
           "order": order, "timeout": timeout})
}

/// An OpenShift Machine in `ns`, controlled by MachineSet `workers`.
fn openshift_machine(ns: &str, name: &str) -> Value {
    json!({"apiVersion": MACHINE_API, "kind": "Machine", "metadata": {"name": name, "namespace": ns,
        "ownerReferences": [{"apiVersion": MACHINE_API, "kind": "MachineSet", "name": "workers",
                             "uid": "3f1a2b4c-0000-4000-8000-00000000abcd", "controller": true}]}})
}

async fn events(env: &TestEnv) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    Ok(api.list(&Default::default()).await?.items)
}

/// What the remediation objects, w1 and the check look like, for a failure's post-mortem.
async fn dump(env: &TestEnv) -> String {
    let mut out = String::new();
    for (api, kind) in [
        (reboot::API_VERSION, "SelfNodeRemediation"),
        (FAR_API, "FenceAgentsRemediation"),
        (MDR_API, "MachineDeletionRemediation"),
    ] {
        if let Ok(l) = list(env, api, kind, MEDIK8S).await {
            out.push_str(&format!("{kind}: {}\n", Value::Array(l)));
        }
    }
    if let Ok(n) = get(env, "v1", "Node", None, "w1").await {
        out.push_str(&format!(
            "w1: {}\n",
            n.map(|n| json!({"spec": n["spec"], "metadata": n["metadata"]["annotations"]})).unwrap_or_default()
        ));
    }
    if let Ok(s) = check_status(env, "NodeHealthCheck", "workers").await {
        out.push_str(&format!("status: {s}\n"));
    }
    out
}

async fn taint_keys(env: &TestEnv, node: &str) -> Result<Vec<String>> {
    Ok(standins::taints(&env.client(), node).await?)
}

/// A control-plane worker fails: its object carries medik8s' whole contract (checked field by
/// field), the reboot-like stand-in takes it (finalizer, taints, phases) and reports success, the
/// Node comes back, Vigil deletes the object and the stand-in lets it go with its taints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_gets_the_whole_contract_and_the_reboot_like_stand_in_remediates_it() -> Result<()> {
    let env = standin_env().await?;
    workers(&env, 3).await?;
    // w1 is a control-plane Node too, with an OpenShift Machine in the template's namespace.
    env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1",
        "labels": {"role": "worker", "node-role.kubernetes.io/control-plane": ""},
        "annotations": {"machine.openshift.io/machine": format!("{MEDIK8S}/m-w1")}}}))
        .await?;
    let machine = env.apply(openshift_machine(MEDIK8S, "m-w1")).await?;
    let machine_uid = machine.metadata.uid.clone().context("machine uid")?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    nhc(&env, "workers", json!({"minHealthy": 2, "remediationTemplate": reboot_ref("reboot")})).await?;
    let check = get(&env, "vigil.dev/v1alpha1", "NodeHealthCheck", None, "workers").await?.context("check")?;
    let check_uid = check["metadata"]["uid"].as_str().context("check uid")?.to_string();
    let settings = reboot::RebootSettings {
        assumed_rebooted_after: Duration::from_secs(3),
        release_after_delete: Duration::from_secs(1),
        ..Default::default()
    };
    let _reboot = reboot::start(&env.client(), settings);
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let object = wait_for("w1's object", WAIT, || async {
        object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await
    })
    .await?;
    // The contract, field by field.
    assert_eq!(object["apiVersion"], reboot::API_VERSION);
    assert_eq!(object["kind"], "SelfNodeRemediation", "the template's kind minus Template");
    assert_eq!(object["metadata"]["namespace"], MEDIK8S, "the template's namespace");
    assert_eq!(object["metadata"]["name"], "w1", "named after the Node");
    assert_eq!(object["metadata"]["annotations"]["remediation.medik8s.io/node-name"], "w1");
    assert_eq!(object["metadata"]["annotations"]["remediation.medik8s.io/template-name"], "reboot");
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app.kubernetes.io/part-of": "node-healthcheck-controller", "remediation.medik8s.io/isControlPlaneNode": ""})
    );
    assert_eq!(
        object["metadata"]["ownerReferences"],
        json!([
            {"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "name": "workers", "uid": check_uid,
             "controller": false, "blockOwnerDeletion": false},
            {"apiVersion": MACHINE_API, "kind": "Machine", "name": "m-w1", "uid": machine_uid, "controller": false},
        ])
    );
    assert_eq!(object["spec"], json!({"remediationStrategy": "Automatic"}), "spec.template.spec of the template");
    // The stand-in takes it, then reports success once the Node is assumed rebooted.
    let done = wait_for("w1 remediated", WAIT, || async {
        let o = object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await?;
        Ok(o.filter(|o| condition_of(o, "Succeeded").is_some_and(|(s, _)| s == "True")))
    })
    .await?;
    assert_eq!(done["metadata"]["finalizers"], json!([reboot::FINALIZER]));
    assert_eq!(done["status"]["phase"], "Fencing-Completed");
    assert!(done["status"]["timeAssumedRebooted"].is_string(), "{done}");
    assert_eq!(condition_of(&done, "Processing"), Some(("False".into(), "RemediationFinishedSuccessfully".into())));
    let tainted = taint_keys(&env, "w1").await?;
    assert!(tainted.contains(&reboot::NO_SCHEDULE_TAINT.to_string()), "{tainted:?}");
    assert!(tainted.contains(&standins::OUT_OF_SERVICE_TAINT.to_string()), "{tainted:?}");
    // The created Event names the object it is about.
    let told = events(&env).await?.into_iter().any(|e| {
        e.reason.as_deref() == Some("RemediationCreated")
            && e.related
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("SelfNodeRemediation") && r.name.as_deref() == Some("w1"))
    });
    assert!(told, "a RemediationCreated event about SelfNodeRemediation medik8s/w1");
    // The Node is back: the object is deleted, and gone once the stand-in lets it go.
    set_ready(&env, "w1", "True", &secs_ago(0)).await?;
    let cleaned = wait_for("w1's object gone and its taints off", WAIT, || async {
        let gone = object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await?.is_none();
        // (the API server's own not-ready taint stays: no node lifecycle controller runs here)
        let left = taint_keys(&env, "w1").await?;
        let untainted =
            [reboot::NO_SCHEDULE_TAINT, standins::OUT_OF_SERVICE_TAINT].iter().all(|t| !left.iter().any(|k| k == t));
        Ok((gone && untainted).then_some(()))
    })
    .await;
    if cleaned.is_err() {
        eprintln!("{}", dump(&env).await);
    }
    cleaned?;
    // The check's next decision, after the object's removal, lists the Node no more.
    wait_for("w1 off the check's status", WAIT, || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        Ok((s["unhealthyNodes"].as_array().map_or(0, Vec::len) == 0).then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// Three workers under the check `workers`, which fences first (10 minutes), then reboots.
async fn fence_then_reboot(env: &TestEnv) -> Result<()> {
    workers(env, 3).await?;
    env.apply(template(FAR_API, "FenceAgentsRemediationTemplate", "fence", MEDIK8S, json!({"agent": "fence_ipmilan"})))
        .await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    nhc(
        env,
        "workers",
        json!({"minHealthy": 2, "escalatingRemediations": [
            step(FAR_API, "FenceAgentsRemediationTemplate", "fence", 1, "10m"),
            step(reboot::API_VERSION, "SelfNodeRemediationTemplate", "reboot", 2, "10m")]}),
    )
    .await?;
    Ok(())
}

/// Fencing first, then a reboot: the fence agent fails, the stand-in reports `Succeeded=False`
/// and Vigil moves on within a second (not at the step's 10-minute timeout); the fencing object
/// keeps `nhc-timed-out`, written before the reboot object was made, and each object has its own
/// RemediationCreated event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_moves_on_within_a_second_of_succeeded_false() -> Result<()> {
    let env = standin_env().await?;
    fence_then_reboot(&env).await?;
    let settings = fence::FenceSettings { agent: fence::Agent::Fails, retries: 1, ..Default::default() };
    let fence = fence::start(&env.client(), settings);
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let reboot_seen = wait_for("the reboot step", WAIT, || async {
        let o = object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await?;
        Ok(o.map(|o| (o, Instant::now())))
    })
    .await?;
    let failed = fence.failed_at(&format!("{MEDIK8S}/w1")).context("the fence-like stand-in failed w1's object")?;
    let after = reboot_seen.1.saturating_duration_since(failed);
    eprintln!("from Succeeded=False to the next step's object: {after:?}");
    assert!(after < Duration::from_secs(1), "the next step came {after:?} after Succeeded=False");
    let fenced = object_for(&env, FAR_API, "FenceAgentsRemediation", "w1").await?.context("the first object stays")?;
    assert_eq!(condition_of(&fenced, "Succeeded"), Some(("False".into(), "FenceAgentFailed".into())));
    assert_eq!(condition_of(&fenced, "FenceAgentActionSucceeded"), Some(("False".into(), "FenceAgentFailed".into())));
    let timed_out = fenced["metadata"]["annotations"]["remediation.medik8s.io/nhc-timed-out"]
        .as_str()
        .context("the first object keeps nhc-timed-out")?;
    let timed_out: jiff::Timestamp = timed_out.parse()?;
    let created: jiff::Timestamp =
        reboot_seen.0["metadata"]["creationTimestamp"].as_str().context("creationTimestamp")?.parse()?;
    assert!(timed_out.as_second() <= created.as_second(), "annotated at {timed_out}, next step made at {created}");
    // Still there a while later, still annotated; never two steps given up on at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fenced = object_for(&env, FAR_API, "FenceAgentsRemediation", "w1").await?.context("kept")?;
    assert!(fenced["metadata"]["annotations"]["remediation.medik8s.io/nhc-timed-out"].is_string());
    let entry = check_status(&env, "NodeHealthCheck", "workers").await?["unhealthyNodes"][0].clone();
    let records: Vec<(&str, bool)> = entry["remediations"]
        .as_array()
        .context("records")?
        .iter()
        .map(|r| (r["resource"]["kind"].as_str().unwrap_or(""), r.get("timedOut").is_some()))
        .collect();
    assert_eq!(records, [("FenceAgentsRemediation", true), ("SelfNodeRemediation", false)], "{entry}");
    // One RemediationCreated event per object, each naming its own.
    let created_about: Vec<String> = events(&env)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RemediationCreated"))
        .filter_map(|e| e.related.and_then(|r| r.kind))
        .collect();
    for kind in ["FenceAgentsRemediation", "SelfNodeRemediation"] {
        assert!(
            created_about.iter().any(|k| k == kind),
            "no RemediationCreated event about the {kind}: {created_about:?}"
        );
    }
    // The step given up is told about its object too.
    wait_for("a RemediationTimedOut event about the fencing object", WAIT, || async {
        Ok(events(&env).await?.into_iter().find(|e| {
            e.reason.as_deref() == Some("RemediationTimedOut")
                && e.related.as_ref().and_then(|r| r.kind.as_deref()) == Some("FenceAgentsRemediation")
        }))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// The deletion-like stand-in deletes w1's OpenShift Machine and expects the Node gone for good
/// (`PermanentNodeDeletionExpected=True`); the Node is deleted (as the machine controller would):
/// its object stays until the replacement Machine appears and the stand-in reports success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodes_deletion_like_object_is_kept_while_permanent_deletion_is_expected() -> Result<()> {
    let env = standin_env().await?;
    workers(&env, 3).await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1", "labels": {"role": "worker"},
        "annotations": {"machine.openshift.io/machine": format!("{MACHINES_NS}/m-w1")}}}))
        .await?;
    env.apply(openshift_machine(MACHINES_NS, "m-w1")).await?;
    env.apply(template(MDR_API, "MachineDeletionRemediationTemplate", "replace", MEDIK8S, json!({}))).await?;
    let replace_ref = json!({"apiVersion": MDR_API, "kind": "MachineDeletionRemediationTemplate", "name": "replace", "namespace": MEDIK8S});
    nhc(&env, "workers", json!({"minHealthy": 2, "remediationTemplate": replace_ref})).await?;
    let _replace = replace::start(&env.client(), replace::ReplaceSettings::default());
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let object = wait_for("w1's Machine deleted", WAIT, || async {
        let o = object_for(&env, MDR_API, "MachineDeletionRemediation", "w1").await?;
        Ok(o.filter(|o| condition_of(o, "PermanentNodeDeletionExpected").is_some_and(|(s, _)| s == "True")))
    })
    .await;
    if object.is_err() {
        eprintln!("{}", dump(&env).await);
    }
    let object = object?;
    assert_eq!(object["metadata"]["name"], "w1", "found by its name");
    assert!(object["metadata"].get("finalizers").is_none(), "no finalizer");
    assert_eq!(condition_of(&object, "Succeeded"), Some(("Unknown".into(), "MachineDeleted".into())));
    assert!(get(&env, MACHINE_API, "Machine", Some(MACHINES_NS), "m-w1").await?.is_none(), "deleted at once");
    assert_eq!(
        object["metadata"]["ownerReferences"].as_array().map(Vec::len),
        Some(1),
        "the Machine is in another namespace: it cannot own the object"
    );
    // The machine controller deletes the Node.
    env.delete("v1", "Node", None, "w1").await?;
    stays("w1's object deleted while its Node is expected gone for good", Duration::from_secs(4), || async {
        Ok(object_for(&env, MDR_API, "MachineDeletionRemediation", "w1").await?.is_none())
    })
    .await?;
    // The replacement appears: success, and only then is the object deleted.
    env.apply(openshift_machine(MACHINES_NS, "m-w4")).await?;
    wait_for("w1's object deleted once it succeeded", WAIT, || async {
        Ok(object_for(&env, MDR_API, "MachineDeletionRemediation", "w1").await?.is_none().then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// A NodeMaintenance for w1: the maintenance stand-in takes w1's Lease and cordons it; w1 goes
/// NotReady (powered off for the maintenance) and is never remediated; the maintenance ends with
/// w1 still down: remediated under the check's own Lease, which the maintenance operator cannot
/// take then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_maintenance_is_never_remediated_and_is_once_released() -> Result<()> {
    let env = standin_env().await?;
    workers(&env, 4).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    // A short grace after the maintenance, so the test stays short.
    let spec =
        json!({"minHealthy": 2, "remediationTemplate": reboot_ref("reboot"), "plannedMaintenance": {"grace": "1s"}});
    nhc(&env, "workers", spec).await?;
    let _maintenance = maintenance::start(&env.client(), maintenance::MaintenanceSettings::default());
    let controller = Controller::start(&env);
    wait_for("the lease namespace", WAIT, || async { get(&env, "v1", "Namespace", None, LEASES).await }).await?;
    let nm = |name: &str| {
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
               "metadata": {"name": name}, "spec": {"nodeName": "w1", "reason": "kernel update"}})
    };
    env.apply(nm("w1-kernel")).await?;
    wait_for("w1 cordoned under the maintenance operator's Lease", WAIT, || async {
        let lease = get(&env, "coordination.k8s.io/v1", "Lease", Some(LEASES), "node-w1").await?;
        let node = get(&env, "v1", "Node", None, "w1").await?;
        let held = lease.is_some_and(|l| l["spec"]["holderIdentity"] == maintenance::HOLDER);
        Ok((held && node.is_some_and(|n| n["spec"]["unschedulable"] == true)).then_some(()))
    })
    .await?;
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let entry = wait_for("w1 waiting", WAIT, || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        Ok(s["unhealthyNodes"]
            .as_array()
            .and_then(|l| l.iter().find(|u| u["name"] == "w1" && u.get("waiting").is_some()).cloned()))
    })
    .await?;
    let message = entry["waiting"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("node-maintenance") || message.contains("maintenance"), "{message}");
    stays("w1 remediated under maintenance", Duration::from_secs(4), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty())
    })
    .await?;
    // The maintenance ends with w1 still down.
    env.delete("nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance", None, "w1-kernel").await?;
    wait_for("w1 remediated once the maintenance ended", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    let lease = get(&env, "coordination.k8s.io/v1", "Lease", Some(LEASES), "node-w1").await?.context("Lease")?;
    assert_eq!(lease["spec"]["holderIdentity"], "NodeHealthCheck-workers");
    let node = get(&env, "v1", "Node", None, "w1").await?.context("w1")?;
    assert_ne!(node["spec"]["unschedulable"], true, "given back");
    // A new maintenance cannot take the Lease the check holds.
    env.apply(nm("w1-again")).await?;
    let refused = wait_for("the maintenance refused the check's Lease", WAIT, || async {
        let o = get(&env, "nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance", None, "w1-again").await?;
        Ok(o.filter(|o| o["status"]["phase"] == "Running"))
    })
    .await?;
    assert_eq!(refused["status"]["lastError"], "node lease is held by NodeHealthCheck-workers");
    let node = get(&env, "v1", "Node", None, "w1").await?.context("w1")?;
    assert_ne!(node["spec"]["unschedulable"], true, "not cordoned");
    controller.stop().await;
    Ok(())
}

fn cluster_version(progressing: &str, version: &str) -> Value {
    let at = secs_ago(0);
    json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion", "metadata": {"name": "version"},
        "status": {"desired": {"version": version, "image": format!("quay.io/openshift-release-dev/ocp-release:{version}")},
                   "observedGeneration": 1, "versionHash": "h", "availableUpdates": [],
                   "conditions": [{"type": "Progressing", "status": progressing, "lastTransitionTime": at,
                                   "message": format!("Working towards {version}")}]}})
}

/// Sets w1's machine-config annotations (the operator's signal of a Node being upgraded).
async fn machine_configs(env: &TestEnv, current: &str, desired: &str) -> Result<()> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.client());
    let patch = json!({"metadata": {"annotations": {
        "machineconfiguration.openshift.io/currentConfig": current,
        "machineconfiguration.openshift.io/desiredConfig": desired}}});
    nodes.patch("w1", &Default::default(), &kube::api::Patch::Merge(&patch)).await?;
    Ok(())
}

/// The postponement Events of the check, as (name, note): each its own Event.
async fn postponement_events(env: &TestEnv) -> Result<Vec<(String, String)>> {
    Ok(events(env)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RemediationSkipped"))
        .filter_map(|e| Some((e.metadata.name?, e.note?)))
        .filter(|(_, note)| note.starts_with("Postponing potential remediations"))
        .collect())
}

/// Waits for a postponement Event whose note starts with `cause`; its name.
async fn wait_postponement(env: &TestEnv, cause: &str) -> Result<String> {
    wait_for(&format!("a postponement Event saying {cause:?}"), WAIT, || async {
        Ok(postponement_events(env).await?.into_iter().find(|(_, n)| n.starts_with(cause)).map(|(name, _)| name))
    })
    .await
}

/// OpenShift's own ClusterVersion CRD: while `Progressing=True`, nothing new is remediated and the
/// status and an Event say why; when the cause changes (a second upgrade, then a Node's machine
/// config), a new Event names the new cause; once nothing postpones, the Node is remediated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_new_is_remediated_while_the_cluster_upgrades() -> Result<()> {
    const UPGRADING: &str = "Postponing potential remediations because of ongoing cluster upgrade: ";
    let env = standin_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    env.apply(
        json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion", "metadata": {"name": "version"},
                     "spec": {"clusterID": "5b2d2c11-0000-4000-8000-000000000001"}}),
    )
    .await?;
    env.apply_status(cluster_version("True", "4.19.1")).await?;
    nhc(&env, "workers", json!({"minHealthy": 2, "remediationTemplate": reboot_ref("reboot")})).await?;
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let s =
        wait_check_condition(&env, "NodeHealthCheck", "workers", "RemediationPostponed", "True", "ClusterUpgrading")
            .await?;
    let message = s["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "RemediationPostponed"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with(&format!("{UPGRADING}ClusterVersion version is Progressing=True to 4.19.1")),
        "{message}"
    );
    stays("w1 remediated during the upgrade", Duration::from_secs(4), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty())
    })
    .await?;
    let first =
        wait_postponement(&env, &format!("{UPGRADING}ClusterVersion version is Progressing=True to 4.19.1")).await?;

    // The cause changes twice: another version, then a Node's machine config.
    env.apply_status(cluster_version("True", "4.19.2")).await?;
    let second =
        wait_postponement(&env, &format!("{UPGRADING}ClusterVersion version is Progressing=True to 4.19.2")).await?;
    machine_configs(&env, "rendered-worker-a", "rendered-worker-b").await?;
    env.apply_status(cluster_version("False", "4.19.2")).await?;
    let third = wait_postponement(
        &env,
        &format!("{UPGRADING}Node w1 moves from machine config rendered-worker-a to rendered-worker-b"),
    )
    .await?;
    let names: std::collections::BTreeSet<_> = [&first, &second, &third].into_iter().collect();
    assert_eq!(names.len(), 3, "each cause its own Event: {:?}", postponement_events(&env).await?);
    stays("w1 remediated while its machine config moves", Duration::from_secs(3), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty())
    })
    .await?;
    // The first Event still says what it said: no later report rewrote it.
    let notes = postponement_events(&env).await?;
    assert!(
        notes.iter().any(|(n, note)| *n == first && note.contains("to 4.19.1")),
        "the first Event keeps its cause: {notes:?}"
    );

    // The upgrade is over: w1 is remediated.
    machine_configs(&env, "rendered-worker-b", "rendered-worker-b").await?;
    wait_for("w1 remediated after the upgrade", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    wait_check_condition(&env, "NodeHealthCheck", "workers", "RemediationPostponed", "False", "NotPostponed").await?;
    controller.stop().await;
    Ok(())
}

/// A ValidatingAdmissionPolicy refusing the `nhc-timed-out` annotation on FenceAgentsRemediations.
fn refuse_timed_out_annotation() -> [Value; 2] {
    [
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "no-timed-out"},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{"apiGroups": ["fence-agents-remediation.medik8s.io"],
                         "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["fenceagentsremediations"]}]},
                     "validations": [{"expression": "!has(object.metadata.annotations) || !('remediation.medik8s.io/nhc-timed-out' in object.metadata.annotations)",
                                      "message": "the test refuses nhc-timed-out"}]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "no-timed-out"},
            "spec": {"policyName": "no-timed-out", "validationActions": ["Deny"]}}),
    ]
}

/// The fence agent fails, but the API server refuses the fencing object's `nhc-timed-out`
/// annotation: the reboot object is not made (two steps would be live at once) for as long as
/// the annotation cannot be written, and is made once it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_step_waits_while_the_previous_ones_annotation_is_refused() -> Result<()> {
    let env = standin_env().await?;
    fence_then_reboot(&env).await?;
    let [policy, binding] = refuse_timed_out_annotation();
    env.apply(policy).await?;
    env.apply(binding).await?;
    let settings = fence::FenceSettings { agent: fence::Agent::Fails, retries: 0, ..Default::default() };
    let fence = fence::start(&env.client(), settings);
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    wait_for("the fencing object failed", WAIT, || async { Ok(fence.failed_at(&format!("{MEDIK8S}/w1")).map(|_| ())) })
        .await?;
    // The policy takes a moment to be enforced: the annotation must not have made it.
    let fenced = object_for(&env, FAR_API, "FenceAgentsRemediation", "w1").await?.context("the fencing object")?;
    if fenced["metadata"]["annotations"].get("remediation.medik8s.io/nhc-timed-out").is_some() {
        anyhow::bail!("the admission policy was not enforced yet; the test cannot tell anything");
    }
    stays("the reboot object made while the fencing object is not annotated", Duration::from_secs(4), || async {
        Ok(object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await?.is_some())
    })
    .await?;
    env.delete("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", None, "no-timed-out").await?;
    wait_for("the reboot object once the annotation is written", WAIT, || async {
        let fenced = object_for(&env, FAR_API, "FenceAgentsRemediation", "w1").await?;
        let annotated =
            fenced.is_some_and(|f| f["metadata"]["annotations"].get("remediation.medik8s.io/nhc-timed-out").is_some());
        let next = object_for(&env, reboot::API_VERSION, "SelfNodeRemediation", "w1").await?;
        Ok((annotated && next.is_some()).then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}
