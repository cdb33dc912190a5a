//! Properties of the remediation back-off over random event sequences: targets of random pools
//! fail and recover at random instants; each decision's plan is applied (remediation objects
//! created and removed, Machines replaced by their owner) and its status fed back through its
//! JSON, as the controller does, waking at `next_wake` as the controller does. Then:
//! within any window, the starts of one pool never exceed `maxRemediations`; the history stays
//! bounded and holds only records inside the window; the same input gives the same plan.

mod support;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::shared::{BackedOffPool, RemediationRecord};
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::backoff::HISTORY_CAP;
use vigil_engine::node::{self, NhcInput};
use vigil_engine::{Action, Plan};

/// One event: after `dt` seconds, target slot `slot` turns unhealthy (`fail`) or healthy.
#[derive(Debug, Clone)]
struct Event {
    dt: i64,
    slot: usize,
    fail: bool,
}

#[derive(Debug, Clone)]
struct Model {
    /// Pool of each slot (`None`: no pool label / no deployment).
    pools: Vec<Option<u8>>,
    max: u32,
    window_secs: i64,
    events: Vec<Event>,
}

fn model() -> impl Strategy<Value = Model> {
    (
        prop::collection::vec(prop::option::weighted(0.8, 0u8..3), 1..7),
        1u32..4,
        prop::sample::select(vec![60i64, 600, 1800, 3600]),
        prop::collection::vec((1i64..1500, 0usize..7, prop::bool::weighted(0.6)), 1..40),
    )
        .prop_map(|(pools, max, window_secs, events)| {
            let n = pools.len();
            let events = events.into_iter().map(|(dt, slot, fail)| Event { dt, slot: slot % n, fail }).collect();
            Model { pools, max, window_secs, events }
        })
}

/// The status through its JSON, as the API server hands it back (times in whole seconds).
fn round_trip<S: serde::Serialize + serde::de::DeserializeOwned>(s: &S) -> S {
    serde_json::from_value(serde_json::to_value(s).expect("to json")).expect("from json")
}

/// Starts per pool must not exceed `max` within any window; returns why not.
fn over_limit(starts: &[(String, Timestamp)], max: u32, window: SignedDuration) -> Option<String> {
    for (pool, s) in starts {
        let from = *s - window;
        let n = starts.iter().filter(|(p, t)| p == pool && *t > from && t <= s).count();
        if n > max as usize {
            return Some(format!("{n} starts in {pool} within {window:?} before {s}: {starts:?}"));
        }
    }
    None
}

/// The history is bounded and only holds what still counts; a backed-off pool is at its limit.
fn history_ok(
    history: &[RemediationRecord],
    pools: &[BackedOffPool],
    max: u32,
    window: SignedDuration,
    now: Timestamp,
) -> Result<(), String> {
    if history.len() > HISTORY_CAP {
        return Err(format!("{} records", history.len()));
    }
    let mut per_pool: BTreeMap<&str, u32> = BTreeMap::new();
    for r in history {
        *per_pool.entry(&r.pool).or_default() += 1;
        if r.started.0 <= now - window {
            return Err(format!("{r:?} is outside the window at {now}"));
        }
    }
    if let Some((pool, n)) = per_pool.iter().find(|(_, n)| **n > max) {
        return Err(format!("{n} records for {pool}"));
    }
    for p in pools {
        if !p.history_full && per_pool.get(p.pool.as_str()).copied().unwrap_or(0) < max {
            return Err(format!("{p:?} backed off below its limit: {history:?}"));
        }
        if p.resumes_at.0 <= now {
            return Err(format!("{p:?} resumes in the past ({now})"));
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// NodeHealthCheck: Nodes of random pools; a remediation object stays until the Node is healthy.
// ----------------------------------------------------------------------------------------------

const NS: &str = "medik8s";
const LABEL: &str = "example.com/pool";

struct NhcSim {
    check: Value,
    template: TemplateView,
    /// Per slot: Ready status and since.
    ready: Vec<(bool, Timestamp)>,
    pools: Vec<Option<u8>>,
    objects: Vec<RemediationView>,
    status: Option<NodeHealthCheckStatus>,
    starts: Vec<(String, Timestamp)>,
}

impl NhcSim {
    fn new(m: &Model) -> Self {
        let check = json!({
            "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1},
            "spec": {
                "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
                "maxUnhealthy": "100%",
                "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS},
                "backoff": {"maxRemediations": m.max, "window": format!("{}s", m.window_secs), "poolLabel": LABEL},
            },
        });
        let template = TemplateView::read(&json!({
            "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
            "metadata": {"name": "snr", "namespace": NS}, "spec": {"template": {"spec": {}}}
        }))
        .expect("template");
        NhcSim {
            check,
            template,
            ready: vec![(true, t0()); m.pools.len()],
            pools: m.pools.clone(),
            objects: Vec::new(),
            status: None,
            starts: Vec::new(),
        }
    }

    fn nodes(&self) -> Vec<NodeView> {
        self.ready
            .iter()
            .enumerate()
            .map(|(i, (ok, since))| {
                let b = node(&format!("n{i}")).ready(if *ok { "True" } else { "False" }, *since);
                match self.pools[i] {
                    Some(p) => b.label(LABEL, &format!("p{p}")),
                    None => b,
                }
                .build()
            })
            .collect()
    }

    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let mut v = self.check.clone();
        if let Some(s) = &self.status {
            v["status"] = serde_json::to_value(s).expect("status");
        }
        let check: NodeHealthCheck = serde_json::from_value(v).expect("check");
        let policy = vigil_api::validate::node_health_check(&check).expect("valid");
        let nodes = self.nodes();
        let refs: Vec<&NodeView> = nodes.iter().collect();
        let objects: Vec<&RemediationView> = self.objects.iter().collect();
        let templates = [Some(&self.template)];
        node::decide(
            &NhcInput {
                check: &check,
                policy: &policy,
                nodes: &refs,
                templates: &templates,
                remediations: &objects,
                around: Default::default(),
            },
            now,
        )
    }

    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, target, .. } => {
                    let mut o = object.clone();
                    let name = o["metadata"]["name"].as_str().expect("name").to_string();
                    if self.objects.iter().any(|x| x.meta.name == name) {
                        continue;
                    }
                    o["metadata"]["uid"] = json!(format!("uid-{name}-{now}"));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    self.objects.push(RemediationView::read(&o).expect("named"));
                    let slot: usize = target.name()[1..].parse().expect("slot");
                    let pool =
                        self.pools[slot].map_or_else(|| format!("Node/{}", target.name()), |p| format!("{LABEL}=p{p}"));
                    self.starts.push((pool, now));
                }
                Action::DeleteRemediation { object, .. } => self.objects.retain(|x| x.meta.name != object.name),
                // This world keeps no Leases: every Node's Lease is free.
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        self.status = Some(round_trip(&plan.status));
    }
}

/// Runs the events, deciding at each event and at every `next_wake` in between; checks each
/// plan with `check` before applying it.
fn run<W>(
    world: &mut W,
    events: &[Event],
    decide: impl Fn(&W, Timestamp) -> Plan<NodeHealthCheckStatus>,
    apply: impl Fn(&mut W, &Plan<NodeHealthCheckStatus>, Timestamp),
    change: impl Fn(&mut W, &Event, Timestamp),
    check: impl Fn(&W, &Plan<NodeHealthCheckStatus>, Timestamp) -> Result<(), String>,
) -> Result<(), String> {
    let mut now = t0();
    for e in events {
        let until = now + SignedDuration::from_secs(e.dt);
        let mut guard = 0;
        loop {
            let plan = decide(world, now);
            check(world, &plan, now)?;
            apply(world, &plan, now);
            guard += 1;
            match plan.next_wake {
                Some(w) if w > now && w < until && guard < 200 => now = w,
                _ => break,
            }
        }
        now = until;
        change(world, e, now);
    }
    let plan = decide(world, now);
    check(world, &plan, now)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// NodeHealthCheck: within any window, starts per pool never exceed maxRemediations; the
    /// history stays bounded; deciding twice on the same input gives the same plan.
    #[test]
    fn node_pools_never_start_more_than_allowed_within_a_window(m in model()) {
        let window = SignedDuration::from_secs(m.window_secs);
        let mut sim = NhcSim::new(&m);
        let outcome = run(
            &mut sim,
            &m.events,
            |s, now| s.decide(now),
            |s, plan, now| s.apply(plan, now),
            |s, e, now| {
                if s.ready[e.slot].0 == e.fail {
                    s.ready[e.slot] = (!e.fail, now);
                }
            },
            |s, plan, now| {
                if s.decide(now) != *plan {
                    return Err("the same input gave another plan".into());
                }
                history_ok(&plan.status.features.remediation_history, &plan.status.features.backed_off_pools, m.max, window, now)
            },
        );
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
        let over = over_limit(&sim.starts, m.max, window);
        prop_assert!(over.is_none(), "{:?}", over);
    }

    /// MachineHealthCheck with an owner that replaces a Machine as soon as it is marked: the
    /// replacement is new (a new name, healthy until an event fails its slot again).
    #[test]
    fn machine_pools_never_start_more_than_allowed_within_a_window(m in model()) {
        let window = SignedDuration::from_secs(m.window_secs);
        let mut w = with_machines(&m);
        let mut starts: Vec<(String, Timestamp)> = Vec::new();
        let mut generation = vec![0u32; m.pools.len()];
        let mut now = t0();
        for e in &m.events {
            let until = now + SignedDuration::from_secs(e.dt);
            for _ in 0..200 {
                let plan = w.decide(now);
                prop_assert_eq!(&w.decide(now), &plan, "same input, same plan");
                let checked = history_ok(&plan.status.features.remediation_history, &plan.status.features.backed_off_pools, m.max, window, now);
                prop_assert!(checked.is_ok(), "{:?}", checked);
                w.apply(&plan);
                w.status = w.status.as_ref().map(round_trip);
                for (name, writes) in machine_writes(&plan) {
                    if writes.iter().any(|(t, s, _)| t == "OwnerRemediated" && s == "False") {
                        let slot: usize = name[1..].split('-').next().expect("slot").parse().expect("slot");
                        starts.push((m.pools[slot].map_or_else(|| format!("Machine/{name}"), |p| format!("MachineDeployment/p{p}")), now));
                        generation[slot] += 1;
                        replace(&mut w, &m, slot, generation[slot], now);
                    }
                }
                match plan.next_wake {
                    Some(wake) if wake > now && wake < until => now = wake,
                    _ => break,
                }
            }
            now = until;
            let name = format!("m{}-{}", e.slot, generation[e.slot]);
            w = w.node(node(&name).ready(if e.fail { "False" } else { "True" }, now));
        }
        let over = over_limit(&starts, m.max, window);
        prop_assert!(over.is_none(), "{:?}", over);
    }
}

/// One healthy Machine per slot, named `m<slot>-<generation>`, with its Node.
fn with_machines(m: &Model) -> MhcWorld {
    let mut w =
        MhcWorld::new().spec("backoff", json!({"maxRemediations": m.max, "window": format!("{}s", m.window_secs)}));
    for (slot, pool) in m.pools.iter().enumerate() {
        w = w.machine_with_node(slot_machine(slot, 0, *pool), "True", t0());
    }
    w
}

fn slot_machine(slot: usize, generation: u32, pool: Option<u8>) -> MachineJson {
    let m = machine(&format!("m{slot}-{generation}"));
    match pool {
        Some(p) => m.label("cluster.x-k8s.io/deployment-name", &format!("p{p}")),
        None => m,
    }
}

/// The owner deletes the marked Machine and makes a healthy one in its place.
fn replace(w: &mut MhcWorld, m: &Model, slot: usize, generation: u32, now: Timestamp) {
    let old = format!("m{slot}-{}", generation - 1);
    w.machines.retain(|v| v.pointer("/metadata/name").and_then(Value::as_str) != Some(old.as_str()));
    w.nodes.remove(&old);
    let fresh = slot_machine(slot, generation, m.pools[slot]).created(Some(now));
    *w = w.clone().machine_with_node(fresh, "True", now);
}
