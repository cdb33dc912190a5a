//! Heap kept by each cached Node and Machine (issue 18, item 5), to be read with a heap
//! profiler. Builds 10 000 Nodes or Machines shaped like the ones `vigil-bench` creates (a
//! kubelet's labels, annotations, capacity, node info and four conditions with messages; a
//! v1beta2 Machine with seven conditions), decodes them the way the controller's watches do
//! (`wire::WireNode` then `wire::slim`; `index::machine_entry`), keeps them in maps keyed as the
//! index keys them, drops the decoded wire forms, and exits with the cache still allocated. Under
//! heaptrack the memory "leaked" at exit is then what the cache holds; `none` builds and drops
//! the same inputs and keeps nothing (the baseline to subtract). `old-nodes` keeps the form the
//! Node cache held before `NodeView` (a k8s-openapi `Node` reduced to name, uid, labels,
//! annotations, deletion time and conditions without messages).
//!
//! ```text
//! cargo build -p vigil-controller --example cache_bytes   # sizes do not depend on the profile
//! for m in none old-nodes nodes machines; do
//!   heaptrack -o /tmp/cache-$m target/debug/examples/cache_bytes $m
//!   heaptrack_print /tmp/cache-$m.zst | grep 'leaked'
//! done
//! ```
//! Per object: (leaked − leaked of `none`) / 10 000. Heaptrack counts requested bytes; the
//! allocator's rounding and headers come on top.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use vigil_api::views::NodeView;
use vigil_controller::wire::{WireNode, slim};
use vigil_index::index::{MachineEntry, machine_entry};

const N: usize = 10_000;
const SINCE: &str = "2026-11-24T20:00:00Z";
const NOW: &str = "2026-11-24T22:00:00Z";

/// A kubelet-registered Node, as vigil-bench's fleet writes it.
fn node_json(i: usize) -> Value {
    let name = format!("node-{i:05}");
    let zone = format!("bench-1{}", ["a", "b", "c"][i % 3]);
    let resources = json!({"cpu": "4", "memory": "16331268Ki", "pods": "110", "ephemeral-storage": "101430960Ki",
                           "hugepages-1Gi": "0", "hugepages-2Mi": "0"});
    let cond = |t: &str, s: &str, r: &str, m: &str| json!({"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": NOW, "lastTransitionTime": SINCE});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("{i:08x}-0000-4000-8000-000000000001"), "resourceVersion": "123456",
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.xlarge",
                "topology.kubernetes.io/region": "bench-1", "topology.kubernetes.io/zone": zone,
                "bench.vigil.dev/group": format!("g{}", i % 5),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "cluster.x-k8s.io/cluster-name": "bench", "cluster.x-k8s.io/cluster-namespace": "bench",
                "cluster.x-k8s.io/machine": format!("machine-{i:05}"), "cluster.x-k8s.io/owner-kind": "MachineSet",
            },
        },
        "spec": {"providerID": format!("bench:///{name}"), "podCIDR": format!("10.244.{}.0/24", i % 256)},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kernelVersion": "6.1.0-28-cloud-amd64", "kubeletVersion": "v1.34.4"},
        },
    })
}

/// A v1beta2 Machine with its status, as vigil-bench's fleet writes it (after Vigil's verdict).
fn machine_json(i: usize) -> Value {
    let name = format!("machine-{i:05}");
    let set = format!("bench-g{}", i % 5);
    let cond = |t: &str, r: &str| json!({"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": SINCE});
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": name, "namespace": "bench", "uid": format!("{i:08x}-0000-4000-8000-000000000002"),
            "resourceVersion": "234567", "generation": 1, "creationTimestamp": SINCE,
            "labels": {"cluster.x-k8s.io/cluster-name": "bench", "cluster.x-k8s.io/set-name": set,
                       "bench.vigil.dev/group": format!("g{}", i % 5)},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": set,
                                 "uid": "00000000-0000-4000-8000-000000000003", "controller": true,
                                 "blockOwnerDeletion": true}],
        },
        "spec": {"clusterName": "bench", "version": "v1.34.4", "providerID": format!("bench:///node-{i:05}"),
                 "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}},
        "status": {
            "nodeRef": {"name": format!("node-{i:05}")}, "phase": "Running",
            "conditions": [cond("Available", "Available"), cond("Ready", "Ready"), cond("BootstrapConfigReady", "Ready"),
                           cond("InfrastructureReady", "Ready"), cond("NodeReady", "NodeReady"),
                           cond("NodeHealthy", "NodeHealthy"), cond("HealthCheckSucceeded", "HealthCheckSucceeded")],
        },
    })
}

/// The cache's Node before `NodeView`: a k8s-openapi Node reduced to what the rules read.
fn old_cached_node(wire: &WireNode) -> Node {
    let conditions = wire
        .conditions
        .iter()
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: None,
            last_transition_time: c.last_transition_time.as_deref().and_then(|t| t.parse().ok()).map(Time),
            last_heartbeat_time: c.last_heartbeat_time.as_deref().and_then(|t| t.parse().ok()).map(Time),
        })
        .collect();
    let m = &wire.metadata;
    Node {
        metadata: ObjectMeta {
            name: m.name.clone(),
            uid: m.uid.clone(),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus { conditions: Some(conditions), ..Default::default() }),
    }
}

fn wire_nodes() -> Vec<WireNode> {
    (0..N).map(|i| serde_json::from_value(node_json(i)).expect("a Node decodes")).collect()
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        "none" => {
            drop(wire_nodes());
            drop((0..N).map(machine_json).collect::<Vec<_>>());
        }
        "old-nodes" => {
            let nodes = wire_nodes();
            let cache: HashMap<String, Arc<Node>> = nodes
                .iter()
                .map(|w| (w.metadata.name.clone().unwrap_or_default(), Arc::new(old_cached_node(w))))
                .collect();
            drop(nodes);
            keep(cache);
        }
        "nodes" => {
            println!(
                "size of NodeView {} B, of one condition {} B",
                std::mem::size_of::<NodeView>(),
                std::mem::size_of::<vigil_api::views::NodeConditionView>()
            );
            let nodes = wire_nodes();
            let cache: HashMap<String, Arc<NodeView>> = nodes
                .iter()
                .map(|w| {
                    let (view, _) = slim(w);
                    (view.name.clone(), Arc::new(view))
                })
                .collect();
            drop(nodes);
            keep(cache);
        }
        "machines" => {
            let machines: Vec<Value> = (0..N).map(machine_json).collect();
            let cache: BTreeMap<String, MachineEntry> =
                machines.iter().filter_map(|m| machine_entry(m).map(|e| (e.view.meta.name.clone(), e))).collect();
            drop(machines);
            println!(
                "size of MachineEntry {} B, of its WriteBasis {} B, of MachineView {} B",
                std::mem::size_of::<MachineEntry>(),
                std::mem::size_of::<vigil_engine::machine_write::WriteBasis>(),
                std::mem::size_of::<vigil_api::views::MachineView>()
            );
            keep(cache);
        }
        other => {
            eprintln!("unknown mode {other:?}: expected none, old-nodes, nodes or machines");
            std::process::exit(2);
        }
    }
}

/// Leaves `cache` allocated at exit, where the heap profiler counts it as leaked.
fn keep<T>(cache: T) {
    println!("kept {N} objects");
    std::mem::forget(cache);
}
