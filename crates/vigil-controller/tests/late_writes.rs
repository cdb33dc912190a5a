//! Writes that land late: a replica's writes are held (every one it sends from a moment on is
//! kept, unsent, while its reads still pass: it keeps seeing the cluster and deciding), its right
//! to write runs out, another replica takes over and remediates the same targets, and only then
//! are the held writes delivered — carried out by the API server however late
//! ([`vigil_testenv::WriteHold`]). Whatever they were, they must change nothing: no second
//! remediation object (for a template with and without `multiple-templates-support`), no
//! Machine marked again, no check status written over. Both with shards and with one leader.

mod support;
use support::*;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::Duration;
use vigil_controller::Options;
use vigil_controller::leader::LeaderOptions;
use vigil_testenv::{Delivered, Identity, TestEnv, WriteHold, wait_for};

/// Where the replicas' election Leases live.
const ELECTION_NS: &str = "vigil-system";
/// Where the node Leases live (a NodeHealthCheck takes a Node's Lease before remediating it).
const NODE_LEASE_NS: &str = "medik8s-leases";

/// Short election times, so a takeover comes soon; the renew deadline is what the held replica
/// has, once its Lease renewals are held too, to see the failures and send its remediating
/// writes into the hold: on two cores running the whole suite, 3 s was sometimes not enough.
fn election(identity: &str) -> LeaderOptions {
    LeaderOptions {
        lease_name: "vigil".into(),
        namespace: ELECTION_NS.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(8),
        retry_period: Duration::from_secs(1),
    }
}

fn replica(identity: &str, shards: u32) -> Options {
    Options {
        // One per check: each decision waits for its held writes until its right runs out.
        workers: 4,
        leader: Some(election(identity)),
        shards,
        lease_namespace: NODE_LEASE_NS.into(),
        ..Default::default()
    }
}

/// A self-hosted cluster with Machine m1 on Node n1 (MachineHealthCheck `workers`, owner
/// remediation), Node g1 under NodeHealthCheck `multi` (its template has
/// `multiple-templates-support`: upstream names such objects with `generateName`) and Node f1
/// under NodeHealthCheck `fixed` (objects named after the Node).
async fn setup(env: &TestEnv) -> Result<()> {
    for ns in [ELECTION_NS, NODE_LEASE_NS, MEDIK8S] {
        env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    }
    env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "limited-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": vigil_testenv::LIMITED_USER}]}))
        .await?;
    healthy_fleet(env, 1).await?;
    mhc(env, "workers", json!({})).await?;
    node(env, "g1", json!({"group": "multi"})).await?;
    node(env, "f1", json!({"group": "fixed"})).await?;
    env.apply(snr_template("reboot-multi", MEDIK8S, true)).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    for (name, template) in [("multi", "reboot-multi"), ("fixed", "reboot")] {
        env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"group": name}}, "minHealthy": 0,
                     "remediationTemplate": reboot_ref(template),
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]}}))
            .await?;
    }
    Ok(())
}

/// Waits until every check's status says it may remediate (the replica deciding them wrote it).
async fn all_decided(env: &TestEnv) -> Result<()> {
    wait_check_condition(env, "MachineHealthCheck", "workers", "RemediationAllowed", "True", "RemediationAllowed")
        .await?;
    for name in ["multi", "fixed"] {
        wait_check_condition(env, "NodeHealthCheck", name, "RemediationAllowed", "True", "RemediationAllowed").await?;
    }
    Ok(())
}

/// The remediation objects of each Node, by name.
async fn objects_of(env: &TestEnv) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = list_snr(env, MEDIK8S)
        .await?
        .iter()
        .map(|o| {
            let node = o["metadata"]["annotations"]["remediation.medik8s.io/node-name"].as_str().unwrap_or("");
            (node.to_string(), o["metadata"]["name"].as_str().unwrap_or("").to_string())
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Whether Machine m1 is marked for its owner's remediation.
async fn m1_marked(env: &TestEnv) -> Result<bool> {
    Ok(machine_condition(env, "m1", "OwnerRemediated").await?.is_some_and(|(s, _)| s == "False"))
}

/// The writes of the held replica that may be carried out late: Events (a report, never read
/// back) and its membership Lease (which grants no right to write).
fn harmless(d: &Delivered) -> bool {
    d.path.starts_with("/apis/events.k8s.io/") || d.path.contains("/leases/vigil-member-")
}

/// The scenario: replica `h` (through a hold) decides every check; its writes are held right
/// before three targets fail; replica `t` (started by `start_taker`, or already standing by)
/// takes over and remediates them; then `h`'s writes are delivered. Returns what they came to.
async fn late_writes_change_nothing(env: &TestEnv, shards: u32, standby_first: bool) -> Result<()> {
    setup(env).await?;
    let upstream = env.client_at(env.server_url(), Identity::Limited).await?;
    let (held_client, hold) = WriteHold::client(upstream);
    let h = Controller::start_with(held_client, replica("h", shards));
    all_decided(env).await?;
    let t_early = standby_first.then(|| Controller::start_with(env.client(), replica("t", shards)));

    // From now on h's writes are held (the node Leases it takes before a create pass: the cut
    // comes after them and before the create). The targets fail at once: h decides and writes
    // into the hold while its right to write lasts.
    hold.hold(&[&format!("/namespaces/{NODE_LEASE_NS}/leases")]);
    for n in ["n1", "g1", "f1"] {
        set_ready(env, n, "False", &secs_ago(60)).await?;
    }
    let kept = wait_for("h's remediating writes held", WAIT, || async {
        let kept = hold.kept();
        let creates = kept.iter().filter(|(m, p)| m == "POST" && p.contains("/selfnoderemediations")).count();
        let machine = kept.iter().any(|(m, p)| m == "PATCH" && p.contains("/machines/m1/status"));
        Ok((creates == 2 && machine).then_some(kept))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; held: {:?}", hold.kept()))?;
    eprintln!("LATE held: {kept:?}");
    let t = match t_early {
        Some(t) => t,
        None => Controller::start_with(env.client(), replica("t", shards)),
    };
    // t takes over (h's Lease renewals are held too) and remediates the three targets.
    wait_for("t to remediate g1, f1 and m1", Duration::from_secs(60), || async {
        let objects = objects_of(env).await?;
        let done = ["g1", "f1"].iter().all(|n| objects.iter().any(|(o, _)| o == n)) && m1_marked(env).await?;
        Ok(done.then_some(()))
    })
    .await?;
    // ... and writes the statuses that say so: each NodeHealthCheck names its object, and the
    // MachineHealthCheck's comes from a decision that counts m1 unhealthy. The Machine is marked
    // before that status is written, and a status t wrote while its caches filled (a refusal,
    // which keeps the counts it found) may still stand: the comparison starts from t's own.
    wait_for("t's statuses naming the objects", WAIT, || async {
        let mut named = true;
        for name in ["multi", "fixed"] {
            let s = check_status(env, "NodeHealthCheck", name).await?;
            named &= s["unhealthyNodes"][0]["remediations"][0]["resource"]["uid"].is_string();
        }
        let s = check_status(env, "MachineHealthCheck", "workers").await?;
        let decided = s["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "RemediationAllowed" && c["status"] == "True"));
        named &= decided && s["currentHealthy"] == 0;
        Ok(named.then_some(()))
    })
    .await?;
    let before = objects_of(env).await?;
    let statuses_before = statuses(env).await?;

    let delivered = hold.release().await;
    for d in &delivered {
        eprintln!("LATE delivered: {d}");
    }
    // Time for what the late writes did to show, and for t to react to it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = objects_of(env).await?;
    let carried_out: Vec<&Delivered> = delivered.iter().filter(|d| d.carried_out() && !harmless(d)).collect();
    eprintln!(
        "LATE shards={shards}: {} writes delivered late, {} carried out besides events and membership ({}); objects before {before:?} after {after:?}",
        delivered.len(),
        carried_out.len(),
        carried_out.iter().map(|d| format!("{} {}", d.method, d.path)).collect::<Vec<_>>().join(", ")
    );
    let mut failures = Vec::new();
    if after != before {
        failures.push(format!("the remediation objects changed: before {before:?}, after {after:?}"));
    }
    for n in ["g1", "f1"] {
        let count = after.iter().filter(|(o, _)| o == n).count();
        if count != 1 {
            failures.push(format!("{n} has {count} remediation objects"));
        }
    }
    if !carried_out.is_empty() {
        failures.push(format!(
            "late writes were carried out: {}",
            carried_out.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("; ")
        ));
    }
    let statuses_after = statuses(env).await?;
    if statuses_after != statuses_before {
        failures.push(format!("a check status changed: before {statuses_before}, after {statuses_after}"));
    }
    h.stop().await;
    t.stop().await;
    if !failures.is_empty() {
        bail!("late writes changed something:\n{}", failures.join("\n"));
    }
    Ok(())
}

/// What the checks' statuses say about their targets (the remediations with their objects, the
/// Machines remediated), without times that may move.
async fn statuses(env: &TestEnv) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for name in ["multi", "fixed"] {
        let s = check_status(env, "NodeHealthCheck", name).await?;
        out.insert(format!("NodeHealthCheck/{name}"), s["unhealthyNodes"].clone());
    }
    let s = check_status(env, "MachineHealthCheck", "workers").await?;
    out.insert("MachineHealthCheck/workers".into(), json!([s["currentHealthy"], s["remediationsAllowed"]]));
    Ok(Value::Object(out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_replicas_writes_landing_after_a_takeover_change_nothing() -> Result<()> {
    let env = env().await?;
    late_writes_change_nothing(&env, 6, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_writes_landing_after_a_takeover_change_nothing() -> Result<()> {
    let env = env().await?;
    late_writes_change_nothing(&env, 1, true).await
}
