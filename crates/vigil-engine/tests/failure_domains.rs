//! Failure-domain budgets (`spec.failureDomains`), as tables: which targets a check starts
//! remediating when some domains are over their budget, how small domains are handled
//! (`minAllowed`), what is reported (status list, `FailureDomainsHealthy`, notices on
//! transitions), and that remediations already started go on. The properties (no new
//! remediation in a paused domain, the status list is the oracle's, same input same plan) are in
//! `node_props.rs` and `machine_props.rs`.

mod support;

use jiff::Timestamp;
use serde_json::{Value, json};
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::failure_domains::FailureDomainStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::plan::{NoticeKind, Plan};

const ZONE: &str = "topology.kubernetes.io/zone";
const SNR_NS: &str = "medik8s";

fn nhc(spec: &Value, status: Option<&NodeHealthCheckStatus>) -> NodeHealthCheck {
    let mut v = json!({
        "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
        "spec": spec,
    });
    if let Some(s) = status {
        v["status"] = serde_json::to_value(s).expect("status");
    }
    serde_json::from_value(v).expect("check")
}

fn nhc_spec(domains: Option<Value>) -> Value {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "maxUnhealthy": "100%",
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": SNR_NS},
    });
    if let Some(d) = domains {
        spec["failureDomains"] = d;
    }
    spec
}

fn decide_nhc(
    spec: &Value,
    status: Option<&NodeHealthCheckStatus>,
    nodes: &[NodeView],
    objects: &[RemediationView],
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let check = nhc(spec, status);
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let template = TemplateView::read(&json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": SNR_NS},
        "spec": {"template": {"spec": {}}}
    }))
    .expect("template");
    let templates = [Some(&template)];
    let remediations: Vec<&RemediationView> = objects.iter().collect();
    node::decide(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &templates,
            remediations: &remediations,
            around: Default::default(),
        },
        now,
    )
}

/// A Node of `zone` (`""`: no zone label), Ready=False since T0 when `sick`.
fn zoned(name: &str, zone: &str, sick: bool) -> NodeView {
    let n = node(name).ready(if sick { "False" } else { "True" }, t0());
    if zone.is_empty() { n.build() } else { n.label(ZONE, zone).build() }
}

/// Messages of a plan's notices of `kind`.
fn told<S>(plan: &Plan<S>, kind: NoticeKind) -> Vec<String> {
    plan.notices.iter().filter(|n| n.kind == kind).map(|n| n.message.clone()).collect()
}

/// `name: unhealthy/targets allowed N [paused]` of a status list.
fn domains(list: &[FailureDomainStatus]) -> Vec<String> {
    list.iter()
        .map(|d| {
            format!(
                "{}: {}/{} allowed {}{}",
                d.name,
                d.unhealthy,
                d.targets,
                d.allowed,
                if d.paused { " paused" } else { "" }
            )
        })
        .collect()
}

struct NhcRow {
    what: &'static str,
    domains: Option<Value>,
    /// Check-wide `maxUnhealthy` (default 100%).
    max_unhealthy: Option<Value>,
    /// (name, zone, sick)
    nodes: Vec<(&'static str, &'static str, bool)>,
    created: Vec<&'static str>,
    status: Vec<&'static str>,
    /// `FailureDomainsHealthy` status, `None` when absent.
    healthy: Option<&'static str>,
}

#[test]
fn node_health_check_remediates_only_in_domains_within_their_budget() {
    let fd = |max: Value, min: Option<u32>| {
        let mut v = json!({"key": ZONE, "maxUnhealthy": max});
        if let Some(min) = min {
            v["minAllowed"] = json!(min);
        }
        Some(v)
    };
    let rows = [
        NhcRow {
            what: "zone-a over its budget pauses; one failure in zone-b is remediated",
            domains: fd(json!("20%"), None),
            max_unhealthy: None,
            nodes: vec![
                ("a1", "zone-a", true),
                ("a2", "zone-a", true),
                ("a3", "zone-a", true),
                ("a4", "zone-a", false),
                ("a5", "zone-a", false),
                ("b1", "zone-b", true),
                ("b2", "zone-b", false),
                ("b3", "zone-b", false),
                ("b4", "zone-b", false),
            ],
            created: vec!["b1"],
            status: vec!["zone-a: 3/5 allowed 1 paused", "zone-b: 1/4 allowed 1"],
            healthy: Some("False"),
        },
        NhcRow {
            what: "small domain: maxUnhealthy 0 with minAllowed 1 remediates one of two",
            domains: fd(json!(0), Some(1)),
            max_unhealthy: None,
            nodes: vec![("c1", "zone-c", true), ("c2", "zone-c", false)],
            created: vec!["c1"],
            status: vec!["zone-c: 1/2 allowed 1"],
            healthy: Some("True"),
        },
        NhcRow {
            what: "small domain: two of two is over minAllowed 1",
            domains: fd(json!(0), Some(1)),
            max_unhealthy: None,
            nodes: vec![("c1", "zone-c", true), ("c2", "zone-c", true)],
            created: vec![],
            status: vec!["zone-c: 2/2 allowed 1 paused"],
            healthy: Some("False"),
        },
        NhcRow {
            what: "minAllowed 0 and 0%: any failure pauses its domain",
            domains: fd(json!("0%"), Some(0)),
            max_unhealthy: None,
            nodes: vec![("c1", "zone-c", true), ("c2", "zone-c", false)],
            created: vec![],
            status: vec!["zone-c: 1/2 allowed 0 paused"],
            healthy: Some("False"),
        },
        NhcRow {
            what: "a percentage rounds up as a NodeHealthCheck's maxUnhealthy: 30% of 4 allows 2",
            domains: fd(json!("30%"), Some(0)),
            max_unhealthy: None,
            nodes: vec![
                ("a1", "zone-a", true),
                ("a2", "zone-a", true),
                ("a3", "zone-a", false),
                ("a4", "zone-a", false),
            ],
            created: vec!["a1", "a2"],
            status: vec!["zone-a: 2/4 allowed 2"],
            healthy: Some("True"),
        },
        NhcRow {
            what: "Nodes without the label are in no domain: only the check-wide budget applies",
            domains: fd(json!(0), Some(0)),
            max_unhealthy: None,
            nodes: vec![("a1", "zone-a", true), ("a2", "zone-a", false), ("x1", "", true), ("x2", "", false)],
            created: vec!["x1"],
            status: vec!["zone-a: 1/2 allowed 0 paused"],
            healthy: Some("False"),
        },
        NhcRow {
            what: "the check-wide budget is evaluated first and still stops everything",
            domains: fd(json!("50%"), None),
            max_unhealthy: Some(json!(1)),
            nodes: vec![
                ("a1", "zone-a", true),
                ("a2", "zone-a", false),
                ("b1", "zone-b", true),
                ("b2", "zone-b", false),
            ],
            created: vec![],
            status: vec!["zone-a: 1/2 allowed 1", "zone-b: 1/2 allowed 1"],
            healthy: Some("True"),
        },
        NhcRow {
            what: "off by default: no list, no condition, upstream behaviour",
            domains: None,
            max_unhealthy: None,
            nodes: vec![("a1", "zone-a", true), ("a2", "zone-a", true), ("a3", "zone-a", true)],
            created: vec!["a1", "a2", "a3"],
            status: vec![],
            healthy: None,
        },
    ];
    for row in rows {
        let mut spec = nhc_spec(row.domains.clone());
        if let Some(max) = &row.max_unhealthy {
            spec["maxUnhealthy"] = max.clone();
        }
        let nodes: Vec<NodeView> = row.nodes.iter().map(|(n, z, s)| zoned(n, z, *s)).collect();
        let plan = decide_nhc(&spec, None, &nodes, &[], at(301));
        assert_eq!(created_names(&plan), row.created, "{}", row.what);
        assert_eq!(domains(&plan.status.features.failure_domains), row.status, "{}", row.what);
        let cond = check_condition(&plan.status.conditions, "FailureDomainsHealthy");
        assert_eq!(cond.map(|c| c.status.as_str()), row.healthy, "{}", row.what);

        // Dry-run lists exactly what the real plan starts: the domain budgets hold there too.
        let mut dry = spec.clone();
        dry["dryRun"] = json!(true);
        let shadow = decide_nhc(&dry, None, &nodes, &[], at(301));
        let would: Vec<&str> = shadow.status.features.would_remediate.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(would, row.created, "{}: dry-run", row.what);
        assert_eq!(
            shadow.status.features.failure_domains, plan.status.features.failure_domains,
            "{}: dry-run",
            row.what
        );
    }
}

#[test]
fn node_health_check_names_paused_domains_and_counts_and_tells_each_transition_once() {
    let spec = nhc_spec(Some(json!({"key": ZONE, "maxUnhealthy": "20%"})));
    let outage = |a3_sick: bool| {
        vec![
            zoned("a1", "zone-a", true),
            zoned("a2", "zone-a", true),
            zoned("a3", "zone-a", a3_sick),
            zoned("a4", "zone-a", false),
            zoned("a5", "zone-a", false),
            zoned("b1", "zone-b", false),
            zoned("x1", "", false),
        ]
    };
    // Two of five are within the 5m duration already count as not healthy (as the check-wide
    // budget): the zone pauses before anyone is remediated.
    let first = decide_nhc(&spec, None, &outage(true), &[], at(10));
    assert!(told(&first, NoticeKind::FailureDomainResumed).is_empty());
    let short = told(&first, NoticeKind::FailureDomainShortCircuit);
    assert_eq!(short.len(), 1, "{short:?}");
    assert!(
        first.notices.iter().filter(|n| n.kind == NoticeKind::FailureDomainShortCircuit).all(|n| n.target.is_none()),
        "a notice about the check"
    );
    assert!(short[0].contains("zone-a: 3 of 5 unhealthy, 1 allowed"), "{}", short[0]);
    assert!(!short[0].contains("zone-b"), "{}", short[0]);
    let cond = check_condition(&first.status.conditions, "FailureDomainsHealthy").expect("condition");
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "FailureDomainShortCircuit"));
    assert!(cond.message.contains("zone-a: 3 of 5 unhealthy, 1 allowed"), "{}", cond.message);
    assert!(
        cond.message.contains("1 target(s) in no domain (0 unhealthy) are governed by the check-wide budget only"),
        "{}",
        cond.message
    );

    // Decided again on its own status: nothing new is told, past the duration nothing starts.
    let again = decide_nhc(&spec, Some(&first.status), &outage(true), &[], at(400));
    assert!(notices(&again).iter().all(|n| n.0 != NoticeKind::FailureDomainShortCircuit), "told once");
    assert_eq!(created_names(&again), Vec::<String>::new());

    // a3 recovers: 2 of 5 is still over 1.
    let still = decide_nhc(&spec, Some(&again.status), &outage(false), &[], at(500));
    assert!(notices(&still).iter().all(|n| n.0 != NoticeKind::FailureDomainResumed));
    assert_eq!(created_names(&still), Vec::<String>::new());

    // a2 recovers too: within budget, resumed, and a1 is remediated at once.
    let mut nodes = outage(false);
    nodes[1] = zoned("a2", "zone-a", false);
    let resumed = decide_nhc(&spec, Some(&still.status), &nodes, &[], at(600));
    let back = told(&resumed, NoticeKind::FailureDomainResumed);
    assert_eq!(back.len(), 1);
    assert!(back[0].contains("zone-a: 1 of 5 unhealthy, 1 allowed"), "{}", back[0]);
    assert_eq!(created_names(&resumed), ["a1"]);
    let cond = check_condition(&resumed.status.conditions, "FailureDomainsHealthy").expect("condition");
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("True", "WithinBudget"));

    // Switching the feature off removes the list and the condition.
    let off = decide_nhc(&nhc_spec(None), Some(&resumed.status), &nodes, &[], at(700));
    assert_eq!(off.status.features.failure_domains, vec![]);
    assert!(check_condition(&off.status.conditions, "FailureDomainsHealthy").is_none());
}

#[test]
fn node_health_check_keeps_going_with_remediations_started_before_the_domain_paused() {
    let spec = nhc_spec(Some(json!({"key": ZONE, "maxUnhealthy": 1})));
    let mut nodes = vec![zoned("a1", "zone-a", true), zoned("a2", "zone-a", false), zoned("a3", "zone-a", false)];
    let first = decide_nhc(&spec, None, &nodes, &[], at(301));
    assert_eq!(created_names(&first), ["a1"]);
    // Before the object is seen, a2 and a3 fail: the zone pauses (3 of 3 > 1), yet the earlier
    // request for a1 is completed (it is not a new remediation), and nothing starts for a2/a3.
    nodes[1] = zoned("a2", "zone-a", true);
    nodes[2] = zoned("a3", "zone-a", true);
    let later = decide_nhc(&spec, Some(&first.status), &nodes, &[], at(700));
    assert_eq!(created_names(&later), ["a1"], "the request in flight goes on, no new one");
    assert_eq!(domains(&later.status.features.failure_domains), ["zone-a: 3/3 allowed 1 paused"]);
}

#[test]
fn node_health_check_status_list_is_bounded_paused_domains_first() {
    // 120 zones of one healthy Node, and 3 zones whose single Node is sick with 0 allowed.
    let spec = nhc_spec(Some(json!({"key": ZONE, "maxUnhealthy": 0, "minAllowed": 0})));
    let mut nodes: Vec<NodeView> = (0..120).map(|i| zoned(&format!("n{i:03}"), &format!("z{i:03}"), false)).collect();
    for i in [5, 60, 119] {
        nodes[i] = zoned(&format!("n{i:03}"), &format!("z{i:03}"), true);
    }
    let plan = decide_nhc(&spec, None, &nodes, &[], at(301));
    assert_eq!(plan.status.features.failure_domains.len(), 100);
    let paused: Vec<&str> =
        plan.status.features.failure_domains.iter().filter(|d| d.paused).map(|d| d.name.as_str()).collect();
    assert_eq!(paused, ["z005", "z060", "z119"], "paused domains are never cut");
    assert!(plan.status.features.failure_domains.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
    let cond = check_condition(&plan.status.conditions, "FailureDomainsHealthy").expect("condition");
    assert!(
        cond.message.contains("3 paused failure domain(s)") && cond.message.contains("120 domain(s)"),
        "{}",
        cond.message
    );
}

// ---------------------------------------------------------------------------------------------
// MachineHealthCheck
// ---------------------------------------------------------------------------------------------

/// A Machine in `spec.failureDomain` `fd` whose Node (same name, zone label `zone`) is Ready=False
/// since T0 when `sick`.
fn machine_in(w: MhcWorld, name: &str, fd: &str, zone: &str, sick: bool) -> MhcWorld {
    let mut w = w
        .machine(machine(name).node(name))
        .node(node(name).ready(if sick { "False" } else { "True" }, t0()).label(ZONE, zone));
    if !fd.is_empty() {
        w.edit_machine(name, |m| set_pointer(m, "/spec/failureDomain", json!(fd)));
    }
    w
}

#[test]
fn machine_health_check_budgets_domains_by_spec_failure_domain_or_node_label() {
    struct Row {
        what: &'static str,
        domains: Value,
        /// (name, spec.failureDomain, Node zone label, sick)
        machines: Vec<(&'static str, &'static str, &'static str, bool)>,
        asked: Vec<&'static str>,
        status: Vec<&'static str>,
    }
    let rows = [
        Row {
            what: "spec.failureDomain: fd-a over budget, one of two in fd-b remediated (30% of 2 rounds down to 0, minAllowed 1)",
            domains: json!({"key": "spec.failureDomain", "maxUnhealthy": "30%"}),
            machines: vec![
                ("a1", "fd-a", "z", true),
                ("a2", "fd-a", "z", true),
                ("a3", "fd-a", "z", false),
                ("b1", "fd-b", "z", true),
                ("b2", "fd-b", "z", false),
            ],
            asked: vec!["b1"],
            status: vec!["fd-a: 2/3 allowed 1 paused", "fd-b: 1/2 allowed 1"],
        },
        Row {
            what: "minAllowed 0: 30% of 2 rounds down to 0, so one failure pauses the small domain",
            domains: json!({"key": "spec.failureDomain", "maxUnhealthy": "30%", "minAllowed": 0}),
            machines: vec![("b1", "fd-b", "z", true), ("b2", "fd-b", "z", false)],
            asked: vec![],
            status: vec!["fd-b: 1/2 allowed 0 paused"],
        },
        Row {
            what: "a Node label: the zone of each Machine's Node",
            domains: json!({"key": ZONE, "maxUnhealthy": 1}),
            machines: vec![
                ("a1", "", "zone-a", true),
                ("a2", "", "zone-a", true),
                ("b1", "", "zone-b", true),
                ("b2", "", "zone-b", false),
            ],
            asked: vec!["b1"],
            status: vec!["zone-a: 2/2 allowed 1 paused", "zone-b: 1/2 allowed 1"],
        },
        Row {
            what: "Machines without spec.failureDomain are in no domain",
            domains: json!({"key": "spec.failureDomain", "maxUnhealthy": 0, "minAllowed": 0}),
            machines: vec![("a1", "fd-a", "z", true), ("x1", "", "z", true)],
            asked: vec!["x1"],
            status: vec!["fd-a: 1/1 allowed 0 paused"],
        },
    ];
    for row in rows {
        let mut w = MhcWorld::new().spec("maxUnhealthy", json!("100%")).spec("failureDomains", row.domains.clone());
        for (name, fd, zone, sick) in &row.machines {
            w = machine_in(w, name, fd, zone, *sick);
        }
        let plan = w.decide(at(301));
        assert_eq!(owner_asked(&plan), row.asked, "{}", row.what);
        assert_eq!(domains(&plan.status.features.failure_domains), row.status, "{}", row.what);
        // Every unhealthy Machine is still marked: only the remediation request waits.
        for (name, _, _, sick) in &row.machines {
            let marked = written(&plan, name, "HealthCheckSucceeded").map(|(c, _)| c.status.as_str());
            assert_eq!(marked, Some(if *sick { "False" } else { "True" }), "{}: {name}", row.what);
        }
    }
}

#[test]
fn machine_health_check_domain_pause_is_told_once_and_lifts() {
    let mut w = MhcWorld::new().spec("failureDomains", json!({"key": "spec.failureDomain", "maxUnhealthy": 1}));
    for (name, fd, sick) in [("a1", "fd-a", true), ("a2", "fd-a", true), ("a3", "fd-a", false), ("b1", "fd-b", false)] {
        w = machine_in(w, name, fd, "z", sick);
    }
    let first = w.decide(at(301));
    let short = told(&first, NoticeKind::FailureDomainShortCircuit);
    assert_eq!(short.len(), 1);
    assert!(short[0].contains("by spec.failureDomain: fd-a: 2 of 3 unhealthy, 1 allowed"), "{}", short[0]);
    assert_eq!(owner_asked(&first), Vec::<String>::new());
    w.apply(&first);
    let again = w.decide(at(400));
    assert!(notices(&again).iter().all(|n| n.0 != NoticeKind::FailureDomainShortCircuit), "told once");
    w.apply(&again);
    w = w.node(node("a2").ready("True", at(450)).label(ZONE, "z"));
    let lifted = w.decide(at(500));
    assert!(notices(&lifted).iter().any(|n| n.0 == NoticeKind::FailureDomainResumed));
    assert_eq!(owner_asked(&lifted), ["a1"]);
}
