//! Properties of pacing (`spec.maxInFlight`) over random event sequences: targets fail and
//! recover at random instants; each plan is applied (remediation objects created, annotated and
//! removed; Machines marked, and replaced by their owner when it acts) and its status fed back
//! through its JSON; every check decides again at the same instant until nothing changes, as a
//! change wakes it, and at `next_wake`. Then, for every plan, against a count of what is in
//! flight made by the test from the world itself:
//! - never more than `maxInFlight` started and unfinished: a plan starts at most
//!   `limit - in flight`, and exactly that many when that many wait (no slot is left idle);
//! - the queue is ordered by unhealthy-since (ties by name), nothing started is younger than
//!   anything queued, and the queue is exactly the unhealthy targets that did not start;
//! - the same input gives the same plan, and deciding without the previous status (a restart
//!   that lost it) starts exactly the same targets.

mod support;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::shared::QueuedTarget;
use vigil_api::threshold::IntOrPercent;
use vigil_api::views::NodeView;
use vigil_api::views::{RemediationView, TemplateView};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::{Action, Plan};

/// The unhealthy timeout of both kinds.
const TIMEOUT: i64 = 300;

/// One event: after `dt` seconds, target slot `slot` fails, recovers, or (MachineHealthCheck) its
/// owner acts on the Machines marked for it.
#[derive(Debug, Clone)]
enum Event {
    Fail { dt: i64, slot: usize },
    Recover { dt: i64, slot: usize },
    OwnerActs { dt: i64, all: bool },
}

impl Event {
    fn dt(&self) -> i64 {
        match self {
            Event::Fail { dt, .. } | Event::Recover { dt, .. } | Event::OwnerActs { dt, .. } => *dt,
        }
    }
}

#[derive(Debug, Clone)]
struct Model {
    slots: usize,
    max: IntOrPercent,
    /// NodeHealthCheck: two escalation steps of 5m (then it gives up) instead of one template.
    escalate: bool,
    events: Vec<Event>,
}

fn model() -> impl Strategy<Value = Model> {
    (
        2usize..9,
        prop_oneof![(1u32..4).prop_map(IntOrPercent::Count), (1u32..=100).prop_map(IntOrPercent::Percent)],
        any::<bool>(),
        prop::collection::vec((0i64..700, 0usize..9, 0u8..10), 1..40),
    )
        .prop_map(|(slots, max, escalate, raw)| {
            let events = raw
                .into_iter()
                .map(|(dt, slot, what)| match what {
                    0..=4 => Event::Fail { dt, slot: slot % slots },
                    5..=7 => Event::Recover { dt, slot: slot % slots },
                    8 => Event::OwnerActs { dt, all: false },
                    _ => Event::OwnerActs { dt, all: true },
                })
                .collect();
            Model { slots, max, escalate, events }
        })
}

fn max_json(max: IntOrPercent) -> Value {
    match max {
        IntOrPercent::Count(n) => json!(n),
        IntOrPercent::Percent(p) => json!(format!("{p}%")),
    }
}

/// The limit, as docs/features.md states it: a count as written; a percentage of the targets rounded
/// down, at least 1.
fn limit(max: IntOrPercent, targets: usize) -> usize {
    match max {
        IntOrPercent::Count(n) => n as usize,
        IntOrPercent::Percent(p) => (targets * p as usize / 100).max(1),
    }
}

/// The status through its JSON, as the API server hands it back (times in whole seconds).
fn round_trip<S: serde::Serialize + serde::de::DeserializeOwned>(s: &S) -> S {
    serde_json::from_value(serde_json::to_value(s).expect("to json")).expect("from json")
}

/// The queue must be ordered by (unhealthy-since, name) with positions 1..; it must hold exactly
/// `waiting` (the unhealthy targets that did not start, with their since); nothing started may
/// come after anything queued.
fn queue_ok(
    queued: &[QueuedTarget],
    count: i32,
    waiting: &[(Timestamp, String)],
    started: &[(Timestamp, String)],
) -> Result<(), String> {
    let got: Vec<(Timestamp, String)> = queued.iter().map(|q| (q.unhealthy_since.0, q.name.clone())).collect();
    let mut want = waiting.to_vec();
    want.sort();
    if got != want {
        return Err(format!("queue {got:?}, want {want:?}"));
    }
    if queued.iter().enumerate().any(|(i, q)| q.position != i as i32 + 1) || count as usize != queued.len() {
        return Err(format!("positions or count wrong: {queued:?} count {count}"));
    }
    if let (Some(last), Some(first)) = (started.iter().max(), got.first())
        && last > first
    {
        return Err(format!("{last:?} started while the older {first:?} was queued"));
    }
    Ok(())
}

/// Starts must fill exactly the free slots: `min(limit - in_flight, candidates)`.
fn starts_ok(limit: usize, in_flight: usize, candidates: usize, starts: usize) -> Result<(), String> {
    let want = limit.saturating_sub(in_flight).min(candidates);
    if starts != want {
        return Err(format!(
            "{starts} started with {in_flight} in flight, limit {limit}, {candidates} candidates: want {want}"
        ));
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// NodeHealthCheck: a remediation object stays until its Node is healthy (and is given up on at
// the end of the escalation).
// ----------------------------------------------------------------------------------------------

const NS: &str = "medik8s";

struct NhcSim {
    check: Value,
    templates: Vec<TemplateView>,
    escalate: bool,
    /// Per slot: Ready status and since.
    ready: Vec<(bool, Timestamp)>,
    objects: Vec<RemediationView>,
    status: Option<NodeHealthCheckStatus>,
}

fn template_ref(kind: &str, name: &str) -> Value {
    json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": kind, "name": name, "namespace": NS})
}

impl NhcSim {
    fn new(m: &Model) -> Self {
        let mut spec = json!({
            "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": format!("{TIMEOUT}s")}],
            "maxUnhealthy": "100%",
            "maxInFlight": max_json(m.max),
        });
        if m.escalate {
            spec["escalatingRemediations"] = json!([
                {"remediationTemplate": template_ref("RebootTemplate", "reboot"), "order": 0, "timeout": "5m"},
                {"remediationTemplate": template_ref("FenceTemplate", "fence"), "order": 1, "timeout": "5m"},
            ]);
        } else {
            spec["remediationTemplate"] = template_ref("RebootTemplate", "reboot");
        }
        let templates = [("RebootTemplate", "reboot"), ("FenceTemplate", "fence")]
            .iter()
            .map(|(kind, name)| {
                TemplateView::read(&json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": {"template": {"spec": {}}}}))
                    .expect("template")
            })
            .collect();
        NhcSim {
            check: json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1}, "spec": spec}),
            templates,
            escalate: m.escalate,
            ready: vec![(true, t0()); m.slots],
            objects: Vec::new(),
            status: None,
        }
    }

    fn decide_with(&self, status: Option<&NodeHealthCheckStatus>, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        let mut v = self.check.clone();
        if let Some(s) = status {
            v["status"] = serde_json::to_value(s).expect("status");
        }
        let check: NodeHealthCheck = serde_json::from_value(v).expect("check");
        let policy = vigil_api::validate::node_health_check(&check).expect("valid");
        let nodes: Vec<NodeView> = self
            .ready
            .iter()
            .enumerate()
            .map(|(i, (ok, since))| node(&format!("n{i}")).ready(if *ok { "True" } else { "False" }, *since).build())
            .collect();
        let refs: Vec<&NodeView> = nodes.iter().collect();
        let objects: Vec<&RemediationView> = self.objects.iter().collect();
        let steps = if self.escalate { 2 } else { 1 };
        let templates: Vec<Option<&TemplateView>> = self.templates.iter().take(steps).map(Some).collect();
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

    fn decide(&self, now: Timestamp) -> Plan<NodeHealthCheckStatus> {
        self.decide_with(self.status.as_ref(), now)
    }

    fn has_objects(&self, slot: usize) -> bool {
        self.objects.iter().any(|o| o.meta.name == format!("n{slot}"))
    }

    /// In flight, counted from the world: a Node with an object not given up on, not Ready.
    fn in_flight(&self) -> usize {
        (0..self.ready.len())
            .filter(|&i| {
                !self.ready[i].0
                    && self.objects.iter().any(|o| {
                        o.meta.name == format!("n{i}")
                            && !o.meta.annotations.contains_key("remediation.medik8s.io/nhc-timed-out")
                    })
            })
            .count()
    }

    /// Nodes that would start now but for pacing: unhealthy past the timeout, without objects.
    fn candidates(&self, now: Timestamp) -> Vec<(Timestamp, String)> {
        (0..self.ready.len())
            .filter(|&i| {
                let (ok, since) = self.ready[i];
                !ok && since + SignedDuration::from_secs(TIMEOUT) < now && !self.has_objects(i)
            })
            .map(|i| (self.ready[i].1, format!("n{i}")))
            .collect()
    }

    fn apply(&mut self, plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) {
        for a in &plan.actions {
            match a {
                Action::CreateRemediation { object, .. } => {
                    let mut o = object.clone();
                    let id = format!(
                        "{}-{}",
                        o["metadata"]["name"].as_str().expect("name"),
                        o["kind"].as_str().expect("kind")
                    );
                    o["metadata"]["uid"] = json!(format!("uid-{id}-{now}"));
                    o["metadata"]["creationTimestamp"] = json!(now.to_string());
                    self.objects.push(RemediationView::read(&o).expect("named"));
                }
                Action::DeleteRemediation { object, .. } => {
                    self.objects.retain(|x| !(x.meta.name == object.name && x.meta.kind == object.kind))
                }
                Action::AnnotateRemediation { object, key, value, .. } => {
                    for x in
                        self.objects.iter_mut().filter(|x| x.meta.name == object.name && x.meta.kind == object.kind)
                    {
                        x.meta.annotations.insert(key.clone(), value.clone());
                    }
                }
                // This world keeps no Leases: every Node's Lease is free.
                Action::WriteLease(_) | Action::DeleteLease { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        self.status = Some(round_trip(&plan.status));
    }

    /// Checks one plan against the world it was decided on.
    fn check(&self, plan: &Plan<NodeHealthCheckStatus>, max: IntOrPercent, now: Timestamp) -> Result<(), String> {
        if self.decide(now) != *plan {
            return Err("the same input gave another plan".into());
        }
        let starts = |p: &Plan<NodeHealthCheckStatus>| -> BTreeSet<String> {
            creates(p)
                .iter()
                .filter(|o| o["kind"] == "Reboot")
                .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        };
        let started = starts(plan);
        if starts(&self.decide_with(None, now)) != started {
            return Err("without the previous status (a restart) other targets start".into());
        }
        let candidates = self.candidates(now);
        let limit = limit(max, self.ready.len());
        starts_ok(limit, self.in_flight(), candidates.len(), started.len())?;
        let (s, waiting): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|(_, n)| started.contains(n));
        queue_ok(&plan.status.features.queued, plan.status.features.queued_count, &waiting, &s)
    }
}

// ----------------------------------------------------------------------------------------------
// MachineHealthCheck: a marked Machine stays until its owner acts (deletes it and makes a
// healthy one in its place) or its Node recovers.
// ----------------------------------------------------------------------------------------------

struct MhcSim {
    w: MhcWorld,
    /// Per slot: the generation of its Machine `m<slot>-<generation>`.
    generation: Vec<u32>,
    /// Per slot: Ready status and since.
    ready: Vec<(bool, Timestamp)>,
}

impl MhcSim {
    fn new(m: &Model) -> Self {
        let mut w = MhcWorld::new().spec("maxInFlight", max_json(m.max)).spec(
            "unhealthyConditions",
            json!([{"type": "Ready", "status": "False", "timeout": format!("{TIMEOUT}s")}]),
        );
        for slot in 0..m.slots {
            w = w.machine_with_node(machine(&format!("m{slot}-0")), "True", t0());
        }
        MhcSim { w, generation: vec![0; m.slots], ready: vec![(true, t0()); m.slots] }
    }

    fn name(&self, slot: usize) -> String {
        format!("m{slot}-{}", self.generation[slot])
    }

    fn condition(&self, slot: usize, type_: &str) -> Option<String> {
        let name = self.name(slot);
        let m = self.w.machines.iter().find(|m| m["metadata"]["name"] == name.as_str())?;
        let list = m.pointer("/status/conditions")?.as_array()?;
        list.iter().find(|c| c["type"] == type_).and_then(|c| c["status"].as_str()).map(str::to_string)
    }

    fn asked(&self, slot: usize) -> bool {
        self.condition(slot, "OwnerRemediated").as_deref() == Some("False")
    }

    /// In flight, counted from the world: asked, and its Node still not Ready.
    fn in_flight(&self) -> usize {
        (0..self.ready.len()).filter(|&i| self.asked(i) && !self.ready[i].0).count()
    }

    /// Machines that would start now but for pacing: unhealthy past the timeout, not asked.
    fn candidates(&self, now: Timestamp) -> Vec<(Timestamp, String)> {
        (0..self.ready.len())
            .filter(|&i| {
                let (ok, since) = self.ready[i];
                !ok && since + SignedDuration::from_secs(TIMEOUT) < now && !self.asked(i)
            })
            .map(|i| (self.ready[i].1, self.name(i)))
            .collect()
    }

    fn set_ready(&mut self, slot: usize, ok: bool, now: Timestamp) {
        self.ready[slot] = (ok, now);
        let name = self.name(slot);
        self.w = self.w.clone().node(node(&name).ready(if ok { "True" } else { "False" }, now));
    }

    /// The owner replaces the Machines marked for it (`all`), or the first of them by slot.
    fn owner_acts(&mut self, all: bool, now: Timestamp) {
        let marked: Vec<usize> = (0..self.ready.len())
            .filter(|&i| self.asked(i) && self.condition(i, "HealthCheckSucceeded").as_deref() == Some("False"))
            .collect();
        for slot in marked.into_iter().take(if all { usize::MAX } else { 1 }) {
            let old = self.name(slot);
            self.w.machines.retain(|m| m["metadata"]["name"] != old.as_str());
            self.w.nodes.remove(&old);
            self.generation[slot] += 1;
            let fresh = machine(&self.name(slot)).created(Some(now));
            self.w = self.w.clone().machine_with_node(fresh, "True", now);
            self.ready[slot] = (true, now);
        }
    }

    fn check(&self, plan: &Plan<MachineHealthCheckStatus>, max: IntOrPercent, now: Timestamp) -> Result<(), String> {
        if self.w.decide(now) != *plan {
            return Err("the same input gave another plan".into());
        }
        let starts = |p: &Plan<MachineHealthCheckStatus>| -> BTreeSet<String> {
            machine_writes(p)
                .into_iter()
                .filter(|(_, w)| w.iter().any(|(t, s, _)| t == "OwnerRemediated" && s == "False"))
                .map(|(name, _)| name)
                .collect()
        };
        let started = starts(plan);
        let mut restarted = self.w.clone();
        restarted.status = None;
        if starts(&restarted.decide(now)) != started {
            return Err("without the previous status (a restart) other targets start".into());
        }
        let candidates = self.candidates(now);
        let limit = limit(max, self.ready.len());
        starts_ok(limit, self.in_flight(), candidates.len(), started.len())?;
        let (s, waiting): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|(_, n)| started.contains(n));
        queue_ok(&plan.status.features.queued, plan.status.features.queued_count, &waiting, &s)
    }
}

/// Runs the events: at each instant the check decides until its plan changes nothing (a change
/// wakes it), then waits for the next event or its `next_wake`, whichever comes first.
fn run<W>(
    world: &mut W,
    events: &[Event],
    mut step: impl FnMut(&mut W, Timestamp) -> Result<(bool, Option<Timestamp>), String>,
    mut change: impl FnMut(&mut W, &Event, Timestamp),
) -> Result<(), String> {
    let mut now = t0();
    for e in events.iter().chain([&Event::Recover { dt: 900, slot: 0 }]) {
        let until = now + SignedDuration::from_secs(e.dt());
        for _ in 0..100 {
            let mut wake = None;
            for _ in 0..20 {
                let (acted, next) = step(world, now)?;
                wake = next;
                if !acted {
                    break;
                }
            }
            match wake {
                Some(w) if w > now && w < until => now = w,
                _ => break,
            }
        }
        now = until;
        change(world, e, now);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// NodeHealthCheck: never more than maxInFlight in flight (and no idle slot while a Node
    /// waits), the queue in unhealthy-since order, same input same plan, a restart starts the same.
    #[test]
    fn nodes_never_exceed_max_in_flight_and_wait_oldest_first(m in model()) {
        let mut sim = NhcSim::new(&m);
        let outcome = run(
            &mut sim,
            &m.events,
            |s, now| {
                let plan = s.decide(now);
                s.check(&plan, m.max, now)?;
                let acted = !plan.actions.is_empty() || s.status.as_ref() != Some(&round_trip(&plan.status));
                s.apply(&plan, now);
                Ok((acted, plan.next_wake))
            },
            |s, e, now| match *e {
                Event::Fail { slot, .. } if s.ready[slot].0 => s.ready[slot] = (false, now),
                Event::Recover { slot, .. } if !s.ready[slot].0 => s.ready[slot] = (true, now),
                _ => {}
            },
        );
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
    }

    /// MachineHealthCheck with an owner that replaces marked Machines when it acts: the same.
    #[test]
    fn machines_never_exceed_max_in_flight_and_wait_oldest_first(m in model()) {
        let mut sim = MhcSim::new(&m);
        let outcome = run(
            &mut sim,
            &m.events,
            |s, now| {
                let plan = s.w.decide(now);
                s.check(&plan, m.max, now)?;
                let acted = !plan.actions.is_empty() || s.w.status.as_ref() != Some(&round_trip(&plan.status));
                s.w.apply(&plan);
                s.w.status = s.w.status.as_ref().map(round_trip);
                Ok((acted, plan.next_wake))
            },
            |s, e, now| match *e {
                // A Machine asked for and recovered is left to its owner, never failed again.
                Event::Fail { slot, .. } if s.ready[slot].0 && !s.asked(slot) => s.set_ready(slot, false, now),
                Event::Recover { slot, .. } if !s.ready[slot].0 => s.set_ready(slot, true, now),
                Event::OwnerActs { all, .. } => s.owner_acts(all, now),
                _ => {}
            },
        );
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
    }
}
