//! End-to-end: `vigil run --serve-medik8s` against a real kube-apiserver with medik8s' own
//! NodeHealthCheck CRD (node-healthcheck-operator v0.12.0): a medik8s check decided in place
//! (status in medik8s' schema, the operator's events, remediation objects owned as the operator
//! owns them, the operator's own objects taken over), an invalid one refused, and the mode
//! refusing to start, or stopping, while the operator's leader Lease is held.

use anyhow::{Context as _, Result};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use std::time::Duration;
use vigil_controller::Options;
use vigil_controller::medik8s::{OPERATOR_LEASE, refuse_to_start};
use vigil_testenv::{TestEnv, wait_for};

mod support;
use support::*;

const API: &str = "remediation.medik8s.io/v1alpha1";
/// Where the operator runs in these tests (OLM's namespace on OpenShift).
const OPERATOR_NS: &str = "openshift-workload-availability";
const HOLDER: &str = "node-healthcheck-controller-manager-6c9f7d9b8-x2x4q_1f0c3c5e";

async fn medik8s_env() -> Result<TestEnv> {
    let env = env().await?;
    env.install_crds(&[vigil_testenv::medik8s_nhc_crd()?]).await?;
    Ok(env)
}

fn serving(env: &TestEnv) -> Controller {
    Controller::start_with(env.client(), Options { workers: 2, serve_medik8s: true, ..Default::default() })
}

/// A medik8s NodeHealthCheck of the workers, as its users write it.
async fn medik8s_nhc(env: &TestEnv, name: &str, extra: Value) -> Result<Value> {
    let mut spec = json!({"selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}],
        "remediationTemplate": reboot_ref("reboot")});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    let o = env
        .apply(json!({"apiVersion": API, "kind": "NodeHealthCheck", "metadata": {"name": name}, "spec": spec}))
        .await?;
    Ok(serde_json::to_value(o)?)
}

async fn medik8s_status(env: &TestEnv, name: &str) -> Result<Value> {
    Ok(get(env, API, "NodeHealthCheck", None, name)
        .await?
        .and_then(|o| o.get("status").cloned())
        .unwrap_or(Value::Null))
}

/// Waits for the medik8s check's `Disabled` condition to have `status` and `reason`.
async fn wait_disabled(env: &TestEnv, name: &str, status: &str, reason: &str) -> Result<Value> {
    wait_for(&format!("medik8s NodeHealthCheck {name} Disabled={status}/{reason}"), WAIT, || async {
        let s = medik8s_status(env, name).await?;
        let hit = s["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| c["type"] == "Disabled" && c["status"] == status && c["reason"] == reason)
        });
        Ok(hit.then_some(s))
    })
    .await
}

/// Events about the medik8s check `name` (as medik8s' kind, not Vigil's), as (type, reason, note).
async fn events_of(env: &TestEnv, name: &str) -> Result<Vec<(String, String, String)>> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.api_version.as_deref() == Some(API)
                    && r.kind.as_deref() == Some("NodeHealthCheck")
                    && r.name.as_deref() == Some(name)
            })
        })
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

async fn wait_event(env: &TestEnv, name: &str, reason: &str) -> Result<(String, String, String)> {
    wait_event_about(env, name, reason, "").await
}

/// Waits for an event of `reason` on the medik8s check `name` whose note contains `about`.
async fn wait_event_about(env: &TestEnv, name: &str, reason: &str, about: &str) -> Result<(String, String, String)> {
    wait_for(&format!("a {reason} event on medik8s NodeHealthCheck {name} about {about:?}"), WAIT, || async {
        Ok(events_of(env, name).await?.into_iter().find(|e| e.1 == reason && e.2.contains(about)))
    })
    .await
}

/// The operator's leader Lease, held by `holder` and renewed at `renewed`.
async fn operator_lease(env: &TestEnv, holder: &str, renewed: Timestamp) -> Result<()> {
    let micro = |t: Timestamp| t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    env.apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": OPERATOR_LEASE, "namespace": OPERATOR_NS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": micro(renewed), "renewTime": micro(renewed)}}))
    .await?;
    Ok(())
}

/// Renews the operator's Lease every second with `renewed()` as its renew time, as a running
/// operator does, until dropped.
fn keep_renewing(env: &TestEnv, renewed: fn() -> Timestamp) -> tokio::task::JoinHandle<()> {
    let client = env.client();
    tokio::spawn(async move {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(client, OPERATOR_NS);
        loop {
            let t = renewed().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
            let patch = json!({"spec": {"renewTime": t}});
            let _ = leases.patch(OPERATOR_LEASE, &Default::default(), &kube::api::Patch::Merge(&patch)).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// A medik8s check is decided in place: the SelfNodeRemediation the operator made before the
/// swap is taken over (no second one for that Node), a new one is owned exactly as the operator
/// owns its objects, the status is medik8s' schema with its reasons (the operator's deprecated
/// field cleared), and the events carry the operator's reasons on the medik8s object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_medik8s_check_is_decided_in_place_and_the_operators_objects_are_taken_over() -> Result<()> {
    let env = medik8s_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    let check = medik8s_nhc(&env, "workers", json!({"minHealthy": 1})).await?;
    let uid = check["metadata"]["uid"].as_str().context("uid")?.to_string();
    // Before the swap: the operator remediates w3 and says so in its status.
    set_ready(&env, "w3", "False", &secs_ago(600)).await?;
    let owner =
        json!({"apiVersion": API, "kind": "NodeHealthCheck", "name": "workers", "uid": uid, "controller": false});
    let theirs = env
        .apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
            "metadata": {"name": "w3", "namespace": MEDIK8S, "ownerReferences": [owner],
                         "labels": {"app.kubernetes.io/part-of": "node-healthcheck-controller"},
                         "annotations": {"remediation.medik8s.io/node-name": "w3", "remediation.medik8s.io/template-name": "reboot"}},
            "spec": {"remediationStrategy": "Automatic"}}))
        .await?;
    let theirs_uid = theirs.metadata.uid.clone().context("uid")?;
    let started = secs_ago(300);
    env.apply_status(json!({"apiVersion": API, "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "status": {"observedNodes": 3, "healthyNodes": 2, "phase": "Remediating", "reason": "NHC is remediating 1 nodes",
            "inFlightRemediations": {"w3": started},
            "unhealthyNodes": [{"name": "w3", "remediations": [{"started": started,
                "resource": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                             "namespace": MEDIK8S, "name": "w3", "uid": theirs_uid}}]}],
            "conditions": [{"type": "Disabled", "status": "False", "reason": "NodeHealthCheckEnabled",
                            "message": "No issues found, NodeHealthCheck is enabled.", "lastTransitionTime": secs_ago(3600)}]}}))
    .await?;

    let controller = serving(&env);
    // Decided by Vigil: its RemediationAllowed condition is in medik8s' condition list.
    let s = wait_for("the status of Vigil's decision", WAIT, || async {
        let s = medik8s_status(&env, "workers").await?;
        let decided = s["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "RemediationAllowed"));
        Ok(decided.then_some(s))
    })
    .await?;
    assert!(s.get("inFlightRemediations").is_none(), "the deprecated field cleared: {s}");
    assert_eq!((s["observedNodes"].as_i64(), s["healthyNodes"].as_i64()), (Some(3), Some(2)), "{s}");
    let w3 =
        s["unhealthyNodes"].as_array().and_then(|ns| ns.iter().find(|n| n["name"] == "w3")).context("w3 listed")?;
    assert_eq!(w3["remediations"][0]["resource"]["uid"], theirs_uid.as_str(), "the operator's object, taken over: {s}");
    assert_eq!(w3["remediations"][0]["started"], started.as_str(), "its start kept: {s}");
    let disabled =
        s["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Disabled")).context("Disabled")?;
    assert_eq!(
        (disabled["status"].as_str(), disabled["reason"].as_str()),
        (Some("False"), Some("NodeHealthCheckEnabled"))
    );
    assert_eq!(for_node(&list_snr(&env, MEDIK8S).await?, "w3").len(), 1, "no second object for w3");

    // A new failure: remediated with an object the operator would have made.
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let w1 = wait_for("w1's remediation", WAIT, || async {
        Ok(for_node(&list_snr(&env, MEDIK8S).await?, "w1").first().map(|o| (*o).clone()))
    })
    .await?;
    assert_eq!(w1["metadata"]["name"], "w1");
    let owners = w1["metadata"]["ownerReferences"].as_array().context("owners")?;
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0]["apiVersion"].as_str(),
            owners[0]["kind"].as_str(),
            owners[0]["name"].as_str(),
            owners[0]["uid"].as_str()
        ),
        (Some(API), Some("NodeHealthCheck"), Some("workers"), Some(uid.as_str())),
        "owned by the medik8s check, as the operator owns its objects"
    );
    let s = wait_for("w1 in the status", WAIT, || async {
        let s = medik8s_status(&env, "workers").await?;
        let listed = s["unhealthyNodes"].as_array().is_some_and(|ns| ns.iter().any(|n| n["name"] == "w1"));
        Ok(listed.then_some(s))
    })
    .await?;
    assert_eq!((s["healthyNodes"].as_i64(), s["phase"].as_str()), (Some(1), Some("Remediating")), "{s}");
    assert!(s.get("observedGeneration").is_none() && s.get("queued").is_none(), "medik8s' schema only: {s}");
    for reason in ["DetectedUnhealthy", "RemediationCreated"] {
        let (type_, _, _) = wait_event_about(&env, "workers", reason, "w1").await?;
        assert_eq!(type_, "Normal", "{reason}: as the operator emits it");
    }

    // Healthy again: the object goes, the operator's reason says so.
    set_ready(&env, "w1", "True", &secs_ago(0)).await?;
    wait_for("w1's object removed", WAIT, || async {
        Ok(for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty().then_some(()))
    })
    .await?;
    wait_event_about(&env, "workers", "RemediationRemoved", "w1").await?;
    assert!(get(&env, "vigil.dev/v1alpha1", "NodeHealthCheck", None, "workers").await?.is_none(), "nothing converted");
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// The storm cool-down's start survives medik8s' schema (the API server prunes Vigil's own
/// status fields): it is kept as medik8s keeps it, in `StormCooldownActive`, so the cool-down
/// ends after its duration (it does not start over at every decision) and the Node waiting for
/// it is remediated then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_cooldown_survives_medik8s_schema_and_ends_on_time() -> Result<()> {
    let env = medik8s_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    medik8s_nhc(&env, "workers", json!({"minHealthy": 2, "stormCooldownDuration": "6s"})).await?;
    let controller = serving(&env);
    wait_disabled(&env, "workers", "False", "NodeHealthCheckEnabled").await?;
    // Both fail at once: one healthy of three, a storm.
    set_ready(&env, "w1", "False", &secs_ago(0)).await?;
    set_ready(&env, "w2", "False", &secs_ago(0)).await?;
    let condition = |s: &Value, type_: &str| -> Option<Value> {
        s["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).cloned()
    };
    wait_for("StormActive=True", WAIT, || async {
        let s = medik8s_status(&env, "workers").await?;
        Ok(condition(&s, "StormActive").filter(|c| c["status"] == "True").map(|_| ()))
    })
    .await?;
    // w2 recovers: the threshold is met again and the cool-down starts.
    set_ready(&env, "w2", "True", &secs_ago(0)).await?;
    let cooling = wait_for("StormCooldownActive=True", WAIT, || async {
        let s = medik8s_status(&env, "workers").await?;
        Ok(condition(&s, "StormCooldownActive").filter(|c| c["status"] == "True"))
    })
    .await?;
    let started: Timestamp = cooling["lastTransitionTime"].as_str().context("start")?.parse()?;
    let w1 = wait_for("w1 remediated once the cool-down passed", Duration::from_secs(40), || async {
        Ok(for_node(&list_snr(&env, MEDIK8S).await?, "w1").first().map(|o| (*o).clone()))
    })
    .await?;
    let created: Timestamp = w1["metadata"]["creationTimestamp"].as_str().context("created")?.parse()?;
    assert!(
        created >= started + SignedDuration::from_secs(6),
        "not before the cool-down ended ({started} + 6s, {created})"
    );
    // The status follows the create (it is written last).
    wait_for("the storm and its cool-down over in the status", WAIT, || async {
        let s = medik8s_status(&env, "workers").await?;
        let over = |type_: &str| condition(&s, type_).is_some_and(|c| c["status"] == "False");
        Ok((over("StormCooldownActive") && over("StormActive")).then_some(()))
    })
    .await?;
    wait_event(&env, "workers", "StormRecoveryEnded").await?;
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// An invalid medik8s check (both thresholds, which the operator's webhook refuses but the CRD
/// lets through) is never acted on; its status and a `Disabled` event name the field and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_medik8s_check_is_refused_naming_the_field_and_value() -> Result<()> {
    let env = medik8s_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    medik8s_nhc(&env, "workers", json!({"minHealthy": "51%", "maxUnhealthy": 1})).await?;
    set_ready(&env, "w1", "False", &secs_ago(600)).await?;
    let controller = serving(&env);
    let s = wait_disabled(&env, "workers", "True", "InvalidSpec").await?;
    assert_eq!(s["phase"], "Disabled", "{s}");
    let message = s["reason"].as_str().unwrap_or("");
    assert!(
        message.contains(r#"spec.minHealthy: invalid value "51%": only one of minHealthy and maxUnhealthy may be set (maxUnhealthy is "1")"#),
        "{message}"
    );
    let (type_, _, _) = wait_event_about(&env, "workers", "Disabled", "spec.minHealthy").await?;
    assert_eq!(type_, "Warning");
    stays("no remediation from an invalid check", Duration::from_secs(3), || async {
        Ok(!list_snr(&env, MEDIK8S).await?.is_empty())
    })
    .await?;
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// `--serve-medik8s` refuses to start without medik8s' CRD, and while the operator's leader Lease
/// is held and renewed (by the wall clock, or seen renewed when the operator's clock is behind);
/// a released or long-expired Lease lets it start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mode_refuses_to_start_while_the_operators_lease_is_held() -> Result<()> {
    let env = env().await?;
    let err = refuse_to_start(&env.client()).await.expect_err("no medik8s CRD");
    assert!(err.contains("NodeHealthCheck.remediation.medik8s.io/v1alpha1 is not served"), "{err}");
    env.install_crds(&[vigil_testenv::medik8s_nhc_crd()?]).await?;
    refuse_to_start(&env.client()).await.map_err(anyhow::Error::msg).context("no operator Lease")?;

    operator_lease(&env, HOLDER, Timestamp::now()).await?;
    let err = refuse_to_start(&env.client()).await.expect_err("the operator runs");
    for words in
        [format!("Lease {OPERATOR_NS}/{OPERATOR_LEASE}"), format!("{HOLDER:?}"), "Scale its Deployment to 0".into()]
    {
        assert!(err.contains(&words), "{words}: {err}");
    }

    // Released (controller-runtime's release on shutdown): it starts.
    operator_lease(&env, "", Timestamp::now()).await?;
    refuse_to_start(&env.client()).await.map_err(anyhow::Error::msg).context("a released Lease")?;

    // Held but last renewed an hour ago, and nobody renews it: the operator is gone.
    let hour_ago = || Timestamp::now() - SignedDuration::from_hours(1);
    operator_lease(&env, HOLDER, hour_ago()).await?;
    refuse_to_start(&env.client()).await.map_err(anyhow::Error::msg).context("an expired Lease")?;

    // Renewed every second by an operator whose clock is an hour behind: it runs.
    let renewer = keep_renewing(&env, hour_ago);
    let err = refuse_to_start(&env.client()).await.expect_err("renewed while watched");
    assert!(err.contains(HOLDER), "{err}");
    renewer.abort();
    env.stop().await?;
    Ok(())
}

/// The operator starting while Vigil serves its checks: Vigil stops deciding them at once, says
/// so once in the status and an event, remediates nothing meanwhile, and resumes when the
/// operator's Lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_stops_while_the_operator_runs_and_resumes_after() -> Result<()> {
    let env = medik8s_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    medik8s_nhc(&env, "workers", json!({"minHealthy": 1})).await?;
    let controller = serving(&env);
    wait_disabled(&env, "workers", "False", "NodeHealthCheckEnabled").await?;

    operator_lease(&env, HOLDER, Timestamp::now()).await?;
    let renewer = keep_renewing(&env, Timestamp::now);
    let s = wait_disabled(&env, "workers", "True", "NodeHealthCheckOperatorRunning").await?;
    let message = s["reason"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("Lease {OPERATOR_NS}/{OPERATOR_LEASE}")) && message.contains(HOLDER),
        "{message}"
    );
    let (type_, _, _) = wait_event_about(&env, "workers", "Disabled", "the NodeHealthCheck operator runs").await?;
    assert_eq!(type_, "Warning");

    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    stays("a remediation while the operator runs", Duration::from_secs(4), || async {
        Ok(!list_snr(&env, MEDIK8S).await?.is_empty())
    })
    .await?;
    let told = events_of(&env, "workers").await?.into_iter().filter(|e| e.2.contains("operator runs")).count();
    assert_eq!(told, 1, "told once, not at every renewal");

    // The operator goes (it releases its Lease): Vigil resumes and remediates w1.
    renewer.abort();
    operator_lease(&env, "", Timestamp::now()).await?;
    wait_for("w1's remediation after the operator went", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    wait_disabled(&env, "workers", "False", "NodeHealthCheckEnabled").await?;
    wait_event(&env, "workers", "Enabled").await?;
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// Every status the medik8s check `name` is written with from now on, as the API server's watch
/// delivers them (each write is a version of its own).
fn record_statuses(
    env: &TestEnv,
    name: &'static str,
) -> (tokio::task::JoinHandle<()>, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use futures::StreamExt as _;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(env.client(), &vigil_controller::medik8s::api_resource());
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let Ok(list) = api.list(&Default::default()).await else { return };
        let version = list.metadata.resource_version.unwrap_or_default();
        let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
        let Ok(stream) = api.watch(&params, &version).await else { return };
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(event)) = stream.next().await {
            if let kube::api::WatchEvent::Modified(o) | kube::api::WatchEvent::Added(o) = event {
                let status = o.data.get("status").cloned().unwrap_or(Value::Null);
                into.lock().expect("lock").push(status);
            }
        }
    });
    (task, seen)
}

/// A valid check Vigil serves is never written `Disabled` by a start of Vigil: while the caches
/// list, nothing is decided and nothing written (the last decision's status stands), so two
/// starts (a rollout) leave its phase, `Disabled=False` and its events as they were, and the
/// check is decided as soon as the caches are in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_writes_no_disabled_into_a_valid_check() -> Result<()> {
    let env = medik8s_env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    medik8s_nhc(&env, "workers", json!({"minHealthy": 1})).await?;
    // As the operator (or Vigil before) left it: enabled.
    env.apply_status(json!({"apiVersion": API, "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "status": {"observedNodes": 3, "healthyNodes": 3, "phase": "Enabled", "reason": "",
            "conditions": [{"type": "Disabled", "status": "False", "reason": "NodeHealthCheckEnabled",
                            "message": "No issues found, NodeHealthCheck is enabled.", "lastTransitionTime": secs_ago(3600)}]}}))
    .await?;
    let (recorder, seen) = record_statuses(&env, "workers");
    tokio::time::sleep(Duration::from_millis(500)).await;

    for (start, node) in [(1, "w1"), (2, "w2")] {
        let controller = serving(&env);
        // Decided once the caches are in: a Node failing now is listed.
        set_ready(&env, node, "False", &secs_ago(60)).await?;
        wait_for(&format!("{node} listed after start {start}"), WAIT, || async {
            let s = medik8s_status(&env, "workers").await?;
            let listed = s["unhealthyNodes"].as_array().is_some_and(|ns| ns.iter().any(|n| n["name"] == node));
            Ok(listed.then_some(()))
        })
        .await?;
        controller.stop().await;
    }
    recorder.abort();

    let statuses = seen.lock().expect("lock").clone();
    assert!(statuses.len() >= 2, "the recorder saw Vigil's writes: {statuses:?}");
    for s in &statuses {
        assert_ne!(s["phase"], "Disabled", "a start wrote phase Disabled: {s}");
        let disabled = s["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Disabled"));
        assert!(disabled.is_none_or(|c| c["status"] == "False"), "a start wrote Disabled=True: {s}");
    }
    let told = events_of(&env, "workers").await?;
    assert!(
        !told.iter().any(|(_, reason, _)| reason == "Disabled" || reason == "Enabled"),
        "no Disabled or Enabled event for a check that stayed enabled: {told:?}"
    );
    env.stop().await?;
    Ok(())
}
