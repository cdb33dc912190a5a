//! End-to-end against the real Cluster API controllers: Vigil marks Machines, and Cluster API's
//! own MachineSet (and MachineDeployment, Machine and Cluster reconcilers, pinned v1.14.2, built
//! by `scripts/capi-managers.sh`) acts on the marks, with workload clusters served by Cluster
//! API's in-memory infrastructure provider. Nothing here plays the owner.
//!
//! The provider listens on fixed ports, so these tests run one at a time: each holds
//! [`SERIAL`] (and `CapiManagers::start` takes a host-wide lock as well). Each prints one JSON
//! line of timings and appends it to `target/tmp/vigil-capi-e2e.jsonl`.

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use vigil_testenv::TestEnv;
use vigil_testenv::capi::{
    CapiManagers, DEPLOYMENT_NAME_LABEL, WorkloadCluster, deployment_machines, set_node_ready, wait_instant,
    workload_client,
};

mod support;
use support::{Controller, check_status, condition, env, stays};

/// One real-Cluster-API test at a time in this binary (the provider's ports are fixed).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "default";
/// Limit for a workload cluster to come up (Machines provisioned, Nodes joined).
const UP: Duration = Duration::from_secs(120);
/// Limit for one step the controllers take (mark, delete, replace).
const STEP: Duration = Duration::from_secs(60);
/// The checks' Node timeout.
const TIMEOUT_S: u64 = 3;

/// A management cluster with the real managers and one running Vigil, plus workload clusters.
struct Fleet {
    // Field order is drop order: Vigil, then the managers, then the API server.
    vigil: Option<Controller>,
    capi: CapiManagers,
    env: TestEnv,
}

impl Fleet {
    async fn start(clusters: &[WorkloadCluster]) -> Result<Fleet> {
        let env = env().await?;
        let capi = CapiManagers::start(&env).await?;
        for c in clusters {
            capi.create_cluster(&env, c).await?;
        }
        for c in clusters {
            capi.wait_cluster(&env, c, UP).await?;
        }
        Ok(Fleet { vigil: None, capi, env })
    }

    fn start_vigil(&mut self) {
        self.vigil = Some(Controller::start(&self.env));
    }

    async fn stop(mut self) {
        if let Some(v) = self.vigil.take() {
            v.stop().await;
        }
    }

    /// Fails with both managers' log tails when `r` is an error, so a failure says what Cluster
    /// API did; keeps their logs when `VIGIL_TESTENV_KEEP=1`.
    fn explain<T>(&mut self, r: Result<T>) -> Result<T> {
        if std::env::var_os("VIGIL_TESTENV_KEEP").is_some()
            && let Some(dir) = self.capi.keep_logs()
        {
            eprintln!("capi logs kept in {}", dir.display());
        }
        r.map_err(|e| e.context(self.capi.log_tails()))
    }
}

/// A Vigil MachineHealthCheck over one cluster's worker MachineDeployment (as a user writes it).
async fn worker_check(env: &TestEnv, cluster: &WorkloadCluster, extra: Value) -> Result<String> {
    let name = format!("{}-workers", cluster.name);
    let mut spec = json!({"clusterName": cluster.name,
        "selector": {"matchLabels": {DEPLOYMENT_NAME_LABEL: cluster.deployment()}},
        "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": format!("{TIMEOUT_S}s")},
                                {"type": "Ready", "status": "Unknown", "timeout": format!("{TIMEOUT_S}s")}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": cluster.namespace}, "spec": spec}))
        .await?;
    Ok(name)
}

/// (expectedMachines, currentHealthy) of a Vigil check.
async fn check_counts(env: &TestEnv, name: &str) -> Result<(Option<i64>, Option<i64>)> {
    let s = check_status(env, "MachineHealthCheck", name).await?;
    Ok((s["expectedMachines"].as_i64(), s["currentHealthy"].as_i64()))
}

async fn wait_all_healthy(env: &TestEnv, check: &str, n: i64) -> Result<Instant> {
    wait_instant(&format!("check {check} to count {n} of {n} healthy"), STEP, || async {
        Ok(check_counts(env, check).await? == (Some(n), Some(n)))
    })
    .await
}

async fn machine(env: &TestEnv, name: &str) -> Result<Option<Value>> {
    env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some(NS), name).await
}

/// (status, reason) of a Machine condition.
fn machine_condition(m: &Value, type_: &str) -> Option<(String, String)> {
    condition(m, type_)
        .map(|c| (c["status"].as_str().unwrap_or("").to_string(), c["reason"].as_str().unwrap_or("").to_string()))
}

/// Whether the Machine is gone or being deleted.
async fn deleting(env: &TestEnv, name: &str) -> Result<bool> {
    Ok(machine(env, name).await?.is_none_or(|m| m.pointer("/metadata/deletionTimestamp").is_some()))
}

/// A worker Machine and its Node, the first in name order.
async fn a_worker(env: &TestEnv, cluster: &WorkloadCluster) -> Result<(String, String)> {
    let machines = deployment_machines(env, NS, &cluster.deployment()).await?;
    machines.into_iter().find_map(|(m, n)| n.map(|n| (m, n))).context("no worker Machine with a Node")
}

/// Waits for a Machine of the deployment that is not in `before` and whose Node is listed by the
/// workload cluster's own API server; returns its name and when it was seen.
async fn wait_replacement(
    env: &TestEnv,
    cluster: &WorkloadCluster,
    before: &BTreeSet<String>,
    workload: &kube::Client,
) -> Result<(String, Instant)> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload.clone());
    vigil_testenv::wait_for("a replacement Machine whose Node joined the workload cluster", STEP, || {
        let nodes = &nodes;
        async move {
            for (m, n) in deployment_machines(env, NS, &cluster.deployment()).await? {
                let Some(n) = n.filter(|_| !before.contains(&m)) else { continue };
                if nodes.get_opt(&n).await?.is_some() {
                    return Ok(Some((m, Instant::now())));
                }
            }
            Ok(None)
        }
    })
    .await
}

fn names(set: &BTreeSet<(String, Option<String>)>) -> BTreeSet<String> {
    set.iter().map(|(m, _)| m.clone()).collect()
}

/// Prints one JSON line and appends it to `target/tmp/vigil-capi-e2e.jsonl` for the suite's note.
fn report(line: Value) {
    let text = line.to_string();
    println!("{text}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("vigil-capi-e2e.jsonl");
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{text}");
    }
}

fn secs(from: Instant, to: Instant) -> f64 {
    (to.saturating_duration_since(from).as_secs_f64() * 1000.0).round() / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_worker_is_replaced_by_the_real_machineset() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c1 = WorkloadCluster::new(NS, "c1", 3);
    let mut fleet = Fleet::start(std::slice::from_ref(&c1)).await?;
    let r = replacement(&mut fleet, &c1).await;
    let r = fleet.explain(r);
    fleet.stop().await;
    r
}

async fn replacement(fleet: &mut Fleet, c1: &WorkloadCluster) -> Result<()> {
    let env = &fleet.env;
    let check = worker_check(env, c1, json!({})).await?;
    let workload = workload_client(env, NS, &c1.name).await?;
    fleet.start_vigil();
    let env = &fleet.env;
    wait_all_healthy(env, &check, 3).await?;
    let before_set = deployment_machines(env, NS, &c1.deployment()).await?;
    let before = names(&before_set);
    let (victim, node) = a_worker(env, c1).await?;

    let failed = Instant::now();
    set_node_ready(&workload, &node, "False").await?;
    let marked = wait_instant(&format!("{victim} marked HealthCheckSucceeded=False"), STEP, || async {
        Ok(match machine(env, &victim).await? {
            Some(m) => machine_condition(&m, "HealthCheckSucceeded").is_some_and(|(s, _)| s == "False"),
            None => true,
        })
    })
    .await?;
    let deleted = wait_instant(&format!("{victim} deleted by the MachineSet"), STEP, || deleting(env, &victim)).await?;
    let (replacement, joined) = wait_replacement(env, c1, &before, &workload).await?;
    let healthy = wait_all_healthy(env, &check, 3).await?;

    // What a user counts: the failed Machine is gone, exactly one new one took its place, the
    // other two were not touched.
    wait_instant(&format!("{victim} gone"), STEP, || async { Ok(machine(env, &victim).await?.is_none()) }).await?;
    let after = names(&deployment_machines(env, NS, &c1.deployment()).await?);
    let kept: BTreeSet<String> = before.iter().filter(|m| **m != victim).cloned().collect();
    let expected: BTreeSet<String> = kept.iter().cloned().chain([replacement.clone()]).collect();
    assert_eq!(after, expected, "the two healthy Machines stay and one replacement is added");
    assert!(marked.saturating_duration_since(failed) >= Duration::from_secs(TIMEOUT_S - 1), "not before the timeout");
    report(json!({"test": "worker_replacement", "capi": "v1.14.2", "timeout_s": TIMEOUT_S,
        "failure_to_mark_s": secs(failed, marked), "failure_to_deletion_s": secs(failed, deleted),
        "failure_to_replacement_node_s": secs(failed, joined), "failure_to_all_healthy_s": secs(failed, healthy),
        "mark_to_deletion_s": secs(marked, deleted), "deletion_to_replacement_node_s": secs(deleted, joined)}));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_unhealthy_short_circuit_deletes_nothing_then_the_remaining_one_is_replaced() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c1 = WorkloadCluster::new(NS, "c1", 3);
    let mut fleet = Fleet::start(std::slice::from_ref(&c1)).await?;
    let r = short_circuit(&mut fleet, &c1).await;
    let r = fleet.explain(r);
    fleet.stop().await;
    r
}

async fn short_circuit(fleet: &mut Fleet, c1: &WorkloadCluster) -> Result<()> {
    let check = worker_check(&fleet.env, c1, json!({"maxUnhealthy": "40%"})).await?;
    let workload = workload_client(&fleet.env, NS, &c1.name).await?;
    fleet.start_vigil();
    let env = &fleet.env;
    wait_all_healthy(env, &check, 3).await?;
    let before_set = deployment_machines(env, NS, &c1.deployment()).await?;
    let before = names(&before_set);
    let pairs: Vec<(String, String)> = before_set.iter().filter_map(|(m, n)| Some((m.clone(), n.clone()?))).collect();
    let [(m1, n1), (m2, n2), ..] = pairs.as_slice() else { bail!("fewer than 2 workers with Nodes: {pairs:?}") };

    let failed = Instant::now();
    set_node_ready(&workload, n1, "False").await?;
    set_node_ready(&workload, n2, "False").await?;
    // Two of three (67%) is over 40%: Vigil says so and asks no one to remediate.
    wait_instant("the check to report TooManyUnhealthy", STEP, || async {
        let s = check_status(env, "MachineHealthCheck", &check).await?;
        Ok(s["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "RemediationAllowed" && c["status"] == "False" && c["reason"] == "TooManyUnhealthy"
            })
        }))
    })
    .await?;
    stays("a Machine deleted while remediation is short-circuited", Duration::from_secs(8), || async {
        Ok(names(&deployment_machines(env, NS, &c1.deployment()).await?) != before)
    })
    .await?;
    for m in [m1, m2] {
        let obj = machine(env, m).await?.context("machine")?;
        assert_eq!(machine_condition(&obj, "OwnerRemediated"), None, "{m}: nobody asked to remediate");
    }

    // One recovers: one of three (33%) is within 40%, so the other is marked and replaced.
    let recovered = Instant::now();
    set_node_ready(&workload, n1, "True").await?;
    let deleted = wait_instant(&format!("{m2} deleted by the MachineSet"), STEP, || deleting(env, m2)).await?;
    let (_, joined) = wait_replacement(env, c1, &before, &workload).await?;
    wait_all_healthy(env, &check, 3).await?;
    assert!(machine(env, m1).await?.is_some_and(|m| m.pointer("/metadata/deletionTimestamp").is_none()), "{m1} kept");
    report(json!({"test": "max_unhealthy_short_circuit", "capi": "v1.14.2", "blocked_for_s": secs(failed, recovered),
        "recovery_to_deletion_s": secs(recovered, deleted), "recovery_to_replacement_node_s": secs(recovered, joined)}));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn debug_hold_fleet() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let c1 = WorkloadCluster::new(NS, "c1", 3);
    let mut fleet = Fleet::start(std::slice::from_ref(&c1)).await?;
    worker_check(&fleet.env, &c1, json!({})).await?;
    fleet.env.write_kubeconfig("/tmp/dbg-kubeconfig").await?;
    let s = fleet.env.get_json("v1", "Secret", Some(NS), "c1-kubeconfig").await?.context("s")?;
    std::fs::write("/tmp/dbg-c1.b64", s["data"]["value"].as_str().unwrap_or(""))?;
    eprintln!("READY capi dir {:?}", fleet.capi.keep_logs());
    tokio::time::sleep(Duration::from_secs(400)).await;
    fleet.stop().await;
    Ok(())
}
