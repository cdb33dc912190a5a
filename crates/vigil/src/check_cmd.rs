//! `vigil check`: what Vigil would do to the live fleet right now, and what next.
//!
//! The cluster is read once ([`crate::live`], get and list only) into the objects of a scenario
//! with an empty timeline; the simulator then runs the real engine on it once, read twice: as it
//! stands once this instant settled (what the checks look like and what Vigil would do now) and
//! forward, with nothing changing and no other controller acting, up to a horizon (the next
//! change, e.g. "w-3 will be remediated at 12:40:05 unless it recovers"). Nothing is written
//! anywhere.

use anyhow::{Context, Result};
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use vigil_api::conditions::ConditionStatus;
use vigil_api::conditions::find;
use vigil_api::manifest::{health_check_from_value, parse_documents};
use vigil_api::validate::NhcPolicy;
use vigil_api::views::MachineView;
use vigil_api::well_known::{EXTERNALLY_REMEDIATED, OWNER_REMEDIATED};
use vigil_api::{GROUP, NodeHealthCheck, validate};
use vigil_engine::target::LOCAL_CLUSTER;
use vigil_simulator::output::Event;
use vigil_simulator::scenario::Models;
use vigil_simulator::store::Key;
use vigil_simulator::{Scenario, Start, simulate_packed};

/// How far ahead `vigil check` looks for the next change.
pub const HORIZON: SignedDuration = SignedDuration::from_hours(24);

/// Exit code: nothing is being or would be remediated now.
pub const EXIT_QUIET: u8 = 0;
/// Exit code: the cluster could not be read, or a check or candidate policy is invalid.
pub const EXIT_ERROR: u8 = 1;
/// Exit code: at least one target is being remediated or would be remediated now.
pub const EXIT_REMEDIATING: u8 = 2;

/// One condition as shown to the operator.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ConditionOut {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    pub reason: String,
    /// For a person.
    pub message: String,
}

/// An unhealthy target: why, since when, and its remediation.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetOut {
    /// Machine `namespace/name` or Node name.
    pub target: String,
    /// Why it is unhealthy (a condition reason, or the broken rule).
    pub reason: String,
    /// Why, for a person.
    pub message: String,
    /// Since when the verdict (MachineHealthCheck) or the broken condition (NodeHealthCheck) holds.
    pub since: Option<String>,
    /// What is being done about it (`OwnerRemediated=False …`, the remediation objects), if anything.
    pub remediation: Option<String>,
    /// With remediation per condition: the rule that started the incident and the remediation
    /// it chose (`status.chosenRemediations`).
    pub chosen: Option<String>,
    /// NodeHealthCheck: what its remediation waits for (`unhealthyNodes[].waiting`: another
    /// holder's Lease, planned maintenance, a remediator finishing), as `reason: message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// A target waiting for a remediation slot (`spec.maxInFlight`).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueuedOut {
    /// Its place, 1 for the next to start.
    pub position: i64,
    /// Machine `namespace/name` or Node name.
    pub target: String,
    /// When it became unhealthy (RFC 3339): the queue's order.
    pub unhealthy_since: String,
}

/// One thing Vigil does, now or later.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventOut {
    /// The simulator's event name (`RemediationRequested`, `Unhealthy`, …; docs/scenario.md "Output").
    pub event: String,
    /// Machine `namespace/name` or Node name, if the event is about one target.
    pub target: Option<String>,
    /// Machine-readable reason.
    pub reason: String,
    /// For a person.
    pub message: String,
}

/// The next change, if nothing else changes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NextOut {
    /// When (RFC 3339).
    pub at: String,
    /// How long from now, to the second (Go duration syntax).
    #[serde(rename = "in")]
    pub in_: String,
    /// What happens then.
    pub events: Vec<EventOut>,
}

/// The answer for one check.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckOut {
    /// `MachineHealthCheck/<ns>/<name>` or `NodeHealthCheck/<name>`.
    pub check: String,
    /// Targets selected.
    pub targets: i64,
    /// Of which healthy.
    pub healthy: i64,
    /// Of which not healthy.
    pub unhealthy: i64,
    /// MachineHealthCheck: how many more remediations the short-circuit allows.
    pub remediations_allowed: Option<i64>,
    /// NodeHealthCheck: its phase (Disabled, Paused, Remediating, Enabled).
    pub phase: Option<String>,
    /// The `RemediationAllowed` condition (the short-circuit's verdict).
    pub remediation_allowed: Option<ConditionOut>,
    /// Each unhealthy target.
    pub unhealthy_targets: Vec<TargetOut>,
    /// The `RemediationQueued` condition (`spec.maxInFlight`), when the check has one.
    pub remediation_queued: Option<ConditionOut>,
    /// NodeHealthCheck: the `RemediationPostponed` condition (a cluster upgrade), when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remediation_postponed: Option<ConditionOut>,
    /// How many targets wait for a remediation slot.
    pub queued_count: i64,
    /// The first of them (at most 100), next first.
    pub queued: Vec<QueuedOut>,
    /// With `voluntaryDisruptions: Count`: how many targets each signal takes out of the
    /// budget (`status.disruptions`), by signal.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disruptions: Vec<DisruptionOut>,
    /// NodeHealthCheck with `spec.flapping`: each Node with episodes within the window
    /// (`status.flapping`), by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flapping: Vec<FlappingOut>,
    /// What Vigil would do at this instant (empty when the cluster already shows its decision).
    pub now: Vec<EventOut>,
    /// The next change within the horizon if nothing else changes.
    pub next: Option<NextOut>,
    /// Why Vigil decides nothing for this check (invalid spec, workload cluster unreachable).
    pub problem: Option<String>,
    /// Whether a target is being or would be remediated now.
    pub remediating: bool,
}

/// Targets one voluntary-disruption signal takes out of a check's budget.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DisruptionOut {
    /// `Deleting`, `ClusterAutoscaler`, `Karpenter`, `Kured` or `NodeMaintenance`.
    pub signal: String,
    /// How many targets.
    pub targets: i64,
}

/// A Node's episodes within the window of `spec.flapping`, so an operator sees a flapping Node
/// before it is remediated.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FlappingOut {
    /// The Node.
    pub target: String,
    /// Its episodes started within the window.
    pub episodes: usize,
}

/// The whole answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckReport {
    /// The instant evaluated (RFC 3339).
    pub now: String,
    /// One entry per check, in name order.
    pub checks: Vec<CheckOut>,
}

impl CheckReport {
    /// The documented exit code (0, 1 or 2).
    pub fn exit_code(&self) -> u8 {
        if self.checks.iter().any(|c| c.problem.is_some()) {
            EXIT_ERROR
        } else if self.checks.iter().any(|c| c.remediating) {
            EXIT_REMEDIATING
        } else {
            EXIT_QUIET
        }
    }
}

/// Reads candidate health checks from files; an invalid one is an error naming the field and
/// the value (the same findings as `vigil validate`), so it is never evaluated.
pub fn candidates(paths: &[PathBuf]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let documents = parse_documents(&text).with_context(|| path.display().to_string())?;
        for (i, mut doc) in documents.into_iter().enumerate() {
            let what = format!("{}: document {}", path.display(), i + 1);
            if doc.pointer("/metadata/namespace").is_none() && doc["kind"] == "MachineHealthCheck" {
                doc["metadata"]["namespace"] = json!("default");
            }
            let check = health_check_from_value(&doc).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
            if let Err(invalid) = check.validate() {
                let lines: Vec<String> =
                    invalid.errors.iter().map(|e| format!("{what}: {}: {e}", invalid.object)).collect();
                anyhow::bail!("invalid policy, nothing evaluated:\n{}", lines.join("\n"));
            }
            out.push(doc);
        }
    }
    Ok(out)
}

fn label_of(v: &Value) -> String {
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    match text("/kind") {
        "MachineHealthCheck" => {
            format!("MachineHealthCheck/{}/{}", text("/metadata/namespace"), text("/metadata/name"))
        }
        kind => format!("{kind}/{}", text("/metadata/name")),
    }
}

/// Whether `wanted` (as given on the command line) names the check `label`: the full label,
/// `namespace/name` or `name`.
fn names(wanted: &str, label: &str) -> bool {
    label == wanted || label.ends_with(&format!("/{wanted}"))
}

/// Evaluates the fleet at `now` (to the millisecond). With candidates, only they are evaluated
/// (one named like a live check keeps its status, as applying it would); `only` limits the
/// report to those checks.
pub fn evaluate(
    mut fleet: crate::live::Fleet,
    candidates: Vec<Value>,
    only: &[String],
    now: Timestamp,
) -> Result<CheckReport> {
    // Evaluated at a whole millisecond, so the simulator's times (milliseconds) add up exactly.
    let now = Timestamp::from_millisecond(now.as_millisecond()).unwrap_or(now);
    if !candidates.is_empty() {
        put_candidates(&mut fleet, candidates);
    }
    let labels: Vec<String> = fleet.checks.iter().map(label_of).collect();
    for wanted in only {
        if !labels.iter().any(|l| names(wanted, l)) {
            anyhow::bail!("no health check named {wanted:?} (there are: {})", labels.join(", "));
        }
    }
    let problems = set_aside_unreachable(&mut fleet);
    let scenario = Scenario {
        name: "vigil check".into(),
        start: now,
        duration: HORIZON,
        objects: fleet.checks,
        workload_clusters: BTreeMap::new(),
        lease_namespace: match fleet.lease_namespace.as_str() {
            "" => vigil_api::well_known::DEFAULT_LEASE_NAMESPACE.to_string(),
            ns => ns.to_string(),
        },
        timeline: Vec::new(),
        models: Models::default(),
    };
    // One run: what it shows once this instant settled is "now", what follows is "next".
    let (mut checks, ahead) = simulate_packed(scenario, fleet.objects, fleet.workload_clusters, |at_now| {
        at_now.statuses.iter().map(|(label, status)| check_out(label, status, &at_now, now)).collect::<Vec<_>>()
    })?;
    for check in &mut checks {
        check.next = next_out(&check.check, &ahead.events, now);
    }
    ahead.discard();
    checks.extend(problems.into_iter().map(|(label, problem)| unevaluated(label, problem)));
    checks.retain(|c| only.is_empty() || only.iter().any(|w| names(w, &c.check)));
    checks.sort_by(|a, b| a.check.cmp(&b.check));
    Ok(CheckReport { now: now.to_string(), checks })
}

/// Puts `candidates` in place of the live checks: a live check selecting the same targets would
/// otherwise contend with them over the same Machines. A candidate named like a live check
/// takes its status, as applying it would.
fn put_candidates(fleet: &mut crate::live::Fleet, candidates: Vec<Value>) {
    let live: BTreeMap<String, Value> = std::mem::take(&mut fleet.checks)
        .into_iter()
        .filter_map(|mut o| Some((label_of(&o), o.get_mut("status")?.take())))
        .collect();
    for mut candidate in candidates {
        if let Some(status) = live.get(&label_of(&candidate)) {
            candidate["status"] = status.clone();
        }
        fleet.checks.push(candidate);
    }
}

/// Takes out of `fleet` every MachineHealthCheck whose workload cluster cannot be read (it gets
/// no decision, as in the controller); returns why, by check label.
fn set_aside_unreachable(fleet: &mut crate::live::Fleet) -> BTreeMap<String, String> {
    let mut problems: BTreeMap<String, String> = BTreeMap::new();
    fleet.checks.retain(|o| {
        if o["kind"] != "MachineHealthCheck" {
            return true;
        }
        let key = format!(
            "{}/{}",
            o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
            o.pointer("/spec/clusterName").and_then(Value::as_str).unwrap_or("")
        );
        match fleet.unreachable.get(&key) {
            Some(why) => {
                problems
                    .insert(label_of(o), format!("workload cluster {key} unreachable, Vigil decides nothing: {why}"));
                false
            }
            None => true,
        }
    });
    problems
}

/// The answer for a check Vigil decides nothing for, and why.
fn unevaluated(label: String, problem: String) -> CheckOut {
    CheckOut {
        check: label,
        targets: 0,
        healthy: 0,
        unhealthy: 0,
        remediations_allowed: None,
        phase: None,
        remediation_allowed: None,
        unhealthy_targets: Vec::new(),
        remediation_queued: None,
        remediation_postponed: None,
        queued_count: 0,
        queued: Vec::new(),
        disruptions: Vec::new(),
        flapping: Vec::new(),
        now: Vec::new(),
        next: None,
        problem: Some(problem),
        remediating: false,
    }
}

fn event_out(e: &Event) -> EventOut {
    let detail = |k: &str| e.details.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let message = match e.event.as_str() {
        "RemediationCreated" | "RemediationRemoved" => {
            format!("{} {}/{}", detail("kind"), detail("namespace"), detail("name"))
        }
        _ => detail("message"),
    };
    EventOut { event: e.event.clone(), target: e.target.clone(), reason: detail("reason"), message }
}

fn condition_out(status: &Value, type_: &str) -> Option<ConditionOut> {
    let c = status.get("conditions")?.as_array()?.iter().find(|c| c["type"] == type_)?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Some(ConditionOut { status: s("status"), reason: s("reason"), message: s("message") })
}

/// Target `name`'s entry of `status.chosenRemediations`, for a person: `rule R chose M`.
fn chosen_of(status: &Value, name: &str) -> Option<String> {
    let entry = status.get("chosenRemediations")?.as_array()?.iter().find(|e| e["name"] == name)?;
    let s = |k: &str| entry[k].as_str().unwrap_or("");
    Some(format!("rule {} chose {} (since {})", s("rule"), s("remediation"), s("since")))
}

/// The first change after this instant in `events` (a run looking ahead) for the check `label`.
fn next_out(label: &str, events: &[Event], now: Timestamp) -> Option<NextOut> {
    let mine = |e: &&Event| e.check.as_deref() == Some(label);
    events.iter().filter(mine).find(|e| e.t > 0.0).map(|first| {
        let at = now.checked_add(SignedDuration::from_secs_f64(first.t)).unwrap_or(now);
        NextOut {
            at: at.to_string(),
            in_: vigil_api::duration::format_go_duration(SignedDuration::from_secs(first.t.round() as i64)),
            events: events.iter().filter(mine).filter(|e| e.t == first.t).map(event_out).collect(),
        }
    })
}

/// Whether `e` says a check's spec cannot be read or is invalid: `NoDecision` with reason
/// `InvalidSpec`, as `vigil run` tells it (the check's problem, not something that happened).
fn invalid_spec(e: &Event) -> bool {
    e.event == "NoDecision" && e.details.get("reason").and_then(Value::as_str) == Some("InvalidSpec")
}

/// The answer for one check as it stands at this instant (`next` is filled in from the run ahead).
fn check_out(label: &str, status: &Value, at_now: &Start<'_>, now: Timestamp) -> CheckOut {
    let mine = |e: &&Event| e.check.as_deref() == Some(label);
    let now_events: Vec<&Event> = at_now.events.iter().filter(mine).collect();
    let problem = now_events.iter().find(|e| invalid_spec(e)).map(|e| event_out(e).message);
    let requested_now =
        now_events.iter().any(|e| matches!(e.event.as_str(), "RemediationRequested" | "RemediationCreated"));
    let mut out = CheckOut {
        check: label.to_string(),
        targets: 0,
        healthy: 0,
        unhealthy: 0,
        remediations_allowed: None,
        phase: None,
        remediation_allowed: condition_out(status, "RemediationAllowed"),
        unhealthy_targets: Vec::new(),
        remediation_queued: condition_out(status, vigil_engine::pacing::CONDITION),
        remediation_postponed: condition_out(status, vigil_api::well_known::REMEDIATION_POSTPONED),
        queued_count: int(status, "queuedCount"),
        queued: Vec::new(),
        disruptions: disruptions_out(status),
        flapping: Vec::new(),
        now: now_events.iter().filter(|e| !invalid_spec(e)).map(|e| event_out(e)).collect(),
        next: None,
        problem,
        remediating: requested_now,
    };
    if let Some(rest) = label.strip_prefix("MachineHealthCheck/") {
        let (namespace, name) = rest.split_once('/').unwrap_or(("", rest));
        let policy = mhc_policy(at_now, namespace, name);
        out.flapping = flapping_out(status, policy.as_ref().and_then(|p| p.flapping), now);
        let expressions = policy.as_ref().map_or(&[][..], |p| p.expressions.as_slice());
        machine_check_out(&mut out, namespace, status, at_now, (expressions, now));
    } else {
        node_check_out(&mut out, status, at_now, now);
    }
    out
}

/// `status.disruptions`.
fn disruptions_out(status: &Value) -> Vec<DisruptionOut> {
    let list = status.get("disruptions").and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .map(|d| DisruptionOut { signal: d["signal"].as_str().unwrap_or("").to_string(), targets: int(d, "targets") })
        .collect()
}

/// The integer `status.<k>` (0 when absent).
fn int(status: &Value, k: &str) -> i64 {
    status.get(k).and_then(Value::as_i64).unwrap_or(0)
}

/// The validated policy of MachineHealthCheck `namespace/name`, when it is valid.
fn mhc_policy(at_now: &Start<'_>, namespace: &str, name: &str) -> Option<vigil_api::validate::MhcPolicy> {
    let key = Key {
        cluster: LOCAL_CLUSTER.into(),
        group: GROUP.into(),
        kind: "MachineHealthCheck".into(),
        namespace: namespace.into(),
        name: name.into(),
    };
    let check: vigil_api::MachineHealthCheck = serde_json::from_value(at_now.store.read(&key)?.into_owned()).ok()?;
    validate::machine_health_check(&check).ok()
}

/// Fills in a MachineHealthCheck's counts, queue and unhealthy Machines (in `namespace`); one
/// unhealthy by an expression (of `expressions`) shows since when it has held at `now`.
fn machine_check_out(
    out: &mut CheckOut,
    namespace: &str,
    status: &Value,
    at_now: &Start<'_>,
    (expressions, now): (&[vigil_api::validate::ExpressionRule], Timestamp),
) {
    out.queued = queued_out(status, |name| format!("{namespace}/{name}"));
    out.targets = int(status, "expectedMachines");
    out.healthy = int(status, "currentHealthy");
    out.unhealthy = out.targets - out.healthy;
    out.remediations_allowed = Some(int(status, "remediationsAllowed"));
    for name in status.get("targets").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        let Some(mut target) = unhealthy_machine_out(&out.check, namespace, name, status, at_now) else { continue };
        if target.reason == vigil_api::reason::Reason::ExpressionMatched.as_str()
            && let Some((_, since)) = expression_of(status, name, expressions, now)
        {
            target.since = Some(since);
        }
        out.remediating |= target.remediation.as_deref().is_some_and(|r| r.contains("WaitingForRemediation"));
        out.unhealthy_targets.push(target);
    }
}

/// Machine `namespace/name` of the check `label`, if its verdict (`HealthCheckSucceeded=False`)
/// says it is unhealthy: why, since when, and its remediation conditions.
fn unhealthy_machine_out(
    label: &str,
    namespace: &str,
    name: &str,
    status: &Value,
    at_now: &Start<'_>,
) -> Option<TargetOut> {
    let key = Key {
        cluster: LOCAL_CLUSTER.into(),
        group: "cluster.x-k8s.io".into(),
        kind: "Machine".into(),
        namespace: namespace.into(),
        name: name.into(),
    };
    let machine = at_now.store.read(&key).and_then(|m| MachineView::read(&m))?;
    let verdict = find(&machine.conditions, "HealthCheckSucceeded").filter(|c| c.status == ConditionStatus::False)?;
    let remediation = [OWNER_REMEDIATED, EXTERNALLY_REMEDIATED].iter().find_map(|t| {
        find(&machine.conditions, t)
            .filter(|c| c.status == ConditionStatus::False)
            .map(|c| format!("{t}=False {}: {}", c.reason.as_deref().unwrap_or(""), c.message.as_deref().unwrap_or("")))
    });
    let reason = verdict.reason.as_deref().unwrap_or("").to_string();
    let since = if reason == vigil_api::reason::Reason::UnhealthyNode {
        node_condition_since(at_now, label, &machine)
    } else {
        None
    };
    Some(TargetOut {
        target: format!("{namespace}/{name}"),
        reason,
        message: verdict.message.clone().unwrap_or_default(),
        since: since.or(verdict.last_transition_time).map(|t| t.to_string()),
        remediation,
        chosen: chosen_of(status, name),
        waiting: None,
    })
}

/// Fills in a NodeHealthCheck's counts, phase, queue and unhealthy Nodes.
fn node_check_out(out: &mut CheckOut, status: &Value, at_now: &Start<'_>, now: Timestamp) {
    out.queued = queued_out(status, str::to_string);
    out.targets = int(status, "observedNodes");
    out.healthy = int(status, "healthyNodes");
    out.unhealthy = out.targets - out.healthy;
    out.phase = status.get("phase").and_then(Value::as_str).map(str::to_string);
    let name = out.check.strip_prefix("NodeHealthCheck/").unwrap_or(&out.check);
    let check_key = Key {
        cluster: LOCAL_CLUSTER.into(),
        group: GROUP.into(),
        kind: "NodeHealthCheck".into(),
        namespace: String::new(),
        name: name.into(),
    };
    let policy = at_now
        .store
        .get(&check_key)
        .and_then(|v| serde_json::from_value::<NodeHealthCheck>(v.clone()).ok())
        .and_then(|c| validate::node_health_check(&c).ok());
    out.flapping = flapping_out(status, policy.as_ref().and_then(|p| p.flapping), now);
    for entry in status.get("unhealthyNodes").and_then(Value::as_array).into_iter().flatten() {
        out.remediating |= entry
            .get("remediations")
            .and_then(Value::as_array)
            .is_some_and(|rs| rs.iter().any(|r| r.get("timedOut").is_none()));
        out.unhealthy_targets.push(unhealthy_node_out(entry, status, at_now, policy.as_ref(), now));
    }
}

/// One entry of a NodeHealthCheck's `status.unhealthyNodes`: why the Node is unhealthy (by the
/// check's `policy`), since when, its remediation objects and what they wait for.
fn unhealthy_node_out(
    entry: &Value,
    status: &Value,
    at_now: &Start<'_>,
    policy: Option<&NhcPolicy>,
    now: Timestamp,
) -> TargetOut {
    let node_name = entry.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    let node_key = Key {
        cluster: LOCAL_CLUSTER.into(),
        group: String::new(),
        kind: "Node".into(),
        namespace: String::new(),
        name: node_name.clone(),
    };
    let node = at_now.store.read(&node_key).and_then(|n| vigil_api::views::NodeView::read(&n));
    let because = match (&node, policy) {
        (Some(node), Some(policy)) => {
            vigil_engine::node::unhealthy_because(node, policy, now).map(|(rule, since)| (rule.clone(), since))
        }
        _ => None,
    };
    let flaps = flaps_of(status, &node_name, policy, now).filter(|_| because.is_none());
    let expressions = policy.map_or(&[][..], |p| p.expressions.as_slice());
    let matched = expression_of(status, &node_name, expressions, now).filter(|_| because.is_none());
    let (reason, message, since) = match (&node, because) {
        (None, _) => ("NodeDeleted".to_string(), format!("Node {node_name} no longer exists"), None),
        (Some(_), None) if let Some((message, since)) = matched => {
            (vigil_api::reason::Reason::ExpressionMatched.as_str().to_string(), message, Some(since))
        }
        (Some(_), None) if let Some((count, window)) = flaps => (
            vigil_api::reason::Reason::Flapping.as_str().to_string(),
            format!("{count} episodes within {window}: a rule matched and cleared again each time"),
            None,
        ),
        (Some(_), Some((rule, since))) => (
            "UnhealthyNode".to_string(),
            format!("{} for more than {}", rule.describe(), vigil_api::duration::format_go_duration(rule.timeout)),
            Some(since.to_string()),
        ),
        (Some(_), None) => (
            "Recovering".to_string(),
            "conditions healthy again; remediation objects kept until healthyDelay passes".to_string(),
            None,
        ),
    };
    let remediations = remediations_out(entry);
    TargetOut {
        chosen: chosen_of(status, &node_name),
        target: node_name,
        reason,
        message,
        since,
        remediation: (!remediations.is_empty()).then(|| remediations.join(", ")),
        waiting: entry
            .get("waiting")
            .map(|w| format!("{}: {}", w["reason"].as_str().unwrap_or(""), w["message"].as_str().unwrap_or(""))),
    }
}

/// `status.flapping`: each target's episodes within the window at `now`, those with none left
/// out.
fn flapping_out(
    status: &Value,
    policy: Option<vigil_api::validate::FlappingPolicy>,
    now: Timestamp,
) -> Vec<FlappingOut> {
    let (Some(f), Some(list)) = (policy, status.get("flapping")) else {
        return Vec::new();
    };
    let record: Vec<vigil_api::shared::FlappingTarget> = serde_json::from_value(list.clone()).unwrap_or_default();
    record
        .iter()
        .map(|t| FlappingOut { target: t.name.clone(), episodes: vigil_engine::flapping::within(t, f.window, now) })
        .filter(|o| o.episodes > 0)
        .collect()
}

/// A flapping Node's episodes within the window and the window (`status.flapping`, counted as
/// the engine counts them), when it has at least `flapping.episodes` of them.
fn flaps_of(status: &Value, name: &str, policy: Option<&NhcPolicy>, now: Timestamp) -> Option<(usize, String)> {
    let f = policy?.flapping?;
    let record: Vec<vigil_api::shared::FlappingTarget> =
        serde_json::from_value(status.get("flapping")?.clone()).ok()?;
    let count = vigil_engine::flapping::flapping(&record, name, f, now)?;
    Some((count, vigil_api::duration::format_go_duration(f.window)))
}

/// The expression a target has matched for its duration at `now` (`status.expressionMatches`,
/// read as the engine reads it): which one, for how long, and since when.
fn expression_of(
    status: &Value,
    name: &str,
    expressions: &[vigil_api::validate::ExpressionRule],
    now: Timestamp,
) -> Option<(String, String)> {
    let record: Vec<vigil_api::shared::ExpressionMatch> =
        serde_json::from_value(status.get("expressionMatches")?.clone()).ok()?;
    expressions.iter().enumerate().find_map(|(i, rule)| {
        let since = vigil_engine::expressions::held_since(&record, name, i)?;
        let due = since.checked_add(rule.duration).ok()?;
        (due <= now).then(|| {
            let message = format!(
                "expression {}.expression ({}) held for {} or more",
                rule.path,
                rule.expression.source(),
                vigil_api::duration::format_go_duration(rule.duration)
            );
            (message, since.to_string())
        })
    })
}

/// An unhealthy Node's remediation objects, for a person: `Kind namespace/name since T`.
fn remediations_out(entry: &Value) -> Vec<String> {
    entry
        .get("remediations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let res = &r["resource"];
            let timed_out = if r.get("timedOut").is_some() { " (timed out)" } else { "" };
            format!(
                "{} {}/{} since {}{timed_out}",
                res["kind"].as_str().unwrap_or(""),
                res["namespace"].as_str().unwrap_or(""),
                res["name"].as_str().unwrap_or(""),
                r["started"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// `status.queued`, each target named by `name` as the report names targets.
fn queued_out(status: &Value, name: impl Fn(&str) -> String) -> Vec<QueuedOut> {
    status
        .get("queued")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|q| QueuedOut {
            position: q.get("position").and_then(Value::as_i64).unwrap_or(0),
            target: name(q.get("name").and_then(Value::as_str).unwrap_or("")),
            unhealthy_since: q.get("unhealthySince").and_then(Value::as_str).unwrap_or("").to_string(),
        })
        .collect()
}

/// When the Node condition behind an `UnhealthyNode` verdict started: the earliest transition
/// of a Node condition that one of the check's rules names with that status.
fn node_condition_since(at_now: &Start<'_>, label: &str, machine: &MachineView) -> Option<Timestamp> {
    let rest = label.strip_prefix("MachineHealthCheck/")?;
    let (namespace, name) = rest.split_once('/')?;
    let policy = mhc_policy(at_now, namespace, name)?;
    let node_name = machine.node_name.as_deref()?;
    let workload = format!("{namespace}/{}", policy.cluster_name);
    let node_key = |cluster: &str| Key {
        cluster: cluster.into(),
        group: String::new(),
        kind: "Node".into(),
        namespace: String::new(),
        name: node_name.into(),
    };
    let node = at_now.store.read(&node_key(&workload)).or_else(|| at_now.store.read(&node_key(LOCAL_CLUSTER)))?;
    node.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .filter(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("");
            policy.node_conditions.iter().any(|r| r.matches(s("type"), s("status"), c["reason"].as_str()))
        })
        .filter_map(|c| c["lastTransitionTime"].as_str()?.parse::<Timestamp>().ok())
        .min()
}

fn hms(rfc3339: &str) -> String {
    rfc3339.parse::<Timestamp>().map(|t| t.strftime("%H:%M:%S").to_string()).unwrap_or_else(|_| rfc3339.to_string())
}

/// The readable form: one block per check.
pub fn text(report: &CheckReport) -> String {
    let mut out = format!("vigil check at {}\n", report.now);
    if report.checks.is_empty() {
        out.push_str("\nno health checks found\n");
    }
    for c in &report.checks {
        out.push_str(&format!("\n{}\n", c.check));
        if let Some(problem) = &c.problem {
            out.push_str(&format!("  PROBLEM: {problem}\n"));
            continue;
        }
        let mut line = format!("  targets {}: {} healthy, {} unhealthy", c.targets, c.healthy, c.unhealthy);
        if let Some(n) = c.remediations_allowed {
            line.push_str(&format!("; budget: {n} more remediation{}", if n == 1 { "" } else { "s" }));
        }
        if let Some(phase) = &c.phase {
            line.push_str(&format!("; phase {phase}"));
        }
        out.push_str(&line);
        out.push('\n');
        if let Some(ra) = &c.remediation_allowed {
            let detail = if ra.message.is_empty() { String::new() } else { format!(": {}", ra.message) };
            out.push_str(&format!("  RemediationAllowed={} {}{detail}\n", ra.status, ra.reason));
        }
        if !c.disruptions.is_empty() {
            let total: i64 = c.disruptions.iter().map(|d| d.targets).sum();
            let each: Vec<String> = c.disruptions.iter().map(|d| format!("{} {}", d.signal, d.targets)).collect();
            out.push_str(&format!(
                "  taken down on purpose: {total} ({}), counted in the budget (voluntaryDisruptions: Count)\n",
                each.join(", ")
            ));
        }
        if !c.flapping.is_empty() {
            let each: Vec<String> = c.flapping.iter().map(|f| format!("{} {}", f.target, f.episodes)).collect();
            out.push_str(&format!("  flapping: episodes within the window: {}\n", each.join(", ")));
        }
        if let Some(p) = c.remediation_postponed.as_ref().filter(|p| p.status == "True") {
            let what = match p.reason.as_str() {
                "ClusterUpgrading" => "cluster upgrading",
                "UpgradeStateUnknown" => "upgrade state unknown",
                other => other,
            };
            out.push_str(&format!("  postponed: {what}: {}\n", p.message));
        }
        for t in &c.unhealthy_targets {
            let since = t.since.as_deref().map(|s| format!(" since {}", hms(s))).unwrap_or_default();
            out.push_str(&format!("  unhealthy {}{since}: {}: {}\n", t.target, t.reason, t.message));
            if let Some(c) = &t.chosen {
                out.push_str(&format!("    {c}\n"));
            }
            if let Some(w) = &t.waiting {
                out.push_str(&format!("    waiting: {w}\n"));
            }
            if let Some(r) = &t.remediation {
                out.push_str(&format!("    remediation: {r}\n"));
            } else if let Some(q) = c.queued.iter().find(|q| q.target == t.target) {
                out.push_str(&format!("    remediation: queued, number {} for a remediation slot\n", q.position));
            }
        }
        queue_text(&mut out, c);
        if c.now.is_empty() {
            out.push_str("  now: nothing to do (the cluster already shows Vigil's decision)\n");
        } else {
            out.push_str("  now:\n");
            for e in &c.now {
                out.push_str(&format!("    {}\n", describe(e, None)));
            }
        }
        match &c.next {
            None => out.push_str("  next: no change within 24h unless an object changes\n"),
            Some(next) => {
                out.push_str(&format!("  next: at {} (in {}), unless something changes:\n", hms(&next.at), next.in_));
                for e in &next.events {
                    out.push_str(&format!("    {}\n", describe(e, Some(&hms(&next.at)))));
                }
            }
        }
    }
    out
}

/// The pacing queue (`spec.maxInFlight`): how many wait, in flight against the limit (the
/// condition says it), and the first of them in order.
fn queue_text(out: &mut String, c: &CheckOut) {
    let Some(rq) = c.remediation_queued.as_ref().filter(|rq| rq.status == "True") else { return };
    let detail = rq.message.split("; next: ").next().unwrap_or(&rq.message);
    out.push_str(&format!("  queued: {detail}\n"));
    for q in c.queued.iter().take(10) {
        out.push_str(&format!("    {}. {} unhealthy since {}\n", q.position, q.target, hms(&q.unhealthy_since)));
    }
    if c.queued_count > 10 {
        out.push_str(&format!("    … and {} more\n", c.queued_count - 10));
    }
}

fn describe(e: &EventOut, at: Option<&str>) -> String {
    let target = e.target.as_deref().unwrap_or("");
    match (e.event.as_str(), at) {
        ("RemediationRequested" | "RemediationCreated", Some(at)) => {
            format!("{target} will be remediated at {at} unless it recovers ({}: {})", e.event, e.message)
        }
        ("MachineMarkedUnhealthy" | "DetectedUnhealthy", Some(at)) => {
            format!("{target} will be marked unhealthy at {at} unless it recovers: {}", e.message)
        }
        // Looking ahead nothing changes, heartbeats included: say what a heartbeat prevents.
        ("StaleCondition", Some(at)) => {
            format!("{target}: a condition will be set aside as stale at {at} unless its reporter heartbeats before")
        }
        _ => {
            let target = if target.is_empty() { String::new() } else { format!("{target} ") };
            let reason = if e.reason.is_empty() { String::new() } else { format!("{}: ", e.reason) };
            format!("{} {target}{reason}{}", e.event, e.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vigil check` says which rule started each incident and which remediation it chose, for
    /// an unhealthy Node decided now (the same engine run as `vigil run`).
    #[test]
    fn check_names_the_rule_and_the_remediation_it_chose() {
        let now: Timestamp = "2030-01-01T01:00:00Z".parse().expect("time");
        let node = |name: &str, disk: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": "worker"}},
                "status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": "2029-12-01T00:00:00Z"},
                    {"type": "DiskProblem", "status": disk, "reason": "DiskFailing", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}})
        };
        let template = |kind: &str, name: &str| {
            json!({"apiVersion": "remediation.example.io/v1", "kind": kind, "metadata": {"name": name, "namespace": "ops"},
                "spec": {"template": {"spec": {}}}})
        };
        let reference = |kind: &str, name: &str| json!({"apiVersion": "remediation.example.io/v1", "kind": kind, "name": name, "namespace": "ops"});
        let check = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                "remediationTemplate": reference("RebootTemplate", "reboot"),
                "unhealthyConditions": [
                    {"type": "Ready", "status": "Unknown", "duration": "5m"},
                    {"type": "DiskProblem", "status": "True", "duration": "5m", "reasons": ["DiskFailing"],
                     "remediationTemplate": reference("ReplaceTemplate", "replace")}]}});
        let fleet = crate::live::Fleet {
            checks: vec![check],
            objects: crate::live::packed(vec![
                template("RebootTemplate", "reboot"),
                template("ReplaceTemplate", "replace"),
                node("w-1", "True"),
                node("w-2", "False"),
                node("w-3", "False"),
            ]),
            workload_clusters: BTreeMap::new(),
            unreachable: BTreeMap::new(),
            notes: Vec::new(),
            lease_namespace: String::new(),
        };
        let report = evaluate(fleet, Vec::new(), &[], now).expect("evaluates");
        let target = &report.checks[0].unhealthy_targets[0];
        assert_eq!(target.target, "w-1");
        assert_eq!(target.message, "DiskProblem=True with reason DiskFailing for more than 5m0s");
        assert_eq!(
            target.chosen.as_deref(),
            Some(
                "rule spec.unhealthyConditions[1] DiskProblem=True chose spec.unhealthyConditions[1].remediationTemplate (ReplaceTemplate ops/replace) (since 2030-01-01T01:00:00Z)"
            )
        );
        let out = text(&report);
        assert!(
            out.contains("    rule spec.unhealthyConditions[1] DiskProblem=True chose spec.unhealthyConditions[1]"),
            "{out}"
        );
        assert!(
            out.contains("remediation: Replace ops/w-1 since"),
            "the rule's own remediation is what is created: {out}"
        );
    }

    /// `vigil check` shows how many episodes within the window each flapping Node has, from the
    /// check's `status.flapping`, before it is remediated for them.
    #[test]
    fn check_shows_a_flapping_nodes_episodes() -> Result<()> {
        let now: Timestamp = "2030-01-01T00:30:00Z".parse()?;
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w-1", "labels": {"role": "worker"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": "2030-01-01T00:14:00Z"}]}});
        let template = json!({"apiVersion": "remediation.example.io/v1", "kind": "RebootTemplate", "metadata": {"name": "reboot", "namespace": "ops"},
            "spec": {"template": {"spec": {}}}});
        let episodes = json!([
            {"start": "2029-12-31T23:00:00Z", "end": "2029-12-31T23:03:00Z"},
            {"start": "2030-01-01T00:01:00Z", "end": "2030-01-01T00:04:00Z"},
            {"start": "2030-01-01T00:11:00Z", "end": "2030-01-01T00:14:00Z"}]);
        let check = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                "remediationTemplate": {"apiVersion": "remediation.example.io/v1", "kind": "RebootTemplate", "name": "reboot", "namespace": "ops"},
                "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5m"}],
                "flapping": {"episodes": 3, "window": "1h"}},
            "status": {"flapping": [{"name": "w-1", "episodes": episodes}]}});
        let mut fleet = crate::live::Fleet::of(vec![template, node]);
        fleet.checks = vec![check];
        let report = evaluate(fleet, Vec::new(), &[], now)?;
        let c = &report.checks[0];
        let flapping: Vec<(&str, usize)> = c.flapping.iter().map(|f| (f.target.as_str(), f.episodes)).collect();
        assert_eq!(flapping, [("w-1", 2)], "the episode of 23:00 is out of the window");
        let out = text(&report);
        assert!(out.contains("  flapping: episodes within the window: w-1 2\n"), "{out}");
        Ok(())
    }

    /// `vigil check` names the expression a Node is unhealthy by, and since when it has held,
    /// from the check's `status.expressionMatches`.
    #[test]
    fn check_names_the_expression_a_node_matched() -> Result<()> {
        let now: Timestamp = "2030-01-01T00:30:00Z".parse()?;
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w-1", "labels": {"role": "worker", "disk": "failing"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}});
        let template = json!({"apiVersion": "remediation.example.io/v1", "kind": "RebootTemplate", "metadata": {"name": "reboot", "namespace": "ops"},
            "spec": {"template": {"spec": {}}}});
        let check = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers", "generation": 1},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                "remediationTemplate": {"apiVersion": "remediation.example.io/v1", "kind": "RebootTemplate", "name": "reboot", "namespace": "ops"},
                "unhealthyExpressions": [{"expression": "'disk' in node.labels && node.labels['disk'] == 'failing'", "duration": "10m"}]},
            "status": {"unhealthyNodes": [{"name": "w-1"}], "observedGeneration": 1,
                "expressionMatches": [{"name": "w-1", "expression": 0, "since": "2030-01-01T00:05:00Z"}]}});
        let mut fleet = crate::live::Fleet::of(vec![template, node]);
        fleet.checks = vec![check];
        let report = evaluate(fleet, Vec::new(), &[], now)?;
        let out = text(&report);
        assert!(out.contains("ExpressionMatched"), "{out}");
        assert!(out.contains("expression spec.unhealthyExpressions[0].expression ("), "{out}");
        assert!(out.contains("held for 10m0s or more"), "{out}");
        Ok(())
    }

    /// `vigil check` says who else holds a Node (its medik8s Lease, naming the holder) and that
    /// nothing new starts while the cluster upgrades, naming the signal; it asks for nothing.
    #[test]
    fn check_names_the_lease_holder_and_the_upgrade_that_postpones() -> Result<()> {
        let now: Timestamp = "2030-01-01T01:00:00Z".parse()?;
        let node = |name: &str, ready: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": "worker"}},
                "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": "2030-01-01T00:00:00Z"}]}})
        };
        let mut objects = vec![
            json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
                "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                    "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": "ops"}}}),
            json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
                "metadata": {"name": "snr", "namespace": "ops"}, "spec": {"template": {"spec": {}}}}),
            node("w-1", "False"),
            node("w-2", "True"),
            node("w-3", "True"),
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "node-w-1", "namespace": "medik8s-leases"},
                "spec": {"holderIdentity": "node-maintenance", "leaseDurationSeconds": 3600,
                         "acquireTime": "2030-01-01T00:30:00.000000Z", "renewTime": "2030-01-01T00:30:00.000000Z"}}),
        ];
        let fleet = crate::live::Fleet::of(objects.clone());
        let report = evaluate(fleet, Vec::new(), &[], now)?;
        let c = &report.checks[0];
        assert!(!c.remediating, "nothing is remediated under another holder's Lease");
        let waiting = c.unhealthy_targets[0].waiting.as_deref().unwrap_or_default();
        assert!(
            waiting.starts_with("NodeLeaseHeld: ")
                && waiting.contains("held by node-maintenance until 2030-01-01T01:30:00Z"),
            "{waiting}"
        );
        assert!(text(&report).contains("    waiting: NodeLeaseHeld: "), "{}", text(&report));
        // The Lease is gone, but the cluster upgrades.
        objects.pop();
        objects.push(json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion", "metadata": {"name": "version"},
            "status": {"desired": {"version": "4.19.1"}, "conditions": [
                {"type": "Progressing", "status": "True", "lastTransitionTime": "2030-01-01T00:50:00Z", "message": "Working towards 4.19.1"}]}}));
        let report = evaluate(crate::live::Fleet::of(objects), Vec::new(), &[], now)?;
        let c = &report.checks[0];
        assert!(!c.remediating);
        let out = text(&report);
        assert!(
            out.contains("  postponed: cluster upgrading: Postponing potential remediations because of ongoing cluster upgrade: ClusterVersion version is Progressing=True to 4.19.1"),
            "{out}"
        );
        Ok(())
    }

    /// A fleet of four workers whose Nodes went `Ready=Unknown` at the given instants (`None`:
    /// healthy), checked by a MachineHealthCheck with `maxInFlight: 2`.
    fn paced_fleet(failed: &[(&str, Option<&str>)]) -> crate::live::Fleet {
        crate::live::Fleet::of(paced_objects(failed))
    }

    /// The objects of [`paced_fleet`].
    fn paced_objects(failed: &[(&str, Option<&str>)]) -> Vec<Value> {
        let mut objects = vec![
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "prod", "namespace": "default"}, "spec": {},
                   "status": {"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true}}}),
            json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck", "metadata": {"name": "workers", "namespace": "default"},
                   "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": "workers"}}, "maxInFlight": 2,
                            "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "300s"}]}}),
        ];
        for (name, since) in failed {
            objects.push(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": "default", "labels": {"pool": "workers", "cluster.x-k8s.io/cluster-name": "prod"}, "creationTimestamp": "2029-12-01T00:00:00Z"},
                "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"name": name}}}));
            let (status, at) = match since {
                Some(at) => ("Unknown", *at),
                None => ("True", "2029-12-01T00:00:00Z"),
            };
            objects.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": status, "lastTransitionTime": at, "lastHeartbeatTime": at}]}}));
        }
        objects
    }

    /// `vigil check` on a MachineHealthCheck with an expression and flapping: the Machine an
    /// expression made unhealthy shows the expression and since when it has held (its status'
    /// clock), and each Machine's episodes within the window are listed.
    #[test]
    fn check_shows_a_machines_expression_and_its_flaps() -> Result<()> {
        let bad = "'health' in node.labels && node.labels['health'] == 'bad'";
        let mut objects = paced_objects(&[("w-1", None), ("w-2", None)]);
        for o in objects.iter_mut() {
            if o["kind"] == "MachineHealthCheck" {
                o["spec"]["unhealthyExpressions"] = json!([{"expression": bad, "timeout": "10m"}]);
                o["spec"]["flapping"] = json!({"episodes": 3, "window": "1h"});
                // the clock belongs to the spec it was kept under
                o["metadata"]["generation"] = json!(1);
                o["status"] = json!({"observedGeneration": 1,
                    "expressionMatches": [{"name": "w-1", "expression": 0, "since": "2030-01-01T00:05:00Z"}],
                    "flapping": [{"name": "w-2", "episodes": [
                        {"start": "2030-01-01T00:10:00Z", "end": "2030-01-01T00:13:00Z"},
                        {"start": "2030-01-01T00:20:00Z", "end": "2030-01-01T00:23:00Z"}]}]});
            }
            if o["kind"] == "Node" && o["metadata"]["name"] == "w-1" {
                o["metadata"]["labels"] = json!({"health": "bad"});
            }
        }
        let report = evaluate(crate::live::Fleet::of(objects), Vec::new(), &[], "2030-01-01T00:30:00Z".parse()?)?;
        let c = &report.checks[0];
        let target = &c.unhealthy_targets[0];
        assert_eq!((target.target.as_str(), target.reason.as_str()), ("default/w-1", "ExpressionMatched"));
        assert!(target.message.contains("spec.unhealthyExpressions[0].expression"), "{}", target.message);
        assert_eq!(target.since.as_deref(), Some("2030-01-01T00:05:00Z"), "the expression's own clock");
        let flaps: Vec<(&str, usize)> = c.flapping.iter().map(|f| (f.target.as_str(), f.episodes)).collect();
        assert_eq!(flaps, [("w-2", 2)]);
        let out = text(&report);
        assert!(out.contains("  flapping: episodes within the window: w-2 2\n"), "{out}");
        Ok(())
    }

    /// `vigil check` shows the pacing queue: what starts now (the two longest-unhealthy), who
    /// waits and in which order, in the text and the JSON.
    #[test]
    fn check_shows_the_pacing_queue_in_order() -> Result<()> {
        let fleet = paced_fleet(&[
            ("w-1", Some("2030-01-01T00:03:00Z")),
            ("w-2", Some("2030-01-01T00:01:00Z")),
            ("w-3", Some("2030-01-01T00:02:00Z")),
            ("w-4", Some("2030-01-01T00:00:00Z")),
            ("w-5", None),
        ]);
        let report = evaluate(fleet, Vec::new(), &[], "2030-01-01T01:00:00Z".parse()?)?;
        let c = &report.checks[0];
        let requested: Vec<&str> =
            c.now.iter().filter(|e| e.event == "RemediationRequested").filter_map(|e| e.target.as_deref()).collect();
        assert_eq!(requested, ["default/w-4", "default/w-2"], "the two longest-unhealthy, oldest first");
        let queued: Vec<(i64, &str, &str)> =
            c.queued.iter().map(|q| (q.position, q.target.as_str(), q.unhealthy_since.as_str())).collect();
        assert_eq!(queued, [(1, "default/w-3", "2030-01-01T00:02:00Z"), (2, "default/w-1", "2030-01-01T00:03:00Z")]);
        assert_eq!(c.queued_count, 2);
        assert_eq!(c.remediation_queued.as_ref().map(|q| q.status.as_str()), Some("True"));
        let json = serde_json::to_value(&report)?;
        assert_eq!(json["checks"][0]["queued"][0]["unhealthySince"], "2030-01-01T00:02:00Z");
        assert_eq!(json["checks"][0]["queuedCount"], 2);
        let text = text(&report);
        eprintln!("$ vigil check\n{text}");
        for line in [
            "  queued: 2 target(s) wait for a remediation slot: 2 of 2 in flight (maxInFlight 2): default/w-2, default/w-4\n",
            "    1. default/w-3 unhealthy since 00:02:00\n",
            "    2. default/w-1 unhealthy since 00:03:00\n",
            "    remediation: queued, number 1 for a remediation slot\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        // Without a queue, no queue lines.
        let quiet = evaluate(paced_fleet(&[("w-1", None)]), Vec::new(), &[], "2030-01-01T01:00:00Z".parse()?)?;
        assert!(!super::text(&quiet).contains("queued"), "{}", super::text(&quiet));
        Ok(())
    }

    #[test]
    fn names_match_the_full_label_namespace_name_or_name() {
        assert!(names("MachineHealthCheck/default/workers", "MachineHealthCheck/default/workers"));
        assert!(names("default/workers", "MachineHealthCheck/default/workers"));
        assert!(names("workers", "MachineHealthCheck/default/workers"));
        assert!(names("workers", "NodeHealthCheck/workers"));
        assert!(!names("orkers", "NodeHealthCheck/workers"));
        assert!(!names("other/workers", "MachineHealthCheck/default/workers"));
    }
}
