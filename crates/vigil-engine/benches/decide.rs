//! One full decision over 1 000, 10 000 and 100 000 targets, for each kind of check. The fleet
//! is in steady state except 1% of Nodes NotReady (half past their timeout, half pending), so
//! every rule path is exercised; a NodeHealthCheck is decided again with two CEL expression
//! rules, to show what evaluating them per Node costs. Target: under 1 µs per target.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView, TemplateView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck, validate};
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::node::{self, NhcInput};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn node(i: usize) -> NodeView {
    let (status, since) = match i % 100 {
        0 => ("False", "2029-12-31T23:50:00Z"),  // past the 5m timeout
        50 => ("False", "2029-12-31T23:58:00Z"), // pending
        _ => ("True", "2029-12-01T00:00:00Z"),
    };
    let node = Node {
        metadata: ObjectMeta {
            name: Some(format!("n{i}")),
            labels: Some(BTreeMap::from([("pool".to_string(), "workers".to_string())])),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: status.into(),
                last_heartbeat_time: Some(Time(ts("2029-12-31T23:59:50Z"))),
                last_transition_time: Some(Time(ts(since))),
                message: None,
                reason: None,
            }]),
            ..Default::default()
        }),
    };
    NodeView::from(node)
}

fn machine(i: usize) -> MachineView {
    MachineView::read(&json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": format!("m{i}"), "namespace": "default", "uid": format!("u{i}"),
                     "creationTimestamp": "2029-12-01T00:00:00Z",
                     "labels": {"cluster.x-k8s.io/cluster-name": "prod", "pool": "workers"}},
        "status": {"nodeRef": {"name": format!("n{i}")},
                   "conditions": [{"type": "HealthCheckSucceeded", "status": "True", "reason": "HealthCheckSucceeded", "message": "", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}
    }))
    .expect("machine")
}

fn bench_machine_health_check(c: &mut Criterion) {
    bench_mhc(c, "machine_health_check_decide", json!({}));
}

/// The same decision with the two CEL expression rules of the NodeHealthCheck's group, evaluated
/// for every Machine with a Node.
fn bench_machine_health_check_with_expressions(c: &mut Criterion) {
    let expressions = json!({"unhealthyExpressions": [
        {"expression": "'example.com/disk' in node.labels && node.labels['example.com/disk'] == 'failing'", "timeout": "10m"},
        {"expression": "node.unschedulable && 'Ready' in node.conditions && node.conditions['Ready'].status != 'True'", "timeout": "15m"}]});
    bench_mhc(c, "machine_health_check_decide_with_expressions", expressions);
}

fn bench_mhc(c: &mut Criterion, name: &str, extra: serde_json::Value) {
    let mut spec = json!({"clusterName": "prod", "selector": {"matchLabels": {"pool": "workers"}}, "maxUnhealthy": "40%",
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"},
                                         {"type": "Ready", "status": "Unknown", "timeout": "300s"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    let check: MachineHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": "default", "generation": 1}, "spec": spec
    }))
    .expect("check");
    let policy = validate::machine_health_check(&check).expect("valid");
    let cluster = ClusterView::read(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": "default"},
        "status": {"initialization": {"controlPlaneInitialized": true, "infrastructureProvisioned": true}}}))
    .expect("cluster");
    let now = ts("2030-01-01T00:00:00Z");
    let mut group = c.benchmark_group(name);
    for size in SIZES {
        // Adapters hand Machines over sorted by name (a BTreeMap index), as here.
        let mut machines: Vec<MachineView> = (0..size).map(machine).collect();
        machines.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        let machine_refs: Vec<&MachineView> = machines.iter().collect();
        // Keyed by Node name with a fast hasher (foldhash), as an adapter's Node index should be.
        let nodes: HashMap<String, NodeView, foldhash::fast::RandomState> =
            (0..size).map(|i| (format!("n{i}"), node(i))).collect();
        let input = MhcInput {
            check: &check,
            policy: &policy,
            cluster: Some(&cluster),
            machines: &machine_refs,
            machines_selected: false,
            nodes: NodeSource::Reachable(&nodes),
            templates: &[],
            remediations: &[],
        };
        group.throughput(Throughput::Elements(size as u64));
        group.sample_size(if size >= 100_000 { 10 } else { 30 });
        group.bench_with_input(BenchmarkId::from_parameter(size), &input, |b, input| {
            b.iter(|| black_box(machine::decide(black_box(input), now)))
        });
    }
    group.finish();
}

fn bench_node_health_check(c: &mut Criterion) {
    bench_nhc(c, "node_health_check_decide", json!({}));
}

/// The same decision with two CEL expression rules on the check, evaluated for every Node: one
/// over a label no Node has, one over the Ready condition and the cordon.
fn bench_node_health_check_with_expressions(c: &mut Criterion) {
    let expressions = json!({"unhealthyExpressions": [
        {"expression": "'example.com/disk' in node.labels && node.labels['example.com/disk'] == 'failing'", "duration": "10m"},
        {"expression": "node.unschedulable && 'Ready' in node.conditions && node.conditions['Ready'].status != 'True'", "duration": "15m"}]});
    bench_nhc(c, "node_health_check_decide_with_expressions", expressions);
}

fn bench_nhc(c: &mut Criterion, name: &str, extra: serde_json::Value) {
    let mut spec = json!({"selector": {"matchLabels": {"pool": "workers"}}, "minHealthy": "51%",
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                                         "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": "medik8s"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "workers", "generation": 1}, "spec": spec
    }))
    .expect("check");
    let policy = validate::node_health_check(&check).expect("valid");
    let template = TemplateView::read(&json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
        "kind": "SelfNodeRemediationTemplate", "metadata": {"name": "reboot", "namespace": "medik8s"},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
    .expect("template");
    let templates = [Some(&template)];
    let now = ts("2030-01-01T00:00:00Z");
    let mut group = c.benchmark_group(name);
    for size in SIZES {
        let mut nodes: Vec<NodeView> = (0..size).map(node).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let node_refs: Vec<&NodeView> = nodes.iter().collect();
        let input = NhcInput {
            check: &check,
            policy: &policy,
            nodes: &node_refs,
            templates: &templates,
            remediations: &[],
            around: Default::default(),
        };
        group.throughput(Throughput::Elements(size as u64));
        group.sample_size(if size >= 100_000 { 10 } else { 30 });
        group.bench_with_input(BenchmarkId::from_parameter(size), &input, |b, input| {
            b.iter(|| black_box(node::decide(black_box(input), now)))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_machine_health_check,
    bench_machine_health_check_with_expressions,
    bench_node_health_check,
    bench_node_health_check_with_expressions
);
criterion_main!(benches);
