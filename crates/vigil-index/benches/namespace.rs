//! What one Machine update costs the controller when a namespace holds many checks: the
//! `--clusters` fleet shape (one MachineHealthCheck per workload cluster, all in one namespace,
//! four Machines per cluster), at 100, 300 and 1 000 clusters. One iteration is what the
//! controller does for a Machine status update that changes nothing a rule reads (Cluster API
//! keeps writing them): store it in the index, then decide every check it concerns. Were the
//! work per update independent of the number of checks, the three sizes would cost the same.
//! A second group times the cold start's share: the first lists stored and every check decided.
//! A third times one confirming decision (one check decided again with the other checks' claims
//! about its target derived now, as before every remediation): it should not grow with the
//! number of checks either.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::hint::black_box;
use vigil_api::MachineHealthCheck;
use vigil_api::views::NodeView;
use vigil_engine::target::{CheckRef, Target};
use vigil_index::index::{Index, Source};
use vigil_index::sources::SourceState;
use vigil_index::{decision, gather};

const SIZES: [usize; 3] = [100, 300, 1_000];
const NS: &str = "default";
const DEPLOYMENT_LABEL: &str = "cluster.x-k8s.io/deployment-name";

fn now() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("time")
}

fn cluster(i: usize) -> String {
    format!("w{i:04}")
}

fn machine(i: usize, j: usize, version: u64) -> Value {
    let c = cluster(i);
    let mut labels = json!({"cluster.x-k8s.io/cluster-name": c});
    if j > 0 {
        labels[DEPLOYMENT_LABEL] = json!(format!("{c}-md-0"));
    } else {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
           "metadata": {"name": format!("{c}-m{j}"), "namespace": NS, "uid": format!("u-{c}-{j}"),
                        "resourceVersion": version.to_string(), "creationTimestamp": "2029-12-01T00:00:00Z",
                        "labels": labels},
           "spec": {"clusterName": c},
           "status": {"nodeRef": {"name": format!("{c}-n{j}")}, "observedGeneration": version,
                      "conditions": [{"type": "HealthCheckSucceeded", "status": "True", "reason": "HealthCheckSucceeded",
                                      "message": "", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}})
}

fn node(name: String) -> NodeView {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": "2029-12-31T23:59:50Z", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}
    }))
    .expect("Node");
    NodeView::from(&node)
}

/// `n` workload clusters in one namespace, each with its check, Cluster, four Machines and
/// their Nodes, every source synced and every check decided once (so claims are cached).
fn fleet(n: usize) -> Index {
    let mut idx = Index::default();
    for source in [Source::Mhcs, Source::Machines, Source::Clusters] {
        *idx.state_mut(&source) = SourceState::Synced;
    }
    for i in 0..n {
        let c = cluster(i);
        let check: MachineHealthCheck = serde_json::from_value(json!({
            "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
            "metadata": {"name": format!("{c}-workers"), "namespace": NS, "uid": format!("u-{c}"),
                         "resourceVersion": "1", "generation": 1, "creationTimestamp": "2029-12-01T00:00:00Z"},
            "spec": {"clusterName": c, "selector": {"matchLabels": {DEPLOYMENT_LABEL: format!("{c}-md-0")}},
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5s"},
                                             {"type": "Ready", "status": "Unknown", "timeout": "5s"}]}
        }))
        .expect("MachineHealthCheck");
        idx.put_mhc(Some(check), None);
        idx.put_cluster(
            Some(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": c, "namespace": NS, "uid": format!("uc-{c}")},
                "status": {"initialization": {"controlPlaneInitialized": true, "infrastructureProvisioned": true}}})),
            None,
        );
        let workload = format!("{NS}/{c}");
        for j in 0..4 {
            idx.put_machine(Some(&machine(i, j, 1)), None);
            idx.put_node(&workload, Some(node(format!("{c}-n{j}"))), None, now());
        }
        *idx.state_mut(&Source::Nodes(workload)) = SourceState::Synced;
    }
    for key in idx.all_checks() {
        let job = gather::job(&idx, &key, now()).expect("decided");
        assert!(job.plan.actions.is_empty(), "a healthy fleet needs no write: {:?}", job.plan.actions);
        decision::cache_claims(&mut idx, &key);
    }
    idx
}

fn machine_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("machine_update");
    for n in SIZES {
        let mut idx = fleet(n);
        let mut version = 1;
        group.bench_with_input(BenchmarkId::new("checks_in_namespace", n), &n, |b, &n| {
            b.iter(|| {
                version += 1;
                let update = machine((version as usize) % n, 1, version);
                let concerned = idx.put_machine(Some(&update), None);
                for key in &concerned {
                    black_box(gather::job(&idx, key, now()));
                    decision::cache_claims(&mut idx, key);
                }
                concerned.len()
            })
        });
    }
    group.finish();
}

/// The cold start's share of the same work: the first lists of checks, Clusters, Machines and
/// Nodes stored, then every check decided once.
fn first_lists(c: &mut Criterion) {
    let mut group = c.benchmark_group("first_lists");
    group.sample_size(10);
    for n in SIZES {
        group.bench_with_input(BenchmarkId::new("checks_in_namespace", n), &n, |b, &n| {
            b.iter(|| fleet(n).claims().len())
        });
    }
    group.finish();
}

/// One check's confirming decision about one of its Machines and that Machine's Node.
fn confirming_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("confirming_decision");
    for n in SIZES {
        let idx = fleet(n);
        let c = cluster(n / 2);
        let key = CheckRef::Machine { namespace: NS.into(), name: format!("{c}-workers") };
        let about = BTreeSet::from([
            Target::Machine { namespace: NS.into(), name: format!("{c}-m1") },
            Target::Node { cluster: format!("{NS}/{c}"), name: format!("{c}-n1") },
        ]);
        group.bench_with_input(BenchmarkId::new("checks_in_namespace", n), &n, |b, _| {
            b.iter(|| black_box(gather::job_with_fresh_holders(&idx, &key, now(), &about)).is_some())
        });
    }
    group.finish();
}

criterion_group!(benches, machine_update, first_lists, confirming_decision);
criterion_main!(benches);
