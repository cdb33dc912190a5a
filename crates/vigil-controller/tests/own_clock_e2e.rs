//! End-to-end: the rules that run on Vigil's own clock (flapping episodes, expression rules) on a
//! real kube-apiserver and etcd, across a restart of the controller: the clock lives in the
//! check's status, so a new instance goes on where the last one stopped.

use anyhow::{Context as _, Result};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use std::time::Duration;
use vigil_testenv::{TestEnv, wait_for};

mod support;
use support::*;

/// The check's `status.flapping` entry of `target` (a Node of the NodeHealthCheck `workers`, or
/// a Machine of the MachineHealthCheck `workers` when `kind` says so), once the last of its
/// `episodes` episodes is open (`open`) or closed.
async fn wait_episodes(env: &TestEnv, (kind, target): (&str, &str), episodes: usize, open: bool) -> Result<Value> {
    let what = format!("{target} with {episodes} episodes, the last one {}", if open { "open" } else { "closed" });
    let node = target;
    wait_for(&what, WAIT, || async {
        let s = check_status(env, kind, "workers").await?;
        let entry = s["flapping"].as_array().into_iter().flatten().find(|t| t["name"] == node).cloned();
        let hit = entry
            .as_ref()
            .and_then(|t| t["episodes"].as_array())
            .is_some_and(|e| e.len() == episodes && e.last().is_some_and(|last| last.get("end").is_none() == open));
        Ok(entry.filter(|_| hit))
    })
    .await
}

/// One flap of `node`: NotReady (the condition's transition now), seen by the NodeHealthCheck,
/// then Ready.
async fn flap(env: &TestEnv, node: &str, nth: usize) -> Result<()> {
    flap_target(env, node, ("NodeHealthCheck", node), nth).await
}

/// One flap of `node`, seen by the check as an episode of `target` (`kind`, target name).
async fn flap_target(env: &TestEnv, node: &str, target: (&str, &str), nth: usize) -> Result<()> {
    set_ready(env, node, "False", &secs_ago(0)).await?;
    wait_episodes(env, target, nth, true).await?;
    set_ready(env, node, "True", &secs_ago(0)).await?;
    wait_episodes(env, target, nth, false).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_episodes_survive_a_restart_and_the_third_is_remediated() -> Result<()> {
    let env = env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    // No single episode comes near the rule's minute: only the count can make w1 unhealthy.
    let spec = json!({"minHealthy": 1, "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "1m"}],
        "remediationTemplate": reboot_ref("reboot"), "flapping": {"episodes": 3, "window": "10m"}});
    nhc(&env, "workers", spec).await?;
    let controller = Controller::start(&env);
    flap(&env, "w1", 1).await?;
    flap(&env, "w1", 2).await?;
    stays("a remediation of w1 after two flaps", Duration::from_secs(2), || async {
        Ok(!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty())
    })
    .await?;

    // A restart: the new instance knows the two episodes only from the status.
    controller.stop().await;
    let second = Controller::start(&env);
    set_ready(&env, "w1", "False", &secs_ago(0)).await?;
    wait_for("w1's remediation at its third episode", WAIT, || async {
        Ok((!for_node(&list_snr(&env, MEDIK8S).await?, "w1").is_empty()).then_some(()))
    })
    .await?;
    // The status follows the remediation object: it lists w1 remediated, its episodes cleared.
    let s = wait_for("w1 listed as remediated", WAIT, || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        let listed = s["unhealthyNodes"].as_array().into_iter().flatten().any(|e| e["name"] == "w1");
        Ok(listed.then_some(s))
    })
    .await?;
    assert!(s["flapping"].as_array().is_none_or(|f| f.iter().all(|t| t["name"] != "w1")), "{s}");
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    let note = wait_for("a Flapping event", WAIT, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| e.reason.as_deref() == Some("Flapping")).and_then(|e| e.note))
    })
    .await?;
    assert!(note.contains("w1") && note.contains("3 times"), "{note}");
    // Only w1 flapped.
    let snrs = list_snr(&env, MEDIK8S).await?;
    assert_eq!((for_node(&snrs, "w2").len(), for_node(&snrs, "w3").len()), (0, 0));
    second.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expressions_clock_survives_a_restart_and_remediates_on_time() -> Result<()> {
    const DISK: &str = "'example.com/disk' in node.labels && node.labels['example.com/disk'] == 'failing'";
    let env = env().await?;
    workers(&env, 3).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    let spec = json!({"minHealthy": 1, "remediationTemplate": reboot_ref("reboot"),
        "unhealthyExpressions": [{"expression": DISK, "duration": "8s"}]});
    nhc(&env, "workers", spec).await?;
    let controller = Controller::start(&env);
    env.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "w1", "labels": {"role": "worker", "example.com/disk": "failing"}}}))
        .await?;
    let since = wait_for("the expression's clock for w1", WAIT, || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        let m = s["expressionMatches"].as_array().into_iter().flatten().find(|m| m["name"] == "w1").cloned();
        Ok(m.and_then(|m| m["since"].as_str().map(str::to_string)))
    })
    .await?;
    let since: Timestamp = since.parse()?;
    // Down for five of the eight seconds: a clock started again by the new instance would
    // remediate at the earliest 13 s after `since`.
    controller.stop().await;
    let up_again = since.checked_add(SignedDuration::from_secs(5))?;
    let wait = Timestamp::now().duration_until(up_again);
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
    assert!(list_snr(&env, MEDIK8S).await?.is_empty(), "nothing is remediated while no instance runs");
    let second = Controller::start(&env);
    let snr = wait_for("w1's remediation", WAIT, || async {
        Ok(for_node(&list_snr(&env, MEDIK8S).await?, "w1").first().map(|o| (*o).clone()))
    })
    .await?;
    let created: Timestamp =
        snr["metadata"]["creationTimestamp"].as_str().context("the remediation's creation time")?.parse()?;
    let held = created.duration_since(since);
    // Whole seconds on both sides: never before the duration, and on the first instance's clock.
    assert!(held >= SignedDuration::from_secs(7), "remediated {held:?} after the expression first held");
    assert!(held <= SignedDuration::from_secs(12), "remediated {held:?} after the expression first held");
    wait_for("w1 listed as remediated", WAIT, || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        Ok(s["unhealthyNodes"].as_array().into_iter().flatten().any(|e| e["name"] == "w1").then_some(()))
    })
    .await?;
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    let note = wait_for("an event naming the expression", WAIT, || async {
        let list = events.list(&Default::default()).await?;
        let named = |n: &String| n.contains("w1") && n.contains("spec.unhealthyExpressions[0]");
        Ok(list.items.into_iter().filter_map(|e| e.note).find(named))
    })
    .await?;
    eprintln!("{note}");
    let snrs = list_snr(&env, MEDIK8S).await?;
    assert_eq!((for_node(&snrs, "w2").len(), for_node(&snrs, "w3").len()), (0, 0));
    second.stop().await;
    Ok(())
}

/// A MachineHealthCheck's own clocks across a restart: an expression over a Machine's Node held
/// for its timeout on the first instance's clock, and a Machine's flaps counted by both instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_health_checks_expression_clock_and_flaps_survive_a_restart() -> Result<()> {
    const DISK: &str = "'example.com/disk' in node.labels && node.labels['example.com/disk'] == 'failing'";
    let env = env().await?;
    healthy_fleet(&env, 3).await?;
    mhc(
        &env,
        "workers",
        json!({"unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "1m"}],
               "unhealthyExpressions": [{"expression": DISK, "timeout": "8s"}],
               "flapping": {"episodes": 3, "window": "10m"}}),
    )
    .await?;
    let controller = Controller::start(&env);
    flap_target(&env, "n2", ("MachineHealthCheck", "m2"), 1).await?;
    flap_target(&env, "n2", ("MachineHealthCheck", "m2"), 2).await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "labels": {"example.com/disk": "failing"}}}))
        .await?;
    let since = wait_for("the expression's clock for m1", WAIT, || async {
        let s = check_status(&env, "MachineHealthCheck", "workers").await?;
        let m = s["expressionMatches"].as_array().into_iter().flatten().find(|m| m["name"] == "m1").cloned();
        Ok(m.and_then(|m| m["since"].as_str().map(str::to_string)))
    })
    .await?;
    let since: Timestamp = since.parse()?;
    // Down for five of the eight seconds: a clock started again by the new instance would ask
    // for m1's remediation at the earliest 13 s after `since`.
    controller.stop().await;
    let up_again = since.checked_add(SignedDuration::from_secs(5))?;
    tokio::time::sleep(Duration::try_from(Timestamp::now().duration_until(up_again)).unwrap_or_default()).await;
    assert_eq!(machine_condition(&env, "m1", "OwnerRemediated").await?, None, "nothing while no instance runs");
    let second = Controller::start(&env);
    wait_machine_condition(&env, "m1", "HealthCheckSucceeded", "False", "ExpressionMatched").await?;
    let m1 = get(&env, "cluster.x-k8s.io/v1beta2", "Machine", Some(NS), "m1").await?.context("m1")?;
    let asked = condition(&m1, "OwnerRemediated").context("m1's owner is asked")?;
    let asked: Timestamp = asked["lastTransitionTime"].as_str().context("a transition time")?.parse()?;
    let held = asked.duration_since(since);
    assert!(held >= SignedDuration::from_secs(7), "asked {held:?} after the expression first held");
    assert!(held <= SignedDuration::from_secs(12), "asked {held:?} after the expression first held");
    // m2's two flaps are known to the new instance from the status alone: the third counts.
    assert_eq!(machine_condition(&env, "m2", "OwnerRemediated").await?, None, "two flaps never remediate");
    set_ready(&env, "n2", "False", &secs_ago(0)).await?;
    wait_machine_condition(&env, "m2", "HealthCheckSucceeded", "False", "Flapping").await?;
    wait_machine_condition(&env, "m2", "OwnerRemediated", "False", "WaitingForRemediation").await?;
    assert_eq!(machine_condition(&env, "m3", "OwnerRemediated").await?, None, "m3 stayed healthy");
    second.stop().await;
    Ok(())
}
