//! Voluntary disruptions in the budget (`spec.voluntaryDisruptions: Count`), as tables: which
//! signal takes a target out of the budget, that the threshold, the failure-domain budgets and
//! `maxInFlight` each count them, that a target counts once, that `Ignore` (the default) counts
//! health alone, and what is reported; then the property over random fleets: remediation plus
//! disruption never exceeds the budget, and the same input gives the same plan.

mod support;

use proptest::prelude::*;
use serde_json::{Value, json};
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::{MaintenanceView, NodeView, TemplateView};
use vigil_engine::lookup::Observed;
use vigil_engine::node::{self, Around, NhcInput};
use vigil_engine::plan::Plan;

const SNR_NS: &str = "medik8s";
const ZONE: &str = "topology.kubernetes.io/zone";
const AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";
const KARPENTER: &str = "karpenter.sh/disrupted";
const KARPENTER_V1BETA1: &str = "karpenter.sh/disruption";
const KURED: &str = "weave.works/kured-reboot-in-progress";
const DRAIN: &str = "medik8s.io/drain";

fn nhc_spec(extra: Value) -> Value {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": SNR_NS},
        // leave planned maintenance out of the way: these tables are about the budget
        "plannedMaintenance": {"enabled": false},
    });
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    spec
}

fn decide_nhc(spec: &Value, nodes: &[NodeView], maintenances: &[MaintenanceView]) -> Plan<NodeHealthCheckStatus> {
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
        "spec": spec,
    }))
    .expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let template = TemplateView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": SNR_NS},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template");
    let maintenance_refs: Vec<&MaintenanceView> = maintenances.iter().collect();
    let around = Around { maintenances: Observed::Known(&maintenance_refs), ..Around::default() };
    node::decide(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &[Some(&template)],
            remediations: &[],
            around,
        },
        at(400),
    )
}

/// A Node Ready=False since T0 (past every timeout at 400 s) when `sick`, else Ready.
fn n(name: &str, sick: bool) -> NodeBuilder {
    node(name).ready(if sick { "False" } else { "True" }, t0())
}

fn maintenance(node_name: &str) -> MaintenanceView {
    MaintenanceView::read(&json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": format!("nm-{node_name}")},
        "spec": {"nodeName": node_name, "reason": "firmware"}
    }))
    .expect("a NodeMaintenance")
}

/// `signal N` of a status list.
fn counted(list: &[vigil_api::shared::DisruptionCount]) -> Vec<String> {
    list.iter().map(|d| format!("{} {}", d.signal, d.targets)).collect()
}

fn allowed_condition(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> (String, String) {
    let c = check_condition(conditions, "RemediationAllowed").expect("RemediationAllowed");
    (c.status.clone(), c.message.clone())
}

struct NhcRow {
    what: &'static str,
    spec: Value,
    nodes: Vec<NodeBuilder>,
    maintained: Vec<&'static str>,
    created: Vec<&'static str>,
    counted: Vec<&'static str>,
}

#[test]
fn a_node_health_check_counts_nodes_taken_down_on_purpose_only_when_asked() {
    let count = |extra: Value| {
        let mut v = json!({"voluntaryDisruptions": "Count"});
        if let (Some(o), Value::Object(extra)) = (v.as_object_mut(), extra) {
            o.extend(extra);
        }
        nhc_spec(v)
    };
    let rows = vec![
        NhcRow {
            what: "Ignore (the default): a Node the autoscaler removes counts healthy, the sick Node is remediated",
            spec: nhc_spec(json!({"maxUnhealthy": 1})),
            nodes: vec![n("a", true), n("b", false).taint(AUTOSCALER), n("c", false), n("d", false)],
            maintained: vec![],
            created: vec!["a"],
            counted: vec![],
        },
        NhcRow {
            what: "Count: the sick Node and the one the autoscaler removes are two, over maxUnhealthy 1",
            spec: count(json!({"maxUnhealthy": 1})),
            nodes: vec![n("a", true), n("b", false).taint(AUTOSCALER), n("c", false), n("d", false)],
            maintained: vec![],
            created: vec![],
            counted: vec!["ClusterAutoscaler 1"],
        },
        NhcRow {
            what: "Count: two are within maxUnhealthy 2",
            spec: count(json!({"maxUnhealthy": 2})),
            nodes: vec![n("a", true), n("b", false).taint(AUTOSCALER), n("c", false), n("d", false)],
            maintained: vec![],
            created: vec!["a"],
            counted: vec!["ClusterAutoscaler 1"],
        },
        NhcRow {
            what: "Count with minHealthy: 75% of 4 needs 3 available; one sick and one rebooted by kured leave 2",
            spec: count(json!({"minHealthy": "75%"})),
            nodes: vec![
                n("a", true),
                n("b", false).cordoned().annotation(KURED, "2026-12-03T00:00:00Z"),
                n("c", false),
                n("d", false),
            ],
            maintained: vec![],
            created: vec![],
            counted: vec!["Kured 1"],
        },
        NhcRow {
            what: "every signal is read, each Node counted once under its first",
            spec: count(json!({"maxUnhealthy": "100%"})),
            nodes: vec![
                n("a", true),
                n("b", false).taint(AUTOSCALER).taint(KARPENTER),
                n("c", false).taint(KARPENTER),
                n("d", false).taint(KARPENTER_V1BETA1),
                n("e", false).cordoned().annotation(KURED, "2026-12-03T00:00:00Z"),
                n("f", false).cordoned().taint(DRAIN),
                n("g", false),
                n("h", false).deleting(),
                n("i", false),
            ],
            maintained: vec!["g"],
            created: vec!["a"],
            counted: vec!["Deleting 1", "ClusterAutoscaler 1", "Karpenter 2", "Kured 1", "NodeMaintenance 2"],
        },
        NhcRow {
            what: "a cordon alone, or kured's annotation or the drain taint without a cordon, is no signal",
            spec: count(json!({"maxUnhealthy": 1})),
            nodes: vec![
                n("a", true),
                n("b", false).cordoned(),
                n("c", false).annotation(KURED, "2026-12-03T00:00:00Z"),
                n("d", false).taint(DRAIN),
            ],
            maintained: vec![],
            created: vec!["a"],
            counted: vec![],
        },
        NhcRow {
            what: "a sick Node the autoscaler also removes counts once, as not healthy",
            spec: count(json!({"maxUnhealthy": 1})),
            nodes: vec![n("a", true).taint(AUTOSCALER), n("b", false), n("c", false)],
            maintained: vec![],
            created: vec!["a"],
            counted: vec![],
        },
    ];
    for row in rows {
        let nodes: Vec<NodeView> = row.nodes.iter().map(NodeBuilder::build).collect();
        let maintained: Vec<MaintenanceView> = row.maintained.iter().map(|m| maintenance(m)).collect();
        let plan = decide_nhc(&row.spec, &nodes, &maintained);
        assert_eq!(created_names(&plan), row.created, "{}", row.what);
        assert_eq!(counted(&plan.status.features.disruptions), row.counted, "{}", row.what);
        // the status' healthy count is health alone
        let healthy = row.nodes.iter().zip(&nodes).filter(|(_, v)| v.conditions.iter().all(|c| &*c.status == "True"));
        assert_eq!(plan.status.healthy_nodes as usize, healthy.count(), "{}", row.what);
    }
}

#[test]
fn a_node_health_check_says_why_the_budget_is_spent() {
    let spec = nhc_spec(json!({"maxUnhealthy": 1, "voluntaryDisruptions": "Count"}));
    let nodes: Vec<NodeView> = [n("a", true), n("b", false).taint(KARPENTER), n("c", false), n("d", false)]
        .iter()
        .map(NodeBuilder::build)
        .collect();
    let plan = decide_nhc(&spec, &nodes, &[]);
    let (status, message) = allowed_condition(&plan.status.conditions);
    assert_eq!(status, "False");
    assert_eq!(
        message,
        "4 nodes observed, 3 healthy, 1 not healthy; 1 taken down on purpose (Karpenter 1), leaving 2 available; maxUnhealthy 1 (allows 1 unhealthy)"
    );
    assert!(plan.short_circuited, "the plan says the short-circuit stopped remediation");
}

#[test]
fn a_failure_domain_counts_its_nodes_taken_down_on_purpose() {
    let domains = json!({"key": ZONE, "maxUnhealthy": 1, "minAllowed": 0});
    let nodes: Vec<NodeView> = [
        n("a-1", true).label(ZONE, "zone-a"),
        n("a-2", false).label(ZONE, "zone-a").taint(AUTOSCALER),
        n("a-3", false).label(ZONE, "zone-a"),
        n("b-1", true).label(ZONE, "zone-b"),
        n("b-2", false).label(ZONE, "zone-b"),
    ]
    .iter()
    .map(NodeBuilder::build)
    .collect();
    let ignore = nhc_spec(json!({"maxUnhealthy": "100%", "failureDomains": domains}));
    assert_eq!(created_names(&decide_nhc(&ignore, &nodes, &[])), ["a-1", "b-1"]);
    let count = nhc_spec(json!({"maxUnhealthy": "100%", "failureDomains": domains, "voluntaryDisruptions": "Count"}));
    let plan = decide_nhc(&count, &nodes, &[]);
    assert_eq!(created_names(&plan), ["b-1"], "zone-a has one sick and one removed: over its budget of 1");
    let a = plan.status.features.failure_domains.iter().find(|d| d.name == "zone-a").expect("zone-a");
    assert_eq!((a.unhealthy, a.targets, a.paused), (2, 3, true));
}

#[test]
fn a_node_taken_down_on_purpose_holds_a_remediation_slot() {
    let nodes: Vec<NodeView> = [n("a", true), n("b", true), n("c", false).taint(KARPENTER), n("d", false)]
        .iter()
        .map(NodeBuilder::build)
        .collect();
    let ignore = nhc_spec(json!({"maxUnhealthy": "100%", "maxInFlight": 2}));
    assert_eq!(created_names(&decide_nhc(&ignore, &nodes, &[])), ["a", "b"]);
    let count = nhc_spec(json!({"maxUnhealthy": "100%", "maxInFlight": 2, "voluntaryDisruptions": "Count"}));
    let plan = decide_nhc(&count, &nodes, &[]);
    assert_eq!(created_names(&plan), ["a"], "c holds one of the two slots");
    assert_eq!(plan.status.features.queued_count, 1);
    let queued = check_condition(&plan.status.conditions, "RemediationQueued").expect("RemediationQueued");
    assert!(
        queued.message.contains("2 of 2 in flight (maxInFlight 2, 1 of them taken down on purpose)"),
        "{}",
        queued.message
    );
    // a sick Node that is also removed holds one slot, not two
    let nodes: Vec<NodeView> =
        [n("a", true).taint(KARPENTER), n("b", true), n("d", false)].iter().map(NodeBuilder::build).collect();
    assert_eq!(created_names(&decide_nhc(&count, &nodes, &[])), ["a", "b"]);
}

// ----------------------------------------------------------------------------------------------
// MachineHealthCheck
// ----------------------------------------------------------------------------------------------

/// Machines m1..m4 with Nodes of the same name: m1's Node Ready=False since T0, m2's Node built
/// by `second` (Ready), m3 and m4 healthy.
fn machines(w: MhcWorld, second: NodeBuilder) -> MhcWorld {
    w.machine_with_node(machine("m1"), "False", t0())
        .machine(machine("m2").node("m2"))
        .node(second)
        .machine_with_node(machine("m3"), "True", t0())
        .machine_with_node(machine("m4"), "True", t0())
}

#[test]
fn a_machine_health_check_counts_machines_taken_down_on_purpose_only_when_asked() {
    let karpenter = node("m2").ready("True", t0()).taint(KARPENTER);
    let ignore = machines(MhcWorld::new().spec("maxUnhealthy", json!(1)), karpenter.clone());
    let plan = ignore.decide(at(301));
    assert_eq!(owner_asked(&plan), ["m1"]);
    assert!(plan.status.features.disruptions.is_empty());

    let count = machines(
        MhcWorld::new().spec("maxUnhealthy", json!(1)).spec("voluntaryDisruptions", json!("Count")),
        karpenter.clone(),
    );
    let plan = count.decide(at(301));
    assert_eq!(owner_asked(&plan), Vec::<String>::new(), "m1 and m2 are two, over maxUnhealthy 1");
    assert_eq!(counted(&plan.status.features.disruptions), ["Karpenter 1"]);
    assert_eq!(plan.status.current_healthy, 3, "currentHealthy is health alone");
    assert_eq!(plan.status.remediations_allowed, 0);
    let c = check_condition(&plan.status.conditions, "RemediationAllowed").expect("RemediationAllowed");
    assert!(
        c.message.ends_with("(total: 4, unhealthy: 2, maxUnhealthy: 1; 1 taken down on purpose (Karpenter 1))"),
        "{}",
        c.message
    );
    // m1 is still marked unhealthy: only the request waits
    assert_eq!(written(&plan, "m1", "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()), Some("False"));

    let roomy = machines(
        MhcWorld::new().spec("maxUnhealthy", json!(2)).spec("voluntaryDisruptions", json!("Count")),
        karpenter,
    );
    assert_eq!(owner_asked(&roomy.decide(at(301))), ["m1"]);
}

#[test]
fn a_machine_being_deleted_is_out_of_the_budget_either_way_and_counted_when_asked() {
    let deleting = |w: MhcWorld| {
        let mut w = machines(w, node("m2").ready("True", t0()));
        w.edit_machine("m2", |m| set_pointer(m, "/metadata/deletionTimestamp", json!("2020-01-01T00:00:00Z")));
        w
    };
    let ignore = deleting(MhcWorld::new().spec("maxUnhealthy", json!(1)));
    assert_eq!(
        owner_asked(&ignore.decide(at(301))),
        Vec::<String>::new(),
        "as Cluster API: a deleting Machine is not healthy"
    );
    let count = deleting(MhcWorld::new().spec("maxUnhealthy", json!(2)).spec("voluntaryDisruptions", json!("Count")));
    let plan = count.decide(at(301));
    assert_eq!(owner_asked(&plan), ["m1"]);
    assert_eq!(counted(&plan.status.features.disruptions), ["Deleting 1"]);
}

#[test]
fn a_machine_whose_node_is_removed_holds_a_remediation_slot() {
    let removed = node("m2").ready("True", t0()).taint(AUTOSCALER);
    let w = |count: bool| {
        let mut w = MhcWorld::new().spec("maxInFlight", json!(1));
        if count {
            w = w.spec("voluntaryDisruptions", json!("Count"));
        }
        machines(w, removed.clone())
    };
    assert_eq!(owner_asked(&w(false).decide(at(301))), ["m1"]);
    let plan = w(true).decide(at(301));
    assert_eq!(owner_asked(&plan), Vec::<String>::new(), "m2's Node holds the only slot");
    assert_eq!(plan.status.features.queued.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(), ["m1"]);
}

// ----------------------------------------------------------------------------------------------
// Property: remediation plus disruption never exceeds the budget
// ----------------------------------------------------------------------------------------------

/// What a random target carries: sick or not, and a signal (0: none; 1 autoscaler; 2 Karpenter;
/// 3 kured; 4 being deleted).
fn random_targets() -> impl Strategy<Value = Vec<(bool, u8)>> {
    prop::collection::vec((any::<bool>(), 0u8..5), 1..12)
}

fn with_signal(b: NodeBuilder, signal: u8) -> NodeBuilder {
    match signal {
        1 => b.taint(AUTOSCALER),
        2 => b.taint(KARPENTER),
        3 => b.cordoned().annotation(KURED, "2026-12-03T00:00:00Z"),
        4 => b.deleting(),
        _ => b,
    }
}

/// The property, given what the targets carry, how many started and the status' counts: when
/// anything starts, the targets not healthy plus the healthy ones taken down on purpose are within
/// `maxUnhealthy`, and what starts plus those are within `maxInFlight`; the status counts exactly
/// the targets taken down on purpose.
fn within_budget(
    targets: &[(bool, u8)],
    started: usize,
    counted: &[vigil_api::shared::DisruptionCount],
    (max_unhealthy, max_in_flight): (u32, Option<u32>),
) -> Result<(), TestCaseError> {
    let sick = targets.iter().filter(|(s, _)| *s).count();
    let disrupted = targets.iter().filter(|(s, signal)| !*s && *signal != 0).count();
    if started > 0 {
        prop_assert!(
            sick + disrupted <= max_unhealthy as usize,
            "{sick} sick + {disrupted} disrupted > {max_unhealthy}"
        );
        if let Some(m) = max_in_flight {
            prop_assert!(started + disrupted <= m as usize, "{started} started + {disrupted} disrupted > {m}");
        }
    }
    let total: i32 = counted.iter().map(|d| d.targets).sum();
    prop_assert_eq!(total as usize, disrupted);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// NodeHealthCheck with `voluntaryDisruptions: Count`: when anything starts, the Nodes not
    /// healthy plus the healthy ones taken down on purpose are within `maxUnhealthy`, and what
    /// starts plus those are within `maxInFlight`; the same input gives the same plan.
    #[test]
    fn node_remediation_plus_disruption_stays_within_the_budget(
        targets in random_targets(),
        max_unhealthy in 0u32..12,
        max_in_flight in prop::option::of(1u32..6),
    ) {
        let mut extra = json!({"maxUnhealthy": max_unhealthy, "voluntaryDisruptions": "Count"});
        if let Some(m) = max_in_flight {
            extra["maxInFlight"] = json!(m);
        }
        let spec = nhc_spec(extra);
        let nodes: Vec<NodeView> = targets
            .iter()
            .enumerate()
            .map(|(i, (sick, signal))| with_signal(n(&format!("n{i:02}"), *sick), *signal).build())
            .collect();
        let plan = decide_nhc(&spec, &nodes, &[]);
        within_budget(&targets, created_names(&plan).len(), &plan.status.features.disruptions, (max_unhealthy, max_in_flight))?;
        prop_assert_eq!(format!("{:?}", decide_nhc(&spec, &nodes, &[])), format!("{plan:?}"));
    }

    /// MachineHealthCheck with `voluntaryDisruptions: Count`: the same bounds, the Machines asked
    /// for remediation standing for what starts.
    #[test]
    fn machine_remediation_plus_disruption_stays_within_the_budget(
        targets in random_targets(),
        max_unhealthy in 0u32..12,
        max_in_flight in prop::option::of(1u32..6),
    ) {
        let mut w = MhcWorld::new().spec("maxUnhealthy", json!(max_unhealthy)).spec("voluntaryDisruptions", json!("Count"));
        if let Some(m) = max_in_flight {
            w = w.spec("maxInFlight", json!(m));
        }
        for (i, (sick, signal)) in targets.iter().enumerate() {
            let name = format!("m{i:02}");
            let node_signal = if *signal == 4 { 0 } else { *signal };
            w = w.machine(machine(&name).node(&name)).node(with_signal(node(&name).ready(if *sick { "False" } else { "True" }, t0()), node_signal));
            if *signal == 4 {
                w.edit_machine(&name, |m| set_pointer(m, "/metadata/deletionTimestamp", json!("2020-01-01T00:00:00Z")));
            }
        }
        let plan = w.decide(at(301));
        within_budget(&targets, owner_asked(&plan).len(), &plan.status.features.disruptions, (max_unhealthy, max_in_flight))?;
        prop_assert_eq!(format!("{:?}", w.decide(at(301))), format!("{plan:?}"));
    }
}
