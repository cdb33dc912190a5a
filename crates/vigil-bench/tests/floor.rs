//! The floor contender on a real API server: it remediates exactly the Machines whose Node stayed
//! unhealthy for the timeout, never before it, once each, and leaves the others alone (a Node
//! that recovers in time included). A floor that cut corners would make every ratio to it lie.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use vigil_testenv::TestEnv;

const NS: &str = "bench";
const TIMEOUT_SECS: i64 = 3;

fn node(name: &str, ready: &str, since: Timestamp) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Bench", "message": "",
                      "lastHeartbeatTime": since.to_string(), "lastTransitionTime": since.to_string()}]}})
}

fn machine(name: &str) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
           "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "fleet"}},
           "spec": {"clusterName": "fleet", "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}})
}

fn machine_status(name: &str, node: &str, since: Timestamp) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": name, "namespace": NS},
           "status": {"nodeRef": {"name": node}, "phase": "Running",
                      "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                      "lastTransitionTime": since.to_string()}]}})
}

/// The remediation conditions on Machine `name`: `(type, status, lastTransitionTime)`.
async fn remediation_conditions(env: &TestEnv, name: &str) -> Vec<(String, String, Timestamp)> {
    let m = env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some(NS), name).await.expect("read a Machine");
    let conditions = m.and_then(|m| m.pointer("/status/conditions").cloned()).unwrap_or(json!([]));
    conditions
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "HealthCheckSucceeded" || c["type"] == "OwnerRemediated")
        .map(|c| {
            let at = c["lastTransitionTime"].as_str().and_then(|t| t.parse().ok()).unwrap_or(Timestamp::UNIX_EPOCH);
            (c["type"].as_str().unwrap_or("").to_string(), c["status"].as_str().unwrap_or("").to_string(), at)
        })
        .collect()
}

/// `vigil-floor` against `env` with `extra` arguments: its directory (kept while it runs), its
/// log and the process.
async fn start_floor(env: &TestEnv, extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, tokio::process::Child) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).await.expect("kubeconfig");
    let log = dir.path().join("floor.log");
    let floor = tokio::process::Command::new(Path::new(env!("CARGO_BIN_EXE_vigil-floor")))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--timeout-secs", &TIMEOUT_SECS.to_string()])
        .args(extra)
        .stderr(std::fs::File::create(&log).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start vigil-floor");
    (dir, log, floor)
}

/// A real API server with Cluster API's CRDs and the bench namespace.
async fn start_env() -> TestEnv {
    let env = TestEnv::start().await.expect("API server");
    env.install_upstream_crds().await.expect("Cluster API CRDs");
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).await.expect("namespace");
    env
}

async fn wait_synced(log: &Path) {
    vigil_testenv::wait_for("the floor's sync", Duration::from_secs(30), || async {
        Ok(std::fs::read_to_string(log).ok().filter(|l| l.contains("vigil-floor: synced")).map(drop))
    })
    .await
    .expect("synced");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_floor_remediates_exactly_the_failed_machines_never_before_the_timeout() {
    let env = start_env().await;
    let long_ago = Timestamp::now() - SignedDuration::from_hours(1);
    for i in 1..=4 {
        env.apply(node(&format!("n{i}"), "True", long_ago)).await.expect("Node");
        env.apply_status(node(&format!("n{i}"), "True", long_ago)).await.expect("Node status");
        env.apply(machine(&format!("m{i}"))).await.expect("Machine");
        env.apply_status(machine_status(&format!("m{i}"), &format!("n{i}"), long_ago)).await.expect("Machine status");
    }
    let (_dir, log, mut floor) = start_floor(&env, &[]).await;
    wait_synced(&log).await;

    // n1 and n2 fail for good, n3 recovers within the timeout, n4 stays healthy.
    // Whole seconds, as the API server keeps a Node condition's time.
    let failed_at = Timestamp::from_second(Timestamp::now().as_second()).expect("a time");
    for n in ["n1", "n2", "n3"] {
        env.apply_status(node(n, "False", failed_at)).await.expect("fail a Node");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.apply_status(node("n3", "True", Timestamp::now())).await.expect("recover n3");

    let expiry = failed_at + SignedDuration::from_secs(TIMEOUT_SECS);
    for m in ["m1", "m2"] {
        let written = vigil_testenv::wait_for(&format!("{m} remediated"), Duration::from_secs(20), || async {
            let c = remediation_conditions(&env, m).await;
            Ok((!c.is_empty()).then_some(c))
        })
        .await
        .expect("remediated");
        let kinds: Vec<(&str, &str)> = written.iter().map(|(t, s, _)| (t.as_str(), s.as_str())).collect();
        assert_eq!(kinds, [("HealthCheckSucceeded", "False"), ("OwnerRemediated", "False")], "{m}");
        // The write's own time; the API server's clock is this machine's.
        assert!(written.iter().all(|(_, _, at)| *at >= expiry), "{m} written before its timeout: {written:?}");
    }
    tokio::time::sleep(Duration::from_secs(TIMEOUT_SECS as u64)).await;
    for m in ["m3", "m4"] {
        assert!(remediation_conditions(&env, m).await.is_empty(), "{m} must be left alone");
    }
    // Failing n1 again (a new transition) writes nothing more: one write per Machine.
    env.apply_status(node("n1", "Unknown", Timestamp::now())).await.expect("n1 again");
    tokio::time::sleep(Duration::from_secs(TIMEOUT_SECS as u64 + 1)).await;
    assert_eq!(remediation_conditions(&env, "m1").await.len(), 2, "m1 is remediated once");
    assert!(floor.try_wait().expect("status").is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_healthy_verdicts_the_floor_judges_every_healthy_machine_once_before_it_says_synced() {
    let env = start_env().await;
    let long_ago = Timestamp::now() - SignedDuration::from_hours(1);
    for i in 1..=4 {
        // n3 failed a moment ago: its timeout has not run out when the floor starts.
        let (ready, since) = if i == 3 { ("False", Timestamp::now()) } else { ("True", long_ago) };
        env.apply(node(&format!("n{i}"), ready, since)).await.expect("Node");
        env.apply_status(node(&format!("n{i}"), ready, since)).await.expect("Node status");
        env.apply(machine(&format!("m{i}"))).await.expect("Machine");
        let mut status = machine_status(&format!("m{i}"), &format!("n{i}"), long_ago);
        if i == 4 {
            let judged = json!({"type": "HealthCheckSucceeded", "status": "True", "reason": "HealthCheckSucceeded", "message": "",
                                "lastTransitionTime": long_ago.to_string()});
            status["status"]["conditions"].as_array_mut().expect("conditions").push(judged);
        }
        env.apply_status(status).await.expect("Machine status");
    }
    let (_dir, log, mut floor) = start_floor(&env, &["--healthy-verdicts"]).await;
    wait_synced(&log).await;
    // Synced means written: nothing to wait for.
    for m in ["m1", "m2"] {
        let kinds: Vec<(String, String)> =
            remediation_conditions(&env, m).await.into_iter().map(|(t, s, _)| (t, s)).collect();
        assert_eq!(kinds, [("HealthCheckSucceeded".to_string(), "True".to_string())], "{m}");
    }
    assert!(remediation_conditions(&env, "m3").await.is_empty(), "m3's Node is not healthy");
    assert_eq!(remediation_conditions(&env, "m4").await.len(), 1, "m4 had its verdict: not written again");
    // A judged Machine whose Node fails has its verdict turned, not a second one added.
    let failed_at = Timestamp::from_second(Timestamp::now().as_second()).expect("a time");
    env.apply_status(node("n1", "False", failed_at)).await.expect("fail n1");
    let written = vigil_testenv::wait_for("m1 remediated", Duration::from_secs(20), || async {
        let c = remediation_conditions(&env, "m1").await;
        Ok(c.iter().any(|(t, _, _)| t == "OwnerRemediated").then_some(c))
    })
    .await
    .expect("remediated");
    let kinds: Vec<(&str, &str)> = written.iter().map(|(t, s, _)| (t.as_str(), s.as_str())).collect();
    assert_eq!(kinds, [("HealthCheckSucceeded", "False"), ("OwnerRemediated", "False")]);
    assert!(floor.try_wait().expect("status").is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
}
