//! The controller beside medik8s' remediators and maintenance, on a real API server: a
//! remediation object its remediator still holds (finalizer) keeps its Node (or Machine) counted
//! until it is gone, and a Node whose medik8s node Lease another holder has is never remediated, then is once
//! the Lease is released, under this check's own Lease.

mod support;

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde_json::{Value, json};
use std::time::Duration;
use support::*;
use vigil_testenv::{TestEnv, wait_for};

const LEASES: &str = "medik8s-leases";

async fn lease(env: &TestEnv, node: &str) -> Result<Option<Value>> {
    get(env, "coordination.k8s.io/v1", "Lease", Some(LEASES), &format!("node-{node}")).await
}

async fn unhealthy_entry(env: &TestEnv, node: &str) -> Result<Option<Value>> {
    let s = check_status(env, "NodeHealthCheck", "workers").await?;
    Ok(s["unhealthyNodes"].as_array().and_then(|l| l.iter().find(|u| u["name"] == node).cloned()))
}

/// The remediator's finalizer on `node`'s object (as self node remediation puts its own).
async fn hold(env: &TestEnv, node: &str, finalizers: Value) -> Result<()> {
    let mut o = list_snr(env, MEDIK8S)
        .await?
        .into_iter()
        .find(|o| o["metadata"]["annotations"]["remediation.medik8s.io/node-name"] == node)
        .with_context(|| format!("no object for {node}"))?;
    o["metadata"]["finalizers"] = finalizers;
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    env.apply(o).await?;
    Ok(())
}

/// Minimum 3 healthy of 4: one Node at a time may be remediated. w1 was rebooted and is back;
/// Vigil deletes its object, which the remediator keeps (finalizer) while it finishes. w2 fails
/// meanwhile: remediating it would leave 2 of 4 healthy, so it waits until w1's object is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_its_remediator_still_holds_keeps_its_node_counted_until_it_is_gone() -> Result<()> {
    let env = env().await?;
    workers(&env, 4).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    nhc(&env, "workers", json!({"minHealthy": 3, "remediationTemplate": reboot_ref("reboot")})).await?;
    let controller = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    wait_for("w1's object", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    hold(&env, "w1", json!(["self-node-remediation.medik8s.io/snr-finalizer"])).await?;
    set_ready(&env, "w1", "True", &secs_ago(0)).await?;
    // Deleted by Vigil, held by the remediator.
    wait_for("w1's object being deleted", WAIT, || async {
        let all = list_snr(&env, MEDIK8S).await?;
        Ok(for_node(&all, "w1").first().and_then(|o| o["metadata"].get("deletionTimestamp")).map(|_| ()))
    })
    .await?;
    let entry = wait_for("w1 listed, waiting for its remediator", WAIT, || async {
        Ok(unhealthy_entry(&env, "w1").await?.filter(|e| e["waiting"]["reason"] == "RemediatorFinishing"))
    })
    .await?;
    let message = entry["waiting"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("SelfNodeRemediation medik8s/w1 is being deleted"), "{message}");
    assert_eq!(check_status(&env, "NodeHealthCheck", "workers").await?["healthyNodes"], 3);
    // w2 fails: 2 of 4 healthy while w1's object exists.
    set_ready(&env, "w2", "False", &secs_ago(60)).await?;
    stays("w2 remediated while w1's object is still being deleted", Duration::from_secs(5), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w2").is_empty())
    })
    .await?;
    let s = check_status(&env, "NodeHealthCheck", "workers").await?;
    assert_eq!(s["healthyNodes"], 2, "{s}");
    // The remediator finishes: w1's object goes, w1 is healthy, w2 is remediated.
    hold(&env, "w1", json!([])).await?;
    wait_for("w2's object once w1's is gone", WAIT, || async {
        let all = list_snr(&env, MEDIK8S).await?;
        Ok((for_node(&all, "w1").is_empty() && !for_node(&all, "w2").is_empty()).then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// The remediator's finalizer on Machine `machine`'s object (named after the Machine) in `ns`.
async fn hold_machine_object(env: &TestEnv, ns: &str, machine: &str, finalizers: Value) -> Result<()> {
    let mut o = list_snr(env, ns)
        .await?
        .into_iter()
        .find(|o| o["metadata"]["name"] == machine)
        .with_context(|| format!("no object for {machine}"))?;
    o["metadata"]["finalizers"] = finalizers;
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    env.apply(o).await?;
    Ok(())
}

fn named(objects: &[Value], name: &str) -> Option<Value> {
    objects.iter().find(|o| o["metadata"]["name"] == name).cloned()
}

/// The same for a MachineHealthCheck with an external template and `maxUnhealthy: 1` over four
/// Machines: m1 recovers and its object, deleted, is held by the remediator; m2 fails meanwhile.
/// Until m1's object is gone m1 does not count healthy, so m2 (two of four) waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machines_object_its_remediator_still_holds_keeps_the_machine_counted_until_it_is_gone() -> Result<()> {
    let env = env().await?;
    healthy_fleet(&env, 4).await?;
    env.apply(snr_template("reboot", NS, false)).await?;
    let template = json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "reboot"});
    mhc(&env, "workers", json!({"remediationTemplate": template, "maxUnhealthy": 1})).await?;
    let controller = Controller::start(&env);
    set_ready(&env, "n1", "False", &secs_ago(60)).await?;
    wait_for("m1's object", WAIT, || async { Ok(named(&list_snr(&env, NS).await?, "m1").map(|_| ())) }).await?;
    hold_machine_object(&env, NS, "m1", json!(["self-node-remediation.medik8s.io/snr-finalizer"])).await?;
    set_ready(&env, "n1", "True", &secs_ago(0)).await?;
    wait_for("m1's object being deleted", WAIT, || async {
        Ok(named(&list_snr(&env, NS).await?, "m1").and_then(|o| o["metadata"].get("deletionTimestamp").map(|_| ())))
    })
    .await?;
    wait_for("m1 not counted healthy while its object is held", WAIT, || async {
        Ok((check_status(&env, "MachineHealthCheck", "workers").await?["currentHealthy"] == 3).then_some(()))
    })
    .await?;
    set_ready(&env, "n2", "False", &secs_ago(60)).await?;
    wait_machine_condition(&env, "m2", "HealthCheckSucceeded", "False", "UnhealthyNode").await?;
    stays("m2 remediated while m1's object is still being deleted", Duration::from_secs(5), || async {
        Ok(named(&list_snr(&env, NS).await?, "m2").is_some())
    })
    .await?;
    let s = check_status(&env, "MachineHealthCheck", "workers").await?;
    assert_eq!(s["currentHealthy"], 2, "{s}");
    // The remediator finishes: m1's object goes, m1 counts healthy, m2 is remediated.
    hold_machine_object(&env, NS, "m1", json!([])).await?;
    wait_for("m2's object once m1's is gone", WAIT, || async {
        let all = list_snr(&env, NS).await?;
        Ok((named(&all, "m1").is_none() && named(&all, "m2").is_some()).then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// A Lease `holder` holds on `node` from now for an hour (the node maintenance operator takes
/// 3 600 s before it drains a Node).
fn foreign_lease(node: &str, holder: &str, uid: &str) -> Value {
    let now = Timestamp::now();
    let micro = format!("{}.000000Z", jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S", now).unwrap_or_default());
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": format!("node-{node}"), "namespace": LEASES,
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600, "acquireTime": micro, "renewTime": micro}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_the_maintenance_operator_holds_is_never_remediated() -> Result<()> {
    let env = env().await?;
    workers(&env, 4).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    nhc(&env, "workers", json!({"minHealthy": 2, "remediationTemplate": reboot_ref("reboot")})).await?;
    let controller = Controller::start(&env);
    // Vigil makes the lease namespace when it is missing.
    wait_for("the lease namespace", WAIT, || async { get(&env, "v1", "Namespace", None, LEASES).await }).await?;
    let w1 = get(&env, "v1", "Node", None, "w1").await?.context("w1")?;
    let uid = w1["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    env.apply(foreign_lease("w1", "node-maintenance", &uid)).await?;
    // An administrator powers w1 off for maintenance.
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let entry = wait_for("w1 waiting for the maintenance operator's Lease", WAIT, || async {
        Ok(unhealthy_entry(&env, "w1").await?.filter(|e| e["waiting"]["reason"] == "NodeLeaseHeld"))
    })
    .await?;
    let message = entry["waiting"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Lease medik8s-leases/node-w1 is held by node-maintenance"), "{message}");
    stays("w1 remediated under maintenance", Duration::from_secs(5), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty())
    })
    .await?;
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    let told = events.list(&Default::default()).await?.items.into_iter().any(|e| {
        e.reason.as_deref() == Some("RemediationSkipped")
            && e.note
                .as_deref()
                .is_some_and(|n| n.contains("node lease is already taken") && n.contains("node-maintenance"))
    });
    assert!(told, "a RemediationSkipped event names the Lease's holder");
    let held = lease(&env, "w1").await?.context("the Lease")?;
    assert_eq!(held["spec"]["holderIdentity"], "node-maintenance", "never taken from its holder");
    // The maintenance ends with w1 still down: remediated, under the check's own Lease.
    env.delete("coordination.k8s.io/v1", "Lease", Some(LEASES), "node-w1").await?;
    wait_for("w1 remediated once the Lease is released", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    let mine = lease(&env, "w1").await?.context("the check's Lease")?;
    assert_eq!(mine["spec"]["holderIdentity"], "NodeHealthCheck-workers");
    assert_eq!(mine["spec"]["leaseDurationSeconds"], 660, "the default 10m step and a minute");
    assert_eq!(mine["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(mine["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    // w1 comes back: its object goes, and then its Lease.
    set_ready(&env, "w1", "True", &secs_ago(0)).await?;
    wait_for("w1's Lease released", WAIT, || async {
        let gone = for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty() && lease(&env, "w1").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}
