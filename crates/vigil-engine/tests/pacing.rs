//! Pacing (`spec.maxInFlight`) rules, as tables: at most N remediations in flight, the others
//! queued in the order they became unhealthy; what counts as in flight for each kind (derived
//! from the objects, so a restart loses nothing; this check's only); percentages; how it meets
//! the short-circuit, the back-off, escalation, dry-run and pause; what is reported. The
//! properties over random event sequences are in `pacing_props.rs`.

mod support;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use std::collections::HashMap;
use support::*;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::shared::QueuedTarget;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::NodeView;
use vigil_api::views::{ClusterView, MachineView, RemediationView, TemplateView};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_engine::holders::{Holders, LOCAL_CLUSTER};
use vigil_engine::lookup::Lookup;
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::pacing::CONDITION;
use vigil_engine::peers::{MhcPeer, MhcPeers};
use vigil_engine::plan::{NoticeKind, Plan};

/// Machines asked for remediation by the plan (owner or external), sorted.
fn started(plan: &Plan<MachineHealthCheckStatus>) -> Vec<String> {
    let mut out: Vec<String> = machine_writes(plan)
        .into_iter()
        .filter(|(_, w)| {
            w.iter().any(|(t, s, _)| (t == "OwnerRemediated" || t == "ExternallyRemediated") && s == "False")
        })
        .map(|(name, _)| name)
        .chain(created_names(plan))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The queue as `(name, unhealthySince, position)`.
fn queue(list: &[QueuedTarget]) -> Vec<(String, Timestamp, i32)> {
    list.iter().map(|q| (q.name.clone(), q.unhealthy_since.0, q.position)).collect()
}

fn q(name: &str, since: Timestamp, position: i32) -> (String, Timestamp, i32) {
    (name.to_string(), since, position)
}

/// Targets of a plan's notices of `kind`, in order.
fn told<S>(plan: &Plan<S>, kind: NoticeKind) -> Vec<String> {
    plan.notices.iter().filter(|n| n.kind == kind).filter_map(|n| n.target_key()).collect()
}

fn queued_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    check_condition(conditions, CONDITION).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// A MachineHealthCheck world with `maxInFlight` and Machines whose Nodes went `Ready=False` at
/// the given seconds from T0 (the 300s timeout has passed for all of them at 1000s).
fn wave(max: Value, failed_at: &[(&str, i64)]) -> MhcWorld {
    let mut w = MhcWorld::new().spec("maxInFlight", max);
    for (name, secs) in failed_at {
        w = w.machine_with_node(machine(name), "False", at(*secs));
    }
    w
}

/// The owner replaces a marked Machine: it is deleted (gone from the world).
fn remove_machine(w: &mut MhcWorld, name: &str) {
    w.machines.retain(|m| m.pointer("/metadata/name").and_then(Value::as_str) != Some(name));
    w.nodes.remove(name);
}

// ----------------------------------------------------------------------------------------------
// MachineHealthCheck
// ----------------------------------------------------------------------------------------------

// Over 80 lines on purpose: one wave followed decision by decision (start, settle, a slot frees,
// a tie), each step asserted where it happens.
#[test]
fn a_wave_starts_the_longest_unhealthy_within_max_in_flight_and_queues_the_rest_in_order() {
    let failed = [("m1", 50), ("m2", 10), ("m3", 30), ("m4", 0), ("m5", 40), ("m6", 40)];
    let mut w = wave(json!(2), &failed);
    let first = w.decide(at(1000));
    assert_eq!(started(&first), ["m2", "m4"], "the two longest-unhealthy");
    for (name, _) in failed {
        assert_eq!(
            written(&first, name, "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()),
            Some("False"),
            "{name}: the verdict is written whether or not it waits"
        );
    }
    let want = vec![q("m3", at(30), 1), q("m5", at(40), 2), q("m6", at(40), 3), q("m1", at(50), 4)];
    assert_eq!(queue(&first.status.features.queued), want, "oldest first, a tie by name");
    assert_eq!(first.status.features.queued_count, 4);
    assert_eq!(told(&first, NoticeKind::RemediationQueued), [key("m3"), key("m5"), key("m6"), key("m1")]);
    let (status, reason, message) = queued_condition(&first.status.conditions).expect("the condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "RemediationQueued"));
    assert!(
        message.starts_with(
            "4 target(s) wait for a remediation slot: 2 of 2 in flight (maxInFlight 2): ns/m2, ns/m4; next: ns/m3"
        ),
        "{message}"
    );
    assert_eq!(first.next_wake, None, "a slot frees only when an object changes, which wakes the check");
    w.apply(&first);

    // Decided again (and through a restart: the status from its JSON): nothing moves, nothing
    // is told again; the two requests are in flight, read from the Machines.
    w.status = Some(serde_json::from_value(serde_json::to_value(w.status.clone()).expect("json")).expect("status"));
    let again = w.decide(at(1010));
    assert_eq!(started(&again), Vec::<String>::new());
    assert_eq!(again.notices, vec![]);
    assert_eq!(again.status, first.status);

    // The owner replaces m4: its slot goes to m3, the next in the queue, which is told it left.
    remove_machine(&mut w, "m4");
    let freed = w.decide(at(1060));
    assert_eq!(started(&freed), ["m3"]);
    assert_eq!(
        queue(&freed.status.features.queued),
        vec![q("m5", at(40), 1), q("m6", at(40), 2), q("m1", at(50), 3)],
        "positions move up"
    );
    assert_eq!(told(&freed, NoticeKind::RemediationDequeued), [key("m3")]);
    let left = freed.notices.iter().find(|n| n.kind == NoticeKind::RemediationDequeued).expect("told");
    assert!(left.message.contains("a remediation slot is free for it"), "{}", left.message);
    assert_eq!(told(&freed, NoticeKind::RemediationQueued), Vec::<String>::new(), "no one joined");
    w.apply(&freed);

    // m2 recovers before its owner acts: it is healthy again, so no longer in flight.
    w = w.node(node("m2").ready("True", at(1100)));
    let recovered = w.decide(at(1101));
    assert_eq!(started(&recovered), ["m5"], "m5 before m6: same time, by name");
    w.apply(&recovered);
    assert_eq!(
        queue(&w.status.as_ref().expect("status").features.queued),
        vec![q("m6", at(40), 1), q("m1", at(50), 2)]
    );
}

/// What counts as in flight, one row per Machine state beside a fresh failure `new` with
/// `maxInFlight: 1`: `new` is queued exactly when the row's Machine is in flight.
#[test]
fn a_request_is_in_flight_until_the_machine_is_healthy_again_or_gone() {
    let asked = |m: MachineJson| m.new_condition("OwnerRemediated", "False", at(400));
    let marked = |m: MachineJson| m.new_condition("HealthCheckSucceeded", "False", at(400));
    let rows: Vec<(&str, MhcWorld, bool)> = vec![
        (
            "asked and still unhealthy",
            MhcWorld::new().machine_with_node(marked(asked(machine("old"))), "False", at(-100)),
            true,
        ),
        (
            "asked, and healthy again before the owner acted",
            MhcWorld::new().machine_with_node(marked(asked(machine("old"))), "True", at(500)),
            false,
        ),
        (
            "asked and being deleted by its owner (its Node fine again): in flight until gone",
            MhcWorld::new().machine_with_node(marked(asked(machine("old"))).deleting(), "True", at(500)),
            true,
        ),
        (
            "asked, Node failing again but inside its timeout, still marked",
            MhcWorld::new().machine_with_node(marked(asked(machine("old"))), "False", at(900)),
            true,
        ),
        ("unhealthy but never asked (a decision of its own)", MhcWorld::new(), false),
        (
            "asked long ago, marked healthy since, failing inside its timeout",
            MhcWorld::new().machine_with_node(
                asked(machine("old")).new_condition("HealthCheckSucceeded", "True", at(500)),
                "False",
                at(900),
            ),
            false,
        ),
    ];
    for (what, w, in_flight) in rows {
        let w = w.spec("maxInFlight", json!(1)).machine_with_node(machine("new"), "False", at(0));
        let plan = w.decide(at(1000));
        let queued: Vec<String> = plan.status.features.queued.iter().map(|q| q.name.clone()).collect();
        assert_eq!(queued == ["new"], in_flight, "{what}: queued {queued:?}, started {:?}", started(&plan));
        assert_eq!(started(&plan).contains(&"new".to_string()), !in_flight, "{what}");
    }
}

/// With a template, the remediation object (or the request just made) is what is in flight;
/// the object of a Machine healthy again is deleted and no longer counts.
#[test]
fn with_a_template_the_remediation_object_is_in_flight() {
    let object = remediation_json(NS, "old", "Machine", "old");
    let sick = MhcWorld::new()
        .with_template()
        .spec("maxInFlight", json!(1))
        .machine_with_node(machine("old"), "False", at(-100))
        .machine_with_node(machine("new"), "False", at(0))
        .remediation(object.clone());
    let plan = sick.decide(at(1000));
    assert_eq!(created_names(&plan), Vec::<String>::new(), "old's object is in flight: new waits");
    assert_eq!(plan.status.features.queued_count, 1);
    let healed = MhcWorld::new()
        .with_template()
        .spec("maxInFlight", json!(1))
        .machine_with_node(machine("old"), "True", at(500))
        .machine_with_node(machine("new"), "False", at(0))
        .remediation(object);
    let plan = healed.decide(at(1000));
    assert_eq!((deleted_names(&plan), created_names(&plan)), (vec!["old".to_string()], vec!["new".to_string()]));
    // A request just made (ExternallyRemediated=False, its object not seen yet) is in flight too.
    let requested = MhcWorld::new()
        .with_template()
        .spec("maxInFlight", json!(1))
        .machine_with_node(
            machine("old")
                .new_condition("HealthCheckSucceeded", "False", at(400))
                .raw_condition(json!({"type": "ExternallyRemediated", "status": "False", "reason": "WaitingForRemediation", "message": "", "lastTransitionTime": at(400).to_string()})),
            "False",
            at(-100),
        )
        .machine_with_node(machine("new"), "False", at(0));
    let plan = requested.decide(at(1000));
    assert_eq!(created_names(&plan), ["old"], "old's lost create is made again; new waits");
    assert_eq!(plan.status.features.queued.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(), ["new"]);
}

/// The queue's order: when the failure began (the matching condition's transition, the startup
/// clock), else when the check first marked the Machine, else now; ties by name.
#[test]
fn the_queue_is_ordered_by_when_each_machine_became_unhealthy() {
    let w = MhcWorld::new()
        .spec("maxInFlight", json!(1))
        .spec("nodeStartupTimeout", json!("10m"))
        // Ready=False since 100s (timeout 300s).
        .machine_with_node(machine("ready-false"), "False", at(100))
        // No Node since it was created at 50s: the startup clock started then.
        .machine(machine("no-node").created(Some(at(50))))
        // Its Node is gone; marked by this check at 70s.
        .machine(machine("node-gone").node("gone").new_condition("HealthCheckSucceeded", "False", at(70)))
        // The remediate annotation, never marked: unhealthy since now.
        .machine_with_node(machine("annotated").annotation("cluster.x-k8s.io/remediate-machine", ""), "True", at(0))
        // The oldest: takes the slot.
        .machine_with_node(machine("first"), "Unknown", at(10));
    let plan = w.decide(at(1000));
    assert_eq!(started(&plan), ["first"]);
    assert_eq!(
        queue(&plan.status.features.queued),
        vec![
            q("no-node", at(50), 1),
            q("node-gone", at(70), 2),
            q("ready-false", at(100), 3),
            q("annotated", at(1000), 4)
        ]
    );
}

#[test]
fn a_percentage_of_the_targets_rounds_down_with_a_floor_of_one() {
    // (maxInFlight, targets, of which failing) → how many start.
    let rows = [(json!("25%"), 8, 8, 2), (json!("10%"), 5, 5, 1), (json!("50%"), 3, 3, 1), (json!("100%"), 4, 4, 4)];
    for (max, targets, failing, want) in rows {
        let mut w = MhcWorld::new().spec("maxInFlight", max.clone());
        for i in 0..targets {
            let status = if i < failing { "False" } else { "True" };
            w = w.machine_with_node(machine(&format!("m{i}")), status, at(i as i64));
        }
        let plan = w.decide(at(1000));
        assert_eq!(started(&plan).len(), want, "{max} of {targets}");
        assert_eq!(plan.status.features.queued_count as usize, failing - want, "{max} of {targets}");
    }
}

/// The short-circuit is applied first: while it holds nothing starts and nothing is queued (the
/// targets wait for `RemediationAllowed`, not for a slot); once it lifts, the queue forms.
#[test]
fn the_short_circuit_comes_first_and_nothing_is_queued_while_it_holds() {
    let failed = [("m1", 0), ("m2", 10), ("m3", 20)];
    let mut w = wave(json!(1), &failed).spec("maxUnhealthy", json!(2));
    for i in 4..=6 {
        w = w.machine_with_node(machine(&format!("m{i}")), "True", at(0));
    }
    let blocked = w.decide(at(1000));
    assert!(blocked.short_circuited);
    assert_eq!(started(&blocked), Vec::<String>::new());
    assert_eq!((blocked.status.features.queued.len(), blocked.status.features.queued_count), (0, 0));
    assert_eq!(queued_condition(&blocked.status.conditions), None, "a check that never queued shows nothing");
    w.apply(&blocked);
    // m1 recovers: 2 unhealthy is within maxUnhealthy; one starts, the other is queued.
    w = w.node(node("m1").ready("True", at(1100)));
    let lifted = w.decide(at(1101));
    assert_eq!(started(&lifted), ["m2"]);
    assert_eq!(queue(&lifted.status.features.queued), vec![q("m3", at(20), 1)]);
}

/// Each waiting target has one reason: a Machine of a backed-off pool is listed as backed off,
/// not queued, and does not take a slot; the queue gets the Machines the back-off lets through.
#[test]
fn a_backed_off_machine_is_not_queued_and_the_back_off_serves_the_longest_unhealthy_first() {
    let md = "cluster.x-k8s.io/deployment-name";
    // a-1 failed after a-2: by name a-1 comes first, by age a-2.
    let w = MhcWorld::new()
        .spec("maxInFlight", json!(1))
        .spec("backoff", json!({"maxRemediations": 1, "window": "1h"}))
        .machine_with_node(machine("a-1").label(md, "a"), "False", at(100))
        .machine_with_node(machine("a-2").label(md, "a"), "False", at(10))
        .machine_with_node(machine("b-1").label(md, "b"), "False", at(50));
    let plan = w.decide(at(1000));
    assert_eq!(started(&plan), ["a-2"], "the pool's one start goes to its longest-unhealthy Machine");
    assert_eq!(plan.status.features.backed_off_pools[0].waiting, ["a-1"]);
    assert_eq!(queue(&plan.status.features.queued), vec![q("b-1", at(50), 1)], "a-1 is not queued");
    // Without pacing the back-off keeps its name order (nothing changes for existing checks).
    let mut unpaced = w.clone();
    unpaced.spec.as_object_mut().expect("spec").remove("maxInFlight");
    assert_eq!(started(&unpaced.decide(at(1000))), ["a-1", "b-1"]);
}

/// Off by default: everything starts, no queue, no condition.
#[test]
fn without_max_in_flight_nothing_is_paced() {
    let failed = [("m1", 50), ("m2", 10), ("m3", 30)];
    let mut w = wave(json!(1), &failed);
    w.spec.as_object_mut().expect("spec").remove("maxInFlight");
    let plan = w.decide(at(1000));
    assert_eq!(started(&plan), ["m1", "m2", "m3"]);
    assert_eq!((plan.status.features.queued.len(), plan.status.features.queued_count), (0, 0));
    assert_eq!(queued_condition(&plan.status.conditions), None);
    // Removing maxInFlight from a check that queued: the queue and the condition go, and each
    // queued Machine is told it left.
    let mut paced = wave(json!(1), &failed);
    let first = paced.decide(at(1000));
    paced.apply(&first);
    paced.spec.as_object_mut().expect("spec").remove("maxInFlight");
    let unpaced = paced.decide(at(1001));
    assert_eq!(started(&unpaced), ["m1", "m3"]);
    assert_eq!(queued_condition(&unpaced.status.conditions), None);
    assert_eq!(told(&unpaced, NoticeKind::RemediationDequeued), [key("m3"), key("m1")]);
}

/// Dry-run paces its would-be starts: `wouldRemediate` lists the longest-unhealthy within the
/// limit (nothing is ever in flight in dry-run), the queue the rest; it settles.
#[test]
fn dry_run_lists_only_what_pacing_lets_start_and_settles() {
    let mut w = wave(json!(2), &[("m1", 50), ("m2", 10), ("m3", 30)]).spec("dryRun", json!(true));
    let plan = w.decide(at(1000));
    assert_eq!(plan.actions, vec![]);
    let would: Vec<&str> = plan.status.features.would_remediate.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(would, ["m2", "m3"]);
    assert_eq!(queue(&plan.status.features.queued), vec![q("m1", at(50), 1)]);
    w.apply(&plan);
    let again = w.decide(at(1100));
    assert_eq!((again.status.clone(), again.notices.clone()), (plan.status.clone(), vec![]), "settled");
}

/// A paused check starts nothing and queues nothing: the condition turns False and the queued
/// Machines are told they left.
#[test]
fn a_paused_check_queues_nothing() {
    let mut w = wave(json!(1), &[("m1", 0), ("m2", 10)]);
    let first = w.decide(at(1000));
    w.apply(&first);
    let w = w.annotate("cluster.x-k8s.io/paused", "");
    let paused = w.decide(at(1001));
    assert_eq!(paused.status.features.queued, vec![]);
    let (status, reason, _) = queued_condition(&paused.status.conditions).expect("condition");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "NoRemediationQueued"));
    assert_eq!(told(&paused, NoticeKind::RemediationDequeued), [key("m2")]);
}

/// Only this check's remediations count: a Machine whose conditions an older overlapping
/// MachineHealthCheck writes (and remediates) is that check's business.
#[test]
fn another_checks_remediation_does_not_take_a_slot() {
    let older = peer_check("older", 0, json!({"pool": "workers", "zone": "a"}), None);
    let younger = peer_check("younger", 10, json!({"pool": "workers"}), Some(json!(1)));
    let machines = vec![
        // The older check's Machine, asked for by it and still broken.
        machine("a-1")
            .label("zone", "a")
            .node("a-1")
            .new_condition("HealthCheckSucceeded", "False", at(400))
            .new_condition("OwnerRemediated", "False", at(400))
            .json(),
        machine("b-1").node("b-1").json(),
    ];
    let nodes = node_map([node("a-1").ready("False", at(0)).build(), node("b-1").ready("False", at(0)).build()]);
    let plan = decide_among_peers(&[older, younger.clone()], 1, &machines, &nodes, at(1000));
    assert_eq!(started(&plan), ["b-1"], "a-1 is the older check's remediation, not this one's");
    assert_eq!(plan.status.features.queued_count, 0);
}

fn peer_check(name: &str, created: i64, selector: Value, max: Option<Value>) -> MachineHealthCheck {
    let mut spec = mhc_spec();
    spec["selector"] = json!({"matchLabels": selector});
    if let Some(max) = max {
        spec["maxInFlight"] = max;
    }
    let mut c = mhc(spec, &[], None);
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.creation_timestamp = Some(Time(at(created)));
    c
}

fn decide_among_peers(
    checks: &[MachineHealthCheck],
    i: usize,
    machines: &[Value],
    nodes: &HashMap<String, NodeView>,
    now: Timestamp,
) -> Plan<MachineHealthCheckStatus> {
    let policies: Vec<MhcPolicy> = checks.iter().map(mhc_policy).collect();
    let peers = MhcPeers::new(checks.iter().zip(&policies).map(|(c, p)| MhcPeer::of(c, p)));
    let views: Vec<MachineView> = machines.iter().map(|m| MachineView::read(m).expect("a named Machine")).collect();
    let refs: Vec<&MachineView> = views.iter().collect();
    let none: HashMap<String, RemediationView> = HashMap::new();
    let cluster_view = ClusterView::read(&cluster().json()).expect("cluster");
    // Every template the policy names is missing, and no remediation object exists.
    let kinds = policies[i].templates().len();
    let templates = vec![None; kinds];
    let lookups: Vec<&dyn Lookup<RemediationView>> =
        (0..kinds).map(|_| &none as &dyn Lookup<RemediationView>).collect();
    let input = MhcInput {
        check: &checks[i],
        policy: &policies[i],
        cluster: Some(&cluster_view),
        machines: &refs,
        machines_selected: false,
        nodes: NodeSource::Reachable(nodes),
        templates: &templates,
        remediations: &lookups,
    };
    machine::decide_among_peers(&input, &Holders::none(), &peers, LOCAL_CLUSTER, now)
}

// ----------------------------------------------------------------------------------------------
// NodeHealthCheck
// ----------------------------------------------------------------------------------------------

const MEDIK8S: &str = "medik8s";

fn snr() -> Value {
    json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": MEDIK8S})
}

fn far() -> Value {
    json!({"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1", "kind": "FenceAgentsRemediationTemplate", "name": "far", "namespace": MEDIK8S})
}

/// A NodeHealthCheck spec over every Node: `maxInFlight` and two escalation steps of 5m.
fn nhc_spec(max: Value) -> Value {
    json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "maxUnhealthy": "100%",
        "escalatingRemediations": [
            {"remediationTemplate": snr(), "order": 0, "timeout": "5m"},
            {"remediationTemplate": far(), "order": 1, "timeout": "5m"},
        ],
        "maxInFlight": max,
    })
}

fn templates() -> Vec<TemplateView> {
    [snr(), far()]
        .iter()
        .map(|t| {
            TemplateView::read(&json!({"apiVersion": t["apiVersion"], "kind": t["kind"], "metadata": {"name": t["name"], "namespace": MEDIK8S}, "spec": {"template": {"spec": {}}}}))
                .expect("template")
        })
        .collect()
}

/// A NodeHealthCheck decision world: the plans' creates become objects, as the API server would.
#[derive(Clone)]
struct Nhc {
    name: String,
    spec: Value,
    status: Option<NodeHealthCheckStatus>,
    nodes: Vec<NodeView>,
    objects: Vec<RemediationView>,
}

impl Nhc {
    fn new(spec: Value, failed_at: &[(&str, i64)]) -> Self {
        let nodes = failed_at.iter().map(|(n, secs)| node(n).ready("False", at(*secs)).build()).collect();
        Nhc { name: "nhc".into(), spec, status: None, nodes, objects: Vec::new() }
    }

    fn check(&self) -> NodeHealthCheck {
        let mut v = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": self.name, "uid": format!("{}-uid", self.name), "generation": 1}, "spec": self.spec});
        if let Some(s) = &self.status {
            v["status"] = serde_json::to_value(s).expect("status");
        }
        serde_json::from_value(v).expect("check")
    }

    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let check = self.check();
        let policy = vigil_api::validate::node_health_check(&check).expect("valid");
        let refs: Vec<&NodeView> = self.nodes.iter().collect();
        let templates = templates();
        let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Some).collect();
        let objects: Vec<&RemediationView> = self.objects.iter().collect();
        node::decide(
            &NhcInput {
                check: &check,
                policy: &policy,
                nodes: &refs,
                templates: &template_refs,
                remediations: &objects,
                around: Default::default(),
            },
            now,
        )
    }

    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                vigil_engine::Action::CreateRemediation { object, .. } => {
                    let mut o = object.clone();
                    let id = format!(
                        "{}-{}",
                        o["metadata"]["name"].as_str().expect("name"),
                        o["kind"].as_str().expect("kind")
                    );
                    o["metadata"]["uid"] = json!(format!("uid-{id}"));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    self.objects.push(RemediationView::read(&o).expect("named"));
                }
                vigil_engine::Action::DeleteRemediation { object, .. } => {
                    self.objects.retain(|x| !(x.meta.name == object.name && x.meta.kind == object.kind))
                }
                vigil_engine::Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in
                        self.objects.iter_mut().filter(|x| x.meta.name == object.name && x.meta.kind == object.kind)
                    {
                        x.meta.annotations.insert(key.clone(), value.clone());
                    }
                }
                // This world keeps no Leases: every Node's Lease is free.
                vigil_engine::Action::WriteLease(_) | vigil_engine::Action::DeleteLease { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        self.status = Some(serde_json::from_value(serde_json::to_value(&plan.status).expect("json")).expect("status"));
    }

    fn set_ready(&mut self, name: &str, status: &str, since: Timestamp) {
        let n = self.nodes.iter_mut().find(|n| n.name == name).expect("a known Node");
        *n = node(name).ready(status, since).build();
    }
}

/// `(Node, kind)` of each object a plan creates.
fn nhc_creates(plan: &Plan<NodeHealthCheckStatus>) -> Vec<(String, String)> {
    creates(plan)
        .iter()
        .map(|o| {
            (o["metadata"]["name"].as_str().unwrap_or("").to_string(), o["kind"].as_str().unwrap_or("").to_string())
        })
        .collect()
}

fn snr_for(nodes: &[&str]) -> Vec<(String, String)> {
    nodes.iter().map(|n| (n.to_string(), "SelfNodeRemediation".to_string())).collect()
}

// Over 80 lines on purpose: one wave followed through escalation, recovery and giving up, each
// step asserted where it happens.
#[test]
fn nodes_start_oldest_first_escalation_takes_no_new_slot_and_a_slot_frees_on_recovery_or_giving_up() {
    let mut w = Nhc::new(nhc_spec(json!(2)), &[("n1", 40), ("n2", 0), ("n3", 20), ("n4", 10)]);
    let first = w.decide(at(1000));
    assert_eq!(nhc_creates(&first), snr_for(&["n2", "n4"]), "the two longest-unhealthy, oldest first");
    assert_eq!(queue(&first.status.features.queued), vec![q("n3", at(20), 1), q("n1", at(40), 2)]);
    assert_eq!(told(&first, NoticeKind::RemediationQueued), ["n3", "n1"]);
    let listed: Vec<&str> = first.status.unhealthy_nodes.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(listed, ["n1", "n2", "n3", "n4"], "unhealthyNodes stay in name order");
    w.apply(&first, at(1000));

    // 5m later the first step times out: n2 and n4 escalate to fencing; that is no new start,
    // so the queue stays as it is.
    let escalated = w.decide(at(1301));
    let fence: Vec<(String, String)> =
        ["n2", "n4"].iter().map(|n| (n.to_string(), "FenceAgentsRemediation".to_string())).collect();
    assert_eq!(nhc_creates(&escalated), fence);
    assert_eq!(queue(&escalated.status.features.queued), vec![q("n3", at(20), 1), q("n1", at(40), 2)]);
    w.apply(&escalated, at(1301));

    // n4 comes back: it is healthy (its objects wait for nothing), so its slot goes to n3.
    w.set_ready("n4", "True", at(1400));
    let recovered = w.decide(at(1400));
    assert_eq!(nhc_creates(&recovered), snr_for(&["n3"]));
    assert_eq!(told(&recovered, NoticeKind::RemediationDequeued), ["n3"]);
    w.apply(&recovered, at(1400));

    // n2's last step times out: the check gives up on it (NoTemplateLeft, nhc-timed-out) and
    // no longer holds it, so its slot goes to n1 once the give-up is written.
    let gave_up = w.decide(at(1602));
    assert_eq!(told(&gave_up, NoticeKind::NoTemplateLeft), ["n2"]);
    assert_eq!(nhc_creates(&gave_up), vec![], "decided on what was observed: n2 still held");
    w.apply(&gave_up, at(1602));
    let freed = w.decide(at(1602));
    assert_eq!(nhc_creates(&freed), snr_for(&["n1"]));
    assert_eq!(freed.status.features.queued, vec![]);
    let (status, reason, _) = queued_condition(&freed.status.conditions).expect("condition");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "NoRemediationQueued"));
}

/// A request of an earlier plan not seen yet (no uid) is in flight; another check's objects are
/// not this check's remediations.
#[test]
fn node_in_flight_counts_this_checks_requests_and_objects_only() {
    let mut w = Nhc::new(nhc_spec(json!(1)), &[("n1", 0), ("n2", 10)]);
    let first = w.decide(at(1000));
    assert_eq!(nhc_creates(&first), snr_for(&["n1"]));
    // The status is written but the object never arrives: the request is in flight.
    w.status = Some(first.status.clone());
    let lost = w.decide(at(1010));
    assert_eq!(nhc_creates(&lost), snr_for(&["n1"]), "the request is completed, not a new start");
    assert_eq!(queue(&lost.status.features.queued), vec![q("n2", at(10), 1)]);

    // Another NodeHealthCheck remediates n1: this one waits for n1 and starts n2 (one slot).
    let mut other = Nhc::new(nhc_spec(json!(1)), &[("n1", 0)]);
    other.name = "other".into();
    let theirs = other.decide(at(1000));
    other.apply(&theirs, at(1000));
    let mut mine = Nhc::new(nhc_spec(json!(1)), &[("n1", 0), ("n2", 10)]);
    mine.objects = other.objects.clone();
    let claims = vigil_engine::holders::nhc_claims(&other.check(), &other.objects.iter().collect::<Vec<_>>());
    let holders = Holders::from_claims(claims);
    let check = mine.check();
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = mine.nodes.iter().collect();
    let templates = templates();
    let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Some).collect();
    let objects: Vec<&RemediationView> = mine.objects.iter().collect();
    let plan = node::decide_among(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &template_refs,
            remediations: &objects,
            around: Default::default(),
        },
        &holders,
        at(1001),
    );
    assert_eq!(nhc_creates(&plan), snr_for(&["n2"]), "n1 is the other check's remediation: it takes no slot here");
    assert_eq!(plan.status.features.queued_count, 0);
}

/// A NodeHealthCheck with `healthyDelay`: a Node healthy again frees its slot at once, though its
/// objects are kept for the delay.
#[test]
fn a_node_healthy_again_frees_its_slot_during_the_healthy_delay() {
    let mut spec = nhc_spec(json!(1));
    spec["healthyDelay"] = json!("10m");
    let mut w = Nhc::new(spec, &[("n1", 0), ("n2", 10)]);
    let first = w.decide(at(1000));
    w.apply(&first, at(1000));
    w.set_ready("n1", "True", at(1100));
    let plan = w.decide(at(1100));
    assert_eq!(deleted_names(&plan), Vec::<String>::new(), "n1's object is kept for the delay");
    assert_eq!(nhc_creates(&plan), snr_for(&["n2"]));
}

/// A NodeHealthCheck in dry-run paces its would-be starts the same way and settles.
#[test]
fn node_dry_run_lists_only_what_pacing_lets_start() {
    let mut spec = nhc_spec(json!(1));
    spec["dryRun"] = json!(true);
    let mut w = Nhc::new(spec, &[("n1", 20), ("n2", 10)]);
    let first = w.decide(at(1000));
    assert_eq!(first.actions, vec![]);
    let would: Vec<&str> = first.status.features.would_remediate.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(would, ["n2"], "the longest-unhealthy only");
    assert_eq!(queue(&first.status.features.queued), vec![q("n1", at(20), 1)]);
    w.apply(&first, at(1000));
    let again = w.decide(at(1100));
    assert_eq!((again.status.features.clone(), again.notices.clone()), (first.status.features.clone(), vec![]));
}
