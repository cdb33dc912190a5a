//! Properties of `node::decide` over random clusters: the threshold and exclusion are never
//! bypassed by new remediation, the plan depends only on the input (not its order), notices are
//! idempotent, and applying plans at one instant settles (what the simulator and controller
//! rely on to stop).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::concerns::remediation_node_name;
use vigil_engine::node::{NhcInput, decide, needs_node};
use vigil_engine::{Action, Plan};

const NS: &str = "medik8s";
const ZONE: &str = "topology.kubernetes.io/zone";

fn zone(z: u8) -> String {
    format!("zone-{z}")
}
const STEPS: [(&str, &str, &str); 2] = [
    ("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediation", "snr"),
    ("fence-agents-remediation.medik8s.io/v1alpha1", "FenceAgentsRemediation", "far"),
];

fn now() -> Timestamp {
    "2030-01-01T03:00:00Z".parse().expect("timestamp")
}

fn ago(secs: i64) -> Timestamp {
    now() - SignedDuration::from_secs(secs)
}

#[derive(Debug, Clone)]
struct Obj {
    step: usize,
    age: i64,
    deleting: bool,
    timed_out: bool,
    failed: bool,
    permanent: bool,
    foreign: bool,
}

#[derive(Debug, Clone)]
struct NodeSpec {
    /// 0 Ready=True, 1 False, 2 Unknown, 3 Unknown without lastTransitionTime.
    ready: u8,
    since: i64,
    excluded: bool,
    control_plane: bool,
    unselected: bool,
    objects: Vec<Obj>,
    /// Failure domain label value (`None`: no label).
    zone: Option<u8>,
}

#[derive(Debug, Clone)]
struct Model {
    nodes: Vec<NodeSpec>,
    vanished: Vec<Obj>,
    min_healthy: bool,
    percent: bool,
    value: u32,
    escalating: bool,
    paused: bool,
    healthy_delay: i64,
    cooldown: bool,
    missing_template: bool,
    generate_name: bool,
    /// `spec.failureDomains` on the zone label: (percent, value, minAllowed).
    domains: Option<(bool, u32, u32)>,
}

fn obj() -> impl Strategy<Value = Obj> {
    (0usize..2, 0i64..2000, prop::bool::weighted(0.1), prop::bool::weighted(0.2), prop::bool::weighted(0.15))
        .prop_flat_map(|(step, age, deleting, timed_out, failed)| {
            (prop::bool::weighted(0.15), prop::bool::weighted(0.1)).prop_map(move |(permanent, foreign)| Obj {
                step,
                age,
                deleting,
                timed_out,
                failed,
                permanent,
                foreign,
            })
        })
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        prop_oneof![4 => Just(0u8), 3 => Just(1u8), 2 => Just(2u8), 1 => Just(3u8)],
        0i64..900,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::collection::vec(obj(), 0..3).prop_map(|v| if v.len() == 2 { v } else { v.into_iter().take(1).collect() }),
        prop::option::weighted(0.85, 0u8..3),
    )
        .prop_map(|(ready, since, excluded, control_plane, unselected, objects, zone)| NodeSpec {
            ready,
            since,
            excluded,
            control_plane,
            unselected,
            objects,
            zone,
        })
}

fn model() -> impl Strategy<Value = Model> {
    (
        prop::collection::vec(node_spec(), 0..24),
        prop::collection::vec(obj(), 0..3),
        (any::<bool>(), any::<bool>(), 0u32..=100),
        (any::<bool>(), prop::bool::weighted(0.2), prop_oneof![Just(-1i64), Just(0i64), Just(120i64)]),
        (any::<bool>(), prop::bool::weighted(0.1), prop::bool::weighted(0.2)),
        prop::option::weighted(0.5, (any::<bool>(), 0u32..=100, 0u32..3)),
    )
        .prop_map(
            |(
                nodes,
                vanished,
                (min_healthy, percent, value),
                (escalating, paused, healthy_delay),
                (cooldown, missing_template, generate_name),
                domains,
            )| Model {
                nodes,
                vanished,
                min_healthy,
                percent,
                value: if percent { value } else { value % 30 },
                escalating,
                paused,
                healthy_delay,
                cooldown,
                missing_template,
                generate_name,
                domains: domains.map(|(percent, value, min)| (percent, if percent { value } else { value % 4 }, min)),
            },
        )
}

fn name(i: usize) -> String {
    format!("n{i:02}")
}

fn template_ref(step: usize) -> Value {
    let (api, kind, name) = STEPS[step];
    json!({"apiVersion": api, "kind": format!("{kind}Template"), "name": name, "namespace": NS})
}

/// What a decision reads, built from a model.
struct World {
    check: NodeHealthCheck,
    nodes: Vec<NodeView>,
    templates: Vec<Option<TemplateView>>,
    objects: Vec<RemediationView>,
}

fn remediation(node: &str, o: &Obj, index: usize) -> RemediationView {
    let (api, kind, template) = STEPS[o.step];
    let name = format!("{node}-{template}-{index}");
    let mut v = json!({
        "apiVersion": api, "kind": kind,
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "creationTimestamp": ago(o.age).to_string(),
            "annotations": {"remediation.medik8s.io/node-name": node, "remediation.medik8s.io/template-name": template},
            "ownerReferences": [{"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
                                 "name": if o.foreign { "someone-else" } else { "nhc" }, "uid": "nhc-uid"}],
        },
        "status": {"conditions": []},
    });
    if o.deleting {
        v["metadata"]["deletionTimestamp"] = json!(ago(1).to_string());
    }
    if o.timed_out {
        v["metadata"]["annotations"]["remediation.medik8s.io/nhc-timed-out"] = json!(ago(o.age / 2).to_string());
    }
    let conds = v["status"]["conditions"].as_array_mut().expect("list");
    if o.failed {
        conds.push(json!({"type": "Succeeded", "status": "False"}));
    }
    if o.permanent {
        conds.push(json!({"type": "PermanentNodeDeletionExpected", "status": "True"}));
    }
    RemediationView::read(&v).expect("named")
}

fn build(m: &Model) -> World {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "healthyDelay": format!("{}s", m.healthy_delay),
        "stormCooldownDuration": if m.cooldown { "10m" } else { "0s" },
    });
    let threshold = if m.percent { json!(format!("{}%", m.value)) } else { json!(m.value) };
    spec[if m.min_healthy { "minHealthy" } else { "maxUnhealthy" }] = threshold;
    if m.escalating {
        spec["escalatingRemediations"] = json!([
            {"remediationTemplate": template_ref(0), "order": 0, "timeout": "5m"},
            {"remediationTemplate": template_ref(1), "order": 1, "timeout": "5m"},
        ]);
    } else {
        spec["remediationTemplate"] = template_ref(0);
    }
    if m.paused {
        spec["pauseRequests"] = json!(["test"]);
    }
    if let Some((percent, value, min)) = m.domains {
        let max = if percent { json!(format!("{value}%")) } else { json!(value) };
        spec["failureDomains"] = json!({"key": ZONE, "maxUnhealthy": max, "minAllowed": min});
    }
    let check: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
        "spec": spec,
    }))
    .expect("check");
    let steps = if m.escalating { 2 } else { 1 };
    let templates = (0..steps)
        .map(|i| {
            if m.missing_template && i == steps - 1 {
                return None;
            }
            let (api, kind, name) = STEPS[i];
            let mut annotations = json!({});
            if m.generate_name {
                annotations["remediation.medik8s.io/multiple-templates-support"] = json!("true");
            }
            TemplateView::read(&json!({
                "apiVersion": api, "kind": format!("{kind}Template"),
                "metadata": {"name": name, "namespace": NS, "annotations": annotations},
                "spec": {"template": {"spec": {"step": i}}}
            }))
        })
        .collect();
    let mut nodes = Vec::new();
    let mut objects = Vec::new();
    for (i, n) in m.nodes.iter().enumerate() {
        let node_name = name(i);
        let mut v = json!({"metadata": {"name": node_name, "labels": {}}, "status": {"conditions": []}});
        if n.excluded {
            v["metadata"]["labels"]["remediation.medik8s.io/exclude-from-remediation"] = json!("true");
        }
        if n.control_plane {
            v["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("");
        }
        if n.unselected {
            v["metadata"]["labels"]["skip"] = json!("y");
        }
        if let Some(z) = n.zone {
            v["metadata"]["labels"][ZONE] = json!(zone(z));
        }
        let status = ["True", "False", "Unknown", "Unknown"][usize::from(n.ready)];
        let mut c = json!({"type": "Ready", "status": status});
        if n.ready != 3 {
            c["lastTransitionTime"] = json!(ago(n.since).to_string());
        }
        v["status"]["conditions"] = json!([c]);
        nodes.push(NodeView::from(serde_json::from_value::<Node>(v).expect("node")));
        for (k, o) in n.objects.iter().enumerate() {
            objects.push(remediation(&node_name, o, k));
        }
    }
    for (k, o) in m.vanished.iter().enumerate() {
        objects.push(remediation("gone", o, k));
    }
    World { check, nodes, templates, objects }
}

impl World {
    fn decide_ordered(&self, now: Timestamp, reverse: bool) -> Plan<NodeHealthCheckStatus> {
        let policy = vigil_api::validate::node_health_check(&self.check).expect("valid spec");
        let mut nodes: Vec<&NodeView> = self.nodes.iter().collect();
        let templates: Vec<Option<&TemplateView>> = self.templates.iter().map(Option::as_ref).collect();
        let mut remediations: Vec<&RemediationView> = self.objects.iter().collect();
        if reverse {
            nodes.reverse();
            remediations.reverse();
        }
        let input = NhcInput {
            check: &self.check,
            policy: &policy,
            nodes: &nodes,
            templates: &templates,
            remediations: &remediations,
            around: Default::default(),
        };
        decide(&input, now)
    }

    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        self.decide_ordered(now, false)
    }

    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, .. } => {
                    let mut o = object.clone();
                    // Whatever the template: never a server-generated name (a late create of the
                    // same step must meet the object it would duplicate).
                    assert!(
                        o["metadata"].get("generateName").is_none() && o["metadata"]["name"].is_string(),
                        "a create without a name of its own: {o}"
                    );
                    let n = o["metadata"]["name"].as_str().expect("name").to_string();
                    o["metadata"]["uid"] = json!(format!("uid-new-{n}"));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    let view = RemediationView::read(&o).expect("named");
                    if !self.objects.iter().any(|x| x.meta.key() == view.meta.key() && x.meta.kind == view.meta.kind) {
                        self.objects.push(view);
                    }
                }
                Action::DeleteRemediation { object, .. } => self.objects.retain(|x| {
                    !(x.meta.kind == object.kind && x.meta.namespace == object.namespace && x.meta.name == object.name)
                }),
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in self.objects.iter_mut().filter(|x| {
                        x.meta.kind == object.kind && x.meta.namespace == object.namespace && x.meta.name == object.name
                    }) {
                        x.meta.annotations.insert(key.clone(), value.clone());
                    }
                }
                Action::SetMachineConditions { .. } => panic!("not a NodeHealthCheck action"),
                // This world keeps no Leases: every Node's Lease is free.
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
            }
        }
        self.check.status = Some(plan.status.clone());
    }
}

/// Whether a node is unhealthy by the default rules (Ready False/Unknown held more than 300s).
fn oracle_unhealthy(n: &NodeSpec) -> bool {
    matches!(n.ready, 1 | 2) && n.since > 300
}

/// The oracle's failure domains: `zone -> (targets, not healthy, allowed)` (a target is healthy
/// when Ready=True and without an object of the check; a percentage rounds up, as the check's).
fn oracle_domains(m: &Model) -> BTreeMap<String, (u64, u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let Some((percent, value, min)) = m.domains else { return out };
    for n in m.nodes.iter().filter(|n| !n.unselected) {
        if let Some(z) = n.zone {
            let e = out.entry(zone(z)).or_default();
            e.0 += 1;
            e.1 += u64::from(n.ready != 0 || n.objects.iter().any(|o| !o.foreign));
        }
    }
    for e in out.values_mut() {
        let scaled = if percent { (e.0 * u64::from(value)).div_ceil(100) } else { u64::from(value) };
        e.2 = scaled.max(u64::from(min));
    }
    out
}

fn creates(plan: &Plan<NodeHealthCheckStatus>) -> Vec<&str> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { target, .. } => Some(target.name()),
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// (a) New remediation never bypasses the threshold, pause or exclusion, and goes only to
    /// selected unhealthy nodes; at most one control-plane node starts, and none while another
    /// control-plane node has a remediation object.
    #[test]
    fn new_remediation_respects_threshold_pause_and_exclusion(m in model()) {
        let w = build(&m);
        let plan = w.decide(now());
        let targets: Vec<(usize, &NodeSpec)> = m.nodes.iter().enumerate().filter(|(_, n)| !n.unselected).collect();
        let has_own = |n: &NodeSpec| n.objects.iter().any(|o| !o.foreign);
        let observed = targets.len() as u64;
        let healthy = targets.iter().filter(|(_, n)| n.ready == 0 && !has_own(n)).count() as u64;
        let scaled = |round_up: bool| {
            if m.percent {
                let p = observed * u64::from(m.value);
                if round_up { p.div_ceil(100) } else { p / 100 }
            } else {
                u64::from(m.value)
            }
        };
        // medik8s rounds both thresholds up
        let met = if m.min_healthy { healthy >= scaled(true) } else { observed - healthy <= scaled(true) };

        let created = creates(&plan);
        let first: Vec<&str> = created
            .iter()
            .copied()
            .filter(|t| m.nodes.iter().enumerate().any(|(i, n)| name(i) == *t && !has_own(n)))
            .collect();
        if !met || m.paused {
            prop_assert!(first.is_empty(), "met={} paused={} first={:?}", met, m.paused, first);
        }
        let startable = targets.iter().filter(|(_, n)| oracle_unhealthy(n) && !n.excluded && !has_own(n)).count();
        prop_assert!(first.len() <= startable);
        for t in &created {
            let (i, n) = m.nodes.iter().enumerate().find(|(i, _)| name(*i) == *t).expect("a create targets a known node");
            prop_assert!(!n.excluded, "excluded node {} got an object", name(i));
            prop_assert!(!n.unselected, "unselected node {} got an object", name(i));
            prop_assert!(oracle_unhealthy(n), "node {} is not unhealthy: {:?}", name(i), n);
        }
        let cp_first: Vec<&str> = first
            .iter()
            .copied()
            .filter(|t| m.nodes.iter().enumerate().any(|(i, n)| name(i) == *t && n.control_plane))
            .collect();
        prop_assert!(cp_first.len() <= 1, "{:?}", cp_first);
        for t in &cp_first {
            let other_busy = m.nodes.iter().enumerate().any(|(i, n)| name(i) != *t && n.control_plane && !n.objects.is_empty());
            prop_assert!(!other_busy, "{} started while another control-plane node has an object", t);
        }
        let unique: BTreeSet<&str> = first.iter().copied().collect();
        prop_assert_eq!(unique.len(), first.len(), "one first object per node");
    }

    /// Failure domains: the status lists every domain with the oracle's counts and allowance
    /// (`max(maxUnhealthy of the domain's targets rounded up, minAllowed)`), and the invariant:
    /// when a domain's not-healthy count exceeds its allowance, no new remediation starts in it
    /// (an escalation of a Node that already has an object of the check is not new). The model
    /// has no previous status, so every other create is a new start.
    #[test]
    fn no_new_remediation_in_a_paused_failure_domain(m in model()) {
        let plan = build(&m).decide(now());
        let oracle = oracle_domains(&m);
        let listed: BTreeMap<String, (u64, u64, u64, bool)> = plan
            .status
            .features.failure_domains
            .iter()
            .map(|d| (d.name.clone(), (d.targets as u64, d.unhealthy as u64, d.allowed as u64, d.paused)))
            .collect();
        let expected: BTreeMap<String, (u64, u64, u64, bool)> =
            oracle.iter().map(|(z, (t, u, a))| (z.clone(), (*t, *u, *a, u > a))).collect();
        prop_assert_eq!(&listed, &expected);
        prop_assert_eq!(
            plan.status.conditions.iter().any(|c| c.type_ == "FailureDomainsHealthy"),
            m.domains.is_some()
        );
        for t in creates(&plan) {
            let (_, n) = m.nodes.iter().enumerate().find(|(i, _)| name(*i) == t).expect("a known node");
            if n.objects.iter().any(|o| !o.foreign) {
                continue; // escalation of a remediation already started
            }
            if let Some(z) = n.zone.filter(|_| m.domains.is_some()) {
                let (_, unhealthy, allowed) = oracle[&zone(z)];
                prop_assert!(unhealthy <= allowed, "{} started in paused {} ({} > {})", t, zone(z), unhealthy, allowed);
            }
        }
    }

    /// (b) The same input gives the same plan, whatever the order of Nodes and objects.
    #[test]
    fn same_input_same_plan(m in model(), earlier in 0i64..1200) {
        let mut w = build(&m);
        let prev = w.decide(ago(earlier));
        w.check.status = Some(prev.status);
        let a = w.decide(now());
        let b = w.decide(now());
        prop_assert_eq!(&a, &b);
        let c = w.decide_ordered(now(), true);
        prop_assert_eq!(&a, &c);
    }

    /// (b') An adapter may hand over only the Nodes the check needs (those it selects, the
    /// control-plane ones, those a remediation object names): the plan is the same as with every
    /// Node of the cluster.
    #[test]
    fn the_nodes_a_check_needs_are_enough(m in model(), earlier in 0i64..1200) {
        let mut w = build(&m);
        let prev = w.decide(ago(earlier));
        w.check.status = Some(prev.status);
        let all = w.decide(now());
        let policy = vigil_api::validate::node_health_check(&w.check).expect("valid spec");
        let named: BTreeSet<&str> = w.objects.iter().map(|o| remediation_node_name(&o.meta)).collect();
        let needed: Vec<NodeView> = w
            .nodes
            .iter()
            .filter(|n| needs_node(&policy, n) || named.contains(n.name.as_str()))
            .cloned()
            .collect();
        let left_out = w.nodes.len() - needed.len();
        w.nodes = needed;
        let some = w.decide(now());
        prop_assert_eq!(&all, &some, "{} Nodes left out", left_out);
    }

    /// (c) Applying nothing and deciding again with the plan's status tells nothing new, and the
    /// status stays as it is (no write).
    #[test]
    fn notices_are_idempotent(m in model(), earlier in 0i64..1200) {
        let mut w = build(&m);
        let prev = w.decide(ago(earlier));
        w.check.status = Some(prev.status);
        let first = w.decide(now());
        w.check.status = Some(first.status.clone());
        let second = w.decide(now());
        prop_assert_eq!(&second.notices, &vec![]);
        prop_assert_eq!(&second.status, &first.status);
    }

    /// (d) The plan never asks to be woken in the past, and applying plans at one instant settles
    /// within a few rounds (no actions, no status change).
    #[test]
    fn applying_plans_settles(m in model()) {
        let mut w = build(&m);
        let mut settled = false;
        for _ in 0..6 {
            let plan = w.decide(now());
            if let Some(t) = plan.next_wake {
                prop_assert!(t > now(), "wake {} is not after now", t);
            }
            let unchanged = w.check.status.as_ref() == Some(&plan.status);
            if plan.actions.is_empty() && unchanged {
                settled = true;
                break;
            }
            w.apply(&plan, now());
        }
        prop_assert!(settled, "still changing after 6 rounds");
    }

    /// Dry-run shadows the real plan: no action at all (nothing created, deleted or annotated),
    /// exactly the Nodes the real plan would start remediating in `status.wouldRemediate`, the
    /// same counts and `RemediationAllowed`, and applying it settles at once.
    #[test]
    fn dry_run_shadows_the_real_plan(m in model()) {
        let real = build(&m).decide(now());
        let mut w = build(&m);
        let mut check = serde_json::to_value(&w.check).expect("check");
        check["spec"]["dryRun"] = json!(true);
        w.check = serde_json::from_value(check).expect("check");
        let dry = w.decide(now());
        prop_assert_eq!(&dry.actions, &vec![]);
        let would: BTreeSet<&str> = dry.status.features.would_remediate.iter().map(|x| x.name.as_str()).collect();
        let real_creates: BTreeSet<&str> = creates(&real).into_iter().collect();
        prop_assert_eq!(would, real_creates);
        prop_assert_eq!((dry.status.observed_nodes, dry.status.healthy_nodes), (real.status.observed_nodes, real.status.healthy_nodes));
        let allowed = |p: &Plan<NodeHealthCheckStatus>| p.status.conditions.iter().find(|c| c.type_ == "RemediationAllowed").map(|c| (c.status.clone(), c.reason.clone()));
        prop_assert_eq!(allowed(&dry), allowed(&real));
        w.apply(&dry, now());
        let again = w.decide(now());
        prop_assert_eq!(&again.actions, &vec![]);
        prop_assert_eq!(&again.notices, &vec![]);
        prop_assert_eq!(&again.status, &dry.status);
    }
}
