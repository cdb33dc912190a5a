//! What one decision of a large MachineHealthCheck costs the controller, from the indexes to the
//! plan (`gather::job`: the check's Machines and Nodes looked up, who holds what, the engine's
//! decision, the status rendered and compared with the stored one), at 2 000 and 6 000 Machines: the two large checks of the
//! benchmark's fleet at 10 000 and 30 000. During a wave such a check is decided again for every
//! one of its Machines that fails, so this is what CPU per remediation grows with. 1% of the
//! Nodes are NotReady past the timeout and a quarter of those Machines already marked (a wave
//! under way), so every path is taken. The `ranked_second` groups add a check created before it
//! in the same namespace (selecting other Machines), as the fleet's second large check and every
//! small check have: each of its Machines' owner is then looked for among the checks ranked first.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use jiff::Timestamp;
use serde_json::{Value, json};
use std::hint::black_box;
use vigil_api::MachineHealthCheck;
use vigil_api::views::NodeView;
use vigil_engine::target::CheckRef;
use vigil_index::gather::CheckStatus;
use vigil_index::index::{Index, Source, WorkloadCluster};
use vigil_index::sources::SourceState;
use vigil_index::{decision, gather};

const SIZES: [usize; 2] = [2_000, 6_000];
const NS: &str = "bench";
const CLUSTER: &str = "fleet";

fn now() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("time")
}

fn failing(i: usize) -> bool {
    i % 100 == 7
}

fn machine(i: usize) -> Value {
    let mut conditions =
        vec![json!({"type": "HealthCheckSucceeded", "status": "True", "reason": "HealthCheckSucceeded",
                                     "message": "", "lastTransitionTime": "2029-12-01T00:00:00Z"})];
    if failing(i) && i % 400 == 7 {
        conditions = vec![
            json!({"type": "HealthCheckSucceeded", "status": "False", "reason": "UnhealthyNode", "message": "",
                   "lastTransitionTime": "2029-12-31T23:59:00Z"}),
            json!({"type": "OwnerRemediated", "status": "False", "reason": "WaitingForRemediation", "message": "",
                   "lastTransitionTime": "2029-12-31T23:59:00Z"}),
        ];
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
           "metadata": {"name": format!("machine-{i:06}"), "namespace": NS, "uid": format!("u-{i}"),
                        "resourceVersion": "1", "creationTimestamp": "2029-12-01T00:00:00Z",
                        "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/set-name": "large",
                                   "bench.vigil.dev/group": "large"},
                        "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
                                             "name": "large", "uid": "u-ms", "controller": true}]},
           "spec": {"clusterName": CLUSTER},
           "status": {"nodeRef": {"name": format!("node-{i:06}")}, "phase": "Running", "conditions": conditions}})
}

fn node(i: usize) -> NodeView {
    let (status, since) = if failing(i) { ("False", "2029-12-31T23:50:00Z") } else { ("True", "2029-12-01T00:00:00Z") };
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{i:06}")},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "KubeletReady",
            "lastHeartbeatTime": "2029-12-31T23:59:50Z", "lastTransitionTime": since}]}
    }))
    .expect("Node");
    NodeView::from(&node)
}

/// A check of the fleet's namespace selecting group `group`, created at `created`.
fn check(name: &str, group: &str, created: &str) -> MachineHealthCheck {
    serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS, "uid": format!("u-{name}"), "resourceVersion": "1",
                     "generation": 1, "creationTimestamp": created},
        "spec": {"clusterName": CLUSTER, "selector": {"matchLabels": {"bench.vigil.dev/group": group}},
                 "maxUnhealthy": "40%",
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5s"},
                                         {"type": "Ready", "status": "Unknown", "timeout": "5s"}]}
    }))
    .expect("MachineHealthCheck")
}

/// One check of `n` Machines of a workload cluster whose Nodes are its own, every source synced;
/// `ranked_second`: another check of the namespace was created before it.
fn fleet(n: usize, ranked_second: bool) -> (Index, CheckRef) {
    let mut idx = Index::default();
    for source in [Source::Mhcs, Source::Machines, Source::Clusters] {
        *idx.state_mut(&source) = SourceState::Synced;
    }
    if ranked_second {
        idx.put_mhc(Some(check("first", "other", "2029-11-01T00:00:00Z")), None);
    }
    let check = check("large", "large", "2029-12-01T00:00:00Z");
    idx.put_mhc(Some(check.clone()), None);
    idx.put_cluster(
        Some(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": CLUSTER, "namespace": NS, "uid": "u-cluster"},
            "status": {"initialization": {"controlPlaneInitialized": true, "infrastructureProvisioned": true}}})),
        None,
    );
    let workload = format!("{NS}/{CLUSTER}");
    idx.connected(&WorkloadCluster::new(NS, CLUSTER), false);
    for i in 0..n {
        idx.put_machine(Some(&machine(i)), None);
        idx.put_node(&workload, Some(node(i)), None, now());
    }
    *idx.state_mut(&Source::Nodes(workload)) = SourceState::Synced;
    let key = CheckRef::Machine { namespace: NS.into(), name: "large".into() };
    let job = gather::job(&idx, &key, now()).expect("decided");
    assert!(!job.plan.actions.is_empty(), "the failing Machines are marked");
    // The check carries the status its first decision wrote (2 000 target names and all), as a
    // check does in the controller after its first status write.
    let CheckStatus::Machine(status) = job.plan.status else { panic!("a MachineHealthCheck's status") };
    let mut written = MachineHealthCheck { status: Some(status), ..check };
    written.metadata.resource_version = Some("2".into());
    idx.put_mhc(Some(written), None);
    assert_eq!(decided(&idx, &key).map(|(_, patch)| patch), Some(false), "the stored status is the decided one");
    decision::cache_claims(&mut idx, &key);
    (idx, key)
}

/// One decision as the controller makes it: the plan, and the status patch it would send.
fn decided(idx: &Index, key: &CheckRef) -> Option<(usize, bool)> {
    gather::job(idx, key, now()).map(|j| (j.plan.actions.len(), j.status_patch().is_some()))
}

fn decide(c: &mut Criterion) {
    for (name, ranked_second) in [("large_check_decide", false), ("large_check_decide_ranked_second", true)] {
        decide_group(c, name, ranked_second);
    }
}

fn decide_group(c: &mut Criterion, name: &str, ranked_second: bool) {
    let mut group = c.benchmark_group(name);
    for n in SIZES {
        let (idx, key) = fleet(n, ranked_second);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| b.iter(|| black_box(decided(&idx, &key))));
    }
    group.finish();
}

/// The same decision followed by what the controller does after it: the check's claims cached.
fn decide_and_cache(c: &mut Criterion) {
    let mut group = c.benchmark_group("large_check_decide_and_cache_claims");
    for n in SIZES {
        let (mut idx, key) = fleet(n, false);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let actions = decided(&idx, &key);
                decision::cache_claims(&mut idx, &key);
                black_box(actions)
            })
        });
    }
    group.finish();
}

/// A decision after one more Node failed: the status moved (one count) while the targets did
/// not, so the status patch is rendered, as in every decision of a wave that marks a Machine.
fn decide_status_moved(c: &mut Criterion) {
    let mut group = c.benchmark_group("large_check_decide_status_moved");
    for n in SIZES {
        let (mut idx, key) = fleet(n, false);
        let failed: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-000001"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "lastHeartbeatTime": "2029-12-31T23:59:50Z", "lastTransitionTime": "2029-12-31T23:50:00Z"}]}
        }))
        .expect("Node");
        idx.put_node(&format!("{NS}/{CLUSTER}"), Some(NodeView::from(&failed)), None, now());
        assert_eq!(decided(&idx, &key).map(|(_, patch)| patch), Some(true), "the status moved");
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| b.iter(|| black_box(decided(&idx, &key))));
    }
    group.finish();
}

criterion_group!(benches, decide, decide_and_cache, decide_status_moved);
criterion_main!(benches);
