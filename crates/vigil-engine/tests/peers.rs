//! A Machine's health-check conditions are written by one MachineHealthCheck only
//! (`vigil_engine::peers`): the owner choice, the other checks' behaviour, and the invariant over
//! any set of overlapping MachineHealthChecks decided in any order.

mod support;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use support::{NS, at, cluster, machine, mhc, mhc_policy, mhc_spec, node, t0};
use vigil_api::MachineHealthCheck;
use vigil_api::conditions::get_condition;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::validate::MhcPolicy;
use vigil_api::views::{ClusterView, MachineView};
use vigil_engine::holders::{CheckRef, Holders, LOCAL_CLUSTER, mhc_claims_among};
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::machine_write::{apply_merge_patch, machine_status_patch};
use vigil_engine::peers::{MhcPeer, MhcPeers, REASON_NO_OVERLAP, REASON_OVERLAP, SELECTED_BY_ANOTHER_CHECK};
use vigil_engine::{Action, NoticeKind, Plan};

/// A MachineHealthCheck `name` created at `created` (seconds from T0; `None`: unset) selecting
/// `selector` (match labels), unhealthy after `Ready=False` for `timeout`.
fn check(name: &str, created: Option<i64>, selector: Value, timeout: &str) -> MachineHealthCheck {
    let mut spec = mhc_spec();
    spec["selector"] = json!({"matchLabels": selector});
    spec["unhealthyConditions"] = json!([{"type": "Ready", "status": "False", "timeout": timeout}]);
    let mut c = mhc(spec, &[], None);
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.creation_timestamp = created.map(|s| Time(at(s)));
    c
}

/// The same check in dry-run (`spec.dryRun: true`).
fn dry_run(mut c: MachineHealthCheck) -> MachineHealthCheck {
    c.spec.dry_run = true;
    c
}

fn cref(name: &str) -> CheckRef {
    CheckRef::Machine { namespace: NS.into(), name: name.into() }
}

#[test]
fn owner_choice_table() {
    let workers = json!({"pool": "workers"});
    let zone_a = json!({"pool": "workers", "zone": "a"});
    let m_a = machine("m-a").label("zone", "a").view();
    let m_b = machine("m-b").label("zone", "b").view();
    let other_ns = machine("m-x").namespace("elsewhere").view();
    // (what, checks, machine, deciding check, owner when not the deciding check)
    type Row<'a> = (&'a str, Vec<MachineHealthCheck>, &'a MachineView, &'a str, Option<&'a str>);
    let rows: Vec<Row<'_>> = vec![
        ("alone: owns", vec![check("a", Some(0), workers.clone(), "5m")], &m_a, "a", None),
        (
            "the older check owns, whatever its name",
            vec![check("a", Some(10), workers.clone(), "5m"), check("z", Some(0), workers.clone(), "10m")],
            &m_a,
            "a",
            Some("z"),
        ),
        (
            "the older check decides: owns",
            vec![check("a", Some(10), workers.clone(), "5m"), check("z", Some(0), workers.clone(), "10m")],
            &m_a,
            "z",
            None,
        ),
        (
            "same creation time: the smaller name owns",
            vec![check("b", Some(0), workers.clone(), "5m"), check("a", Some(0), workers.clone(), "5m")],
            &m_a,
            "b",
            Some("a"),
        ),
        (
            "no creation time ranks last",
            vec![check("a", None, workers.clone(), "5m"), check("b", Some(99), workers.clone(), "5m")],
            &m_a,
            "a",
            Some("b"),
        ),
        (
            "an older check that does not select the Machine does not own it",
            vec![check("old", Some(0), zone_a.clone(), "5m"), check("new", Some(10), workers.clone(), "5m")],
            &m_b,
            "new",
            None,
        ),
        (
            "an older check that selects it owns it",
            vec![check("old", Some(0), zone_a.clone(), "5m"), check("new", Some(10), workers.clone(), "5m")],
            &m_a,
            "new",
            Some("old"),
        ),
        (
            "a Machine of another namespace is never owned by this namespace's checks",
            vec![check("old", Some(0), workers.clone(), "5m"), check("new", Some(10), workers.clone(), "5m")],
            &other_ns,
            "new",
            None,
        ),
        (
            "of three, the oldest selecting one owns",
            vec![
                check("c", Some(20), workers.clone(), "5m"),
                check("b", Some(10), workers.clone(), "5m"),
                check("a", Some(0), zone_a.clone(), "5m"),
            ],
            &m_b,
            "c",
            Some("b"),
        ),
        (
            "an older check in dry-run does not silence a live one: the live check owns",
            vec![
                dry_run(check("shadow", Some(0), workers.clone(), "5m")),
                check("live", Some(10), workers.clone(), "5m"),
            ],
            &m_a,
            "shadow",
            Some("live"),
        ),
        (
            "the live check decides: owns, although the shadow is older",
            vec![
                dry_run(check("shadow", Some(0), workers.clone(), "5m")),
                check("live", Some(10), workers.clone(), "5m"),
            ],
            &m_a,
            "live",
            None,
        ),
        (
            "two checks in dry-run: the older owns",
            vec![
                dry_run(check("a", Some(10), workers.clone(), "5m")),
                dry_run(check("z", Some(0), workers.clone(), "5m")),
            ],
            &m_a,
            "a",
            Some("z"),
        ),
    ];
    for (what, checks, m, me, want) in rows {
        let policies: Vec<MhcPolicy> = checks.iter().map(mhc_policy).collect();
        let peers = MhcPeers::new(checks.iter().zip(&policies).map(|(c, p)| MhcPeer::of(c, p)));
        assert_eq!(peers.owner_other_than(&cref(me), m), want.map(cref).as_ref(), "{what}");
    }
}

/// A world of Machines `m0..` with Nodes, several MachineHealthChecks, and the plans applied as
/// the controller applies them.
#[derive(Debug, Clone)]
struct World {
    machines: Vec<Value>,
    nodes: HashMap<String, vigil_api::views::NodeView>,
    checks: Vec<MachineHealthCheck>,
}

impl World {
    fn decide(&self, i: usize, now: jiff::Timestamp) -> Plan<MachineHealthCheckStatus> {
        let policies: Vec<MhcPolicy> = self.checks.iter().map(mhc_policy).collect();
        let peers = MhcPeers::new(self.checks.iter().zip(&policies).map(|(c, p)| MhcPeer::of(c, p)));
        let views: Vec<MachineView> =
            self.machines.iter().map(|m| MachineView::read(m).expect("a named Machine")).collect();
        let refs: Vec<&MachineView> = views.iter().collect();
        let holders = Holders::from_claims(
            self.checks
                .iter()
                .zip(&policies)
                .flat_map(|(c, p)| mhc_claims_among(c, p, &peers, LOCAL_CLUSTER, &refs, &[])),
        );
        let cluster_view = ClusterView::read(&cluster().json()).expect("cluster");
        let input = MhcInput {
            check: &self.checks[i],
            policy: &policies[i],
            cluster: Some(&cluster_view),
            machines: &refs,
            machines_selected: false,
            nodes: NodeSource::Reachable(&self.nodes),
            templates: &[],
            remediations: &[],
        };
        machine::decide_among_peers(&input, &holders, &peers, LOCAL_CLUSTER, now)
    }

    fn apply(&mut self, i: usize, plan: &Plan<MachineHealthCheckStatus>) {
        self.checks[i].status = Some(plan.status.clone());
        for action in &plan.actions {
            if let Action::SetMachineConditions { machine, version, conditions } = action {
                let target = self
                    .machines
                    .iter_mut()
                    .find(|m| m.pointer("/metadata/name").and_then(Value::as_str) == Some(&machine.name))
                    .expect("a known Machine");
                let patch = machine_status_patch(target, *version, conditions);
                apply_merge_patch(target, &patch);
            }
        }
    }
}

fn written_machines(plan: &Plan<MachineHealthCheckStatus>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::SetMachineConditions { machine, .. } => Some(machine.name.clone()),
            _ => None,
        })
        .collect()
}

fn overlap_notices(plan: &Plan<MachineHealthCheckStatus>) -> Vec<&str> {
    plan.notices
        .iter()
        .filter(|n| n.kind == NoticeKind::MachinesSelectedByAnotherCheck)
        .map(|n| n.message.as_str())
        .collect()
}

/// The repro: `workers` (5m, older) and `workers-slow` (10m) on the same Machines.
fn repro() -> World {
    let workers = json!({"pool": "workers"});
    let machines = vec![machine("m1").node("m1").json(), machine("m2").node("m2").json()];
    let nodes = [node("m1").ready("False", t0()).build(), node("m2").ready("True", t0()).build()]
        .into_iter()
        .map(|n| (n.name.clone(), n))
        .collect();
    World {
        machines,
        nodes,
        checks: vec![
            check("workers", Some(0), workers.clone(), "300s"),
            check("workers-slow", Some(60), workers, "600s"),
        ],
    }
}

#[test]
fn the_other_check_counts_the_machines_writes_nothing_and_says_so_once() {
    let mut w = repro();
    // 11m: both checks have timed out on m1. The owner writes the verdict and asks the owner.
    let now = at(660);
    let owner = w.decide(0, now);
    assert_eq!(written_machines(&owner), ["m1", "m2"]);
    assert!(support::written(&owner, "m1", "OwnerRemediated").is_some());
    assert!(get_condition(&owner.status.conditions, SELECTED_BY_ANOTHER_CHECK).is_none());
    w.apply(0, &owner);

    let other = w.decide(1, now);
    assert!(other.actions.is_empty(), "the other check writes nothing: {:?}", other.actions);
    assert!(other.held_elsewhere.is_empty());
    assert_eq!((other.status.expected_machines, other.status.current_healthy), (2, 1), "it still counts them");
    let message = "MachineHealthCheck/ns/workers writes the health-check conditions of and remediates Machines ns/m1, ns/m2, which this check also selects; this check counts them but writes nothing on them";
    let c = get_condition(&other.status.conditions, SELECTED_BY_ANOTHER_CHECK).expect("the condition");
    assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("True", REASON_OVERLAP, message));
    assert_eq!(overlap_notices(&other), [message]);
    assert!(
        other.notices.iter().all(|n| n.kind == NoticeKind::MachinesSelectedByAnotherCheck),
        "no per-Machine notice from the other check: {:?}",
        other.notices
    );
    w.apply(1, &other);

    // Said once: deciding again tells nothing new.
    let again = w.decide(1, at(700));
    assert!(again.actions.is_empty() && again.notices.is_empty(), "{again:?}");

    // The owner stops selecting m2 (its selector narrows to m1): the condition names m1 only,
    // and is told again; then the owner goes away: False, and nothing to tell.
    w.checks[0] = check("workers", Some(0), json!({"pool": "workers", "keep": "yes"}), "300s");
    w.machines[0] = {
        let mut m = w.machines[0].clone();
        m["metadata"]["labels"]["keep"] = json!("yes");
        m
    };
    let narrower = w.decide(1, at(700));
    assert_eq!(
        overlap_notices(&narrower),
        [
            "MachineHealthCheck/ns/workers writes the health-check conditions of and remediates Machine ns/m1, which this check also selects; this check counts them but writes nothing on them"
        ]
    );
    assert_eq!(written_machines(&narrower), Vec::<String>::new(), "m2 was already written healthy by workers");
    w.apply(1, &narrower);
    w.checks.remove(0);
    let alone = w.decide(0, at(700));
    let c = get_condition(&alone.status.conditions, SELECTED_BY_ANOTHER_CHECK).expect("the condition stays, False");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", REASON_NO_OVERLAP));
    assert!(overlap_notices(&alone).is_empty());
    assert!(
        support::written(&alone, "m1", "OwnerRemediated").is_none(),
        "OwnerRemediated=False is already on m1: nothing to ask twice"
    );
}

#[test]
fn a_check_without_overlap_shows_nothing_new() {
    let mut w = repro();
    w.checks.truncate(1);
    let plan = w.decide(0, at(400));
    assert!(get_condition(&plan.status.conditions, SELECTED_BY_ANOTHER_CHECK).is_none());
    assert!(overlap_notices(&plan).is_empty());
}

// ---------------------------------------------------------------- the invariant

#[derive(Debug, Clone)]
struct Case {
    /// Per Machine: its zone label (0..2) and whether its Node is Ready=False.
    machines: Vec<(u8, bool)>,
    /// Per check: creation time (seconds, or none), zone it selects (none: every worker), timeout (s).
    checks: Vec<(Option<i64>, Option<u8>, i64)>,
    /// Decision order of each round (indices into checks, repeated and shuffled).
    orders: Vec<Vec<usize>>,
    now: i64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0u8..2, any::<bool>()), 1..6),
        prop::collection::vec(
            (prop::option::of(0i64..3), prop::option::of(0u8..2), prop::sample::select(vec![60i64, 300, 600])),
            2..5,
        ),
        0i64..900,
    )
        .prop_flat_map(|(machines, checks, now)| {
            let n = checks.len();
            let order = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
            (Just(machines), Just(checks), prop::collection::vec(order, 4), Just(now))
        })
        .prop_map(|(machines, checks, orders, now)| Case { machines, checks, orders, now })
}

fn world(c: &Case) -> World {
    let mut machines = Vec::new();
    let mut nodes = HashMap::new();
    for (i, (zone, broken)) in c.machines.iter().enumerate() {
        let name = format!("m{i}");
        machines.push(machine(&name).label("zone", &zone.to_string()).node(&name).json());
        let n = node(&name).ready(if *broken { "False" } else { "True" }, t0()).build();
        nodes.insert(name, n);
    }
    let checks = c
        .checks
        .iter()
        .enumerate()
        .map(|(i, (created, zone, timeout))| {
            let selector = match zone {
                Some(z) => json!({"pool": "workers", "zone": z.to_string()}),
                None => json!({"pool": "workers"}),
            };
            check(&format!("c{i}"), *created, selector, &format!("{timeout}s"))
        })
        .collect();
    World { machines, nodes, checks }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For any overlapping MachineHealthChecks: at most one check ever writes conditions to any
    /// one Machine, and deciding the checks repeatedly in any order settles: after two rounds no
    /// plan changes anything (no write, no notice, the same status).
    #[test]
    fn one_writer_per_machine_and_settles(c in case()) {
        let mut w = world(&c);
        let now = at(c.now);
        let mut writers: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
        for (round, order) in c.orders.iter().enumerate() {
            for &i in order {
                let plan = w.decide(i, now);
                for m in written_machines(&plan) {
                    writers.entry(m).or_default().insert(i);
                }
                if round >= 2 {
                    prop_assert!(plan.actions.is_empty(), "round {round}, check c{i} still writes: {:?}", plan.actions);
                    prop_assert!(plan.notices.is_empty(), "round {round}, check c{i} still tells: {:?}", plan.notices);
                    prop_assert_eq!(Some(&plan.status), w.checks[i].status.as_ref(), "round {}, check c{}", round, i);
                }
                w.apply(i, &plan);
            }
        }
        for (m, checks) in &writers {
            prop_assert!(checks.len() <= 1, "Machine {m} written by checks {checks:?}");
        }
    }
}

/// One check of the owner-lookup case: creation time (seconds, or none), dry-run, and its
/// selector's requirements over labels `a`, `b`, `c` (values 0–2): (key, operator, value).
type PeerSpec = (Option<i64>, bool, Vec<(u8, u8, u8)>);

fn selector_of(requirements: &[(u8, u8, u8)]) -> Value {
    let key = |k: u8| ["a", "b", "c"][usize::from(k % 3)];
    let mut labels = serde_json::Map::new();
    let mut expressions = Vec::new();
    for (k, op, v) in requirements {
        match op % 4 {
            0 => {
                labels.insert(key(*k).into(), json!(v.to_string()));
            }
            1 => expressions
                .push(json!({"key": key(*k), "operator": "In", "values": [v.to_string(), ((v + 1) % 3).to_string()]})),
            2 => expressions.push(json!({"key": key(*k), "operator": "Exists"})),
            _ => expressions.push(json!({"key": key(*k), "operator": "NotIn", "values": [v.to_string()]})),
        }
    }
    json!({"matchLabels": labels, "matchExpressions": expressions})
}

/// The ownership rule read literally: rank every check (acting before dry-run, created first,
/// no creation time last, then identity) and take the first that selects the Machine, stopping
/// at `me`.
fn owner_by_scan<'c>(
    checks: &'c [(MachineHealthCheck, MhcPolicy)],
    me: &CheckRef,
    m: &MachineView,
) -> Option<&'c MachineHealthCheck> {
    let mut ranked: Vec<&(MachineHealthCheck, MhcPolicy)> = checks.iter().collect();
    let created = |c: &MachineHealthCheck| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
    ranked.sort_by(|(a, pa), (b, pb)| {
        (pa.dry_run, created(a).is_none(), created(a), CheckRef::of_mhc(a)).cmp(&(
            pb.dry_run,
            created(b).is_none(),
            created(b),
            CheckRef::of_mhc(b),
        ))
    });
    for (c, p) in ranked {
        if CheckRef::of_mhc(c) == *me {
            return None;
        }
        if c.metadata.namespace.as_deref() == Some(m.meta.namespace.as_str()) && vigil_engine::target::is_target(p, m) {
            return Some(c);
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The indexed owner lookup finds exactly the owner a scan over every ranked check finds, for
    /// any selectors (label values, `In` of several values, `Exists`, `NotIn`), any Machine labels
    /// and any deciding check, including one that is not among the peers.
    #[test]
    fn the_indexed_owner_is_the_scanned_owner(
        specs in prop::collection::vec(
            (prop::option::of(0i64..4), any::<bool>(), prop::collection::vec((0u8..3, 0u8..4, 0u8..3), 1..4)),
            1..8,
        ),
        labels in prop::collection::vec(prop::option::of(0u8..3), 3),
        me in 0usize..9,
    ) {
        let specs: Vec<PeerSpec> = specs;
        let checks: Vec<(MachineHealthCheck, MhcPolicy)> = specs
            .iter()
            .enumerate()
            .filter_map(|(i, (created, dry, reqs))| {
                let mut c = check(&format!("c{i}"), *created, json!({}), "5m");
                c.spec.selector = serde_json::from_value(selector_of(reqs)).ok()?;
                c.spec.dry_run = *dry;
                let mut p = vigil_api::validate::machine_health_check(&c).ok()?;
                // Validation adds the cluster-name label to every selector; without it some
                // checks require no label value and are looked at for every Machine.
                if reqs.len() % 2 == 0 {
                    p.selector = vigil_api::selector::Selector::compile(&c.spec.selector).ok()?;
                }
                Some((c, p))
            })
            .collect();
        let mut m = machine("m");
        for (k, v) in ["a", "b", "c"].iter().zip(&labels) {
            if let Some(v) = v {
                m = m.label(k, &v.to_string());
            }
        }
        let m = m.view();
        let peers = MhcPeers::new(checks.iter().map(|(c, p)| MhcPeer::of(c, p)));
        let me = cref(&format!("c{me}"));
        let expected = owner_by_scan(&checks, &me, &m).map(CheckRef::of_mhc);
        prop_assert_eq!(peers.owner_other_than(&me, &m).cloned(), expected);
    }
}
