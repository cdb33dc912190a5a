//! Properties of MachineHealthCheck decisions over random fleets: random Node condition states
//! and transition times, Machines with and without a nodeRef, random short-circuits.
//!
//! (a) never above the budget; (b) deterministic; (c) the order of the Machines does not
//! matter; (d) the wake-up is strictly in the future; plus: the plan settles once applied, and
//! without a Cluster, without the workload cluster or while paused nothing is written.

mod support;

use jiff::Timestamp;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use serde_json::json;
use std::collections::BTreeSet;
use support::*;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::views::CapiVersion;
use vigil_api::well_known::*;
use vigil_engine::plan::{Action, Plan};

/// The decision instant (two hours after `T0`, so every offset below stays after `T0`).
fn now() -> Timestamp {
    at(7200)
}

/// What the Machine's Node looks like.
#[derive(Debug, Clone)]
enum NodeState {
    /// No nodeRef yet.
    NoNodeRef,
    /// nodeRef set, Node gone.
    Deleted,
    /// Node present with `Ready` = `status`, changed `ago` seconds before now.
    Present { status: &'static str, ago: i64 },
}

#[derive(Debug, Clone)]
struct MachineSpec {
    name: String,
    v1beta1: bool,
    node: NodeState,
    /// Created this many seconds before now.
    created_ago: i64,
    remediate_annotation: bool,
    failure: bool,
    deleting: bool,
    control_plane: bool,
    /// A `HealthCheckSucceeded` the Machine already carries.
    prior_health: Option<&'static str>,
    /// An `OwnerRemediated` the Machine already carries (reason `Test`, i.e. the owner's).
    prior_owner: Option<&'static str>,
    /// A remediation object of its name already exists (only used with a template).
    has_object: bool,
    /// `spec.failureDomain` (`None`: not set).
    fd: Option<u8>,
}

#[derive(Debug, Clone, Copy)]
enum ShortCircuit {
    Count(u32),
    Percent(u32),
    Range(u32, u32),
}

#[derive(Debug, Clone, Copy)]
enum TemplateMode {
    None,
    Found,
    Missing,
    WithoutBody,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Normal,
    Paused,
    ClusterPaused,
    ClusterMissing,
    Unreachable,
    ControlPlaneNotInitialized,
    InfrastructureNotReady,
}

#[derive(Debug, Clone)]
struct Fleet {
    machines: Vec<MachineSpec>,
    short_circuit: ShortCircuit,
    template: TemplateMode,
    mode: Mode,
    /// `spec.failureDomains` keyed on `spec.failureDomain`: (percent, minAllowed).
    domains: Option<(u32, u32)>,
}

fn node_state() -> impl Strategy<Value = NodeState> {
    let ago = prop_oneof![0i64..1200, Just(300i64), Just(299), Just(301)];
    prop_oneof![
        1 => Just(NodeState::NoNodeRef),
        1 => Just(NodeState::Deleted),
        6 => (prop_oneof![3 => Just("True"), 1 => Just("False"), 1 => Just("Unknown")], ago).prop_map(|(status, ago)| NodeState::Present { status, ago }),
    ]
}

fn rarely() -> impl Strategy<Value = bool> {
    prop::bool::weighted(0.08)
}

fn machine_spec() -> impl Strategy<Value = MachineSpec> {
    (
        any::<bool>(),
        node_state(),
        prop_oneof![0i64..1200, Just(600i64)],
        (rarely(), rarely(), rarely(), rarely()),
        prop::option::of(prop_oneof![Just("True"), Just("False")]),
        prop::option::of(prop_oneof![Just("True"), Just("False")]),
        (any::<bool>(), prop::option::weighted(0.8, 0u8..3)),
    )
        .prop_map(
            |(
                v1beta1,
                node,
                created_ago,
                (remediate_annotation, failure, deleting, control_plane),
                prior_health,
                prior_owner,
                (has_object, fd),
            )| {
                MachineSpec {
                    name: String::new(),
                    v1beta1,
                    node,
                    created_ago,
                    remediate_annotation,
                    failure,
                    deleting,
                    control_plane,
                    prior_health,
                    prior_owner,
                    has_object,
                    fd,
                }
            },
        )
}

fn short_circuit() -> impl Strategy<Value = ShortCircuit> {
    prop_oneof![
        1 => (0u32..10).prop_map(ShortCircuit::Count),
        2 => prop_oneof![0u32..=100, Just(0), Just(100), Just(40)].prop_map(ShortCircuit::Percent),
        1 => (0u32..3, 0u32..7).prop_map(|(min, width)| ShortCircuit::Range(min, min + width)),
    ]
}

fn fleet() -> impl Strategy<Value = Fleet> {
    (
        prop::collection::vec(machine_spec(), 0..10),
        short_circuit(),
        prop_oneof![
            3 => Just(TemplateMode::None),
            3 => Just(TemplateMode::Found),
            1 => Just(TemplateMode::Missing),
            1 => Just(TemplateMode::WithoutBody),
        ],
        prop_oneof![
            12 => Just(Mode::Normal),
            1 => Just(Mode::Paused),
            1 => Just(Mode::ClusterPaused),
            1 => Just(Mode::ClusterMissing),
            1 => Just(Mode::Unreachable),
            1 => Just(Mode::ControlPlaneNotInitialized),
            1 => Just(Mode::InfrastructureNotReady),
        ],
        prop::option::of((0u32..=100, 0u32..3)),
    )
        .prop_map(|(mut machines, short_circuit, template, mode, domains)| {
            for (i, m) in machines.iter_mut().enumerate() {
                m.name = format!("m{i}");
            }
            Fleet { machines, short_circuit, template, mode, domains }
        })
}

fn ago(secs: i64) -> Timestamp {
    at(7200 - secs)
}

fn machine_json(m: &MachineSpec) -> MachineJson {
    let mut b = machine(&m.name)
        .version(if m.v1beta1 { CapiVersion::V1Beta1 } else { CapiVersion::V1Beta2 })
        .created(Some(ago(m.created_ago)));
    match m.node {
        NodeState::NoNodeRef => {}
        NodeState::Deleted => b = b.node(&format!("gone-{}", m.name)),
        NodeState::Present { .. } => b = b.node(&m.name),
    }
    if m.remediate_annotation {
        b = b.annotation(REMEDIATE_MACHINE_ANNOTATION, "");
    }
    if m.failure {
        b = b.failure(Some("UpdateError"), Some("boom"));
    }
    if m.deleting {
        b = b.deleting();
    }
    if m.control_plane {
        b = b.control_plane();
    }
    if let Some(s) = m.prior_health {
        b = b.new_condition(HEALTH_CHECK_SUCCEEDED, s, ago(1800));
    }
    if let Some(s) = m.prior_owner {
        b = b.new_condition(OWNER_REMEDIATED, s, ago(1800));
    }
    b
}

/// The world of a fleet, its Machines in the order of `machines`.
fn world(f: &Fleet, machines: &[MachineSpec]) -> MhcWorld {
    let mut w = match f.short_circuit {
        ShortCircuit::Count(n) => MhcWorld::new().spec("maxUnhealthy", json!(n)),
        ShortCircuit::Percent(p) => MhcWorld::new().spec("maxUnhealthy", json!(format!("{p}%"))),
        ShortCircuit::Range(a, b) => {
            MhcWorld::new().spec("maxUnhealthy", json!(0)).spec("unhealthyRange", json!(format!("[{a}-{b}]")))
        }
    };
    match f.template {
        TemplateMode::None => {}
        TemplateMode::Found => w = w.with_template(),
        TemplateMode::Missing => {
            w = w.with_template();
            w.template = None;
        }
        TemplateMode::WithoutBody => {
            w = w.with_template();
            w.template = Some(template_without_body(NS));
        }
    }
    match f.mode {
        Mode::Normal => {}
        Mode::Paused => w = w.annotate(PAUSED_ANNOTATION, ""),
        Mode::ClusterPaused => w = w.cluster(Some(cluster().paused())),
        Mode::ClusterMissing => w = w.cluster(None),
        Mode::Unreachable => w.unreachable = Some("connection refused".into()),
        Mode::ControlPlaneNotInitialized => w = w.cluster(Some(cluster().control_plane_initialized(None))),
        Mode::InfrastructureNotReady => w = w.cluster(Some(cluster().infrastructure_ready(None))),
    }
    if let Some((percent, min)) = f.domains {
        w = w.spec(
            "failureDomains",
            json!({"key": "spec.failureDomain", "maxUnhealthy": format!("{percent}%"), "minAllowed": min}),
        );
    }
    for m in machines {
        w = w.machine(machine_json(m));
        if let Some(fd) = m.fd {
            w.edit_machine(&m.name, |v| set_pointer(v, "/spec/failureDomain", json!(format!("fd-{fd}"))));
        }
        if let NodeState::Present { status, ago: secs } = m.node {
            w = w.node(node(&m.name).ready(status, ago(secs)));
        }
        if m.has_object && matches!(f.template, TemplateMode::Found) {
            w = w.remediation(remediation_json(NS, &m.name, "Machine", &m.name));
        }
    }
    w
}

/// Machines (by `namespace/name`) the plan asks to remediate.
fn requested(plan: &Plan<MachineHealthCheckStatus>) -> BTreeSet<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::SetMachineConditions { machine, conditions, .. }
                if conditions.iter().any(|(c, _)| {
                    c.type_ == OWNER_REMEDIATED && c.status == "False" && c.reason == "WaitingForRemediation"
                }) =>
            {
                Some(key(&machine.name))
            }
            Action::CreateRemediation { target, .. } => Some(target.key()),
            _ => None,
        })
        .collect()
}

/// The most remediations the short-circuit allows among `targets`.
fn limit(sc: ShortCircuit, targets: usize) -> usize {
    match sc {
        ShortCircuit::Count(n) => n as usize,
        ShortCircuit::Percent(p) => targets * p as usize / 100,
        ShortCircuit::Range(_, max) => max as usize,
    }
}

fn fleet_and_shuffle() -> impl Strategy<Value = (Fleet, Vec<MachineSpec>)> {
    fleet().prop_flat_map(|f| {
        let machines = f.machines.clone();
        (Just(f), Just(machines).prop_shuffle())
    })
}

/// 512 cases from a fixed seed, so every run checks the same fleets; set `PROPTEST_RNG_SEED`
/// (or `PROPTEST_CASES`) to explore others.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig { cases: 512, ..ProptestConfig::default() };
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config.cases = ProptestConfig::default().cases;
    }
    if matches!(config.rng_seed, RngSeed::Random) {
        config.rng_seed = RngSeed::Fixed(0x2030_0101);
    }
    config
}

proptest! {
    #![proptest_config(config())]

    /// (a) The number of Machines asked to be remediated in one plan is within the limit, and is
    /// zero whenever `RemediationAllowed` is not True.
    #[test]
    fn never_above_the_budget(f in fleet()) {
        let plan = world(&f, &f.machines).decide(now());
        let asked = requested(&plan);
        let allowed = check_condition(&plan.status.conditions, REMEDIATION_ALLOWED).is_some_and(|c| c.status == "True");
        let paused = check_condition(&plan.status.conditions, PAUSED).is_some_and(|c| c.status == "True");
        if !allowed || paused {
            prop_assert!(asked.is_empty(), "asked {asked:?} while not allowed");
            prop_assert_eq!(plan.status.remediations_allowed, 0);
        }
        let targets = usize::try_from(plan.status.expected_machines).expect("non-negative");
        prop_assert!(asked.len() <= limit(f.short_circuit, targets), "asked {} > limit {} ({:?})", asked.len(), limit(f.short_circuit, targets), f.short_circuit);
        prop_assert!(usize::try_from(plan.status.remediations_allowed).expect("non-negative") <= limit(f.short_circuit, targets));
        prop_assert!(plan.status.current_healthy <= plan.status.expected_machines);
    }

    /// Failure domains: each listed domain has the Machines of its `spec.failureDomain`, the
    /// allowance `max(percent of its targets rounded down, minAllowed)` and is paused exactly
    /// when its not-healthy count exceeds that; the invariant: no Machine of a paused domain is
    /// asked to be remediated (no new `OwnerRemediated=False`, no new remediation object).
    #[test]
    fn no_new_remediation_in_a_paused_failure_domain(f in fleet()) {
        let plan = world(&f, &f.machines).decide(now());
        let Some((percent, min)) = f.domains else {
            prop_assert!(plan.status.features.failure_domains.is_empty());
            return Ok(());
        };
        if f.mode != Mode::Normal && f.mode != Mode::ControlPlaneNotInitialized && f.mode != Mode::InfrastructureNotReady {
            prop_assert!(plan.status.features.failure_domains.is_empty(), "no decision, no counts");
            return Ok(());
        }
        let asked = requested(&plan);
        let mut unhealthy_sum = 0;
        for d in &plan.status.features.failure_domains {
            let members: Vec<&MachineSpec> = f.machines.iter().filter(|m| m.fd.map(|x| format!("fd-{x}")) == Some(d.name.clone())).collect();
            prop_assert_eq!(d.targets as usize, members.len());
            let allowed = (members.len() as u64 * u64::from(percent) / 100).max(u64::from(min));
            prop_assert_eq!(d.allowed as u64, allowed);
            prop_assert_eq!(d.paused, d.unhealthy as u64 > allowed);
            unhealthy_sum += d.unhealthy;
            if d.paused {
                for m in members {
                    prop_assert!(!asked.contains(&key(&m.name)), "{} asked in paused {}", m.name, d.name);
                }
            }
        }
        let domains: BTreeSet<u8> = f.machines.iter().filter_map(|m| m.fd).collect();
        prop_assert_eq!(plan.status.features.failure_domains.len(), domains.len());
        prop_assert!(unhealthy_sum <= plan.status.expected_machines - plan.status.current_healthy);
    }

    /// (b) The same input gives the same plan.
    #[test]
    fn deterministic(f in fleet()) {
        let w = world(&f, &f.machines);
        let first = w.decide(now());
        let second = w.decide(now());
        prop_assert_eq!(&first, &second);
        // Rebuilding the world from scratch does not change it either.
        prop_assert_eq!(&first, &world(&f, &f.machines).decide(now()));
    }

    /// (c) The order of the Machines in the input does not change the plan.
    #[test]
    fn machine_order_does_not_matter((f, shuffled) in fleet_and_shuffle()) {
        let plan = world(&f, &f.machines).decide(now());
        let reordered = world(&f, &shuffled).decide(now());
        prop_assert_eq!(plan, reordered);
    }

    /// (d) A wake-up, when there is one, is strictly after now; and deciding at it (nothing
    /// else changed) gives a different verdict or a later wake-up.
    #[test]
    fn next_wake_is_strictly_in_the_future(f in fleet()) {
        let w = world(&f, &f.machines);
        let plan = w.decide(now());
        if let Some(wake) = plan.next_wake {
            prop_assert!(wake > now(), "next_wake {wake} is not after {}", now());
            let later = w.decide(wake);
            prop_assert!(later.next_wake.is_none_or(|t| t > wake), "the wake-up does not move: {:?}", later.next_wake);
            prop_assert!(machine_writes(&later) != machine_writes(&plan), "deciding at the wake-up changes a verdict");
        }
    }

    /// Rule 8: once a plan is applied, deciding again at the same instant asks for nothing more.
    #[test]
    fn applying_a_plan_settles(f in fleet()) {
        let mut w = world(&f, &f.machines);
        let first = w.decide(now());
        w.apply(&first);
        let second = w.decide(now());
        prop_assert_eq!(&second.actions, &vec![]);
        prop_assert_eq!(&second.notices, &vec![]);
        prop_assert_eq!(&second.status, &first.status);
    }

    /// Rules 1 and 7: paused, without the Cluster, or without the workload cluster, no Machine
    /// is written and no object is created or deleted.
    #[test]
    fn no_writes_without_a_decision(
        mut f in fleet(),
        mode in prop_oneof![Just(Mode::Paused), Just(Mode::ClusterPaused), Just(Mode::ClusterMissing), Just(Mode::Unreachable)],
    ) {
        f.mode = mode;
        let plan = world(&f, &f.machines).decide(now());
        prop_assert_eq!(plan.actions, vec![]);
        prop_assert_eq!(plan.next_wake, None);
        prop_assert_eq!(plan.status.remediations_allowed, 0);
    }

    /// Dry-run shadows the real plan: no action at all, the same counts and conditions, exactly
    /// the Machines the real plan would remediate in `status.wouldRemediate`, and applying it
    /// settles at once (same input, same plan).
    #[test]
    fn dry_run_shadows_the_real_plan(f in fleet()) {
        let real_world = world(&f, &f.machines);
        let real = real_world.decide(now());
        let mut w = real_world.clone().spec("dryRun", json!(true));
        let dry = w.decide(now());
        prop_assert_eq!(&dry.actions, &vec![]);
        let would: BTreeSet<String> = dry.status.features.would_remediate.iter().map(|x| key(&x.name)).collect();
        prop_assert_eq!(would, requested(&real));
        prop_assert!(dry.status.features.would_remediate.iter().all(|x| x.since.0 == now()));
        prop_assert_eq!(
            (dry.status.expected_machines, dry.status.current_healthy, dry.status.remediations_allowed),
            (real.status.expected_machines, real.status.current_healthy, real.status.remediations_allowed)
        );
        prop_assert_eq!(&dry.status.conditions, &real.status.conditions);
        w.apply(&dry);
        let again = w.decide(now());
        prop_assert_eq!(&again.actions, &vec![]);
        prop_assert_eq!(&again.notices, &vec![]);
        prop_assert_eq!(&again.status, &dry.status);
    }
}
