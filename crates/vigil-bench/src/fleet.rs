//! The fleet: how N targets are split between health checks, and the objects that make them up.
//!
//! Layout (index `i` of N), mixed fleet (the default): the first 60% are Machines watched by
//! MachineHealthChecks — two large checks of 20% each, then checks of 50 — and the last 40% are
//! Nodes watched by NodeHealthChecks — one large check of 20%, then checks of 50. MHC-only fleet
//! (`--fleet mhc`, the one `--against capi` uses): two large MachineHealthChecks of 20% each,
//! then checks of 50 up to N. Every Node has a Machine (one Cluster, self-hosted: its workload
//! cluster is this same API server).

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use vigil_testenv::TestEnv;

/// Namespace of the Cluster, its Machines, the checks and the remediation objects.
pub const NS: &str = "bench";
/// The one Cluster API Cluster.
pub const CLUSTER: &str = "fleet";
/// The label the checks select on (same value on a Node and its Machine).
pub const GROUP_LABEL: &str = "bench.vigil.dev/group";
/// Size of a small check.
const SMALL: usize = 50;
/// Requests the fleet is created with at once.
const CONCURRENCY: usize = 32;

/// Which kind of check covers a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A MachineHealthCheck: the target is the Machine, remediation is a Machine condition.
    Machine,
    /// A NodeHealthCheck: the target is the Node, remediation is a SelfNodeRemediation.
    Node,
}

/// One health check of the layout.
#[derive(Clone, Debug)]
pub struct Group {
    /// Check name and label value.
    pub name: String,
    /// The kind of check.
    pub kind: Kind,
    /// Target indexes `start..end`.
    pub start: usize,
    /// One past the last target index.
    pub end: usize,
}

impl Group {
    /// How many targets the check covers.
    pub fn size(&self) -> usize {
        self.end - self.start
    }
}

/// Which checks cover the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fleet {
    /// 60% of the targets under MachineHealthChecks, 40% under NodeHealthChecks.
    Mixed,
    /// Every target under MachineHealthChecks (what `--against capi` compares).
    Mhc,
    /// Every target under NodeHealthChecks (one of 20%, then checks of 50), the layout medik8s'
    /// NodeHealthCheck operator was measured on in issue 11 (what `--against medik8s` compares).
    Nhc,
}

impl Fleet {
    /// The flag value, as the summary's `config.fleet` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Fleet::Mixed => "mixed",
            Fleet::Mhc => "mhc",
            Fleet::Nhc => "nhc",
        }
    }
}

/// Whose MachineHealthCheck resources the fleet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckApi {
    /// Vigil's `vigil.dev/v1alpha1` checks.
    Vigil,
    /// Cluster API's own `cluster.x-k8s.io/v1beta2` MachineHealthChecks, equivalent to Vigil's.
    Capi,
}

impl CheckApi {
    /// The apiVersion of these MachineHealthChecks, for reading them back.
    pub fn api_version(self) -> &'static str {
        match self {
            CheckApi::Vigil => vigil_api::API_VERSION,
            CheckApi::Capi => vigil_api::well_known::CAPI_MHC_V1BETA2_API_VERSION,
        }
    }
}

/// Whose NodeHealthCheck resources the fleet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeChecks {
    /// Vigil's `vigil.dev/v1alpha1` checks.
    Vigil,
    /// medik8s' own `remediation.medik8s.io/v1alpha1` NodeHealthChecks: the same spec, another group.
    Medik8s,
    /// Vigil's checks, each with [`EXPRESSIONS`] beside its conditions (`--expressions`; Vigil's
    /// MachineHealthChecks get them too): what evaluating CEL rules for every target at every
    /// decision costs.
    VigilWithExpressions,
}

/// The CEL rules of `--expressions`: one over a label no Node of the fleet has, one over the
/// cordon and the Ready condition (no failed Node is cordoned); neither ever holds, so the
/// remediations are the same as without them.
pub const EXPRESSIONS: [&str; 2] = [
    "'example.com/disk' in node.labels && node.labels['example.com/disk'] == 'failing'",
    "node.unschedulable && 'Ready' in node.conditions && node.conditions['Ready'].status != 'True'",
];

/// Splits `n` targets into checks (see the module doc).
pub fn layout(n: usize, fleet: Fleet) -> Vec<Group> {
    let cut = |pct: usize| n * pct / 100;
    let mhc_end = if fleet == Fleet::Mhc { n } else { cut(60) };
    let mut groups = Vec::new();
    let mut push = |name: String, kind, start, end| {
        if end > start {
            groups.push(Group { name, kind, start, end });
        }
    };
    if fleet == Fleet::Nhc {
        push("nhc-large".into(), Kind::Node, 0, cut(20));
        for (k, start) in (cut(20)..n).step_by(SMALL).enumerate() {
            push(format!("nhc-small-{k:03}"), Kind::Node, start, (start + SMALL).min(n));
        }
        return groups;
    }
    push("mhc-large-a".into(), Kind::Machine, 0, cut(20));
    push("mhc-large-b".into(), Kind::Machine, cut(20), cut(40));
    for (k, start) in (cut(40)..mhc_end).step_by(SMALL).enumerate() {
        push(format!("mhc-small-{k:03}"), Kind::Machine, start, (start + SMALL).min(mhc_end));
    }
    if fleet == Fleet::Mhc {
        return groups;
    }
    push("nhc-large".into(), Kind::Node, cut(60), cut(80));
    for (k, start) in (cut(80)..n).step_by(SMALL).enumerate() {
        push(format!("nhc-small-{k:03}"), Kind::Node, start, (start + SMALL).min(n));
    }
    groups
}

/// The group of each target index.
pub fn group_of(groups: &[Group], n: usize) -> Vec<usize> {
    let mut of = vec![0; n];
    for (g, group) in groups.iter().enumerate() {
        of[group.start..group.end].fill(g);
    }
    of
}

/// Node name of target `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// Machine name of target `i`.
pub fn machine_name(i: usize) -> String {
    format!("machine-{i:05}")
}

/// A metav1.Time string (second precision, as the API server stores it).
pub fn time(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

/// The four kubelet conditions, all fine, or all Unknown as the node lifecycle controller
/// leaves them when the kubelet stops posting.
pub fn node_conditions(ready: bool, heartbeat: &str, since: &str) -> Value {
    let cond = |type_: &str, ok_status: &str, ok_reason: &str, ok_message: &str| {
        let (status, reason, message) = if ready {
            (ok_status, ok_reason, ok_message)
        } else {
            ("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        };
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": since})
    };
    json!([
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ])
}

/// A Node shaped like a kubelet registers it (labels, addresses, capacity, node info; no
/// image list), Ready since `since`.
fn node(i: usize, group: &str, since: &str, now: &str) -> Value {
    let name = node_name(i);
    let ip = format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
    let zone = format!("bench-1{}", ["a", "b", "c"][i % 3]);
    let resources = json!({"cpu": "4", "memory": "16331268Ki", "pods": "110", "ephemeral-storage": "101430960Ki",
                           "hugepages-1Gi": "0", "hugepages-2Mi": "0"});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.xlarge",
                "topology.kubernetes.io/region": "bench-1", "topology.kubernetes.io/zone": zone,
                GROUP_LABEL: group,
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/cluster-namespace": NS,
                "cluster.x-k8s.io/machine": machine_name(i), "cluster.x-k8s.io/owner-kind": "MachineSet",
            },
        },
        "spec": {"providerID": format!("bench:///{name}"), "podCIDR": format!("10.244.{}.0/24", i % 256)},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": node_conditions(true, now, since),
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": format!("{i:032x}"), "systemUUID": format!("{i:08x}-0000-4000-8000-000000000000"),
                "bootID": format!("{i:08x}-0000-4000-8000-00000000b007"),
                "kernelVersion": "6.1.0-28-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.34.4",
                "kubeProxyVersion": "v1.34.4", "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    })
}

/// A v1beta2 Machine owned by its group's MachineSet.
fn machine(i: usize, group_index: usize, group: &str) -> Value {
    let name = machine_name(i);
    let set = format!("{CLUSTER}-{group}");
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/set-name": set, GROUP_LABEL: group},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": set,
                                 "uid": format!("00000000-0000-4000-8000-{group_index:012x}"),
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "clusterName": CLUSTER, "version": "v1.34.4", "providerID": format!("bench:///{}", node_name(i)),
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
        },
    })
}

/// The Machine's status: provisioned, running, linked to its Node.
fn machine_status(i: usize, since: &str) -> Value {
    let cond = |type_: &str, reason: &str| json!({"type": type_, "status": "True", "reason": reason, "message": "", "lastTransitionTime": since});
    json!({"status": {
        "nodeRef": {"name": node_name(i)}, "phase": "Running",
        "initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
        "conditions": [cond("Available", "Available"), cond("Ready", "Ready"), cond("BootstrapConfigReady", "Ready"),
                       cond("InfrastructureReady", "Ready"), cond("NodeReady", "NodeReady"),
                       cond("NodeHealthy", "NodeHealthy")],
    }})
}

/// The Ready conditions both kinds of check act on, with `timeout` (Go duration or seconds).
fn unhealthy_conditions(field: &str, timeout: Value) -> Value {
    json!([{"type": "Ready", "status": "Unknown", field: timeout}, {"type": "Ready", "status": "False", field: timeout}])
}

/// Short-circuit threshold of every MachineHealthCheck (the wave fails at most 30%).
const MAX_UNHEALTHY: &str = "40%";
/// How long a Machine may go without a Node: longer than any run, so it never fires.
const NODE_STARTUP_TIMEOUT_SECS: u64 = 600;

/// The MachineHealthCheck of group `g`: Vigil's, or Cluster API's v1beta2 equivalent (same
/// cluster, selector, unhealthy conditions and timeouts, maxUnhealthy as
/// `remediation.triggerIf.unhealthyLessThanOrEqualTo`, nodeStartupTimeout in seconds).
pub fn machine_health_check(g: &Group, checks: CheckApi, timeout_secs: u64) -> Value {
    let selector = json!({"matchLabels": {GROUP_LABEL: g.name}});
    match checks {
        CheckApi::Vigil => json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
            "metadata": {"name": g.name, "namespace": NS},
            "spec": {"clusterName": CLUSTER, "selector": selector, "maxUnhealthy": MAX_UNHEALTHY,
                     "nodeStartupTimeout": format!("{}m", NODE_STARTUP_TIMEOUT_SECS / 60),
                     "unhealthyConditions": unhealthy_conditions("timeout", json!(format!("{timeout_secs}s")))}}),
        CheckApi::Capi => json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
            "metadata": {"name": g.name, "namespace": NS},
            "spec": {"clusterName": CLUSTER, "selector": selector,
                     "checks": {"nodeStartupTimeoutSeconds": NODE_STARTUP_TIMEOUT_SECS,
                                "unhealthyNodeConditions": unhealthy_conditions("timeoutSeconds", json!(timeout_secs))},
                     "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": MAX_UNHEALTHY}}}}),
    }
}

/// [`machine_health_check`], with [`EXPRESSIONS`] when Vigil's checks carry them (`node_checks`
/// says so for both kinds).
fn machine_check(g: &Group, (checks, node_checks): (CheckApi, NodeChecks), timeout_secs: u64) -> Value {
    let mut check = machine_health_check(g, checks, timeout_secs);
    if checks == CheckApi::Vigil && node_checks == NodeChecks::VigilWithExpressions {
        check["spec"]["unhealthyExpressions"] = expression_rules("timeout", timeout_secs);
    }
    check
}

/// The SelfNodeRemediationTemplate the NodeHealthChecks use.
pub const TEMPLATE: &str = "bench-reboot";

/// The medik8s remediation kind the NodeHealthChecks create.
pub fn remediation_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("self-node-remediation.medik8s.io", "v1alpha1", "SelfNodeRemediation"))
}

/// Cluster API Machines (v1beta2).
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"))
}

/// Installs Cluster API's own MachineHealthCheck CRD (v1beta2 only, from the same pinned module
/// as the test env's other Cluster API CRDs), which the test env does not install.
pub async fn install_capi_mhc_crd(env: &TestEnv) -> Result<()> {
    let path = vigil_testenv::capi_crds_dir()?.join("cluster.x-k8s.io_machinehealthchecks.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{}: invalid YAML", path.display()))?;
    let mut crd = docs
        .into_iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .with_context(|| format!("{}: no CustomResourceDefinition", path.display()))?;
    vigil_testenv::reduce_to_version(&mut crd, "v1beta2").with_context(|| path.display().to_string())?;
    env.install_crds(&[crd]).await
}

/// Creates the Cluster, its kubeconfig Secret (the audited identity), the remediation template,
/// every Node and Machine, and then the checks (`checks` and `node_checks` say whose
/// MachineHealthChecks and NodeHealthChecks);
/// returns once all exist. Every condition has been true `since` (the same instant the kubelets
/// keep reporting, so a heartbeat changes no transition time).
pub async fn create(
    env: &TestEnv,
    n: usize,
    groups: &[Group],
    timeout_secs: u64,
    checks: CheckApi,
    node_checks: NodeChecks,
    since: &str,
) -> Result<()> {
    let since = since.to_string();
    env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS}, "spec": {"paused": false}}))
        .await?;
    env.apply_status(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS},
        "status": {"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                   "conditions": [
                       {"type": "InfrastructureReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": since},
                       {"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized", "message": "", "lastTransitionTime": since}]}}))
    .await?;
    env.apply(env.audited_kubeconfig_secret(NS, CLUSTER)).await?;
    env.apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NS},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
        .await?;

    let group = group_of(groups, n);
    let client = env.client();
    let nodes: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Node>(&()));
    let machines: Api<DynamicObject> = Api::namespaced_with(client, NS, &machine_resource());
    let now = time(Timestamp::now());
    futures::stream::iter(0..n)
        .map(|i| {
            let (nodes, machines, since, now, group) = (&nodes, &machines, &since, &now, &group);
            let name = &groups[group[i]].name;
            async move {
                let node_obj: DynamicObject = serde_json::from_value(node(i, name, since, now))?;
                nodes
                    .create(&PostParams::default(), &node_obj)
                    .await
                    .with_context(|| format!("create {}", node_name(i)))?;
                let machine_obj: DynamicObject = serde_json::from_value(machine(i, group[i], name))?;
                machines
                    .create(&PostParams::default(), &machine_obj)
                    .await
                    .with_context(|| format!("create {}", machine_name(i)))?;
                machines
                    .patch_status(&machine_name(i), &PatchParams::default(), &Patch::Merge(machine_status(i, since)))
                    .await
                    .with_context(|| format!("status of {}", machine_name(i)))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;

    for g in groups {
        let manifest = match g.kind {
            Kind::Machine => machine_check(g, (checks, node_checks), timeout_secs),
            Kind::Node => node_health_check(g, node_checks, timeout_secs),
        };
        env.apply(manifest).await?;
    }
    Ok(())
}

/// The NodeHealthCheck of group `g`: Vigil's or medik8s' (field names are the same; only the
/// group differs).
pub fn node_health_check(g: &Group, checks: NodeChecks, timeout_secs: u64) -> Value {
    let api_version = match checks {
        NodeChecks::Vigil | NodeChecks::VigilWithExpressions => "vigil.dev/v1alpha1",
        NodeChecks::Medik8s => "remediation.medik8s.io/v1alpha1",
    };
    let mut check = json!({"apiVersion": api_version, "kind": "NodeHealthCheck",
        "metadata": {"name": g.name},
        "spec": {"selector": {"matchLabels": {GROUP_LABEL: g.name}}, "minHealthy": "51%",
                 "unhealthyConditions": unhealthy_conditions("duration", json!(format!("{timeout_secs}s"))),
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                                         "kind": "SelfNodeRemediationTemplate", "name": TEMPLATE, "namespace": NS}}});
    if checks == NodeChecks::VigilWithExpressions {
        check["spec"]["unhealthyExpressions"] = expression_rules("duration", timeout_secs);
    }
    check
}

/// [`EXPRESSIONS`] as `spec.unhealthyExpressions`, each held for the conditions' timeout
/// (`field`: what the kind calls it).
fn expression_rules(field: &str, timeout_secs: u64) -> Value {
    let rules: Vec<Value> =
        EXPRESSIONS.iter().map(|e| json!({"expression": e, field: format!("{timeout_secs}s")})).collect();
    json!(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_covers_every_target_once_with_a_few_large_and_many_small_checks() {
        for n in [500, 1000, 5000, 10_000, 1234] {
            let groups = layout(n, Fleet::Mixed);
            let mut covered = vec![0; n];
            for g in &groups {
                covered[g.start..g.end].iter_mut().for_each(|c| *c += 1);
                assert!(g.size() > 0);
            }
            assert!(covered.iter().all(|&c| c == 1), "n={n}");
            let large = groups.iter().filter(|g| g.size() > SMALL).count();
            assert_eq!(large, 3, "n={n}");
        }
        let groups = layout(10_000, Fleet::Mixed);
        assert_eq!(groups.iter().filter(|g| g.kind == Kind::Machine).count(), 42);
        assert_eq!(groups.iter().filter(|g| g.kind == Kind::Node).count(), 41);
        assert_eq!(groups.iter().filter(|g| g.kind == Kind::Machine).map(Group::size).sum::<usize>(), 6000);
    }

    #[test]
    fn the_mhc_fleet_puts_every_target_under_a_machine_health_check() {
        for n in [500, 1000, 1234, 10_000] {
            let groups = layout(n, Fleet::Mhc);
            let mut covered = vec![0; n];
            for g in &groups {
                assert_eq!(g.kind, Kind::Machine, "n={n}");
                covered[g.start..g.end].iter_mut().for_each(|c| *c += 1);
            }
            assert!(covered.iter().all(|&c| c == 1), "n={n}");
        }
        assert_eq!(layout(10_000, Fleet::Mhc).len(), 2 + 6000 / SMALL);
        let nhc = layout(10_000, Fleet::Nhc);
        assert_eq!(nhc.len(), 161, "the 161 NodeHealthChecks issue 11 measured medik8s on");
        assert!(nhc.iter().all(|g| g.kind == Kind::Node));
        assert_eq!(nhc.iter().map(Group::size).sum::<usize>(), 10_000);
    }

    #[test]
    fn medik8s_node_health_checks_are_vigils_in_their_group() {
        let g = Group { name: "nhc-small-003".into(), kind: Kind::Node, start: 0, end: 50 };
        let vigil = node_health_check(&g, NodeChecks::Vigil, 5);
        let medik8s = node_health_check(&g, NodeChecks::Medik8s, 5);
        assert_eq!(vigil["apiVersion"], "vigil.dev/v1alpha1");
        assert_eq!(medik8s["apiVersion"], "remediation.medik8s.io/v1alpha1");
        assert_eq!((&medik8s["metadata"], &medik8s["spec"]), (&vigil["metadata"], &vigil["spec"]));
        assert_eq!(vigil["spec"]["unhealthyConditions"][0]["duration"], "5s");
    }

    #[test]
    fn the_expressions_are_valid_rules_beside_the_same_conditions() {
        let g = Group { name: "nhc-small-003".into(), kind: Kind::Node, start: 0, end: 50 };
        let plain = node_health_check(&g, NodeChecks::Vigil, 5);
        let with = node_health_check(&g, NodeChecks::VigilWithExpressions, 5);
        assert_eq!(with["spec"]["unhealthyConditions"], plain["spec"]["unhealthyConditions"]);
        let check: vigil_api::NodeHealthCheck = serde_json::from_value(with).expect("check");
        let policy = vigil_api::validate::node_health_check(&check).expect("the expressions compile");
        assert_eq!(policy.expressions.len(), EXPRESSIONS.len());
        let g = Group { name: "mhc-small-003".into(), kind: Kind::Machine, start: 0, end: 50 };
        let with = machine_check(&g, (CheckApi::Vigil, NodeChecks::VigilWithExpressions), 5);
        let check: vigil_api::MachineHealthCheck = serde_json::from_value(with).expect("check");
        let policy = vigil_api::validate::machine_health_check(&check).expect("the expressions compile");
        assert_eq!(policy.expressions.len(), EXPRESSIONS.len());
        let capi = machine_check(&g, (CheckApi::Capi, NodeChecks::VigilWithExpressions), 5);
        assert!(capi["spec"].get("unhealthyExpressions").is_none(), "Cluster API's checks have none");
    }

    #[test]
    fn upstream_machine_health_checks_say_what_vigils_say() {
        let g = Group { name: "mhc-small-007".into(), kind: Kind::Machine, start: 0, end: 50 };
        let vigil = machine_health_check(&g, CheckApi::Vigil, 5);
        let capi = machine_health_check(&g, CheckApi::Capi, 5);
        assert_eq!(capi["apiVersion"], "cluster.x-k8s.io/v1beta2");
        assert_eq!(capi["metadata"], vigil["metadata"]);
        for field in ["clusterName", "selector"] {
            assert_eq!(capi["spec"][field], vigil["spec"][field], "{field}");
        }
        assert_eq!(
            capi["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"],
            vigil["spec"]["maxUnhealthy"]
        );
        assert_eq!(vigil["spec"]["nodeStartupTimeout"], "10m");
        assert_eq!(capi["spec"]["checks"]["nodeStartupTimeoutSeconds"], 600);
        let theirs = capi["spec"]["checks"]["unhealthyNodeConditions"].as_array().expect("conditions");
        let ours = vigil["spec"]["unhealthyConditions"].as_array().expect("conditions");
        assert_eq!(theirs.len(), ours.len());
        for (t, o) in theirs.iter().zip(ours) {
            assert_eq!((&t["type"], &t["status"]), (&o["type"], &o["status"]));
            assert_eq!((t["timeoutSeconds"].clone(), o["timeout"].clone()), (json!(5), json!("5s")));
        }
    }
}
