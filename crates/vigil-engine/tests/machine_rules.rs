//! The MachineHealthCheck rules, one table case (or test) per bullet of the spec: what a user
//! sees — status counts, which Machines get which condition with which reason, which remediation
//! objects are created or deleted, which notices are raised, and the exact next wake-up.

mod support;

use jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use support::*;
use vigil_api::conditions::DesiredCondition;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::views::CapiVersion;
use vigil_api::well_known::*;
use vigil_engine::plan::{Action, NoticeKind, Plan};

// ----------------------------------------------------------------------------------------------
// The table machinery
// ----------------------------------------------------------------------------------------------

type Cond = (&'static str, &'static str, &'static str);

const HCS_TRUE: Cond = (HEALTH_CHECK_SUCCEEDED, "True", "HealthCheckSucceeded");
const OWNER_WAITING: Cond = (OWNER_REMEDIATED, "False", "WaitingForRemediation");
const EXT_WAITING: Cond = (EXTERNALLY_REMEDIATED, "False", "WaitingForRemediation");

fn hcs_false(reason: &'static str) -> Cond {
    (HEALTH_CHECK_SUCCEEDED, "False", reason)
}

/// What a case must produce; every field is checked exactly.
struct Expect {
    /// `expectedMachines`, `currentHealthy`, `remediationsAllowed`.
    counts: (i32, i32, i32),
    /// `status.targets`; `None`: every Machine of the world.
    targets: Option<Vec<&'static str>>,
    /// `RemediationAllowed` (status, reason), `None` when absent.
    remediation_allowed: Option<(&'static str, &'static str)>,
    /// `Paused` (status, reason).
    paused: (&'static str, &'static str),
    /// Conditions written per Machine; a Machine not listed gets no write.
    writes: Vec<(&'static str, Vec<Cond>)>,
    /// Names of remediation objects created.
    creates: Vec<&'static str>,
    /// Names of remediation objects deleted.
    deletes: Vec<&'static str>,
    /// Notices `(kind, target Machine name, reason)`, in order.
    notices: Vec<(NoticeKind, Option<&'static str>, &'static str)>,
    /// The exact next wake-up.
    next_wake: Option<Timestamp>,
}

impl Expect {
    /// Remediation allowed, nothing written, nothing said.
    fn allowed(counts: (i32, i32, i32)) -> Self {
        Expect {
            counts,
            targets: None,
            remediation_allowed: Some(("True", "RemediationAllowed")),
            paused: ("False", "NotPaused"),
            writes: Vec::new(),
            creates: Vec::new(),
            deletes: Vec::new(),
            notices: Vec::new(),
            next_wake: None,
        }
    }

    /// Blocked by the short-circuit (the first time: a `RemediationBlocked` notice).
    fn blocked(counts: (i32, i32, i32)) -> Self {
        Expect {
            remediation_allowed: Some(("False", "TooManyUnhealthy")),
            notices: vec![(NoticeKind::RemediationBlocked, None, "TooManyUnhealthy")],
            ..Expect::allowed(counts)
        }
    }

    /// Paused: only the `Paused` condition changes.
    fn paused() -> Self {
        Expect {
            targets: Some(vec![]),
            remediation_allowed: None,
            paused: ("True", "Paused"),
            notices: vec![(NoticeKind::Paused, None, "Paused")],
            ..Expect::allowed((0, 0, 0))
        }
    }
}

struct Case {
    name: &'static str,
    world: MhcWorld,
    now: Timestamp,
    expect: Expect,
}

fn case(name: &'static str, world: MhcWorld, now: Timestamp, expect: Expect) -> Case {
    Case { name, world, now, expect }
}

/// Checks one plan against its expectation; returns what differs.
fn diff(world: &MhcWorld, plan: &Plan<MachineHealthCheckStatus>, e: &Expect) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, got: String, want: String| {
        if got != want {
            out.push(format!("{what}:\n      got:  {got}\n      want: {want}"));
        }
    };
    let s = &plan.status;
    check(
        "counts (expected, healthy, allowed)",
        format!("{:?}", (s.expected_machines, s.current_healthy, s.remediations_allowed)),
        format!("{:?}", e.counts),
    );
    let want_targets: Vec<String> = match &e.targets {
        Some(t) => t.iter().map(|s| s.to_string()).collect(),
        None => {
            let mut all: Vec<String> = world.machine_views().into_iter().map(|m| m.meta.name).collect();
            all.sort();
            all
        }
    };
    check("targets", format!("{:?}", s.targets), format!("{want_targets:?}"));
    let cond = |type_: &str| check_condition(&s.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()));
    check(
        "RemediationAllowed",
        format!("{:?}", cond(REMEDIATION_ALLOWED)),
        format!("{:?}", e.remediation_allowed.map(|(a, b)| (a.to_string(), b.to_string()))),
    );
    check(
        "Paused",
        format!("{:?}", cond(PAUSED)),
        format!("{:?}", Some((e.paused.0.to_string(), e.paused.1.to_string()))),
    );
    let want_writes: BTreeMap<String, Vec<(String, String, String)>> = e
        .writes
        .iter()
        .map(|(m, list)| {
            let mut list: Vec<(String, String, String)> =
                list.iter().map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string())).collect();
            list.sort();
            (m.to_string(), list)
        })
        .collect();
    check("machine writes", format!("{:?}", machine_writes(plan)), format!("{want_writes:?}"));
    let mut want_creates: Vec<&str> = e.creates.clone();
    want_creates.sort();
    check("creates", format!("{:?}", created_names(plan)), format!("{want_creates:?}"));
    let mut want_deletes: Vec<&str> = e.deletes.clone();
    want_deletes.sort();
    check("deletes", format!("{:?}", deleted_names(plan)), format!("{want_deletes:?}"));
    let want_notices: Vec<_> = e.notices.iter().map(|(k, t, r)| (*k, t.map(key), r.to_string())).collect();
    check("notices", format!("{:?}", notices(plan)), format!("{want_notices:?}"));
    check("next_wake", format!("{:?}", plan.next_wake), format!("{:?}", e.next_wake));
    out
}

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in &cases {
        let plan = c.world.decide(c.now);
        let problems = diff(&c.world, &plan, &c.expect);
        if !problems.is_empty() {
            failures.push(format!("case {:?}:\n  {}", c.name, problems.join("\n  ")));
        }
        assert_eq!(plan, c.world.decide(c.now), "case {:?}: deciding twice gives the same plan", c.name);
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// One hour after `T0`: the default decision instant.
fn now() -> Timestamp {
    at(3600)
}

/// A world whose previous status carries these check conditions.
fn with_previous(mut world: MhcWorld, conditions: &[(&str, &str, &str)]) -> MhcWorld {
    let mut status = MachineHealthCheckStatus::default();
    for (type_, s, reason) in conditions {
        let desired = DesiredCondition {
            type_: type_.to_string(),
            status: vigil_api::conditions::ConditionStatus::parse(s).expect("a condition status"),
            reason: vigil_api::reason::Reason::read(reason),
            message: String::new(),
        };
        vigil_api::conditions::set_condition(&mut status.conditions, &desired, t0(), Some(1));
    }
    world.status = Some(status);
    world
}

/// `n` healthy Machines `h1..hn` with Nodes.
fn healthy_fleet(mut world: MhcWorld, n: usize) -> MhcWorld {
    for i in 1..=n {
        world = world.machine_with_node(machine(&format!("h{i}")), "True", t0());
    }
    world
}

/// `n` Machines `u1..un` whose Node has been `Ready=False` since `T0`.
fn unhealthy_fleet(mut world: MhcWorld, n: usize) -> MhcWorld {
    for i in 1..=n {
        world = world.machine_with_node(machine(&format!("u{i}")), "False", t0());
    }
    world
}

/// The first `n` names of a fleet built by [`healthy_fleet`] (`"h"`) or [`unhealthy_fleet`] (`"u"`).
fn names(prefix: &str, n: usize) -> Vec<&'static str> {
    const H: [&str; 7] = ["h1", "h2", "h3", "h4", "h5", "h6", "h7"];
    const U: [&str; 7] = ["u1", "u2", "u3", "u4", "u5", "u6", "u7"];
    let all = if prefix == "h" { &H } else { &U };
    all[..n].to_vec()
}

// ----------------------------------------------------------------------------------------------
// Rule 1: targets and pause
// ----------------------------------------------------------------------------------------------

#[test]
fn rule1_targets_and_pause() {
    let bad = |name: &str| machine(name);
    run(vec![
        case(
            "only selected Machines of the cluster, without opt-out annotations, are targets",
            MhcWorld::new()
                .machine_with_node(machine("m1"), "True", t0())
                .machine_with_node(bad("m2").label(POOL_LABEL, "other"), "False", t0())
                .machine_with_node(bad("m3").label(CLUSTER_NAME_LABEL, "other-cluster"), "False", t0())
                .machine_with_node(bad("m4").without_label(CLUSTER_NAME_LABEL), "False", t0())
                .machine_with_node(bad("m5").annotation(PAUSED_ANNOTATION, ""), "False", t0())
                .machine_with_node(bad("m6").annotation(SKIP_REMEDIATION_ANNOTATION, ""), "False", t0()),
            now(),
            Expect { targets: Some(vec!["m1"]), writes: vec![("m1", vec![HCS_TRUE])], ..Expect::allowed((1, 1, 1)) },
        ),
        case(
            "a paused Cluster (v1beta2) pauses the check: no Machine writes",
            MhcWorld::new()
                .cluster(Some(cluster().paused()))
                .machine_with_node(machine("m1"), "False", t0())
                .machine_with_node(machine("m2"), "True", t0()),
            now(),
            Expect::paused(),
        ),
        case(
            "a paused Cluster (v1beta1) pauses the check",
            MhcWorld::new().cluster(Some(cluster().version(CapiVersion::V1Beta1).paused())).machine_with_node(
                machine("m1"),
                "False",
                t0(),
            ),
            now(),
            Expect::paused(),
        ),
        case(
            "the paused annotation on the check pauses it",
            MhcWorld::new().annotate(PAUSED_ANNOTATION, "").machine(machine("m1").node("gone")),
            now(),
            Expect::paused(),
        ),
        case(
            "a paused check already said so: no second notice",
            with_previous(
                MhcWorld::new().annotate(PAUSED_ANNOTATION, "").machine(machine("m1").node("gone")),
                &[(PAUSED, "True", "Paused")],
            ),
            now(),
            Expect { notices: vec![], ..Expect::paused() },
        ),
        case(
            "an unpaused check that was paused says Resumed and decides again",
            with_previous(
                MhcWorld::new().machine_with_node(machine("m1"), "True", t0()),
                &[(PAUSED, "True", "Paused")],
            ),
            now(),
            Expect {
                writes: vec![("m1", vec![HCS_TRUE])],
                notices: vec![(NoticeKind::Resumed, None, "NotPaused")],
                ..Expect::allowed((1, 1, 1))
            },
        ),
    ]);
}

// ----------------------------------------------------------------------------------------------
// Rule 2: the verdict of each target, in order
// ----------------------------------------------------------------------------------------------

/// An unhealthy verdict on `m1` with remediation requested from the owner (one target, 100%).
fn unhealthy_m1(reason: &'static str) -> Expect {
    Expect {
        writes: vec![("m1", vec![hcs_false(reason), OWNER_WAITING])],
        notices: vec![
            (NoticeKind::Unhealthy, Some("m1"), reason),
            (NoticeKind::RemediationRequested, Some("m1"), "WaitingForRemediation"),
        ],
        ..Expect::allowed((1, 0, 0))
    }
}

#[test]
fn rule2_remediate_annotation_and_failure() {
    let failed = |v: CapiVersion, r: Option<&str>, m: Option<&str>| {
        MhcWorld::new().machine_with_node(machine("m1").version(v).failure(r, m), "True", t0())
    };
    run(vec![
        case(
            "the remediate-machine annotation makes a healthy Machine unhealthy at once",
            MhcWorld::new().machine_with_node(machine("m1").annotation(REMEDIATE_MACHINE_ANNOTATION, ""), "True", t0()),
            now(),
            unhealthy_m1("HasRemediateAnnotation"),
        ),
        case(
            "the annotation comes first, before a failure and a Node timer",
            MhcWorld::new().machine_with_node(
                machine("m1").annotation(REMEDIATE_MACHINE_ANNOTATION, "").failure(Some("UpdateError"), None),
                "False",
                at(3599),
            ),
            now(),
            unhealthy_m1("HasRemediateAnnotation"),
        ),
        case(
            "v1beta1 status.failureReason + failureMessage",
            failed(CapiVersion::V1Beta1, Some("UpdateError"), Some("boom")),
            now(),
            unhealthy_m1("MachineHasFailure"),
        ),
        case(
            "v1beta1 status.failureReason alone",
            failed(CapiVersion::V1Beta1, Some("UpdateError"), None),
            now(),
            unhealthy_m1("MachineHasFailure"),
        ),
        case(
            "v1beta2 status.deprecated.v1beta1.failureReason + failureMessage",
            failed(CapiVersion::V1Beta2, Some("UpdateError"), Some("boom")),
            now(),
            unhealthy_m1("MachineHasFailure"),
        ),
        case(
            "v1beta2 status.deprecated.v1beta1.failureMessage alone",
            failed(CapiVersion::V1Beta2, None, Some("boom")),
            now(),
            unhealthy_m1("MachineHasFailure"),
        ),
        case(
            "a failure needs no Node and no timeout: even a brand-new Machine",
            MhcWorld::new().machine(machine("m1").created(Some(now())).failure(Some("CreateError"), None)),
            now(),
            unhealthy_m1("MachineHasFailure"),
        ),
    ]);
}

#[test]
fn rule2_cluster_readiness_gates_the_verdict() {
    let fleet = |c: ClusterJson| {
        MhcWorld::new()
            .cluster(Some(c))
            .machine_with_node(machine("cp1").control_plane(), "False", t0())
            .machine_with_node(machine("w1"), "False", t0())
            .machine(machine("w2"))
    };
    run(vec![
        case(
            "control plane not initialized: only control-plane Machines are evaluated",
            fleet(cluster().control_plane_initialized(None)),
            now(),
            // w1 has a Node, so it counts healthy; w2 (no Node) does not; cp1 is unhealthy.
            Expect {
                writes: vec![("cp1", vec![hcs_false("UnhealthyNode"), OWNER_WAITING])],
                notices: vec![
                    (NoticeKind::Unhealthy, Some("cp1"), "UnhealthyNode"),
                    (NoticeKind::RemediationRequested, Some("cp1"), "WaitingForRemediation"),
                ],
                ..Expect::allowed((3, 1, 1))
            },
        ),
        case(
            "cluster infrastructure not ready: no verdict at all, even for the control plane",
            fleet(cluster().infrastructure_ready(None)),
            now(),
            Expect::allowed((3, 2, 2)),
        ),
        case(
            "v1beta1 Cluster with infrastructure not ready",
            fleet(cluster().version(CapiVersion::V1Beta1).infrastructure_ready(None)),
            now(),
            Expect::allowed((3, 2, 2)),
        ),
    ]);
}

#[test]
fn rule2_unhealthy_messages_carry_the_condition_reason_as_upstream() {
    // Cluster API: "Condition %s on Node is reporting status %s with reason %s for more than %s"
    // (and the same for Machine conditions); the reason tells an operator what broke.
    let world = MhcWorld::new()
        .spec("unhealthyMachineConditions", json!([{"type": "NodeHealthy", "status": "False", "timeout": "120s"}]))
        .machine_with_node(machine("m1"), "False", t0())
        .machine_with_node(machine("m2").condition("NodeHealthy", "False", t0()), "True", t0());
    let plan = world.decide(now());
    let mut unhealthy: Vec<(Option<String>, String)> = plan
        .notices
        .iter()
        .filter(|n| n.kind == NoticeKind::Unhealthy)
        .map(|n| (n.target_key(), n.message.clone()))
        .collect();
    unhealthy.sort();
    let m1 = unhealthy[0].1.as_str();
    assert!(m1.starts_with("Health check failed: Condition Ready on Node "), "{m1}");
    assert!(m1.ends_with(" is reporting status False with reason Test for more than 5m0s"), "{m1}");
    assert_eq!(
        unhealthy[1].1,
        "Health check failed: Condition NodeHealthy on Machine m2 is reporting status False with reason Test for more than 2m0s"
    );
}

#[test]
fn rule2_unhealthy_machine_conditions() {
    let world = || {
        MhcWorld::new()
            .spec("unhealthyMachineConditions", json!([{"type": "NodeHealthy", "status": "False", "timeout": "120s"}]))
    };
    run(vec![
        case(
            "a Machine condition held past its timeout is UnhealthyMachine; one still timing sets the wake-up",
            world()
                .machine_with_node(machine("m1").condition("NodeHealthy", "False", t0()), "True", t0())
                .machine_with_node(machine("m2").condition("NodeHealthy", "False", at(3540)), "True", t0()),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyMachine"), OWNER_WAITING])],
                notices: vec![
                    (NoticeKind::Unhealthy, Some("m1"), "UnhealthyMachine"),
                    (NoticeKind::RemediationRequested, Some("m1"), "WaitingForRemediation"),
                ],
                next_wake: Some(plus_ns(at(3660), 1)),
                ..Expect::allowed((2, 0, 0))
            },
        ),
        case(
            "Machine conditions come before the Node: a deleted Node still reports UnhealthyMachine",
            world().machine(machine("m1").node("gone").condition("NodeHealthy", "False", t0())),
            now(),
            unhealthy_m1("UnhealthyMachine"),
        ),
        case(
            "v1beta1 Machine: the v1beta2 condition (status.v1beta2.conditions) is the one checked",
            world().machine_with_node(
                machine("m1").v1beta1().new_condition("NodeHealthy", "False", t0()).condition(
                    "NodeHealthy",
                    "True",
                    t0(),
                ),
                "True",
                t0(),
            ),
            now(),
            unhealthy_m1("UnhealthyMachine"),
        ),
        case(
            "v1beta1 Machine with only the legacy condition is checked too",
            world().machine_with_node(machine("m1").v1beta1().condition("NodeHealthy", "False", t0()), "True", t0()),
            now(),
            unhealthy_m1("UnhealthyMachine"),
        ),
        case(
            "a Machine condition with another status is healthy",
            world().machine_with_node(machine("m1").condition("NodeHealthy", "True", t0()), "True", t0()),
            now(),
            Expect { writes: vec![("m1", vec![HCS_TRUE])], ..Expect::allowed((1, 1, 1)) },
        ),
    ]);
}

#[test]
fn rule2_node_deleted_and_startup_timeout() {
    // Startup is timed from the latest of: Machine creation, Cluster ControlPlaneInitialized,
    // Cluster InfrastructureReady, Machine InfrastructureReady (True). Each is the latest once.
    let sources = |latest: usize| {
        let t = |i: usize| if i == latest { at(300) } else { at(100) };
        let world = MhcWorld::new()
            .cluster(Some(cluster().control_plane_initialized(Some(t(1))).infrastructure_ready(Some(t(2)))));
        world.machine(machine("m1").created(Some(t(0))).condition(INFRASTRUCTURE_READY, "True", t(3)))
    };
    let deadline = at(900); // 300s + the default 10m
    let mut cases = vec![
        case(
            "nodeRef set but the Node is gone: NodeDeleted",
            MhcWorld::new().machine(machine("m1").node("gone")),
            now(),
            unhealthy_m1("NodeDeleted"),
        ),
        case(
            "NodeDeleted does not wait for, nor need, nodeStartupTimeout",
            MhcWorld::new()
                .spec("nodeStartupTimeout", json!("0"))
                .machine(machine("m1").node("gone").created(Some(now()))),
            now(),
            unhealthy_m1("NodeDeleted"),
        ),
        case(
            "Machine InfrastructureReady=False does not move the start",
            MhcWorld::new().machine(machine("m1").created(Some(at(100))).condition(
                INFRASTRUCTURE_READY,
                "False",
                at(500),
            )),
            at(700),
            Expect { next_wake: Some(plus_ns(at(700), 1)), ..Expect::allowed((1, 0, 0)) },
        ),
        case(
            "nodeStartupTimeout 0 disables it: no verdict, no timer, not healthy",
            MhcWorld::new().spec("nodeStartupTimeout", json!("0")).machine(machine("m1")),
            now(),
            Expect::allowed((1, 0, 0)),
        ),
        case(
            "a custom nodeStartupTimeout is honoured",
            MhcWorld::new().spec("nodeStartupTimeout", json!("45s")).machine(machine("m1").created(Some(at(3500)))),
            now(),
            unhealthy_m1("NodeStartupTimeout"),
        ),
    ];
    let v1beta1_cluster = MhcWorld::new()
        .cluster(Some(cluster().version(CapiVersion::V1Beta1).control_plane_initialized(Some(at(300)))))
        .machine(machine("m1").created(Some(at(100))));
    cases.push(case(
        "v1beta1 Cluster: startup timed from its ControlPlaneInitialized: pending",
        v1beta1_cluster.clone(),
        deadline,
        Expect { next_wake: Some(plus_ns(deadline, 1)), ..Expect::allowed((1, 0, 0)) },
    ));
    cases.push(case(
        "v1beta1 Cluster: startup timed from its ControlPlaneInitialized: due",
        v1beta1_cluster,
        plus_ns(deadline, 1),
        unhealthy_m1("NodeStartupTimeout"),
    ));
    for (latest, name_pending, name_due) in [
        (
            0,
            "startup timed from creation: at the deadline, pending",
            "startup timed from creation: 1ns later, NodeStartupTimeout",
        ),
        (1, "startup timed from ControlPlaneInitialized: pending", "startup timed from ControlPlaneInitialized: due"),
        (
            2,
            "startup timed from Cluster InfrastructureReady: pending",
            "startup timed from Cluster InfrastructureReady: due",
        ),
        (
            3,
            "startup timed from Machine InfrastructureReady: pending",
            "startup timed from Machine InfrastructureReady: due",
        ),
    ] {
        cases.push(case(
            name_pending,
            sources(latest),
            deadline,
            Expect { next_wake: Some(plus_ns(deadline, 1)), ..Expect::allowed((1, 0, 0)) },
        ));
        cases.push(case(name_due, sources(latest), plus_ns(deadline, 1), unhealthy_m1("NodeStartupTimeout")));
    }
    run(cases);
}

#[test]
fn rule2_unhealthy_node_conditions_and_the_exact_deadline() {
    let deadline = at(300);
    run(vec![
        case(
            "Ready=False exactly at lastTransitionTime + timeout is NOT unhealthy yet",
            MhcWorld::new().machine_with_node(machine("m1"), "False", t0()),
            deadline,
            Expect { next_wake: Some(plus_ns(deadline, 1)), ..Expect::allowed((1, 0, 0)) },
        ),
        case(
            "Ready=False one nanosecond after the deadline is UnhealthyNode",
            MhcWorld::new().machine_with_node(machine("m1"), "False", t0()),
            plus_ns(deadline, 1),
            unhealthy_m1("UnhealthyNode"),
        ),
        case(
            "Ready=Unknown past its timeout is UnhealthyNode",
            MhcWorld::new().machine_with_node(machine("m1"), "Unknown", t0()),
            now(),
            unhealthy_m1("UnhealthyNode"),
        ),
        case(
            "Ready=True is healthy",
            MhcWorld::new().machine_with_node(machine("m1"), "True", t0()),
            now(),
            Expect { writes: vec![("m1", vec![HCS_TRUE])], ..Expect::allowed((1, 1, 1)) },
        ),
        case(
            "a condition no rule names does not matter",
            MhcWorld::new().machine(machine("m1").node("n1")).node(node("n1").ready("True", t0()).condition(
                "DiskPressure",
                "True",
                t0(),
            )),
            now(),
            Expect { writes: vec![("m1", vec![HCS_TRUE])], ..Expect::allowed((1, 1, 1)) },
        ),
        case(
            "the earliest of several pending timers is the wake-up",
            MhcWorld::new()
                .machine_with_node(machine("m1"), "False", at(3500))
                .machine_with_node(machine("m2"), "Unknown", at(3400))
                .machine(machine("m3").created(Some(at(3300)))),
            now(),
            Expect { next_wake: Some(plus_ns(at(3700), 1)), ..Expect::allowed((3, 0, 0)) },
        ),
    ]);
}

// ----------------------------------------------------------------------------------------------
// Rule 3: what counts as healthy, and the short-circuit
// ----------------------------------------------------------------------------------------------

#[test]
fn rule3_short_circuit() {
    // m1 unhealthy, m2 pending (Node), m3 pending (no Node yet), m4 healthy: 3 not healthy.
    let mixed = |max: Value| {
        MhcWorld::new()
            .spec("maxUnhealthy", max)
            .machine_with_node(machine("m1"), "False", t0())
            .machine_with_node(machine("m2"), "False", at(3590))
            .machine(machine("m3").created(Some(at(3540))))
            .machine_with_node(machine("m4"), "True", t0())
    };
    let mixed_wake = Some(plus_ns(at(3890), 1));
    let seven = |unhealthy: usize| {
        unhealthy_fleet(healthy_fleet(MhcWorld::new().spec("maxUnhealthy", json!("40%")), 7 - unhealthy), unhealthy)
    };
    let healthy_writes = |n: usize| names("h", n).into_iter().map(|m| (m, vec![HCS_TRUE])).collect::<Vec<_>>();
    let requested = |n: usize| {
        names("u", n).into_iter().map(|m| (m, vec![hcs_false("UnhealthyNode"), OWNER_WAITING])).collect::<Vec<_>>()
    };
    let notified = |n: usize, requested: bool| {
        let mut out = Vec::new();
        for m in names("u", n) {
            out.push((NoticeKind::Unhealthy, Some(m), "UnhealthyNode"));
            if requested {
                out.push((NoticeKind::RemediationRequested, Some(m), "WaitingForRemediation"));
            }
        }
        out
    };
    let range = |r: &str, max: Value, unhealthy: usize| {
        unhealthy_fleet(
            healthy_fleet(MhcWorld::new().spec("unhealthyRange", json!(r)).spec("maxUnhealthy", max), 3),
            unhealthy,
        )
    };
    run(vec![
        case(
            "pending and not-yet-started targets count against the limit: 3 of 4 > maxUnhealthy 2",
            mixed(json!(2)),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode")]), ("m4", vec![HCS_TRUE])],
                notices: vec![
                    (NoticeKind::RemediationBlocked, None, "TooManyUnhealthy"),
                    (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                ],
                next_wake: mixed_wake,
                ..Expect::blocked((4, 1, 0))
            },
        ),
        case(
            "3 of 4 within maxUnhealthy 3: allowed, none left",
            mixed(json!(3)),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode"), OWNER_WAITING]), ("m4", vec![HCS_TRUE])],
                notices: vec![
                    (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                    (NoticeKind::RemediationRequested, Some("m1"), "WaitingForRemediation"),
                ],
                next_wake: mixed_wake,
                ..Expect::allowed((4, 1, 0))
            },
        ),
        case(
            "a deleting Machine with a healthy Node is not counted healthy",
            MhcWorld::new()
                .spec("maxUnhealthy", json!(0))
                .machine_with_node(machine("m1").deleting(), "True", t0())
                .machine_with_node(machine("m2"), "True", t0()),
            now(),
            Expect { writes: vec![("m2", vec![HCS_TRUE])], ..Expect::blocked((2, 1, 0)) },
        ),
        case(
            "40% of 7 rounds down to 2: 2 unhealthy are allowed",
            seven(2),
            now(),
            Expect {
                writes: [healthy_writes(5), requested(2)].concat(),
                notices: notified(2, true),
                ..Expect::allowed((7, 5, 0))
            },
        ),
        case(
            "40% of 7 rounds down to 2: 3 unhealthy are blocked",
            seven(3),
            now(),
            Expect {
                writes: [
                    healthy_writes(4),
                    names("u", 3).into_iter().map(|m| (m, vec![hcs_false("UnhealthyNode")])).collect(),
                ]
                .concat(),
                notices: [vec![(NoticeKind::RemediationBlocked, None, "TooManyUnhealthy")], notified(3, false)]
                    .concat(),
                ..Expect::blocked((7, 4, 0))
            },
        ),
        case(
            "unhealthyRange wins over maxUnhealthy: [1-2] allows 1 even with maxUnhealthy 0",
            range("[1-2]", json!(0), 1),
            now(),
            Expect {
                writes: [healthy_writes(3), requested(1)].concat(),
                notices: notified(1, true),
                ..Expect::allowed((4, 3, 1))
            },
        ),
        case(
            "unhealthyRange upper bound is inclusive: [1-2] allows 2",
            range("[1-2]", json!(0), 2),
            now(),
            Expect {
                writes: [healthy_writes(3), requested(2)].concat(),
                notices: notified(2, true),
                ..Expect::allowed((5, 3, 0))
            },
        ),
        case(
            "unhealthyRange wins over maxUnhealthy: [0-1] blocks 2 even with maxUnhealthy 100%",
            range("[0-1]", json!("100%"), 2),
            now(),
            Expect {
                writes: [
                    healthy_writes(3),
                    names("u", 2).into_iter().map(|m| (m, vec![hcs_false("UnhealthyNode")])).collect(),
                ]
                .concat(),
                notices: [vec![(NoticeKind::RemediationBlocked, None, "TooManyUnhealthy")], notified(2, false)]
                    .concat(),
                ..Expect::blocked((5, 3, 0))
            },
        ),
        case(
            "below the range's minimum is blocked: [2-3] with 1",
            range("[2-3]", json!("100%"), 1),
            now(),
            Expect {
                writes: [healthy_writes(3), vec![("u1", vec![hcs_false("UnhealthyNode")])]].concat(),
                notices: [vec![(NoticeKind::RemediationBlocked, None, "TooManyUnhealthy")], notified(1, false)]
                    .concat(),
                ..Expect::blocked((4, 3, 0))
            },
        ),
        case(
            "a count maxUnhealthy: 2 of 2 allowed, the rest of the budget is reported",
            unhealthy_fleet(healthy_fleet(MhcWorld::new().spec("maxUnhealthy", json!(3)), 1), 2),
            now(),
            Expect {
                writes: [healthy_writes(1), requested(2)].concat(),
                notices: notified(2, true),
                ..Expect::allowed((3, 1, 1))
            },
        ),
    ]);
}

#[test]
fn rule3_blocked_message_names_total_unhealthy_and_limit() {
    let cases = [
        (json!({"maxUnhealthy": "40%"}), 7, 3, "exceeds maxUnhealthy (total: 7, unhealthy: 3, maxUnhealthy: 40%)"),
        (json!({"maxUnhealthy": 1}), 3, 2, "exceeds maxUnhealthy (total: 3, unhealthy: 2, maxUnhealthy: 1)"),
        (
            json!({"unhealthyRange": "[2-3]"}),
            4,
            1,
            "does not fall within the range (total: 4, unhealthy: 1, unhealthyRange: [2-3])",
        ),
        (
            json!({"unhealthyRange": "[0-1]"}),
            4,
            2,
            "does not fall within the range (total: 4, unhealthy: 2, unhealthyRange: [0-1])",
        ),
    ];
    for (spec, total, unhealthy, want) in cases {
        let mut world = unhealthy_fleet(healthy_fleet(MhcWorld::new(), total - unhealthy), unhealthy);
        for (k, v) in spec.as_object().expect("object") {
            world = world.spec(k, v.clone());
        }
        let plan = world.decide(now());
        let c = check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).expect("RemediationAllowed");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "TooManyUnhealthy"));
        assert_eq!(
            c.message,
            format!("Remediation is not allowed, the number of not started or unhealthy machines {want}")
        );
        assert_eq!(plan.notices[0].message, c.message, "the notice says the same");
    }
}

// ----------------------------------------------------------------------------------------------
// Rule 4: remediation when allowed
// ----------------------------------------------------------------------------------------------

#[test]
fn rule4_remediation_when_allowed() {
    let pair = || {
        MhcWorld::new().machine_with_node(machine("m1"), "False", t0()).machine_with_node(machine("m2"), "True", t0())
    };
    let own_notices = vec![
        (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
        (NoticeKind::RemediationRequested, Some("m1"), "WaitingForRemediation"),
    ];
    run(vec![
        case(
            "without a template: OwnerRemediated=False/WaitingForRemediation; the healthy one gets HealthCheckSucceeded=True",
            pair(),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode"), OWNER_WAITING]), ("m2", vec![HCS_TRUE])],
                notices: own_notices.clone(),
                ..Expect::allowed((2, 1, 1))
            },
        ),
        case(
            "OwnerRemediated=True is turned into a new request",
            MhcWorld::new().machine_with_node(machine("m1").condition(OWNER_REMEDIATED, "True", t0()), "False", t0()),
            now(),
            unhealthy_m1("UnhealthyNode"),
        ),
        case(
            "OwnerRemediated=False set by the owner with its own reason is left alone",
            MhcWorld::new().machine_with_node(
                machine("m1").raw_condition(json!({"type": OWNER_REMEDIATED, "status": "False", "reason": "MachineDeleting", "message": "deleting", "lastTransitionTime": t0().to_string()})),
                "False",
                t0(),
            ),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode")])],
                notices: vec![(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode")],
                ..Expect::allowed((1, 0, 0))
            },
        ),
        case(
            "v1beta1: OwnerRemediated=False set by the owner in status.v1beta2.conditions is left alone",
            MhcWorld::new().machine_with_node(machine("m1").v1beta1().new_condition(OWNER_REMEDIATED, "False", t0()), "False", t0()),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode")])],
                notices: vec![(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode")],
                ..Expect::allowed((1, 0, 0))
            },
        ),
        case(
            "a deleting Machine is marked unhealthy but never asked to be remediated",
            MhcWorld::new().machine_with_node(machine("m1").deleting(), "False", t0()),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode")])],
                notices: vec![(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode")],
                ..Expect::allowed((1, 0, 0))
            },
        ),
        case(
            "with a template: a remediation object and ExternallyRemediated=False; no OwnerRemediated",
            pair().with_template(),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode"), EXT_WAITING]), ("m2", vec![HCS_TRUE])],
                creates: vec!["m1"],
                notices: vec![(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode")],
                ..Expect::allowed((2, 1, 1))
            },
        ),
        case(
            "with a template: a deleting Machine gets no object",
            MhcWorld::new().with_template().machine_with_node(machine("m1").deleting(), "False", t0()),
            now(),
            Expect {
                writes: vec![("m1", vec![hcs_false("UnhealthyNode")])],
                notices: vec![(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode")],
                ..Expect::allowed((1, 0, 0))
            },
        ),
        case(
            "healthy again: its remediation object is deleted, HealthCheckSucceeded=True, Healthy notice",
            MhcWorld::new()
                .with_template()
                .machine_with_node(machine("m1").condition(HEALTH_CHECK_SUCCEEDED, "False", t0()), "True", at(60))
                .remediation(remediation_json(NS, "m1", "Machine", "m1")),
            now(),
            Expect {
                writes: vec![("m1", vec![HCS_TRUE])],
                deletes: vec!["m1"],
                notices: vec![(NoticeKind::Healthy, Some("m1"), "HealthCheckSucceeded")],
                ..Expect::allowed((1, 1, 1))
            },
        ),
        case(
            "an object of the same name that another owner made is not deleted",
            MhcWorld::new()
                .with_template()
                .machine_with_node(machine("m1"), "True", t0())
                .remediation(remediation_json(NS, "m1", "Machine", "someone-else")),
            now(),
            Expect { writes: vec![("m1", vec![HCS_TRUE])], ..Expect::allowed((1, 1, 1)) },
        ),
    ]);
}

#[test]
fn rule4_the_remediation_object_is_built_from_the_template() {
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let world = MhcWorld::new().with_template().machine_with_node(machine("m1").version(version), "False", t0());
        let plan = world.decide(now());
        let created: Vec<_> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateRemediation { object, target, .. } => Some((object.clone(), target.key())),
                _ => None,
            })
            .collect();
        assert_eq!(
            created,
            vec![(
                json!({
                    "apiVersion": REMEDIATION_API_VERSION,
                    "kind": REMEDIATION_KIND,
                    "metadata": {
                        "name": "m1",
                        "namespace": NS,
                        "labels": {CLUSTER_NAME_LABEL: CLUSTER},
                        "ownerReferences": [{"apiVersion": capi_api_version(version), "kind": "Machine", "name": "m1", "uid": "uid-m1"}],
                    },
                    "spec": remediation_spec(),
                }),
                key("m1"),
            )],
            "{version:?}"
        );
        let (c, at) = written(&plan, "m1", EXTERNALLY_REMEDIATED).expect("ExternallyRemediated written");
        assert_eq!((c.status.as_str(), c.reason.as_str(), *at), ("False", "WaitingForRemediation", now()));
    }
}

// ----------------------------------------------------------------------------------------------
// Rule 5: blocked
// ----------------------------------------------------------------------------------------------

#[test]
fn rule5_blocked_writes_health_but_requests_nothing() {
    let fleet = |w: MhcWorld| unhealthy_fleet(healthy_fleet(w.spec("maxUnhealthy", json!(1)), 1), 2);
    let expect = || Expect {
        writes: vec![
            ("h1", vec![HCS_TRUE]),
            ("u1", vec![hcs_false("UnhealthyNode")]),
            ("u2", vec![hcs_false("UnhealthyNode")]),
        ],
        notices: vec![
            (NoticeKind::RemediationBlocked, None, "TooManyUnhealthy"),
            (NoticeKind::Unhealthy, Some("u1"), "UnhealthyNode"),
            (NoticeKind::Unhealthy, Some("u2"), "UnhealthyNode"),
        ],
        ..Expect::blocked((3, 1, 0))
    };
    run(vec![
        case("without a template: no OwnerRemediated", fleet(MhcWorld::new()), now(), expect()),
        case(
            "with a template: no object, no ExternallyRemediated",
            fleet(MhcWorld::new().with_template()),
            now(),
            expect(),
        ),
        case(
            "with a template, a recovered Machine's object is still cleaned up while blocked",
            fleet(MhcWorld::new().with_template()).remediation(remediation_json(NS, "h1", "Machine", "h1")),
            now(),
            Expect { deletes: vec!["h1"], ..expect() },
        ),
        case(
            "still blocked: the notice is not repeated",
            with_previous(
                fleet(MhcWorld::new()),
                &[(PAUSED, "False", "NotPaused"), (REMEDIATION_ALLOWED, "False", "TooManyUnhealthy")],
            ),
            now(),
            Expect { notices: expect().notices.split_off(1), ..expect() },
        ),
    ]);
}

// ----------------------------------------------------------------------------------------------
// Rule 6: fixes of known upstream flaws
// ----------------------------------------------------------------------------------------------

#[test]
fn rule6_one_existing_remediation_object_does_not_stop_the_others() {
    let world = MhcWorld::new()
        .with_template()
        .machine_with_node(machine("m1"), "False", t0())
        .machine_with_node(machine("m2"), "False", t0())
        .remediation(remediation_json(NS, "m1", "Machine", "m1"));
    let plan = world.decide(now());
    let problems = diff(
        &world,
        &plan,
        &Expect {
            writes: vec![
                ("m1", vec![hcs_false("UnhealthyNode"), EXT_WAITING]),
                ("m2", vec![hcs_false("UnhealthyNode"), EXT_WAITING]),
            ],
            creates: vec!["m2"],
            notices: vec![
                (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                (NoticeKind::Unhealthy, Some("m2"), "UnhealthyNode"),
            ],
            ..Expect::allowed((2, 0, 0))
        },
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn rule6_missing_template_still_marks_the_machine_and_says_why() {
    let mut world = MhcWorld::new().with_template().machine_with_node(machine("m1"), "False", t0());
    world.template = None;
    let plan = world.decide(now());
    let problems = diff(
        &world,
        &plan,
        &Expect {
            writes: vec![(
                "m1",
                vec![hcs_false("UnhealthyNode"), (EXTERNALLY_REMEDIATED, "False", "RemediationTemplateNotFound")],
            )],
            notices: vec![
                (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                (NoticeKind::RemediationSkipped, Some("m1"), "RemediationTemplateNotFound"),
            ],
            ..Expect::allowed((1, 0, 0))
        },
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let (c, _) = written(&plan, "m1", EXTERNALLY_REMEDIATED).expect("written");
    assert_eq!(c.message, format!("Remediation template {TEMPLATE_KIND} {NS}/{TEMPLATE_NAME} not found"));
}

#[test]
fn rule6_template_without_spec_template_fails_the_request_without_panicking() {
    let mut world = MhcWorld::new().with_template().machine_with_node(machine("m1"), "False", t0());
    world.template = Some(template_without_body(NS));
    let plan = world.decide(now());
    let problems = diff(
        &world,
        &plan,
        &Expect {
            writes: vec![(
                "m1",
                vec![hcs_false("UnhealthyNode"), (EXTERNALLY_REMEDIATED, "False", "RemediationRequestCreationFailed")],
            )],
            notices: vec![
                (NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                (NoticeKind::RemediationSkipped, Some("m1"), "RemediationRequestCreationFailed"),
            ],
            ..Expect::allowed((1, 0, 0))
        },
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn rule6_healthy_machines_under_a_template_get_health_check_succeeded() {
    let world = MhcWorld::new().with_template().machine_with_node(machine("m1"), "True", t0()).machine_with_node(
        machine("m2").v1beta1(),
        "True",
        t0(),
    );
    let plan = world.decide(now());
    let problems = diff(
        &world,
        &plan,
        &Expect { writes: vec![("m1", vec![HCS_TRUE]), ("m2", vec![HCS_TRUE])], ..Expect::allowed((2, 2, 2)) },
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn rule6_timers_are_kept_while_blocked() {
    // u1, u2 unhealthy (blocked by maxUnhealthy 1); p1's Node went NotReady 100s ago, p2 has no
    // Node yet: the plan must still wake when they can change.
    let world = unhealthy_fleet(MhcWorld::new().spec("maxUnhealthy", json!(1)), 2)
        .machine_with_node(machine("p1"), "False", at(3500))
        .machine(machine("p2").created(Some(at(3200))));
    let plan = world.decide(now());
    let c = check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).expect("RemediationAllowed");
    assert_eq!(c.status, "False");
    assert_eq!(plan.status.remediations_allowed, 0);
    // p1: 3500 + 300s; p2: 3200 + 10m: both at 3800.
    assert_eq!(plan.next_wake, Some(plus_ns(at(3800), 1)));
    // A third one created at 3100 is due at 3700: the earliest wins.
    let world = world.machine(machine("p3").created(Some(at(3100))));
    assert_eq!(world.decide(now()).next_wake, Some(plus_ns(at(3700), 1)));
}

#[test]
fn rule6_a_percentage_is_never_an_error() {
    let cases: Vec<(Value, usize, usize, bool, i32)> = vec![
        // (maxUnhealthy, healthy, unhealthy, allowed, remediationsAllowed)
        (json!("0%"), 0, 0, true, 0),
        (json!("100%"), 0, 0, true, 0),
        (json!("0%"), 3, 0, true, 0),
        (json!("0%"), 2, 1, false, 0),
        (json!("100%"), 0, 3, true, 0),
        (json!("100%"), 2, 1, true, 2),
        (json!("50%"), 1, 0, true, 0),
        (json!("50%"), 0, 1, false, 0),
    ];
    for (max, healthy, unhealthy, allowed, left) in cases {
        let world =
            unhealthy_fleet(healthy_fleet(MhcWorld::new().spec("maxUnhealthy", max.clone()), healthy), unhealthy);
        let plan = world.decide(now());
        let c = check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).expect("RemediationAllowed");
        let what = format!("maxUnhealthy {max} with {healthy} healthy and {unhealthy} unhealthy");
        assert_eq!(c.status == "True", allowed, "{what}: {c:?}");
        assert_eq!(plan.status.remediations_allowed, left, "{what}");
        assert_eq!(plan.status.expected_machines, (healthy + unhealthy) as i32, "{what}");
    }
}

// ----------------------------------------------------------------------------------------------
// Rule 7: safety
// ----------------------------------------------------------------------------------------------

#[test]
fn rule7_safety() {
    let fleet = || {
        MhcWorld::new()
            .with_template()
            .machine_with_node(machine("m1"), "False", t0())
            .machine(machine("m2").node("gone"))
            .machine(machine("m3").created(Some(t0())))
            .machine_with_node(machine("m4"), "True", t0())
    };
    let no_decision = |reason: &'static str| Expect {
        remediation_allowed: Some(("False", reason)),
        notices: vec![(NoticeKind::NoDecision, None, reason)],
        ..Expect::allowed((4, 0, 0))
    };
    let mut unreachable = fleet();
    unreachable.nodes.clear();
    unreachable.unreachable = Some("connection refused".into());
    // A Machine with an unreadable field, whose Node is unhealthy and one whose Node is healthy.
    let broken = |name: &str| machine(name).status_field("conditions", json!("not a list"));
    run(vec![
        case(
            "Cluster not found: no Machine writes, no objects",
            fleet().cluster(None),
            now(),
            no_decision("ClusterNotFound"),
        ),
        case(
            "workload cluster unreachable: no Machine writes, never NodeDeleted",
            unreachable,
            now(),
            no_decision("WorkloadClusterUnreachable"),
        ),
        case(
            "unreadable Machines get no verdict and are not counted healthy",
            MhcWorld::new()
                .spec("maxUnhealthy", json!(1))
                .machine_with_node(broken("b1"), "False", t0())
                .machine_with_node(broken("b2"), "True", t0())
                .machine_with_node(machine("m1"), "True", t0()),
            now(),
            Expect { writes: vec![("m1", vec![HCS_TRUE])], ..Expect::blocked((3, 1, 0)) },
        ),
        case(
            "an unreadable Machine gets no verdict even with the remediate annotation or a failure",
            MhcWorld::new()
                .machine_with_node(broken("b1").annotation(REMEDIATE_MACHINE_ANNOTATION, ""), "True", t0())
                .machine_with_node(broken("b2").failure(Some("UpdateError"), None), "True", t0())
                .machine_with_node(machine("m1").created(None).status_field("conditions", json!(42)), "True", t0()),
            now(),
            Expect::allowed((3, 0, 0)),
        ),
        case(
            "a Node condition without lastTransitionTime cannot be timed: no verdict, not healthy",
            MhcWorld::new().machine(machine("m1").node("n1")).node(node("n1").condition_at("Ready", "False", None)),
            now(),
            Expect::allowed((1, 0, 0)),
        ),
    ]);
    let cluster_message = fleet().cluster(None).decide(now()).notices[0].message.clone();
    assert!(cluster_message.contains(&format!("Cluster {NS}/{CLUSTER} was not found")), "{cluster_message}");
    let mut unreachable = fleet();
    unreachable.unreachable = Some("connection refused".into());
    let message = unreachable.decide(now()).notices[0].message.clone();
    assert!(message.contains("connection refused"), "{message}");
}

// ----------------------------------------------------------------------------------------------
// Both Machine API forms
// ----------------------------------------------------------------------------------------------

#[test]
fn failure_is_read_and_reported_in_both_machine_forms() {
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let world = MhcWorld::new().machine_with_node(
            machine("m1").version(version).failure(Some("UpdateError"), Some("boom")),
            "True",
            t0(),
        );
        let plan = world.decide(now());
        let (c, at) = written(&plan, "m1", HEALTH_CHECK_SUCCEEDED).expect("written");
        assert_eq!((c.status.as_str(), c.reason.as_str(), *at), ("False", "MachineHasFailure", now()), "{version:?}");
        assert_eq!(c.message, "Health check failed: Machine has failed: UpdateError: boom", "{version:?}");
        let failure_path = match version {
            CapiVersion::V1Beta1 => "/status/failureReason",
            CapiVersion::V1Beta2 => "/status/deprecated/v1beta1/failureReason",
        };
        assert_eq!(
            world.machines[0].pointer(failure_path),
            Some(&json!("UpdateError")),
            "the fixture uses the form's own place"
        );
    }
}

#[test]
fn conditions_are_written_in_both_forms_of_each_machine_version() {
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let mut world = MhcWorld::new().machine(machine("m1").version(version).node("gone")).machine_with_node(
            machine("m2").version(version),
            "True",
            t0(),
        );
        let plan = world.decide(now());
        world.apply(&plan);
        let (new_path, legacy_path) = match version {
            CapiVersion::V1Beta1 => ("/status/v1beta2/conditions", "/status/conditions"),
            CapiVersion::V1Beta2 => ("/status/conditions", "/status/deprecated/v1beta1/conditions"),
        };
        let find = |m: &Value, path: &str, type_: &str| -> Value {
            m.pointer(path)
                .and_then(Value::as_array)
                .and_then(|l| l.iter().find(|c| c["type"] == type_).cloned())
                .unwrap_or(Value::Null)
        };
        let (m1, m2) = (&world.machines[0], &world.machines[1]);
        let now_text = now().to_string();
        assert_eq!(
            find(m1, new_path, HEALTH_CHECK_SUCCEEDED),
            json!({"type": HEALTH_CHECK_SUCCEEDED, "status": "False", "reason": "NodeDeleted", "message": "Health check failed: Node gone has been deleted", "lastTransitionTime": now_text, "observedGeneration": 1}),
            "{version:?}"
        );
        assert_eq!(
            find(m1, legacy_path, HEALTH_CHECK_SUCCEEDED),
            json!({"type": HEALTH_CHECK_SUCCEEDED, "status": "False", "severity": "Warning", "reason": "NodeNotFound", "message": "Health check failed: Node gone has been deleted", "lastTransitionTime": now_text}),
            "{version:?}"
        );
        assert_eq!(find(m1, new_path, OWNER_REMEDIATED)["reason"], "WaitingForRemediation", "{version:?}");
        assert_eq!(find(m1, legacy_path, OWNER_REMEDIATED)["reason"], "WaitingForRemediation", "{version:?}");
        assert_eq!(find(m2, new_path, HEALTH_CHECK_SUCCEEDED)["status"], "True", "{version:?}");
        assert_eq!(
            find(m2, legacy_path, HEALTH_CHECK_SUCCEEDED),
            json!({"type": HEALTH_CHECK_SUCCEEDED, "status": "True", "lastTransitionTime": now_text}),
            "{version:?}"
        );
        for action in &plan.actions {
            if let Action::SetMachineConditions { version: v, .. } = action {
                assert_eq!(*v, version, "the write names the Machine's own form");
            }
        }
    }
}

#[test]
fn remediation_conditions_are_written_in_both_forms() {
    let other_conditions = |m: &Value, version: CapiVersion| -> Vec<(String, String, String)> {
        let (new_path, legacy_path) = match version {
            CapiVersion::V1Beta1 => ("/status/v1beta2/conditions", "/status/conditions"),
            CapiVersion::V1Beta2 => ("/status/conditions", "/status/deprecated/v1beta1/conditions"),
        };
        let mut out = Vec::new();
        for (form, path) in [("new", new_path), ("legacy", legacy_path)] {
            for c in m.pointer(path).and_then(Value::as_array).into_iter().flatten() {
                let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                if text("type") != HEALTH_CHECK_SUCCEEDED {
                    out.push((form.to_string(), text("type"), text("reason")));
                }
            }
        }
        out.sort();
        out
    };
    let row = |form: &str, type_: &str, reason: &str| (form.to_string(), type_.to_string(), reason.to_string());
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        // Template found: ExternallyRemediated has no legacy counterpart (as upstream).
        let mut found =
            MhcWorld::new().with_template().machine_with_node(machine("m1").version(version), "False", t0());
        let plan = found.decide(now());
        found.apply(&plan);
        assert_eq!(
            other_conditions(&found.machines[0], version),
            vec![row("new", EXTERNALLY_REMEDIATED, "WaitingForRemediation")],
            "{version:?}"
        );
        // Template missing: the legacy form says which template condition failed.
        let mut missing =
            MhcWorld::new().with_template().machine_with_node(machine("m1").version(version), "False", t0());
        missing.template = None;
        let plan = missing.decide(now());
        missing.apply(&plan);
        assert_eq!(
            other_conditions(&missing.machines[0], version),
            vec![
                row("legacy", "ExternalRemediationTemplateAvailable", "ExternalRemediationTemplateNotFound"),
                row("new", EXTERNALLY_REMEDIATED, "RemediationTemplateNotFound"),
            ],
            "{version:?}"
        );
    }
}

// ----------------------------------------------------------------------------------------------
// Rule 8: idempotence and notices on transitions only
// ----------------------------------------------------------------------------------------------

/// Decides, applies, and decides again at the same instant: the second plan must be quiet.
fn assert_settles(mut world: MhcWorld, now: Timestamp, what: &str) -> MhcWorld {
    let first = world.decide(now);
    world.apply(&first);
    let second = world.decide(now);
    assert_eq!(second.actions, vec![], "{what}: second plan has actions");
    assert_eq!(second.notices, vec![], "{what}: second plan has notices");
    assert_eq!(second.status, first.status, "{what}: status is stable");
    assert_eq!(second.next_wake, first.next_wake, "{what}: wake-up is stable");
    world
}

/// A fleet touching every verdict.
fn busy_fleet(version: CapiVersion, template: bool) -> MhcWorld {
    let m = |name: &str| machine(name).version(version);
    let mut w = MhcWorld::new()
        .spec("unhealthyMachineConditions", json!([{"type": "NodeHealthy", "status": "False", "timeout": "120s"}]))
        .machine_with_node(m("healthy"), "True", t0())
        .machine_with_node(m("not-ready"), "False", t0())
        .machine_with_node(m("unknown"), "Unknown", t0())
        .machine_with_node(m("pending"), "False", at(3500))
        .machine(m("deleted-node").node("gone"))
        .machine(m("no-node"))
        .machine(m("starting").created(Some(at(3300))))
        .machine_with_node(m("annotated").annotation(REMEDIATE_MACHINE_ANNOTATION, ""), "True", t0())
        .machine_with_node(m("failed").failure(Some("UpdateError"), Some("boom")), "True", t0())
        .machine_with_node(m("bad-condition").condition("NodeHealthy", "False", t0()), "True", t0())
        .machine_with_node(m("deleting").deleting(), "False", t0())
        .machine_with_node(m("deleting-healthy").deleting(), "True", t0());
    if template {
        w = w.with_template();
    }
    w
}

#[test]
fn rule8_idempotent_v1beta2() {
    assert_settles(busy_fleet(CapiVersion::V1Beta2, false), now(), "v1beta2, owner remediation");
    assert_settles(busy_fleet(CapiVersion::V1Beta2, true), now(), "v1beta2, template");
    assert_settles(busy_fleet(CapiVersion::V1Beta2, false).spec("maxUnhealthy", json!(1)), now(), "v1beta2, blocked");
}

#[test]
fn rule8_idempotent_v1beta1() {
    assert_settles(busy_fleet(CapiVersion::V1Beta1, false), now(), "v1beta1, owner remediation");
    assert_settles(busy_fleet(CapiVersion::V1Beta1, false).spec("maxUnhealthy", json!(1)), now(), "v1beta1, blocked");
}

#[test]
fn rule8_idempotent_v1beta1_with_template() {
    assert_settles(busy_fleet(CapiVersion::V1Beta1, true), now(), "v1beta1, template");
}

#[test]
fn rule8_idempotent_with_template_failures() {
    let mut missing = busy_fleet(CapiVersion::V1Beta2, true);
    missing.template = None;
    assert_settles(missing, now(), "template not found");
    let mut empty = busy_fleet(CapiVersion::V1Beta2, true);
    empty.template = Some(template_without_body(NS));
    assert_settles(empty, now(), "template without spec.template");
}

#[test]
fn rule8_idempotent_when_paused_or_without_a_decision() {
    assert_settles(busy_fleet(CapiVersion::V1Beta2, false).annotate(PAUSED_ANNOTATION, ""), now(), "paused");
    assert_settles(busy_fleet(CapiVersion::V1Beta2, false).cluster(None), now(), "Cluster not found");
    let mut unreachable = busy_fleet(CapiVersion::V1Beta2, false);
    unreachable.unreachable = Some("timeout".into());
    assert_settles(unreachable, now(), "unreachable");
}

/// Decides at `now`, applies, and returns the notices.
fn step(world: &mut MhcWorld, now: Timestamp) -> Vec<(NoticeKind, Option<String>, String)> {
    let plan = world.decide(now);
    world.apply(&plan);
    notices(&plan)
}

fn set_ready(world: &mut MhcWorld, node_name: &str, status: &str, since: Timestamp) {
    world.nodes.insert(node_name.to_string(), node(node_name).ready(status, since).build());
}

#[test]
fn rule8_notices_fire_on_transitions_only() {
    let n = |kind, target: Option<&str>, reason: &str| (kind, target.map(key), reason.to_string());
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let mut w = MhcWorld::new()
            .spec("maxUnhealthy", json!(1))
            .machine_with_node(machine("m1").version(version), "True", t0())
            .machine_with_node(machine("m2").version(version), "True", t0());
        let what = format!("{version:?}");
        // First decision: all healthy; the normal state is not news.
        assert_eq!(step(&mut w, at(10)), vec![], "{what}");
        assert_eq!(step(&mut w, at(10)), vec![], "{what}");
        // m1's Node goes NotReady: nothing until the timeout has passed.
        set_ready(&mut w, "m1", "False", at(20));
        assert_eq!(step(&mut w, at(20)), vec![], "{what}");
        let due = plus_ns(at(320), 1);
        assert_eq!(w.decide(at(20)).next_wake, Some(due), "{what}");
        assert_eq!(
            step(&mut w, due),
            vec![
                n(NoticeKind::Unhealthy, Some("m1"), "UnhealthyNode"),
                n(NoticeKind::RemediationRequested, Some("m1"), "WaitingForRemediation")
            ],
            "{what}"
        );
        assert_eq!(step(&mut w, at(400)), vec![], "{what}: unhealthy once");
        // m2 too: the short-circuit trips, once.
        set_ready(&mut w, "m2", "False", at(20));
        assert_eq!(
            step(&mut w, at(500)),
            vec![
                n(NoticeKind::RemediationBlocked, None, "TooManyUnhealthy"),
                n(NoticeKind::Unhealthy, Some("m2"), "UnhealthyNode")
            ],
            "{what}"
        );
        assert_eq!(step(&mut w, at(600)), vec![], "{what}: blocked once");
        // m1 recovers: healthy again, and remediation is allowed again (m2 is now requested).
        set_ready(&mut w, "m1", "True", at(700));
        assert_eq!(
            step(&mut w, at(700)),
            vec![
                n(NoticeKind::RemediationAllowed, None, "RemediationAllowed"),
                n(NoticeKind::Healthy, Some("m1"), "HealthCheckSucceeded"),
                n(NoticeKind::RemediationRequested, Some("m2"), "WaitingForRemediation"),
            ],
            "{what}"
        );
        assert_eq!(step(&mut w, at(800)), vec![], "{what}: allowed once");
        // Paused, then resumed.
        w = w.annotate(PAUSED_ANNOTATION, "");
        assert_eq!(step(&mut w, at(900)), vec![n(NoticeKind::Paused, None, "Paused")], "{what}");
        assert_eq!(step(&mut w, at(1000)), vec![], "{what}: paused once");
        w.annotations.clear();
        assert_eq!(step(&mut w, at(1100)), vec![n(NoticeKind::Resumed, None, "NotPaused")], "{what}");
        assert_eq!(step(&mut w, at(1200)), vec![], "{what}: resumed once");
        assert_eq!(w.decide(at(1300)).actions, vec![], "{what}: settled");
    }
}

#[test]
fn rule8_transition_times_move_only_with_the_status() {
    let mut w = MhcWorld::new().machine_with_node(machine("m1"), "False", t0());
    let first = w.decide(now());
    w.apply(&first);
    // The verdict's message changes (the Node is now gone) but the status stays False.
    w.nodes.clear();
    let later = at(7200);
    let plan = w.decide(later);
    let (c, since) = written(&plan, "m1", HEALTH_CHECK_SUCCEEDED).expect("rewritten with the new reason");
    assert_eq!((c.reason.as_str(), *since), ("NodeDeleted", now()), "the transition time is kept");
    let allowed = check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).expect("set");
    assert_eq!(allowed.last_transition_time.0, now(), "the check's own condition keeps its time too");
}

// ----------------------------------------------------------------------------------------------
// Reason-aware rules and remediation per condition
// ----------------------------------------------------------------------------------------------

const REPLACE_TEMPLATE_KIND: &str = "ReplaceRemediationTemplate";
const KERNEL_RULE: &str = "spec.unhealthyConditions[1] KernelDeadlock=True";
const READY_RULE: &str = "spec.unhealthyConditions[0] Ready=False";

fn replace_template_ref() -> Value {
    json!({"apiVersion": REMEDIATION_API_VERSION, "kind": REPLACE_TEMPLATE_KIND, "name": "replace"})
}

fn replace_template() -> vigil_api::views::TemplateView {
    vigil_api::views::TemplateView::read(&json!({
        "apiVersion": REMEDIATION_API_VERSION, "kind": REPLACE_TEMPLATE_KIND,
        "metadata": {"name": "replace", "namespace": NS},
        "spec": {"template": {"spec": {"strategy": "Replace"}}},
    }))
    .expect("a named template")
}

/// The owner by default; a `KernelDeadlock=True` with reason `KernelHasDeadlock` for 60s gets the
/// fixture template (reboot), a `DiskFailing=True` for 60s the replace template; both templates
/// are found.
fn per_rule_world() -> MhcWorld {
    let mut w = MhcWorld::new().spec(
        "unhealthyConditions",
        json!([
            {"type": "Ready", "status": "False", "timeout": "300s"},
            {"type": "KernelDeadlock", "status": "True", "timeout": "60s", "reasons": ["KernelHasDeadlock"],
             "remediationTemplate": template_ref_json()},
            {"type": "DiskFailing", "status": "True", "timeout": "60s", "remediationTemplate": replace_template_ref()},
        ]),
    );
    w.template = Some(template(NS));
    w.other_templates.push(replace_template());
    w
}

/// Machine `m1` whose Node carries `Ready` (status, since) and the given conditions
/// `(type, status, reason, since)`.
fn with_node_conditions(
    w: MhcWorld,
    ready: (&str, Timestamp),
    conditions: &[(&str, &str, &str, Timestamp)],
) -> MhcWorld {
    let mut n = node("m1").ready(ready.0, ready.1);
    for (t, s, r, since) in conditions {
        n = n.condition_with_reason(t, s, r, *since);
    }
    w.machine(machine("m1").node("m1")).node(n)
}

/// `(name, rule, remediation)` of each `status.chosenRemediations` entry.
fn chosen(plan: &Plan<MachineHealthCheckStatus>) -> Vec<(String, String, String)> {
    plan.status
        .features
        .chosen_remediations
        .iter()
        .map(|c| (c.name.clone(), c.rule.clone(), c.remediation.clone()))
        .collect()
}

fn chosen_entry(rule: &str, remediation: &str) -> Vec<(String, String, String)> {
    vec![("m1".to_string(), rule.to_string(), remediation.to_string())]
}

const REBOOT: &str = "spec.unhealthyConditions[1].remediationTemplate (TestRemediationTemplate ns/reboot)";

#[test]
fn reasons_decide_whether_a_condition_matches_a_rule() {
    // (what, the KernelDeadlock condition's reason, unhealthy at 61s)
    let rows = [
        ("a listed reason matches", Some("KernelHasDeadlock"), true),
        ("another reason does not", Some("DockerHung"), false),
        ("reasons compare exactly", Some("kernelhasdeadlock"), false),
        ("a condition without a reason matches no rule with reasons", None, false),
    ];
    for (what, reason, unhealthy) in rows {
        let mut n = node("m1").ready("True", t0());
        n = match reason {
            Some(r) => n.condition_with_reason("KernelDeadlock", "True", r, t0()),
            None => n.condition("KernelDeadlock", "True", t0()).without_reason(),
        };
        let w = per_rule_world().machine(machine("m1").node("m1")).node(n);
        let plan = w.decide(at(61));
        let verdict = written(&plan, "m1", HEALTH_CHECK_SUCCEEDED).map(|(c, _)| c.status.to_string());
        assert_eq!(verdict.as_deref(), Some(if unhealthy { "False" } else { "True" }), "{what}");
        assert_eq!(plan.status.current_healthy, i32::from(!unhealthy), "{what}");
    }
    // Without reasons (upstream's rule) the same condition matches whatever its reason.
    let any = MhcWorld::new()
        .spec("unhealthyConditions", json!([{"type": "KernelDeadlock", "status": "True", "timeout": "60s"}]));
    let w = with_node_conditions(any, ("True", t0()), &[("KernelDeadlock", "True", "DockerHung", t0())]);
    assert_eq!(w.decide(at(61)).status.current_healthy, 0);
    // A Machine condition rule with reasons reads the Machine condition's reason.
    let machine_rule = MhcWorld::new().spec(
        "unhealthyMachineConditions",
        json!([{"type": "NodeHealthy", "status": "False", "timeout": "60s", "reasons": ["NodeNotFound"]}]),
    );
    for (reason, healthy) in [("NodeNotFound", 0), ("NodeConditionsFailed", 1)] {
        let w = machine_rule
            .clone()
            .machine(machine("m1").node("m1").condition_with_reason("NodeHealthy", "False", reason, t0()))
            .node(node("m1").ready("True", t0()));
        assert_eq!(w.decide(at(61)).status.current_healthy, healthy, "Machine condition reason {reason}");
    }
}

/// The timer of a reason-aware rule is the condition's `lastTransitionTime`: a reason that
/// changes without a status change (the kubelet and the node-problem-detector keep the
/// transition time then) does not restart it.
#[test]
fn a_reason_change_without_a_transition_does_not_restart_the_timer() {
    // KernelDeadlock=True since t0 with another reason; at 10m the reason becomes a listed one,
    // the transition time staying t0: the 60s rule holds at once.
    let w = with_node_conditions(per_rule_world(), ("True", t0()), &[("KernelDeadlock", "True", "DockerHung", t0())]);
    assert_eq!(w.decide(at(600)).status.current_healthy, 1, "not listed: healthy");
    let w = with_node_conditions(
        per_rule_world(),
        ("True", t0()),
        &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let plan = w.decide(at(600));
    assert_eq!(
        written(&plan, "m1", HEALTH_CHECK_SUCCEEDED).map(|(c, _)| c.status.to_string()).as_deref(),
        Some("False")
    );
}

#[test]
fn a_rules_own_template_remediates_the_machines_it_made_unhealthy_and_says_so() {
    let w = with_node_conditions(
        per_rule_world(),
        ("True", t0()),
        &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let plan = w.decide(at(61));
    assert_eq!(created_names(&plan), ["m1"]);
    let object = creates(&plan)[0];
    assert_eq!(object["kind"], REMEDIATION_KIND, "the rule's template, not the owner");
    assert_eq!(object["metadata"]["annotations"][RULE_ANNOTATION], KERNEL_RULE, "the choice is on the object");
    assert!(written(&plan, "m1", OWNER_REMEDIATED).is_none());
    assert_eq!(chosen(&plan), chosen_entry(KERNEL_RULE, REBOOT));
    assert_eq!(
        notices(&plan)
            .into_iter()
            .filter(|n| n.0 == NoticeKind::RemediationChosen)
            .map(|n| (n.1, n.2))
            .collect::<Vec<_>>(),
        [(Some(key("m1")), "RemediationChosen".to_string())]
    );
    let message = &plan.notices.iter().find(|n| n.kind == NoticeKind::RemediationChosen).expect("told").message;
    assert!(message.contains(KERNEL_RULE) && message.contains(REBOOT), "{message}");

    // A rule without its own remediation uses the check's: the owner here.
    let w = with_node_conditions(per_rule_world(), ("False", t0()), &[]);
    let plan = w.decide(at(301));
    assert!(creates(&plan).is_empty());
    assert_eq!(
        written(&plan, "m1", OWNER_REMEDIATED).map(|(c, _)| c.reason.to_string()).as_deref(),
        Some("WaitingForRemediation")
    );
    assert_eq!(chosen(&plan), chosen_entry(READY_RULE, "owner"));

    // A verdict no rule makes (no Node within nodeStartupTimeout) gets the check's own too.
    let w = per_rule_world().machine(machine("m1"));
    let plan = w.decide(at(601));
    assert_eq!(chosen(&plan), chosen_entry("NodeStartupTimeout", "owner"));
    assert!(written(&plan, "m1", OWNER_REMEDIATED).is_some());

    // Off by default: a check whose rules name no remediation reports nothing new and marks no
    // object.
    let w = MhcWorld::new().with_template().machine_with_node(machine("m1"), "False", t0());
    let plan = w.decide(at(301));
    assert!(chosen(&plan).is_empty());
    assert!(creates(&plan)[0]["metadata"].get("annotations").is_none(), "{}", creates(&plan)[0]);
    assert!(notices(&plan).iter().all(|n| n.0 != NoticeKind::RemediationChosen));
}

#[test]
fn when_several_rules_match_the_first_in_spec_order_chooses() {
    // Ready=False (rule 0, owner) and KernelDeadlock (rule 1, reboot) both past their timeouts.
    let w = with_node_conditions(
        per_rule_world(),
        ("False", t0()),
        &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let plan = w.decide(at(301));
    assert_eq!(chosen(&plan), chosen_entry(READY_RULE, "owner"));
    assert!(creates(&plan).is_empty());
    // KernelDeadlock (rule 1) and DiskFailing (rule 2) at once: rule 1.
    let w = with_node_conditions(
        per_rule_world(),
        ("True", t0()),
        &[("DiskFailing", "True", "SmartError", t0()), ("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let plan = w.decide(at(61));
    assert_eq!(chosen(&plan)[0].1, KERNEL_RULE);
    assert_eq!(creates(&plan)[0]["kind"], REMEDIATION_KIND);
    // A Machine condition rule is read before every Node condition rule, as the verdict reads them.
    let w = per_rule_world()
        .spec(
            "unhealthyMachineConditions",
            json!([{"type": "NodeHealthy", "status": "False", "timeout": "60s", "remediationTemplate": replace_template_ref()}]),
        )
        .machine(machine("m1").node("m1").condition("NodeHealthy", "False", t0()))
        .node(node("m1").ready("True", t0()).condition_with_reason("KernelDeadlock", "True", "KernelHasDeadlock", t0()));
    let plan = w.decide(at(61));
    assert_eq!(chosen(&plan)[0].1, "spec.unhealthyMachineConditions[0] NodeHealthy=False");
    assert_eq!(creates(&plan)[0]["kind"], "ReplaceRemediation");
}

// Over 80 lines on purpose: one incident told as a story, each step's expectations next to it.
#[test]
fn a_chosen_remediation_does_not_switch_mid_incident_even_across_a_lost_status() {
    // KernelDeadlock at t0: rule 1's template at 61s.
    let mut w = with_node_conditions(
        per_rule_world(),
        ("True", t0()),
        &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let first = w.decide(at(61));
    assert_eq!(created_names(&first), ["m1"]);
    w.apply(&first);
    // Ready=False from 100s: rule 0 (the owner, earlier in spec order) holds from 401s. The
    // incident keeps rule 1: no owner request, no second object, nothing new to tell.
    set_ready(&mut w, "m1", "False", at(100));
    w.nodes.insert(
        "m1".into(),
        node("m1")
            .ready("False", at(100))
            .condition_with_reason("KernelDeadlock", "True", "KernelHasDeadlock", t0())
            .build(),
    );
    let later = w.decide(at(500));
    assert!(written(&later, "m1", OWNER_REMEDIATED).is_none(), "the owner is not asked on top");
    assert!(creates(&later).is_empty());
    assert_eq!(chosen(&later), chosen_entry(KERNEL_RULE, REBOOT));
    assert_eq!(later.status.features.chosen_remediations[0].since.0, at(61), "the incident's start is kept");
    assert!(notices(&later).iter().all(|n| n.0 != NoticeKind::RemediationChosen));
    w.apply(&later);
    // The status is lost (a restart that read an old one, a failed write): the object's
    // annotation still names rule 1.
    w.status = None;
    let restarted = w.decide(at(600));
    assert!(written(&restarted, "m1", OWNER_REMEDIATED).is_none());
    assert!(creates(&restarted).is_empty());
    assert_eq!(chosen(&restarted), chosen_entry(KERNEL_RULE, REBOOT));
    w.apply(&restarted);
    // Healthy again: the object goes, the entry too.
    w.nodes.insert("m1".into(), node("m1").ready("True", at(700)).build());
    let healthy = w.decide(at(701));
    assert_eq!(deleted_names(&healthy), ["m1"]);
    assert!(chosen(&healthy).is_empty());
    w.apply(&healthy);
    // A new incident chooses anew: Ready=False now makes it the owner's.
    w.nodes.insert("m1".into(), node("m1").ready("False", at(800)).build());
    let next = w.decide(at(1101));
    assert_eq!(chosen(&next), chosen_entry(READY_RULE, "owner"));
}

/// The other way round: the owner was asked for rule 0's incident; rule 1 starting to match (and
/// rule 0 stopping) never adds an object, kept by the status and, with the status lost, by the
/// Machine's own `OwnerRemediated=False` (its owner reads that as a request, whenever written).
#[test]
fn an_owner_request_is_never_followed_by_an_object_in_the_same_incident() {
    let mut w = with_node_conditions(per_rule_world(), ("False", t0()), &[]);
    let asked = w.decide(at(301));
    assert!(written(&asked, "m1", OWNER_REMEDIATED).is_some());
    w.apply(&asked);
    // Ready recovers at 400s while KernelDeadlock holds from 350s: the verdict is now rule 1's.
    w.nodes.insert(
        "m1".into(),
        node("m1")
            .ready("True", at(400))
            .condition_with_reason("KernelDeadlock", "True", "KernelHasDeadlock", at(350))
            .build(),
    );
    let plan = w.decide(at(500));
    assert!(creates(&plan).is_empty(), "the status keeps rule 0");
    assert_eq!(chosen(&plan), chosen_entry(READY_RULE, "owner"));
    w.apply(&plan);
    w.status = None;
    let plan = w.decide(at(600));
    assert!(creates(&plan).is_empty(), "without the status the Machine's OwnerRemediated=False still says it started");
    assert_eq!(
        chosen(&plan),
        chosen_entry(KERNEL_RULE, &format!("owner (OwnerRemediated=False is set; {REBOOT} is not started on top)")),
        "chosen anew, and reported as the owner's it is"
    );
}

/// A spec edit mid-incident (rule 1 loses its own template, so its incidents are the owner's now)
/// never hands a Machine that has a remediation object to its owner as well.
#[test]
fn an_edit_mid_incident_never_asks_the_owner_on_top_of_an_object() {
    let mut w = with_node_conditions(
        per_rule_world(),
        ("True", t0()),
        &[("KernelDeadlock", "True", "KernelHasDeadlock", t0())],
    );
    let first = w.decide(at(61));
    assert_eq!(created_names(&first), ["m1"]);
    w.apply(&first);
    w.spec["unhealthyConditions"][1].as_object_mut().expect("a rule").remove("remediationTemplate");
    let edited = w.decide(at(120));
    assert!(written(&edited, "m1", OWNER_REMEDIATED).is_none(), "the object's remediation goes on alone");
    assert!(creates(&edited).is_empty());
    assert_eq!(chosen(&edited), chosen_entry(KERNEL_RULE, "owner"), "reported as the spec says now");
    // The same with the Machine's ExternallyRemediated lost (its write failed, say), the object's
    // kind still read (rule 2 uses the template now): the object alone keeps the owner out.
    w.spec["unhealthyConditions"][2]["remediationTemplate"] = template_ref_json();
    w.edit_machine("m1", |m| {
        if let Some(list) = m.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
            list.retain(|c| c["type"] != EXTERNALLY_REMEDIATED);
        }
    });
    let edited = w.decide(at(130));
    assert!(written(&edited, "m1", OWNER_REMEDIATED).is_none(), "the object keeps the owner out");
    assert!(creates(&edited).is_empty());
}

/// `Plan::remediating` (the `vigil_check_remediating` gauge) counts the Machines whose
/// remediation is under way once the plan is written: the one whose owner this plan asks, the
/// same one observed on the next decision, none once the owner replaced it; in dry-run only
/// what was observed (nothing is asked).
#[test]
fn remediating_counts_machines_whose_owner_is_asked() {
    let mut world = MhcWorld::new()
        .machine_with_node(machine("m1"), "False", t0())
        .machine_with_node(machine("m2"), "True", t0())
        .machine_with_node(machine("m3"), "True", t0());
    let dry = world.clone().spec("dryRun", json!(true)).decide(now());
    assert_eq!((dry.actions.len(), dry.remediating), (0, 0), "dry-run asks nothing");
    let first = world.decide(now());
    assert!(written(&first, "m1", OWNER_REMEDIATED).is_some(), "m1's owner is asked");
    assert_eq!(first.remediating, 1, "asked by this plan");
    world.apply(&first);
    let second = world.decide(now());
    assert_eq!((second.actions.len(), second.remediating), (0, 1), "observed, nothing written again");
    assert_eq!(world.clone().spec("dryRun", json!(true)).decide(now()).remediating, 1, "dry-run: observed counts");
    // The owner remediates by replacing the Machine.
    world.machines.retain(|m| m.pointer("/metadata/name").and_then(Value::as_str) != Some("m1"));
    assert_eq!(world.decide(now()).remediating, 0);
}

/// With a template: a remediation object this plan creates counts, and so does one observed
/// made for the Machine, but not one made for another object; the deletion on recovery takes
/// the count back to 0.
#[test]
fn remediating_counts_machines_with_their_remediation_object() {
    let mut world = MhcWorld::new()
        .with_template()
        .machine_with_node(machine("m1"), "False", t0())
        .machine_with_node(machine("m2"), "True", t0())
        .remediation(remediation_json(NS, "m2", "Machine", "someone-else"));
    let first = world.decide(now());
    assert_eq!((created_names(&first), first.remediating), (vec!["m1".to_string()], 1));
    world.apply(&first);
    assert_eq!(world.decide(now()).remediating, 1, "m1's object, not m2's foreign one");
    world.nodes.insert("m1".into(), node("m1").ready("True", at(3599)).build());
    let plan = world.decide(now());
    assert_eq!((deleted_names(&plan), plan.remediating), (vec!["m1".to_string()], 1), "seen until it is gone");
    world.apply(&plan);
    assert_eq!(world.decide(now()).remediating, 0);
}

/// Pacing applies to a rule's own remediation as to the check's (a start is a start): with
/// `maxInFlight: 1`, two Machines the same rule made unhealthy get its template one at a time,
/// longest-unhealthy first, and the rule's object holds the slot until its Machine is healthy.
#[test]
fn pacing_applies_to_a_rules_own_remediation() {
    let mut w = per_rule_world().spec("maxInFlight", json!(1));
    for (name, since) in [("m2", at(10)), ("m1", t0())] {
        w = w.machine(machine(name).node(name)).node(node(name).ready("True", t0()).condition_with_reason(
            "KernelDeadlock",
            "True",
            "KernelHasDeadlock",
            since,
        ));
    }
    let first = w.decide(at(120));
    assert_eq!(created_names(&first), ["m1"], "the longest-unhealthy first");
    let queued: Vec<&str> = first.status.features.queued.iter().map(|q| q.name.as_str()).collect();
    assert_eq!((queued, first.status.features.queued_count), (vec!["m2"], 1));
    w.apply(&first);
    let second = w.decide(at(130));
    assert!(created_names(&second).is_empty(), "m1's object of the rule's template holds the only slot");
    assert_eq!(second.status.features.queued_count, 1);
    w.apply(&second);
    w = w.node(node("m1").ready("True", t0()));
    let third = w.decide(at(140));
    assert_eq!(created_names(&third), ["m2"], "m1 healthy again frees its slot");
    assert_eq!(third.status.features.queued_count, 0);
    let chosen: Vec<&str> = third.status.features.chosen_remediations.iter().map(|c| c.rule.as_str()).collect();
    assert_eq!(chosen, [KERNEL_RULE], "m2's incident keeps the rule's remediation");
}

/// A remediator finishing: m1 recovered and its object was deleted, but the remediator's
/// finalizer still holds it. Until it is gone m1 is not counted healthy, so with
/// `maxUnhealthy: 1` over four Machines m2 failing is one too many and gets no object; once m1's
/// object is gone, m2 gets its own (docs/beside-medik8s.md, "Remediators finishing").
#[test]
fn a_machine_whose_remediator_is_finishing_is_not_counted_healthy() {
    let mut world = MhcWorld::new().with_template().spec("maxUnhealthy", json!(1));
    for name in ["m1", "m2", "m3", "m4"] {
        world = world.machine_with_node(machine(name), "True", t0());
    }
    let mut finishing = remediation_json(NS, "m1", "Machine", "m1");
    finishing["metadata"]["deletionTimestamp"] = json!(at(60).to_string());
    finishing["metadata"]["finalizers"] = json!(["remediator.example/finish"]);
    world = world.remediation(finishing).node(node("m2").ready("False", at(90)));
    let plan = world.decide(at(400));
    assert_eq!(plan.status.current_healthy, 2, "m1 is not healthy while its object is finishing");
    assert!(created_names(&plan).is_empty(), "two of four not healthy is over maxUnhealthy 1");
    assert!(deleted_names(&plan).is_empty(), "the object being deleted is not deleted again");
    assert_eq!(
        check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).map(|c| c.reason.as_str()),
        Some("TooManyUnhealthy")
    );
    world.remediations.remove("m1");
    let plan = world.decide(at(401));
    assert_eq!(plan.status.current_healthy, 3);
    assert_eq!(created_names(&plan), ["m2"], "m1's object is gone: m2 is remediated");
}

/// With `maxInFlight: 1` a finishing remediator holds its slot: a recovered Machine whose object
/// is still being deleted keeps another Machine's object from being made until it is gone.
#[test]
fn a_finishing_remediator_holds_its_in_flight_slot() {
    let mut world = MhcWorld::new().with_template().spec("maxInFlight", json!(1));
    for name in ["m1", "m2", "m3"] {
        world = world.machine_with_node(machine(name), "True", t0());
    }
    let mut finishing = remediation_json(NS, "m1", "Machine", "m1");
    finishing["metadata"]["deletionTimestamp"] = json!(at(60).to_string());
    finishing["metadata"]["finalizers"] = json!(["remediator.example/finish"]);
    world = world.remediation(finishing).node(node("m2").ready("False", at(90)));
    let plan = world.decide(at(400));
    assert!(created_names(&plan).is_empty(), "m1's remediator still holds the only slot");
    assert_eq!(plan.status.features.queued_count, 1);
    world.remediations.remove("m1");
    assert_eq!(created_names(&world.decide(at(401))), ["m2"]);
}
