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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use vigil_testenv::TestEnv;
use vigil_testenv::capi::{
    CONTROL_PLANE_LABEL, CapiManagers, DEPLOYMENT_NAME_LABEL, KubeadmCluster, WorkloadCluster, cluster_machines,
    control_plane_machines, deployment_machines, set_node_ready, wait_instant, workload_client,
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

/// One management cluster, nine workload clusters, one Vigil: each scenario has its own
/// cluster and check. The replacement runs first and alone (its times are the headline), the
/// others then run at once (one fleet instead of four keeps the suite short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_cluster_api_acts_on_vigils_marks() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let replace = WorkloadCluster::new(NS, "replace", 3);
    let short = WorkloadCluster::new(NS, "short", 3);
    let roll = WorkloadCluster::new(NS, "roll", 3);
    let quiet: Vec<WorkloadCluster> =
        ["recover", "skip", "paused", "annotated"].iter().map(|n| WorkloadCluster::new(NS, n, 2)).collect();
    let (hung, beside) = (WorkloadCluster::new(NS, "hung", 2), WorkloadCluster::new(NS, "beside", 2));
    let all: Vec<WorkloadCluster> = [replace.clone(), short.clone(), roll.clone(), hung.clone(), beside.clone()]
        .into_iter()
        .chain(quiet.clone())
        .collect();
    let mut fleet = Fleet::start(&all).await?;
    let env = &fleet.env;
    let setup = async {
        let mut quiet_checks = Vec::new();
        for c in &quiet {
            quiet_checks.push(worker_check(env, c, json!({})).await?);
        }
        Ok::<_, anyhow::Error>((
            worker_check(env, &replace, json!({})).await?,
            worker_check(env, &short, json!({"maxUnhealthy": "40%"})).await?,
            worker_check(env, &roll, json!({})).await?,
            quiet_checks,
            [worker_check(env, &hung, json!({})).await?, worker_check(env, &beside, json!({})).await?],
        ))
    };
    let (replace_check, short_check, roll_check, quiet_checks, hang_checks) = match setup.await {
        Ok(c) => c,
        Err(e) => return fleet.explain(Err(e)),
    };
    fleet.start_vigil();
    let env = &fleet.env;
    let r = async {
        replacement(env, &replace, &replace_check).await.context("scenario: worker replacement")?;
        let (a, b, c, d) = tokio::join!(
            short_circuit(env, &short, &short_check),
            must_not_replace(env, &quiet, &quiet_checks),
            rollout(env, &roll, &roll_check),
            one_hangs(env, &fleet.capi, [&hung, &beside], &hang_checks)
        );
        a.context("scenario: maxUnhealthy short-circuit")?;
        b.context("scenario: recovered, skip-remediation, paused, remediate-machine")?;
        c.context("scenario: rollout with an unhealthy Machine")?;
        d.context("scenario: one workload API server hangs")?;
        Ok(())
    }
    .await;
    let r = fleet.explain(r);
    fleet.stop().await;
    r
}

/// Limit for a KubeadmControlPlane of three to come up (one Machine after another).
const KCP_UP: Duration = Duration::from_secs(150);

/// A control-plane Node goes `Ready=False` in a cluster whose control plane is a real
/// KubeadmControlPlane of three in-memory Machines: Vigil marks the Machine, KubeadmControlPlane
/// (which first asks etcd, by port-forward through the workload API server, whether removing
/// the member keeps quorum) deletes it and creates a replacement whose Node joins, the check
/// counts all healthy again, and no other control-plane Machine is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_kubeadm_control_plane_remediates_vigils_mark() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let env = env().await?;
    let capi = CapiManagers::start_with_kubeadm(&env).await?;
    let cp = KubeadmCluster::new(NS, "kcp", 3);
    let mut fleet = Fleet { vigil: None, capi, env };
    let up = async {
        fleet.capi.create_kubeadm_cluster(&fleet.env, &cp).await?;
        fleet.capi.wait_kubeadm_cluster(&fleet.env, &cp, KCP_UP).await?;
        control_plane_check(&fleet.env, &cp).await
    }
    .await;
    let check = match up {
        Ok(c) => c,
        Err(e) => return fleet.explain(Err(e)),
    };
    fleet.start_vigil();
    let r = control_plane_replacement(&fleet.env, &fleet.capi, &cp, &check).await;
    let r = match r {
        Ok(()) => Ok(()),
        Err(e) => Err(e.context(kcp_state(&fleet.env, &cp).await)),
    };
    let r = fleet.explain(r);
    fleet.stop().await;
    r
}

/// A Vigil MachineHealthCheck over one cluster's control-plane Machines (as a user writes it).
async fn control_plane_check(env: &TestEnv, cluster: &KubeadmCluster) -> Result<String> {
    let name = format!("{}-control-plane", cluster.name);
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {"clusterName": cluster.name, "selector": {"matchLabels": {CONTROL_PLANE_LABEL: ""}},
            "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": format!("{TIMEOUT_S}s")},
                                    {"type": "Ready", "status": "Unknown", "timeout": format!("{TIMEOUT_S}s")}]}}))
        .await?;
    Ok(name)
}

/// Sets `node` `Ready=False` and waits until Vigil marks `victim` (or it is gone already): when
/// the failure was written, and when the mark was seen.
async fn fail_until_marked(
    env: &TestEnv,
    workload: &kube::Client,
    node: &str,
    victim: &str,
) -> Result<(Instant, Instant)> {
    let failed = Instant::now();
    set_node_ready(workload, node, "False").await?;
    let marked = wait_instant(&format!("{victim} marked HealthCheckSucceeded=False"), STEP, || async {
        Ok(match machine(env, victim).await? {
            Some(m) => machine_condition(&m, "HealthCheckSucceeded").is_some_and(|(s, _)| s == "False"),
            None => true,
        })
    })
    .await?;
    Ok((failed, marked))
}

/// What KubeadmControlPlane and the Machines say, for a failure message.
async fn kcp_state(env: &TestEnv, cluster: &KubeadmCluster) -> String {
    let kcp = env
        .get_json("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", Some(NS), &cluster.control_plane())
        .await;
    let machines = cluster_machines(env, NS, &cluster.name).await;
    let brief = |m: &Value| {
        json!({"name": m.pointer("/metadata/name"), "deleting": m.pointer("/metadata/deletionTimestamp"),
               "node": m.pointer("/status/nodeRef/name"), "conditions": m.pointer("/status/conditions")})
    };
    format!(
        "KubeadmControlPlane status: {}\nMachines: {}",
        kcp.map(|k| k.and_then(|k| k.get("status").cloned()).unwrap_or(Value::Null).to_string()).unwrap_or_default(),
        machines.map(|ms| Value::Array(ms.iter().map(brief).collect()).to_string()).unwrap_or_default()
    )
}

/// Every Machine of the namespace seen with a `deletionTimestamp` (listed every 200 ms) until
/// the task is aborted: a wrongful deletion is what must not happen.
fn watch_deletions(env: &TestEnv) -> (tokio::task::JoinHandle<()>, Arc<Mutex<BTreeSet<String>>>) {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let (client, into) = (env.client(), seen.clone());
    let ar =
        kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
    let task = tokio::spawn(async move {
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(client, NS, &ar);
        loop {
            if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
                let mut into = into.lock().unwrap_or_else(PoisonError::into_inner);
                for m in list.items.iter().filter(|m| m.metadata.deletion_timestamp.is_some()) {
                    into.insert(m.metadata.name.clone().unwrap_or_default());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (task, seen)
}

/// The scenario of [`the_real_kubeadm_control_plane_remediates_vigils_mark`], once the cluster is
/// up and the check exists.
async fn control_plane_replacement(env: &TestEnv, capi: &CapiManagers, cp: &KubeadmCluster, check: &str) -> Result<()> {
    let workload = workload_client(env, NS, &cp.name).await?;
    wait_all_healthy(env, check, 3).await?;
    let before_set = control_plane_machines(env, NS, &cp.name).await?;
    let before = names(&before_set);
    let (victim, node) = before_set
        .iter()
        .find_map(|(m, n)| Some((m.clone(), n.clone()?)))
        .context("no control-plane Machine with a Node")?;
    let (watcher, seen_deleting) = watch_deletions(env);

    let (failed, marked) = fail_until_marked(env, &workload, &node, &victim).await?;
    let deleted =
        wait_instant(&format!("{victim} deleted by KubeadmControlPlane"), STEP, || deleting(env, &victim)).await?;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload.clone());
    let (replacement, joined) =
        vigil_testenv::wait_for("a replacement control-plane Machine whose Node joined", STEP, || {
            let (nodes, before) = (&nodes, &before);
            async move {
                for (m, n) in control_plane_machines(env, NS, &cp.name).await? {
                    let Some(n) = n.filter(|_| !before.contains(&m)) else { continue };
                    if nodes.get_opt(&n).await?.is_some() {
                        return Ok(Some((m, Instant::now())));
                    }
                }
                Ok(None)
            }
        })
        .await?;
    let healthy = wait_all_healthy(env, check, 3).await?;
    wait_instant(&format!("{victim} gone"), STEP, || async { Ok(machine(env, &victim).await?.is_none()) }).await?;
    watcher.abort();

    let after = names(&control_plane_machines(env, NS, &cp.name).await?);
    let kept: BTreeSet<String> = before.iter().filter(|m| **m != victim).cloned().collect();
    let expected: BTreeSet<String> = kept.iter().cloned().chain([replacement.clone()]).collect();
    assert_eq!(after, expected, "the two healthy control-plane Machines stay and one replacement is added");
    let deleted_any = seen_deleting.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(deleted_any, BTreeSet::from([victim.clone()]), "only the unhealthy control-plane Machine is deleted");
    assert!(marked.saturating_duration_since(failed) >= Duration::from_secs(TIMEOUT_S - 1), "not before the timeout");
    let tunnels = capi.workload_upgrades(NS, &cp.name)?;
    assert!(tunnels > 0, "KubeadmControlPlane's etcd port-forwards went through the framing proxy");
    report(json!({"test": "control_plane_replacement_by_kcp", "capi": "v1.14.2", "timeout_s": TIMEOUT_S,
        "failure_to_mark_s": secs(failed, marked), "failure_to_deletion_s": secs(failed, deleted),
        "failure_to_replacement_node_s": secs(failed, joined), "failure_to_all_healthy_s": secs(failed, healthy),
        "mark_to_deletion_s": secs(marked, deleted), "deletion_to_replacement_node_s": secs(deleted, joined),
        "port_forwards_through_proxy": tunnels}));
    Ok(())
}

/// A worker's Node goes `Ready=False`: Vigil marks its Machine, the MachineSet deletes it and
/// creates a replacement whose Node joins, and the check counts all healthy again.
async fn replacement(env: &TestEnv, c1: &WorkloadCluster, check: &str) -> Result<()> {
    let workload = workload_client(env, NS, &c1.name).await?;
    wait_all_healthy(env, check, 3).await?;
    let before_set = deployment_machines(env, NS, &c1.deployment()).await?;
    let before = names(&before_set);
    let (victim, node) = a_worker(env, c1).await?;

    let (failed, marked) = fail_until_marked(env, &workload, &node, &victim).await?;
    let deleted = wait_instant(&format!("{victim} deleted by the MachineSet"), STEP, || deleting(env, &victim)).await?;
    let (replacement, joined) = wait_replacement(env, c1, &before, &workload).await?;
    let healthy = wait_all_healthy(env, check, 3).await?;

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

/// `maxUnhealthy: 40%` with the real owner: two of three failing deletes nothing; once one
/// recovers, the other is replaced.
async fn short_circuit(env: &TestEnv, c1: &WorkloadCluster, check: &str) -> Result<()> {
    let workload = workload_client(env, NS, &c1.name).await?;
    wait_all_healthy(env, check, 3).await?;
    let before_set = deployment_machines(env, NS, &c1.deployment()).await?;
    let before = names(&before_set);
    let pairs: Vec<(String, String)> = before_set.iter().filter_map(|(m, n)| Some((m.clone(), n.clone()?))).collect();
    let [(m1, n1), (m2, n2), ..] = pairs.as_slice() else { bail!("fewer than 2 workers with Nodes: {pairs:?}") };

    let failed = Instant::now();
    set_node_ready(&workload, n1, "False").await?;
    set_node_ready(&workload, n2, "False").await?;
    // Two of three (67%) is over 40%: Vigil says so and asks no one to remediate.
    wait_instant("the check to report TooManyUnhealthy", STEP, || async {
        let s = check_status(env, "MachineHealthCheck", check).await?;
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
    wait_all_healthy(env, check, 3).await?;
    assert!(machine(env, m1).await?.is_some_and(|m| m.pointer("/metadata/deletionTimestamp").is_none()), "{m1} kept");
    report(json!({"test": "max_unhealthy_short_circuit", "capi": "v1.14.2", "blocked_for_s": secs(failed, recovered),
        "recovery_to_deletion_s": secs(recovered, deleted), "recovery_to_replacement_node_s": secs(recovered, joined)}));
    Ok(())
}

/// Sets (or, with `None`, removes) an annotation on a Machine, as a user would.
async fn annotate(env: &TestEnv, machine: &str, key: &str, value: Option<&str>) -> Result<()> {
    let (ar, _) = (
        kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine")),
        (),
    );
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(env.client(), NS, &ar);
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(machine, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    Ok(())
}

/// Pauses or unpauses a Cluster (`spec.paused`), as a user would.
async fn pause(env: &TestEnv, cluster: &str, paused: bool) -> Result<()> {
    let ar =
        kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"));
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(env.client(), NS, &ar);
    let patch = json!({"spec": {"paused": paused}});
    api.patch(cluster, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    Ok(())
}

/// Whether a Machine carries Vigil's request to its owner (`OwnerRemediated=False`), or is gone
/// or being deleted.
async fn asked_or_deleting(env: &TestEnv, name: &str) -> Result<bool> {
    Ok(match machine(env, name).await? {
        None => true,
        Some(m) => {
            m.pointer("/metadata/deletionTimestamp").is_some()
                || machine_condition(&m, "OwnerRemediated").is_some_and(|(s, _)| s == "False")
        }
    })
}

/// Four clusters at once, one case each: a Node that recovers before its timeout, a Machine
/// annotated `cluster.x-k8s.io/skip-remediation`, a paused Cluster (nothing replaced in any of
/// them; the last two are replaced once the annotation or the pause is lifted), and a healthy
/// Machine annotated `cluster.x-k8s.io/remediate-machine` (replaced).
async fn must_not_replace(env: &TestEnv, clusters: &[WorkloadCluster], checks: &[String]) -> Result<()> {
    let [recover, skip, paused, annotated] = clusters else { bail!("four clusters") };
    for check in checks {
        wait_all_healthy(env, check, 2).await?;
    }
    let pick = |c: &WorkloadCluster| {
        let c = c.clone();
        async move {
            let (m, n) = a_worker(env, &c).await?;
            let before = names(&deployment_machines(env, NS, &c.deployment()).await?);
            Ok::<_, anyhow::Error>((m, n, before, workload_client(env, NS, &c.name).await?))
        }
    };
    let (rec_m, rec_n, _, rec_w) = pick(recover).await?;
    let (skip_m, skip_n, skip_before, skip_w) = pick(skip).await?;
    let (pause_m, pause_n, pause_before, pause_w) = pick(paused).await?;
    let (ann_m, _, ann_before, ann_w) = pick(annotated).await?;

    annotate(env, &skip_m, "cluster.x-k8s.io/skip-remediation", Some("")).await?;
    pause(env, &paused.name, true).await?;
    // Let both be seen before the Nodes fail.
    tokio::time::sleep(Duration::from_secs(1)).await;
    set_node_ready(&rec_w, &rec_n, "False").await?;
    set_node_ready(&skip_w, &skip_n, "False").await?;
    set_node_ready(&pause_w, &pause_n, "False").await?;
    let asked = Instant::now();
    annotate(env, &ann_m, "cluster.x-k8s.io/remediate-machine", Some("")).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    set_node_ready(&rec_w, &rec_n, "True").await?;

    // Three timeouts later: nothing asked of the owner, nothing deleted in the first three;
    // meanwhile the annotated one is replaced.
    let must_stay = stays(
        "a Machine that must stay was marked for its owner or deleted",
        Duration::from_secs(3 * TIMEOUT_S),
        || async {
            for m in [&rec_m, &skip_m, &pause_m] {
                if asked_or_deleting(env, m).await? {
                    return Ok(true);
                }
            }
            Ok(false)
        },
    );
    let replaced = async {
        let deleted = wait_instant(&format!("{ann_m} deleted"), STEP, || deleting(env, &ann_m)).await?;
        let (_, joined) = wait_replacement(env, annotated, &ann_before, &ann_w).await?;
        Ok::<_, anyhow::Error>((deleted, joined))
    };
    let (stayed, replaced) = tokio::join!(must_stay, replaced);
    stayed?;
    let (ann_deleted, ann_joined) = replaced?;
    let rec = machine(env, &rec_m).await?.context("recovered Machine")?;
    assert_ne!(
        machine_condition(&rec, "HealthCheckSucceeded").map(|(s, _)| s),
        Some("False".to_string()),
        "recovered before its timeout: never unhealthy"
    );

    // Lift the annotation and the pause: both are replaced now.
    let lifted = Instant::now();
    annotate(env, &skip_m, "cluster.x-k8s.io/skip-remediation", None).await?;
    pause(env, &paused.name, false).await?;
    let (_, skip_joined) = wait_replacement(env, skip, &skip_before, &skip_w).await?;
    let (_, pause_joined) = wait_replacement(env, paused, &pause_before, &pause_w).await?;
    assert!(deleting(env, &skip_m).await? && deleting(env, &pause_m).await?);
    for check in checks {
        wait_all_healthy(env, check, 2).await?;
    }
    report(json!({"test": "skip_paused_recovered_annotated", "capi": "v1.14.2",
        "remediate_annotation_to_deletion_s": secs(asked, ann_deleted),
        "remediate_annotation_to_replacement_node_s": secs(asked, ann_joined),
        "skip_lifted_to_replacement_node_s": secs(lifted, skip_joined),
        "unpause_to_replacement_node_s": secs(lifted, pause_joined)}));
    Ok(())
}

/// A MachineDeployment rollout (new infrastructure template) while one of its old Machines is
/// unhealthy: the rollout replaces every Machine once, nothing is replaced twice, and Vigil
/// asks no owner to remediate a Machine the rollout is already deleting.
async fn rollout(env: &TestEnv, c1: &WorkloadCluster, check: &str) -> Result<()> {
    let workload = workload_client(env, NS, &c1.name).await?;
    wait_all_healthy(env, check, 3).await?;
    let before = names(&deployment_machines(env, NS, &c1.deployment()).await?);
    let (victim, node) = a_worker(env, c1).await?;

    // The new template, then the deployment pointed at it (a user's rollout).
    let v2 = format!("{}-v2", c1.worker_template());
    env.apply(json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachineTemplate",
        "metadata": {"name": v2, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": c1.name}},
        "spec": {"template": {"spec": vigil_testenv::capi::dev_machine_spec()}}}))
        .await?;
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "MachineDeployment",
    ));
    let mds: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(env.client(), NS, &ar);
    let started = Instant::now();
    mds.patch(
        &c1.deployment(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": v2}}}}})),
    )
    .await?;
    set_node_ready(&workload, &node, "False").await?;

    // Until the rollout is done: every Machine ever seen, and any request to an owner written
    // on a Machine after its deletion began.
    let mut seen: BTreeSet<String> = before.clone();
    let mut late_asks: Vec<String> = Vec::new();
    let mut victim_reasons: BTreeSet<String> = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    let done = loop {
        let machines = env
            .list_json(
                "cluster.x-k8s.io/v1beta2",
                "Machine",
                Some(NS),
                &format!("{DEPLOYMENT_NAME_LABEL}={}", c1.deployment()),
            )
            .await?;
        let mut live_new_with_nodes = 0;
        let mut live = 0;
        for m in &machines {
            let name = m.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            seen.insert(name.clone());
            let owner = condition(m, "OwnerRemediated");
            if name == victim
                && let Some(c) = owner
            {
                victim_reasons.insert(format!(
                    "{}/{}",
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                ));
            }
            if let (Some(deleted), Some(c)) = (m.pointer("/metadata/deletionTimestamp").and_then(Value::as_str), owner)
                && c["reason"] == "WaitingForRemediation"
                && c["lastTransitionTime"].as_str().is_some_and(|t| t > deleted)
            {
                late_asks.push(name.clone());
            }
            if m.pointer("/metadata/deletionTimestamp").is_none() {
                live += 1;
                if !before.contains(&name) && m.pointer("/status/nodeRef/name").is_some() {
                    live_new_with_nodes += 1;
                }
            }
        }
        if live == 3 && live_new_with_nodes == 3 && machines.len() == 3 {
            break Instant::now();
        }
        if Instant::now() > deadline {
            bail!("the rollout did not finish in 180 s: {machines:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let healthy = wait_all_healthy(env, check, 3).await?;
    let created = seen.len() - before.len();
    assert_eq!(created, 3, "the rollout creates three Machines and nothing replaces any a second time: {seen:?}");
    assert!(late_asks.is_empty(), "Vigil asked an owner to remediate Machines already being deleted: {late_asks:?}");
    report(json!({"test": "rollout_with_unhealthy_machine", "capi": "v1.14.2", "machines_created": created,
        "victim_owner_remediated_seen": victim_reasons, "rollout_s": secs(started, done), "all_healthy_s": secs(started, healthy)}));
    Ok(())
}

/// One workload cluster's API server hangs (connections open, nothing answered) and later
/// refuses: meanwhile a worker of another cluster fails and is marked at its timeout and replaced
/// as if nothing were wrong elsewhere; nothing in the broken cluster is marked.
async fn one_hangs(
    env: &TestEnv,
    capi: &CapiManagers,
    [hung, beside]: [&WorkloadCluster; 2],
    checks: &[String; 2],
) -> Result<()> {
    let workload = workload_client(env, NS, &beside.name).await?;
    for check in checks {
        wait_all_healthy(env, check, 2).await?;
    }
    let hung_machines = names(&deployment_machines(env, NS, &hung.deployment()).await?);
    let (victim, node) = a_worker(env, beside).await?;
    let mut report_line = json!({"test": "one_workload_api_server_broken", "capi": "v1.14.2", "timeout_s": TIMEOUT_S});
    for (mode, label) in [(vigil_testenv::Mode::Partition, "hangs"), (vigil_testenv::Mode::Down, "refuses")] {
        capi.set_workload_mode(NS, &hung.name, mode)?;
        // Let every connection to it be caught in the fault first.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (victim, node) = if label == "hangs" {
            (victim.clone(), node.clone())
        } else {
            // The second round fails the replacement of the first.
            a_worker(env, beside).await?
        };
        let before: BTreeSet<String> = names(&deployment_machines(env, NS, &beside.deployment()).await?);
        let failed = Instant::now();
        set_node_ready(&workload, &node, "False").await?;
        let marked = wait_instant(&format!("{victim} marked while {} {label}", hung.name), STEP, || async {
            Ok(match machine(env, &victim).await? {
                Some(m) => machine_condition(&m, "HealthCheckSucceeded").is_some_and(|(s, _)| s == "False"),
                None => true,
            })
        })
        .await?;
        let (_, joined) = wait_replacement(env, beside, &before, &workload).await?;
        let mark_s = secs(failed, marked);
        assert!(
            mark_s <= TIMEOUT_S as f64 + 2.0,
            "detection beside a cluster that {label} took {mark_s} s for a {TIMEOUT_S} s timeout"
        );
        report_line[format!("while_one_{label}_failure_to_mark_s")] = json!(mark_s);
        report_line[format!("while_one_{label}_failure_to_replacement_node_s")] = json!(secs(failed, joined));
        for m in &hung_machines {
            assert!(!asked_or_deleting(env, m).await?, "{m} in the broken cluster was marked or deleted");
        }
    }
    capi.set_workload_mode(NS, &hung.name, vigil_testenv::Mode::Pass)?;
    for check in checks {
        wait_all_healthy(env, check, 2).await?;
    }
    report(report_line);
    Ok(())
}
