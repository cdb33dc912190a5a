//! The simulation loop. It does what the controller does, on a virtual clock: a change wakes the
//! checks it concerns (the engine's `concerns` predicates), each woken check gathers its observed
//! state, calls the engine and applies the plan, and a plan's `next_wake` is honoured to the
//! nanosecond. Between changes the clock jumps to the next timeline step, wake-up or model timer.

use crate::output::{Event, seconds};
use crate::scenario::{Change, RemediatorOutcome, Scenario, ScenarioError, Step};
use crate::store::{Key, Store};
use crate::views::{
    CAPI_GROUP, CLUSTER_VERSION_GROUP, KeptCheck, LEASE_GROUP, MAINTENANCE_GROUP, OPENSHIFT_MACHINE_GROUP, ParsedCheck,
    Views, check_key, parse_valid,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize as _;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use vigil_api::conditions::ConditionStatus;
use vigil_api::manifest::{HealthCheck, health_check_from_value};
use vigil_api::reason::Reason;
use vigil_api::views::{
    ClusterVersionView, ClusterView, LeaseView, MachineView, MaintenanceView, Meta, NodeView, OpenShiftMachineView,
    RemediationView, TemplateView,
};
use vigil_api::well_known::{
    CLUSTER_NAME_LABEL, HEALTH_CHECK_SUCCEEDED, NODE_NAME_ANNOTATION, OWNER_REMEDIATED, PAUSED_ANNOTATION,
    REMEDIATE_MACHINE_ANNOTATION,
};
use vigil_api::{GROUP, NodeHealthCheck, validate};
use vigil_engine::assemble::{self, ClaimSource};
use vigil_engine::concerns::{self, group_of};
use vigil_engine::holders::{self, Holders};
use vigil_engine::lookup::Observed;
use vigil_engine::machine::{MhcInput, NodeSource};
use vigil_engine::machine_write::machine_status_patch;
use vigil_engine::node::NhcInput;
use vigil_engine::plan::ObjectRef;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};
use vigil_engine::{Action, Notice, NoticeKind, Plan};

/// How many decisions one check may take in one instant before the run is declared unsettled (a
/// plan that keeps changing what it looks at would otherwise loop forever).
const MAX_ROUNDS_PER_INSTANT: usize = 50;

/// An object's versions as the checks' concern predicates read them ([`Sim::read_versions`]).
struct ReadVersions {
    /// Whether there is a version at all (a change of nothing concerns no one).
    any: bool,
    /// As Machines (a Machine of the management cluster).
    machines: Vec<MachineView>,
    /// As Nodes (a Node of the management cluster).
    nodes: Vec<NodeView>,
    /// As objects (anything else of the management cluster), each with the management cluster's
    /// Node it names as a remediation object's target, if there is one.
    metas: Vec<(Meta, Option<NodeView>)>,
}

/// A NodeHealthCheck as read for what does not need it valid ([`Sim::nhc_as_read`]).
enum NhcRead {
    /// Valid, as kept parsed.
    Kept(Rc<(NodeHealthCheck, validate::NhcPolicy)>),
    /// Parsed but invalid (not kept).
    Parsed(Box<NodeHealthCheck>),
}

impl NhcRead {
    /// The check.
    fn check(&self) -> &NodeHealthCheck {
        match self {
            NhcRead::Kept(parsed) => &parsed.0,
            NhcRead::Parsed(check) => check,
        }
    }
}

/// Work the models do later.
/// The finalizer a remediator model puts on its objects (`holdsDeletion`).
const SIMULATED_FINALIZER: &str = "simulator.vigil.dev/remediator";

/// The kinds of objects around the Nodes that NodeHealthCheck decisions read.
#[derive(Debug, Clone, Copy)]
enum Around {
    Lease,
    Maintenance,
    Version,
    /// An OpenShift Machine.
    Machine,
}

#[derive(Debug, Clone)]
enum Task {
    ReplaceMachine(Key),
    JoinNode(Key),
    Remediator(Key, RemediatorOutcome),
    /// A remediator model lets go of an object it held after its deletion.
    ReleaseFinalizer(Key),
    /// Heartbeat model `i` renews its condition.
    Heartbeat(usize),
    /// Heartbeat model `i` dies.
    HeartbeatsStop(usize),
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub name: String,
    /// Everything that happened, in order.
    pub events: Vec<Event>,
    /// Each check's status at the end, keyed like `Event::check`.
    pub final_statuses: BTreeMap<String, Value>,
    /// Seconds from start to end.
    pub end_t: f64,
    /// Every object at the end.
    pub store: Store,
    /// Each check's status every time it changed: (seconds since start, check, status), for
    /// pictures of the run (`vigil simulate --plot`).
    pub history: Vec<(f64, String, Value)>,
}

struct Sim<'s> {
    scenario: &'s Scenario,
    store: Store,
    now: Timestamp,
    dirty: BTreeSet<CheckRef>,
    wakeups: BTreeMap<CheckRef, Timestamp>,
    tasks: BTreeMap<(Timestamp, u64), Task>,
    task_seq: u64,
    scheduled_replacements: BTreeSet<Key>,
    events: Vec<Event>,
    history: Vec<(f64, String, Value)>,
    invalid_reported: BTreeMap<CheckRef, String>,
    /// Targets held by more than one check, as last reported (each tie is told once).
    ties_reported: BTreeSet<String>,
    /// While the scenario's objects are loaded: every check is decided afterwards anyway, so
    /// working out which checks each object concerns is skipped (it made loading a 10 000-Node
    /// snapshot quadratic).
    loading: bool,
    /// What is read from the store again and again, kept while it is unchanged.
    views: Views,
    /// The timeline's next step to run.
    next_step: usize,
}

/// The run as it stands once its start instant settled: what a run of no duration ends with.
pub struct Start<'r> {
    /// Every object then.
    pub store: &'r Store,
    /// What happened at the start instant.
    pub events: &'r [Event],
    /// Each check's status then, keyed like `Event::check`.
    pub statuses: BTreeMap<String, Value>,
}

/// Runs a scenario to its end.
pub fn simulate(scenario: &Scenario) -> Result<Report, ScenarioError> {
    let workload = scenario.workload_clusters.iter().map(|(cluster, nodes)| (cluster.clone(), nodes.clone()));
    run_with(scenario, scenario.objects.iter().cloned(), workload.collect(), |_| ()).map(|(_, report)| report)
}

/// [`simulate`], taking the scenario's objects into the store instead of copying them (a caller
/// done with the scenario holds a 10 000-Node fleet once, not twice); `at_start` is shown the run
/// once its start instant settled, so `vigil check` learns "now" and "next" from one run.
pub fn simulate_owned<T>(
    mut scenario: Scenario,
    at_start: impl FnOnce(Start<'_>) -> T,
) -> Result<(T, Report), ScenarioError> {
    let objects = std::mem::take(&mut scenario.objects);
    // The clusters stay named (where a check's Nodes live is read from them); their Nodes move.
    let workload =
        scenario.workload_clusters.iter_mut().map(|(cluster, nodes)| (cluster.clone(), std::mem::take(nodes)));
    let workload: Vec<(String, Vec<Value>)> = workload.collect();
    run_with(&scenario, objects.into_iter(), workload, at_start)
}

/// Loads `objects` (management cluster) and each workload cluster's Nodes, then runs, showing
/// `at_start` the start instant.
fn run_with<T>(
    scenario: &Scenario,
    objects: impl Iterator<Item = Value>,
    workload: Vec<(String, Vec<Value>)>,
    at_start: impl FnOnce(Start<'_>) -> T,
) -> Result<(T, Report), ScenarioError> {
    let mut sim = Sim::new(scenario);
    for (i, object) in objects.enumerate() {
        sim.put(LOCAL_CLUSTER, object, &format!("objects[{i}]"))?;
    }
    for (cluster, nodes) in workload {
        for (i, node) in nodes.into_iter().enumerate() {
            sim.put(&cluster, node, &format!("workloadClusters[{cluster:?}][{i}]"))?;
        }
    }
    sim.loading = false;
    for (i, h) in scenario.models.heartbeats.iter().enumerate() {
        if h.until.is_none_or(|until| h.from < until) {
            sim.schedule(h.from, Task::Heartbeat(i));
        }
        if let Some(until) = h.until {
            sim.schedule(until, Task::HeartbeatsStop(i));
        }
    }
    sim.dirty = sim.checks().into_iter().collect();
    let end = scenario.start.checked_add(scenario.duration).unwrap_or(Timestamp::MAX);
    sim.run_until(scenario.start.min(end))?;
    let seen = at_start(Start { store: &sim.store, events: &sim.events, statuses: sim.statuses() });
    sim.run_until(end)?;
    let final_statuses = sim.statuses();
    let report = Report {
        name: scenario.name.clone(),
        events: sim.events,
        final_statuses,
        end_t: seconds(scenario.duration.as_nanos()),
        store: sim.store,
        history: sim.history,
    };
    Ok((seen, report))
}

fn text<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

impl<'s> Sim<'s> {
    /// A simulation at the scenario's start, with nothing loaded yet.
    fn new(scenario: &'s Scenario) -> Sim<'s> {
        Sim {
            scenario,
            store: Store::default(),
            now: scenario.start,
            dirty: BTreeSet::new(),
            wakeups: BTreeMap::new(),
            tasks: BTreeMap::new(),
            task_seq: 0,
            scheduled_replacements: BTreeSet::new(),
            events: Vec::new(),
            history: Vec::new(),
            invalid_reported: BTreeMap::new(),
            ties_reported: BTreeSet::new(),
            loading: true,
            views: Views::default(),
            next_step: 0,
        }
    }
}

impl Sim<'_> {
    /// Runs every instant up to `end`: the first call runs the start instant too, a later one
    /// goes on where the last stopped (as one call to the later `end` would).
    fn run_until(&mut self, end: Timestamp) -> Result<(), ScenarioError> {
        let scenario = self.scenario;
        loop {
            self.settle()?;
            let step_at = scenario.timeline.get(self.next_step).map(|s| self.at(s.at));
            let candidates = [step_at, self.wakeups.values().min().copied(), self.tasks.keys().next().map(|(t, _)| *t)];
            let Some(next) = candidates.into_iter().flatten().min() else { break };
            if next > end {
                break;
            }
            self.now = next;
            while let Some(step) = scenario.timeline.get(self.next_step).filter(|s| self.at(s.at) == next) {
                self.next_step += 1;
                self.step(step)?;
            }
            while let Some(entry) = self.tasks.first_entry() {
                if entry.key().0 != next {
                    break;
                }
                let task = entry.remove();
                self.run_task(task);
            }
            let due: Vec<CheckRef> = self.wakeups.iter().filter(|(_, t)| **t <= next).map(|(c, _)| c.clone()).collect();
            for id in due {
                self.wakeups.remove(&id);
                self.dirty.insert(id);
            }
        }
        Ok(())
    }

    fn at(&self, offset: SignedDuration) -> Timestamp {
        self.scenario.start.checked_add(offset).unwrap_or(Timestamp::MAX)
    }

    fn t(&self) -> f64 {
        seconds(self.now.duration_since(self.scenario.start).as_nanos())
    }

    fn emit(&mut self, event: &str, check: Option<String>, target: Option<String>, details: Map<String, Value>) {
        self.events.push(Event { t: self.t(), event: event.into(), check, target, details });
    }

    /// Each check's status now, keyed like `Event::check`.
    fn statuses(&self) -> BTreeMap<String, Value> {
        self.checks()
            .into_iter()
            .map(|id| {
                let status = self.store.get(&check_key(&id)).and_then(|o| o.get("status")).cloned();
                (id.to_string(), status.unwrap_or(json!({})))
            })
            .collect()
    }

    fn checks(&self) -> Vec<CheckRef> {
        crate::views::check_refs(&self.store).map(|(_, id)| id).collect()
    }

    /// Stores a manifest as the API server would: health checks of upstream apiVersions are
    /// converted, Nodes must be Nodes.
    fn put(&mut self, cluster: &str, object: Value, entry: &str) -> Result<Key, ScenarioError> {
        let err = |message: String| ScenarioError::Entry { entry: entry.to_string(), message };
        let kind = text(&object, "/kind").to_string();
        let object = if kind == "MachineHealthCheck" || kind == "NodeHealthCheck" {
            let check = health_check_from_value(&object).map_err(|e| err(e.to_string()))?;
            let typed = match check {
                HealthCheck::Machine(m) => serde_json::to_value(m),
                HealthCheck::Node(n) => serde_json::to_value(n),
            };
            let mut typed = typed.map_err(|e| err(e.to_string()))?;
            // A check's status is a subresource: applying a manifest without one changes the
            // spec and leaves the status the controller wrote (so lifting a pause is seen).
            if typed.get("status").is_none_or(Value::is_null)
                && let Some(status) = self.store.get(&Key::of(cluster, &typed)).and_then(|o| o.get("status")).cloned()
                && let Some(map) = typed.as_object_mut()
            {
                map.insert("status".into(), status);
            }
            typed
        } else {
            if kind == "Node" && text(&object, "/apiVersion") == "v1" {
                Node::deserialize(&object).map_err(|e| err(format!("not a valid Node: {e}")))?;
            }
            object
        };
        let before = self.store.get(&Key::of(cluster, &object)).cloned();
        let key = self.store.apply(cluster, object, self.now);
        self.changed(&key, before.as_ref());
        Ok(key)
    }

    fn step(&mut self, step: &Step) -> Result<(), ScenarioError> {
        let cluster = step.cluster.as_deref().unwrap_or(LOCAL_CLUSTER).to_string();
        let entry = format!("timeline[{}]", step.index);
        let err = |message: String| ScenarioError::Entry { entry: entry.clone(), message };
        match &step.change {
            Change::Apply(object) => {
                let key = self.put(&cluster, object.clone(), &format!("{entry}.apply"))?;
                self.emit("Applied", None, Some(key.object_name()), object_details(&key));
            }
            Change::Delete(id) => {
                let group = match (id.kind.as_str(), group_of(&id.api_version)) {
                    ("MachineHealthCheck" | "NodeHealthCheck", _) => GROUP,
                    (_, g) => g,
                };
                let key = Key {
                    cluster: cluster.clone(),
                    group: group.into(),
                    kind: id.kind.clone(),
                    namespace: id.namespace.clone().unwrap_or_default(),
                    name: id.name.clone(),
                };
                let before = self
                    .store
                    .delete(&key)
                    .ok_or_else(|| err(format!("{} {} does not exist at this time", id.kind, key.object_name())))?;
                self.emit("Deleted", None, Some(key.object_name()), object_details(&key));
                self.changed(&key, Some(&before));
            }
            Change::SetNodeCondition(c) => {
                let key = |name: &str| Key {
                    cluster: cluster.clone(),
                    group: String::new(),
                    kind: "Node".into(),
                    namespace: String::new(),
                    name: name.to_string(),
                };
                let names: Vec<String> = if c.node_selector.is_empty() {
                    if self.store.get(&key(&c.node)).is_none() {
                        return Err(err(format!("Node {} does not exist at this time", c.node)));
                    }
                    vec![c.node.clone()]
                } else {
                    let matching: Vec<String> = self
                        .store
                        .list(&cluster, "", "Node", None)
                        .filter(|(_, n)| {
                            c.node_selector.iter().all(|(k, v)| {
                                n.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str)
                                    == Some(v.as_str())
                            })
                        })
                        .map(|(k, _)| k.name.clone())
                        .collect();
                    if matching.is_empty() {
                        return Err(err(format!("no Node matches nodeSelector {:?} at this time", c.node_selector)));
                    }
                    matching
                };
                for name in names {
                    self.set_node_condition(
                        &key(&name),
                        &c.type_,
                        &c.status,
                        c.reason.as_deref(),
                        c.message.as_deref(),
                    );
                    let mut d = Map::new();
                    d.insert("type".into(), json!(c.type_));
                    d.insert("status".into(), json!(c.status));
                    d.insert("reason".into(), json!(c.reason.clone().unwrap_or_default()));
                    self.emit("NodeConditionSet", None, Some(name), d);
                }
            }
        }
        Ok(())
    }

    /// Sets a Node condition as a kubelet does: the transition time moves only with the status.
    fn set_node_condition(
        &mut self,
        key: &Key,
        type_: &str,
        status: &str,
        reason: Option<&str>,
        message: Option<&str>,
    ) {
        let Some(mut node) = self.store.get(key).cloned() else { return };
        let before = node.clone();
        let now = self.now.to_string();
        let conditions = node.pointer_mut("/status/conditions").and_then(Value::as_array_mut);
        let mut list = conditions.map(std::mem::take).unwrap_or_default();
        let fresh = json!({"type": type_, "status": status, "reason": reason.unwrap_or(""), "message": message.unwrap_or(""), "lastHeartbeatTime": now, "lastTransitionTime": now});
        match list.iter_mut().find(|c| c["type"] == type_) {
            Some(existing) => {
                let transition =
                    if existing["status"] == status { existing["lastTransitionTime"].clone() } else { json!(now) };
                *existing = fresh;
                existing["lastTransitionTime"] = transition;
            }
            None => list.push(fresh),
        }
        node["status"]["conditions"] = Value::Array(list);
        self.store.apply(&key.cluster, node, self.now);
        self.changed(key, Some(&before));
    }

    /// Marks the checks a change concerns (the same predicates the controller maps watch
    /// events with).
    fn changed(&mut self, key: &Key, before: Option<&Value>) {
        if self.loading {
            return;
        }
        // Who else works on Nodes, and the cluster's version (every NodeHealthCheck reads it).
        let around = match (key.group.as_str(), key.kind.as_str()) {
            _ if key.cluster != LOCAL_CLUSTER => None,
            (LEASE_GROUP, "Lease") => Some(Around::Lease),
            (MAINTENANCE_GROUP, "NodeMaintenance") => Some(Around::Maintenance),
            (CLUSTER_VERSION_GROUP, "ClusterVersion") => Some(Around::Version),
            (OPENSHIFT_MACHINE_GROUP, "Machine") => Some(Around::Machine),
            _ => None,
        };
        if let Some(kind) = around {
            // Each version read once, not once per check.
            let versions: Vec<&Value> = before.into_iter().chain(self.store.get(key)).collect();
            let (leases, maintenances): (Vec<LeaseView>, Vec<MaintenanceView>) = match kind {
                Around::Lease => (versions.iter().filter_map(|v| LeaseView::read(v)).collect(), Vec::new()),
                Around::Maintenance => (Vec::new(), versions.iter().filter_map(|v| MaintenanceView::read(v)).collect()),
                Around::Version | Around::Machine => (Vec::new(), Vec::new()),
            };
            let any = !versions.is_empty();
            for id in self.checks() {
                let CheckRef::Node { .. } = &id else { continue };
                let Some(check) = self.nhc_as_read(&id) else { continue };
                let check = check.check();
                let hit = match kind {
                    Around::Lease => leases.iter().any(|l| concerns::nhc_concerns_node_lease(check, l)),
                    Around::Maintenance => maintenances.iter().any(|m| concerns::nhc_concerns_maintenance(check, m)),
                    Around::Version | Around::Machine => any,
                };
                if hit {
                    self.dirty.insert(id);
                }
            }
            return;
        }
        if key.group == GROUP && key.cluster == LOCAL_CLUSTER {
            let id = if key.kind == "MachineHealthCheck" {
                // Another check of the namespace may now own (or no longer own) Machines' conditions.
                let same_namespace: Vec<CheckRef> = self
                    .checks()
                    .into_iter()
                    .filter(|c| matches!(c, CheckRef::Machine { namespace, .. } if *namespace == key.namespace))
                    .collect();
                self.dirty.extend(same_namespace);
                CheckRef::Machine { namespace: key.namespace.clone(), name: key.name.clone() }
            } else {
                CheckRef::Node { name: key.name.clone() }
            };
            self.dirty.insert(id);
            return;
        }
        if key.kind == "Node"
            && key.group.is_empty()
            && let (Some(b), Some(a)) = (before, self.store.get(key))
            && let (Some(b), Some(a)) = (NodeView::read(b), NodeView::read(a))
            && !concerns::node_change_matters(&b, &a)
            && !concerns::heartbeat_revives(&b, &a, &self.views.guarded_ages(&self.store), self.now)
        {
            return;
        }
        // The Machines of this Node, found once for every check: a Node change concerns the
        // checks its Machines concern, as in the controller.
        let node_machines: Vec<Rc<MachineView>> =
            if key.kind == "Node" && key.group.is_empty() { self.machines_of_node(&key.name) } else { Vec::new() };
        let checks = self.views.checks(&self.store);
        let versions: Vec<&Value> = before.into_iter().chain(self.store.get(key)).collect();
        let read = self.read_versions(key, &versions, &checks);
        self.mark_concerned(key, &read, &node_machines, &checks);
    }

    /// The management cluster's Cluster API Machines whose `status.nodeRef` names Node `node`.
    fn machines_of_node(&mut self, node: &str) -> Vec<Rc<MachineView>> {
        let mut out = Vec::new();
        for namespace in self.views.machine_namespaces(&self.store, node) {
            let machines = self.views.machines(&self.store, &namespace);
            out.extend(machines.iter().filter(|m| m.node_name.as_deref() == Some(node)).cloned());
        }
        out
    }

    /// [`Sim::changed`] for a Cluster API Machine of the management cluster, given its version
    /// before the change already read ([`Sim::read_versions`]).
    fn machine_changed(&mut self, key: &Key, mut read: ReadVersions) {
        if self.loading {
            return;
        }
        let checks = self.views.checks(&self.store);
        if let Some(after) = self.store.get(key) {
            let after = self.read_versions(key, &[after], &checks);
            read.any |= after.any;
            read.machines.extend(after.machines);
            read.nodes.extend(after.nodes);
            read.metas.extend(after.metas);
        }
        self.mark_concerned(key, &read, &[], &checks);
    }

    /// An object's versions (before and after a change) read once as the checks' predicates
    /// look at them: read once per check, they dominated a 10 000-Node outage's run.
    fn read_versions(&self, key: &Key, versions: &[&Value], checks: &[KeptCheck]) -> ReadVersions {
        let local = key.cluster == LOCAL_CLUSTER;
        let node = key.kind == "Node" && key.group.is_empty();
        let machine = local && key.group == CAPI_GROUP && key.kind == "Machine";
        // Of a Machine only NodeHealthChecks read the object's metadata (MachineHealthChecks
        // read it as a Machine), and a Machine is written for each decision's every target.
        let metas = !machine || checks.iter().any(|c| matches!(c.parsed, Some(ParsedCheck::Node(_))));
        ReadVersions {
            any: !versions.is_empty(),
            machines: versions.iter().filter(|_| machine).filter_map(|v| MachineView::read(v)).collect(),
            nodes: versions.iter().filter(|_| local && node).filter_map(|v| NodeView::read(v)).collect(),
            metas: versions
                .iter()
                .filter(|_| local && !node && metas)
                .filter_map(|v| Meta::read(v, &mut Vec::new()))
                .map(|m| {
                    let node = self.management_node(vigil_engine::target::remediation_node_name(&m));
                    (m, node)
                })
                .collect(),
        }
    }

    /// Marks the checks a change of the object under `key` concerns, given its versions `read`.
    fn mark_concerned(
        &mut self,
        key: &Key,
        read: &ReadVersions,
        node_machines: &[Rc<MachineView>],
        checks: &[KeptCheck],
    ) {
        let local = key.cluster == LOCAL_CLUSTER;
        for kept in checks {
            let hit = match (&kept.id, &kept.parsed) {
                (CheckRef::Machine { namespace, .. }, Some(ParsedCheck::Machine(parsed))) => {
                    let (check, policy) = (&parsed.0, &parsed.1);
                    check.status.as_ref().is_some_and(|s| holders::is_waiting(&s.conditions))
                        || match (key.group.as_str(), key.kind.as_str()) {
                            (CAPI_GROUP, "Machine") if local => {
                                read.machines.iter().any(|m| concerns::mhc_concerns_machine(check, policy, m))
                            }
                            (CAPI_GROUP, "Cluster") if local => {
                                read.metas.iter().any(|(m, _)| concerns::mhc_concerns_cluster(check, policy, m))
                            }
                            ("", "Node") => {
                                read.any
                                    && key.cluster == self.node_cluster(namespace, &policy.cluster_name)
                                    && node_machines.iter().any(|m| concerns::mhc_concerns_machine(check, policy, m))
                            }
                            _ if local => read
                                .metas
                                .iter()
                                .any(|(m, _)| concerns::mhc_concerns_remediation_object(check, policy, m)),
                            _ => false,
                        }
                }
                (CheckRef::Node { .. }, Some(ParsedCheck::Node(parsed))) => {
                    let (check, policy) = (&parsed.0, &parsed.1);
                    check.status.as_ref().is_some_and(|s| holders::is_waiting(&s.conditions))
                        || local
                            && match (key.group.as_str(), key.kind.as_str()) {
                                ("", "Node") => {
                                    read.nodes.iter().any(|n| concerns::nhc_concerns_node(check, policy, n))
                                }
                                _ => read.metas.iter().any(|(m, node)| {
                                    concerns::nhc_concerns_remediation_object(check, policy, m, node.as_ref())
                                }),
                            }
                }
                _ => continue,
            };
            if hit && !self.dirty.contains(&kept.id) {
                self.dirty.insert(kept.id.clone());
            }
        }
    }

    /// The NodeHealthCheck `id` as read without validating it (`None`: gone or it does not
    /// parse): the kept parsed check when valid, else parsed again (an invalid check is not kept).
    fn nhc_as_read(&mut self, id: &CheckRef) -> Option<NhcRead> {
        let key = check_key(id);
        match self.views.nhc(&self.store, &key) {
            Some(parsed) => Some(NhcRead::Kept(parsed)),
            None => serde_json::from_value(self.store.get(&key)?.clone()).ok().map(|c| NhcRead::Parsed(Box::new(c))),
        }
    }

    /// A Node of the management cluster by name, if the store has it.
    fn management_node(&self, name: &str) -> Option<NodeView> {
        let key = Key {
            cluster: LOCAL_CLUSTER.to_string(),
            group: String::new(),
            kind: "Node".to_string(),
            namespace: String::new(),
            name: name.to_string(),
        };
        self.store.get(&key).and_then(NodeView::read)
    }

    /// Where an MHC's Nodes live: its workload cluster if the scenario has one, else here.
    fn node_cluster(&self, namespace: &str, cluster_name: &str) -> String {
        let local = !self.scenario.workload_clusters.contains_key(&format!("{namespace}/{cluster_name}"));
        assemble::node_cluster(namespace, cluster_name, local)
    }

    fn settle(&mut self) -> Result<(), ScenarioError> {
        // Counted per check: a fleet may have many more checks than one check may take rounds.
        let mut rounds: BTreeMap<CheckRef, usize> = BTreeMap::new();
        while let Some(id) = self.dirty.pop_first() {
            let n = rounds.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n > MAX_ROUNDS_PER_INSTANT {
                self.dirty.insert(id);
                return Err(self.unsettled());
            }
            self.reconcile(&id);
        }
        Ok(())
    }

    fn unsettled(&self) -> ScenarioError {
        ScenarioError::Entry {
            entry: format!("at +{}s", self.t()),
            message: format!(
                "the checks did not settle: one was decided {MAX_ROUNDS_PER_INSTANT} times in one instant (still pending: {:?}); this is a bug in Vigil, please report it",
                self.dirty.iter().map(ToString::to_string).collect::<Vec<_>>()
            ),
        }
    }

    fn invalid(&mut self, id: &CheckRef, message: String) {
        if self.invalid_reported.get(id) != Some(&message) {
            self.invalid_reported.insert(id.clone(), message.clone());
            let mut d = Map::new();
            d.insert("reason".into(), json!(Reason::InvalidSpec.as_str()));
            d.insert("message".into(), json!(message));
            self.emit("Invalid", Some(id.to_string()), None, d);
        }
        self.wakeups.remove(id);
    }

    fn reconcile(&mut self, id: &CheckRef) {
        let Some(object) = self.store.get(&check_key(id)) else {
            self.wakeups.remove(id);
            return;
        };
        match id {
            CheckRef::Machine { namespace, .. } => self.reconcile_mhc(id, namespace, object.clone()),
            CheckRef::Node { .. } => self.reconcile_nhc(id),
        }
    }

    /// Gathers a MachineHealthCheck's inputs from the store, decides and applies the plan.
    fn reconcile_mhc(&mut self, id: &CheckRef, namespace: &str, object: Value) {
        let (check, policy) = match parse_valid(object, validate::machine_health_check) {
            Ok(parsed) => parsed,
            Err(why) => return self.invalid(id, why),
        };
        let cluster = self
            .store
            .get(&Key {
                cluster: LOCAL_CLUSTER.into(),
                group: CAPI_GROUP.into(),
                kind: "Cluster".into(),
                namespace: namespace.to_string(),
                name: policy.cluster_name.clone(),
            })
            .and_then(ClusterView::read);
        let machines = self.views.machines(&self.store, namespace);
        let machine_refs: Vec<&MachineView> = machines.iter().map(Rc::as_ref).collect();
        let node_cluster = self.node_cluster(namespace, &policy.cluster_name);
        // Only the Nodes of the check's targets: the engine looks up no other (reading
        // every Node of a 10 000-Node cluster for each check dominated a snapshot's run).
        let nodes: HashMap<String, NodeView> = self
            .views
            .mhc_targets(&self.store, namespace, &check_key(id), &policy)
            .iter()
            .filter_map(|m| m.node_name.as_deref())
            .filter_map(|name| {
                let key = Key {
                    cluster: node_cluster.clone(),
                    group: String::new(),
                    kind: "Node".into(),
                    namespace: String::new(),
                    name: name.to_string(),
                };
                let node = NodeView::read(self.store.get(&key)?)?;
                Some((name.to_string(), node))
            })
            .collect();
        let templates: Vec<Option<TemplateView>> = policy.templates().into_iter().map(|t| self.template(t)).collect();
        let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Option::as_ref).collect();
        let remediations = self.mhc_remediations(namespace, &policy);
        let remediation_refs = lookups(&remediations);
        let input = MhcInput {
            check: &check,
            policy: &policy,
            cluster: cluster.as_ref(),
            machines: &machine_refs,
            nodes: NodeSource::Reachable(&nodes),
            templates: &template_refs,
            remediations: &remediation_refs,
        };
        let holders = self.holders_reporting_ties();
        let ranking = self.views.mhc_ranking(&self.store, namespace);
        let plan =
            vigil_engine::machine::decide_among_peers(&input, &holders, &ranking.peers(), &node_cluster, self.now);
        self.apply(id, plan);
    }

    /// Gathers a NodeHealthCheck's inputs from the store, decides and applies the plan.
    fn reconcile_nhc(&mut self, id: &CheckRef) {
        let key = check_key(id);
        let parsed = match self.views.nhc(&self.store, &key) {
            Some(parsed) => parsed,
            // Not kept: it does not parse or is invalid, and is read again for the reason.
            None => {
                let Some(object) = self.store.get(&key).cloned() else { return };
                match parse_valid(object, validate::node_health_check) {
                    Ok(parsed) => Rc::new(parsed),
                    Err(why) => return self.invalid(id, why),
                }
            }
        };
        let (check, policy) = (&parsed.0, &parsed.1);
        let nodes = self.views.nodes(&self.store);
        let node_refs: Vec<&NodeView> = nodes.iter().collect();
        // The check's own steps and every rule's, in `NhcPolicy::all_steps` order (the engine's).
        let templates: Vec<Option<TemplateView>> = policy.all_steps().map(|s| self.template(&s.template)).collect();
        let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Option::as_ref).collect();
        let kinds: BTreeSet<(String, String, String)> = policy
            .all_steps()
            .map(|s| {
                (
                    group_of(&s.template.api_version).to_string(),
                    s.template.remediation_kind().to_string(),
                    s.template.namespace.clone(),
                )
            })
            .collect();
        let remediations: Vec<Rc<Vec<RemediationView>>> =
            kinds.iter().map(|(g, k, ns)| self.views.remediations(&self.store, g, k, ns)).collect();
        let remediation_refs: Vec<&RemediationView> = remediations.iter().flat_map(|r| r.iter()).collect();
        let leases = self.views.leases(&self.store, &self.scenario.lease_namespace);
        let maintenances = self.views.maintenances(&self.store);
        let versions = self.views.cluster_versions(&self.store);
        let machines = self.views.openshift_machines(&self.store);
        let (lease_refs, maintenance_refs, version_refs, machine_refs): (
            Vec<&LeaseView>,
            Vec<&MaintenanceView>,
            Vec<&ClusterVersionView>,
            Vec<&OpenShiftMachineView>,
        ) = (
            leases.iter().collect(),
            maintenances.iter().collect(),
            versions.iter().collect(),
            machines.iter().collect(),
        );
        let input = NhcInput {
            check,
            policy,
            nodes: &node_refs,
            templates: &template_refs,
            remediations: &remediation_refs,
            // The scenario's objects are all there is: a kind with none counts as not served (so
            // a Node's machine-config annotations postpone nothing without a ClusterVersion, as
            // on a live cluster that does not serve the kind).
            around: vigil_engine::node::Around {
                leases: &lease_refs,
                lease_namespace: &self.scenario.lease_namespace,
                maintenances: served_if_any(&maintenance_refs),
                cluster_versions: served_if_any(&version_refs),
                machines: served_if_any(&machine_refs),
            },
        };
        let holders = self.holders_reporting_ties();
        let plan = vigil_engine::node::decide_among(&input, &holders, self.now);
        self.apply(id, plan);
    }

    /// The valid MachineHealthChecks of a namespace, with their policies (who may own a Machine's
    /// conditions: [`vigil_engine::peers`]), and the version of their specs.
    fn mhc_peers(&mut self, namespace: &str) -> crate::views::Peers {
        self.views.mhc_peers(&self.store, namespace)
    }

    /// The remediation objects an MHC looks at: for each of its templates (its own and its rules',
    /// [`validate::MhcPolicy::templates`]), that template's kind in its namespace, by name.
    fn mhc_remediations(&self, namespace: &str, policy: &validate::MhcPolicy) -> Vec<HashMap<String, RemediationView>> {
        policy
            .templates()
            .into_iter()
            .map(|t| {
                self.store
                    .list(LOCAL_CLUSTER, group_of(&t.api_version), t.remediation_kind(), Some(namespace))
                    .filter_map(|(k, v)| RemediationView::read(v).map(|r| (k.name.clone(), r)))
                    .collect()
            })
            .collect()
    }

    /// Who holds which target, from every check's claims (the engine's derivation, as the
    /// controller computes it). A check's claims are computed again only when what they are read
    /// from changed: an MHC's, its namespace; an NHC's, the NodeHealthChecks or the remediation
    /// objects.
    fn holders(&mut self) -> Holders {
        let remediations_at = self.store.version_of(|c, g, _, _| crate::views::may_remediate(c, g));
        let nhcs_at = self.store.list_version(LOCAL_CLUSTER, GROUP, "NodeHealthCheck", None);
        let mut claims = Vec::new();
        for kept in self.views.checks(&self.store).iter() {
            let id = &kept.id;
            let version = match id {
                // An MHC's claims read its namespace's Machines, remediation objects and
                // checks' specs: a check's status write (every decision) does not move them.
                CheckRef::Machine { namespace, .. } => (
                    self.store.version_of(|c, g, k, n| {
                        c == LOCAL_CLUSTER && n == namespace && !(g == GROUP && k == "MachineHealthCheck")
                    }),
                    self.mhc_peers(namespace).1,
                ),
                CheckRef::Node { .. } => (remediations_at, nhcs_at),
            };
            if let Some(kept) = self.views.claims(id, version) {
                claims.extend(kept.iter().cloned());
                continue;
            }
            let Some(found) = self.claims_of(id) else { continue };
            let found = Rc::new(found);
            claims.extend(found.iter().cloned());
            self.views.keep_claims(id.clone(), version, found);
        }
        assemble::holders(None, claims, std::iter::empty(), None)
    }

    /// What one check claims, read from the store (`None`: it is gone or invalid).
    fn claims_of(&mut self, id: &CheckRef) -> Option<Vec<vigil_engine::holders::Claim>> {
        match id {
            CheckRef::Machine { namespace, .. } => {
                let parsed = self.views.mhc(&self.store, &check_key(id))?;
                let (check, policy) = parsed.as_ref();
                // Only its targets can be claimed ([`holders::mhc_claims_among`] looks at no other).
                let machines = self.views.mhc_targets(&self.store, namespace, &check_key(id), policy);
                let machine_refs: Vec<&MachineView> = machines.iter().map(Rc::as_ref).collect();
                let remediations = self.mhc_remediations(namespace, policy);
                let remediation_refs = lookups(&remediations);
                let node_cluster = self.node_cluster(namespace, &policy.cluster_name);
                let ranking = self.views.mhc_ranking(&self.store, namespace);
                Some(assemble::claims(ClaimSource::Machine {
                    check,
                    policy,
                    peers: &ranking.peers(),
                    node_cluster: &node_cluster,
                    machines: &machine_refs,
                    remediations: &remediation_refs,
                }))
            }
            CheckRef::Node { .. } => {
                let check = self.nhc_as_read(id)?;
                let objects = self.views.remediation_objects(&self.store);
                let object_refs: Vec<&RemediationView> = objects.iter().collect();
                Some(assemble::claims(ClaimSource::Node { check: check.check(), remediations: &object_refs }))
            }
        }
    }

    /// [`Sim::holders`], telling once about each target more than one check holds (from before
    /// the one-check-at-a-time rule, or made so by hand): nothing is deleted to resolve it.
    fn holders_reporting_ties(&mut self) -> Holders {
        let holders = self.holders();
        let mut now_tied = BTreeSet::new();
        for (target, holder) in holders.ties() {
            let also: Vec<String> = holder.also.iter().map(ToString::to_string).collect();
            let message = format!(
                "{target} is being remediated by {} and also by {}; nothing is deleted to resolve it, and no other check starts on it",
                holder.check,
                also.join(", ")
            );
            if !self.ties_reported.contains(&message) {
                let name = match target {
                    Target::Node { name, .. } => name.clone(),
                    Target::Machine { namespace, name } => format!("{namespace}/{name}"),
                };
                let mut d = Map::new();
                d.insert("reason".into(), json!(vigil_api::reason::Reason::TargetHeldByMoreThanOneCheck.as_str()));
                d.insert("message".into(), json!(message));
                self.emit("TargetHeldTwice", Some(holder.check.to_string()), Some(name), d);
            }
            now_tied.insert(message);
        }
        self.ties_reported = now_tied;
        holders
    }

    /// The template a check names, read from the management cluster.
    fn template(&self, t: &vigil_api::validate::TemplateRef) -> Option<TemplateView> {
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: group_of(&t.api_version).into(),
            kind: t.kind.clone(),
            namespace: t.namespace.clone(),
            name: t.name.clone(),
        };
        self.store.get(&key).and_then(TemplateView::read)
    }

    /// Applies a plan: status, writes, notices, wake-up.
    fn apply<S: serde::Serialize>(&mut self, id: &CheckRef, plan: Plan<S>) {
        let key = check_key(id);
        self.invalid_reported.remove(id);
        let status = serde_json::to_value(&plan.status).unwrap_or(json!({}));
        if self.store.get(&key).and_then(|o| o.get("status")) != Some(&status) {
            self.history.push((self.t(), id.to_string(), status.clone()));
            self.store.set_status(&key, status);
        }
        // A step given up is told about its object, as the controller's Event is.
        for notice in &plan.notices {
            self.notice_about(id, notice, plan.given_up_object(notice));
        }
        for held in &plan.held_elsewhere {
            self.notice(&held.holder, &held.notice());
        }
        // What the plan puts after an annotation waits for it; a refused one holds it back, as
        // in the controller.
        let mut refused: Vec<ObjectRef> = Vec::new();
        for action in plan.actions {
            if action.after().iter().any(|o| refused.contains(o)) {
                let mut d = Map::new();
                d.insert("message".into(), json!("not sent: the previous step's timed-out annotation was not written"));
                self.emit("WriteFailed", Some(id.to_string()), Some(action.target_name().to_string()), d);
                continue;
            }
            match action {
                Action::AnnotateRemediation { object, key, value, .. } => {
                    if !self.annotate(&object, key, value) {
                        refused.push(object);
                    }
                }
                action => self.act(id, action),
            }
        }
        match plan.next_wake {
            Some(t) => self.wakeups.insert(id.clone(), t),
            None => self.wakeups.remove(id),
        };
    }

    fn notice(&mut self, id: &CheckRef, notice: &Notice) {
        self.notice_about(id, notice, None);
    }

    /// A notice, with the fields of the object it is about (`kind`, `namespace`, `name`), if any.
    fn notice_about(&mut self, id: &CheckRef, notice: &Notice, about: Option<&ObjectRef>) {
        let mut d = Map::new();
        d.insert("reason".into(), json!(notice.reason));
        d.insert("message".into(), json!(notice.message));
        if let Some(o) = about {
            d.insert("kind".into(), json!(o.kind));
            d.insert("namespace".into(), json!(o.namespace));
            d.insert("name".into(), json!(o.name));
        }
        let event = notice.kind.event_reason(id);
        self.emit(event, Some(id.to_string()), notice.target.as_ref().map(Target::key), d);
    }

    /// Applies one action to the store, as the API server would take it.
    fn act(&mut self, id: &CheckRef, action: Action) {
        match action {
            Action::SetMachineConditions { machine, version, conditions } => {
                self.set_machine_conditions(id, machine, version, &conditions)
            }
            Action::CreateRemediation { object, target, lease, .. } => {
                self.create_remediation(id, object, &target, lease.as_ref())
            }
            Action::DeleteRemediation { object, target, .. } => self.delete_remediation(id, object, &target),
            Action::WriteLease(lease) => {
                self.write_lease(id, &lease);
            }
            Action::DeleteLease { lease, uid, resource_version, .. } => self.delete_lease(lease, uid, resource_version),
            Action::AnnotateRemediation { object, key, value, .. } => {
                self.annotate(&object, key, value);
            }
        }
    }

    /// Writes Vigil's conditions on a Machine with the patch the controller sends; a Machine
    /// asked for its owner's remediation is replaced by the owner model later.
    fn set_machine_conditions(
        &mut self,
        id: &CheckRef,
        machine: ObjectRef,
        version: vigil_api::views::CapiVersion,
        conditions: &[(vigil_api::conditions::DesiredCondition, Timestamp)],
    ) {
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: group_of(&machine.api_version).into(),
            kind: machine.kind,
            namespace: machine.namespace,
            name: machine.name,
        };
        // A Cluster API Machine is read as the checks look at it before it is written,
        // instead of copied whole: every decision writes each of its targets.
        let capi = key.group == CAPI_GROUP && key.kind == "Machine";
        let checks = self.views.checks(&self.store);
        let Some(current) = self.store.get(&key) else { return };
        let patch = machine_status_patch(current, version, conditions);
        let read = capi.then(|| self.read_versions(&key, &[current], &checks));
        let before = (!capi).then(|| current.clone());
        if let Err(e) = self.store.patch(&key, &patch) {
            let mut d = Map::new();
            d.insert("message".into(), json!(e));
            self.emit("WriteFailed", Some(id.to_string()), Some(key.object_name()), d);
            return;
        }
        let owner_asked =
            conditions.iter().any(|(c, _)| c.type_ == OWNER_REMEDIATED && c.status == ConditionStatus::False);
        if owner_asked
            && let Some(owner) = self.scenario.models.owner
            && self.scheduled_replacements.insert(key.clone())
        {
            self.schedule(owner.replace_after, Task::ReplaceMachine(key.clone()));
        }
        match read {
            Some(read) => self.machine_changed(&key, read),
            None => self.changed(&key, before.as_ref()),
        }
    }

    /// Creates a remediation object, the Node's Lease first (when it cannot be taken, the object
    /// is not created); the remediator model of its kind acts on it later.
    fn create_remediation(
        &mut self,
        id: &CheckRef,
        mut object: Value,
        target: &Target,
        lease: Option<&vigil_engine::plan::LeaseWrite>,
    ) {
        if let Some(lease) = lease
            && !self.write_lease(id, lease)
        {
            return;
        }
        let model = self.scenario.models.remediators.iter().find(|r| Some(r.kind.as_str()) == object["kind"].as_str());
        if model.is_some_and(|m| m.holds_deletion.is_some()) {
            object["metadata"]["finalizers"] = json!([SIMULATED_FINALIZER]);
        }
        let Ok(key) = self.store.create(LOCAL_CLUSTER, object, self.now) else { return };
        self.emit(
            NoticeKind::RemediationCreated.event_reason(id),
            Some(id.to_string()),
            Some(target.key()),
            object_details(&key),
        );
        if let Some(model) = self.scenario.models.remediators.iter().find(|r| r.kind == key.kind) {
            let (delay, outcome) = match model.outcome {
                RemediatorOutcome::Recovers(d) | RemediatorOutcome::Fails(d) => (d, model.outcome),
            };
            self.schedule(delay, Task::Remediator(key.clone(), outcome));
        }
        self.changed(&key, None);
    }

    /// Deletes a remediation object (once: one being deleted is left alone); a remediator
    /// model that holds deletions lets it go later.
    fn delete_remediation(&mut self, id: &CheckRef, object: ObjectRef, target: &Target) {
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: group_of(&object.api_version).into(),
            kind: object.kind,
            namespace: object.namespace,
            name: object.name,
        };
        let deleting = self.store.get(&key).is_some_and(|o| o.pointer("/metadata/deletionTimestamp").is_some());
        if deleting {
            return;
        }
        let Some((before, gone)) = self.store.request_delete(&key, self.now) else { return };
        self.emit(
            NoticeKind::RemediationDeleted.event_reason(id),
            Some(id.to_string()),
            Some(target.key()),
            object_details(&key),
        );
        let held = self.scenario.models.remediators.iter().find(|r| r.kind == key.kind).and_then(|r| r.holds_deletion);
        if let (false, Some(hold)) = (gone, held) {
            self.schedule(hold, Task::ReleaseFinalizer(key.clone()));
        }
        self.changed(&key, Some(&before));
    }

    /// Releases a node Lease, only if it is still the one seen (uid and version).
    fn delete_lease(&mut self, lease: ObjectRef, uid: Option<String>, resource_version: Option<String>) {
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: group_of(&lease.api_version).into(),
            kind: lease.kind,
            namespace: lease.namespace,
            name: lease.name,
        };
        let Some(current) = self.store.get(&key) else { return };
        let at = |p: &str| current.pointer(p).and_then(Value::as_str).map(str::to_string);
        if at("/metadata/uid") == uid
            && at("/metadata/resourceVersion") == resource_version
            && let Some(before) = self.store.delete(&key)
        {
            self.changed(&key, Some(&before));
        }
    }

    /// Annotates a remediation object; whether it was written (not when it is gone).
    fn annotate(&mut self, object: &ObjectRef, annotation: String, value: String) -> bool {
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: group_of(&object.api_version).into(),
            kind: object.kind.clone(),
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        let Some(before) = self.store.get(&key).cloned() else { return false };
        if self.store.patch(&key, &json!({"metadata": {"annotations": {annotation: value}}})).is_err() {
            return false;
        }
        self.changed(&key, Some(&before));
        true
    }

    /// Takes or renews a node Lease as the API server would let a writer: a create only when
    /// there is none, an update only of the version decided on. `false` (and an event) when it
    /// was refused.
    fn write_lease(&mut self, id: &CheckRef, lease: &vigil_engine::plan::LeaseWrite) -> bool {
        let manifest = lease.manifest();
        let key = Key::of(LOCAL_CLUSTER, &manifest);
        let before = self.store.get(&key).cloned();
        let written = match &lease.resource_version {
            None => self.store.create(LOCAL_CLUSTER, manifest, self.now).map_err(|_| "it exists already".to_string()),
            Some(rv) => self.store.replace_at(manifest, rv, self.now),
        };
        match written {
            Ok(_) => {
                self.changed(&key, before.as_ref());
                true
            }
            Err(why) => {
                let mut d = object_details(&key);
                d.insert("message".into(), json!(format!("the Lease of Node {} was not taken: {why}", lease.node)));
                self.emit("LeaseRefused", Some(id.to_string()), Some(lease.node.clone()), d);
                false
            }
        }
    }

    fn schedule(&mut self, after: SignedDuration, task: Task) {
        self.task_seq += 1;
        let at = self.now.checked_add(after).unwrap_or(Timestamp::MAX);
        self.tasks.insert((at, self.task_seq), task);
    }

    fn run_task(&mut self, task: Task) {
        match task {
            Task::ReplaceMachine(key) => self.replace_machine(&key),
            Task::JoinNode(key) => self.join_node(&key),
            Task::Remediator(key, outcome) => self.remediator_acts(&key, outcome),
            Task::ReleaseFinalizer(key) => {
                if let Some((before, gone)) = self.store.remove_finalizer(&key, SIMULATED_FINALIZER) {
                    if gone {
                        let mut d = object_details(&key);
                        d.insert("message".into(), json!("the remediator finished and let go of its object"));
                        self.emit("RemediationFinished", None, Some(key.object_name()), d);
                    }
                    self.changed(&key, Some(&before));
                }
            }
            Task::Heartbeat(i) => self.heartbeat(i),
            Task::HeartbeatsStop(i) => {
                let Some(h) = self.scenario.models.heartbeats.get(i) else { return };
                let mut d = Map::new();
                d.insert("type".into(), json!(h.type_));
                d.insert("message".into(), json!(format!("the reporter of {} stops heartbeating", h.type_)));
                self.emit("HeartbeatsStopped", None, None, d);
            }
        }
    }

    /// A heartbeat model renews `lastHeartbeatTime` of its condition on every Node it covers
    /// that carries the condition (nothing else changes), then plans its next heartbeat.
    fn heartbeat(&mut self, i: usize) {
        let Some(h) = self.scenario.models.heartbeats.get(i).cloned() else { return };
        let cluster = h.cluster.clone().unwrap_or_else(|| LOCAL_CLUSTER.to_string());
        let now = self.now.to_string();
        let keys: Vec<Key> = self
            .store
            .list(&cluster, "", "Node", None)
            .filter(|(_, n)| {
                h.node_selector.iter().all(|(k, v)| {
                    n.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v.as_str())
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(mut node) = self.store.get(&key).cloned() else { continue };
            let before = node.clone();
            let Some(list) = node.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { continue };
            let Some(c) = list.iter_mut().find(|c| c["type"] == h.type_.as_str()) else { continue };
            c["lastHeartbeatTime"] = json!(now);
            self.store.apply(&key.cluster, node, self.now);
            self.changed(&key, Some(&before));
        }
        let next = self.now.checked_add(h.every).unwrap_or(Timestamp::MAX);
        let end = self.scenario.start.checked_add(self.scenario.duration).unwrap_or(Timestamp::MAX);
        if h.until.is_none_or(|u| next < self.at(u)) && next <= end {
            self.schedule(h.every, Task::Heartbeat(i));
        }
    }

    /// The owner model (MachineSet-like): deletes the Machine and its Node, creates a new one.
    /// As Cluster API's MachineSet did when run against Vigil (`tests/capi_e2e.rs`): it acts only
    /// on a Machine whose `HealthCheckSucceeded` and `OwnerRemediated` are both `False` (a Machine
    /// that recovered first is left alone), and not while its Cluster or the Machine is paused
    /// (it acts once the pause is lifted).
    fn replace_machine(&mut self, key: &Key) {
        self.scheduled_replacements.remove(key);
        let Some(old) = self.store.get(key).cloned() else { return };
        let still_asked = MachineView::read(&old).is_some_and(|m| {
            let is_false = |t: &str| {
                vigil_api::conditions::find(&m.conditions, t).is_some_and(|c| c.status == ConditionStatus::False)
            };
            is_false(HEALTH_CHECK_SUCCEEDED) && is_false(OWNER_REMEDIATED)
        });
        if !still_asked {
            return;
        }
        if self.owner_paused(key, &old) {
            if let Some(owner) = self.scenario.models.owner
                && self.scheduled_replacements.insert(key.clone())
            {
                self.schedule(owner.replace_after, Task::ReplaceMachine(key.clone()));
            }
            return;
        }
        self.store.delete(key);
        self.changed(key, Some(&old));
        let node_name = text(&old, "/status/nodeRef/name").to_string();
        let cluster_name =
            text(&old, &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1"))).to_string();
        let node_cluster = self.node_cluster(&key.namespace, &cluster_name);
        if !node_name.is_empty() {
            let node_key = Key {
                cluster: node_cluster,
                group: String::new(),
                kind: "Node".into(),
                namespace: String::new(),
                name: node_name,
            };
            if let Some(before) = self.store.delete(&node_key) {
                self.changed(&node_key, Some(&before));
            }
        }
        self.task_seq += 1;
        let base = key
            .name
            .rsplit_once("-r")
            .filter(|(_, n)| n.bytes().all(|b| b.is_ascii_digit()))
            .map_or(key.name.as_str(), |(b, _)| b);
        let new_name = format!("{base}-r{}", self.task_seq);
        let mut fresh = json!({"apiVersion": old["apiVersion"], "kind": "Machine", "metadata": {"name": new_name, "namespace": key.namespace}});
        let mut labels = old.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
        if let Some(map) = labels.as_object_mut() {
            map.remove(REMEDIATE_MACHINE_ANNOTATION);
        }
        fresh["metadata"]["labels"] = labels;
        if let Some(spec) = old.get("spec") {
            fresh["spec"] = spec.clone();
        }
        let new_key = self.store.apply(LOCAL_CLUSTER, fresh, self.now);
        let mut d = Map::new();
        d.insert("replacement".into(), json!(new_key.object_name()));
        self.emit("MachineReplaced", None, Some(key.object_name()), d);
        self.changed(&new_key, None);
        if let Some(owner) = self.scenario.models.owner {
            self.schedule(owner.node_ready_after, Task::JoinNode(new_key));
        }
    }

    /// Whether Cluster API's controllers leave `machine` alone for now: its Cluster has
    /// `spec.paused` or either carries the `cluster.x-k8s.io/paused` annotation.
    fn owner_paused(&self, key: &Key, machine: &Value) -> bool {
        let annotated = |o: &Value| {
            o.pointer("/metadata/annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
        };
        let cluster_name = text(machine, &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1")));
        let cluster_key = Key {
            cluster: key.cluster.clone(),
            group: key.group.clone(),
            kind: "Cluster".into(),
            namespace: key.namespace.clone(),
            name: cluster_name.to_string(),
        };
        let cluster_paused = self
            .store
            .get(&cluster_key)
            .is_some_and(|c| c.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) || annotated(c));
        cluster_paused || annotated(machine)
    }

    /// The new Machine's Node joins, Ready.
    fn join_node(&mut self, key: &Key) {
        let Some(machine) = self.store.get(key).cloned() else { return };
        let cluster_name =
            text(&machine, &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1"))).to_string();
        let node_cluster = self.node_cluster(&key.namespace, &cluster_name);
        let now = self.now.to_string();
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": key.name},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        let node_key = self.store.apply(&node_cluster, node, self.now);
        self.changed(&node_key, None);
        let node_ref = if text(&machine, "/apiVersion").ends_with("v1beta1") {
            json!({"apiVersion": "v1", "kind": "Node", "name": key.name})
        } else {
            json!({"name": key.name})
        };
        if self.store.patch(key, &json!({"status": {"nodeRef": node_ref}})).is_ok() {
            self.changed(key, Some(&machine));
        }
        self.emit("NodeJoined", None, Some(key.name.clone()), Map::new());
    }

    /// A remediator model acts on its object: the Node recovers, or the object reports failure.
    fn remediator_acts(&mut self, key: &Key, outcome: RemediatorOutcome) {
        let Some(object) = self.store.get(key).cloned() else { return };
        let now = self.now.to_string();
        match outcome {
            RemediatorOutcome::Recovers(_) => {
                let Some((cluster, node)) = self.node_of(&object) else { return };
                let node_key = Key {
                    cluster,
                    group: String::new(),
                    kind: "Node".into(),
                    namespace: String::new(),
                    name: node.clone(),
                };
                if self.store.get(&node_key).is_none() {
                    let fresh = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "status": {"conditions": []}});
                    self.store.apply(&node_key.cluster, fresh, self.now);
                }
                self.set_node_condition(
                    &node_key,
                    "Ready",
                    ConditionStatus::True.as_str(),
                    Some("KubeletReady"),
                    Some("kubelet is posting ready status"),
                );
                let _ = self.store.patch(key, &json!({"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "RemediationFinished", "message": "", "lastTransitionTime": now}]}}));
                self.changed(key, Some(&object));
                let mut d = object_details(key);
                d.insert("message".into(), json!(format!("{} {} brought the Node back", key.kind, key.object_name())));
                self.emit("NodeRecovered", None, Some(node), d);
            }
            RemediatorOutcome::Fails(_) => {
                let _ = self.store.patch(key, &json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "RemediationFailed", "message": "the remediator gave up", "lastTransitionTime": now}]}}));
                self.changed(key, Some(&object));
                let target = object
                    .pointer(&format!("/metadata/annotations/{}", NODE_NAME_ANNOTATION.replace('/', "~1")))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.emit("RemediationFailed", None, target, object_details(key));
            }
        }
    }

    /// The Node a remediation object is about: its node-name annotation (NodeHealthCheck), or
    /// the Node of the Machine that owns it (MachineHealthCheck).
    fn node_of(&self, object: &Value) -> Option<(String, String)> {
        if let Some(node) = object
            .pointer(&format!("/metadata/annotations/{}", NODE_NAME_ANNOTATION.replace('/', "~1")))
            .and_then(Value::as_str)
        {
            return Some((LOCAL_CLUSTER.into(), node.to_string()));
        }
        let namespace = text(object, "/metadata/namespace");
        let owners = object.pointer("/metadata/ownerReferences").and_then(Value::as_array)?;
        let machine_name = owners.iter().find(|o| o["kind"] == "Machine").and_then(|o| o["name"].as_str())?;
        let machine = self.store.get(&Key {
            cluster: LOCAL_CLUSTER.into(),
            group: CAPI_GROUP.into(),
            kind: "Machine".into(),
            namespace: namespace.into(),
            name: machine_name.into(),
        })?;
        let cluster_name = text(machine, &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1")));
        let node = text(machine, "/status/nodeRef/name");
        let node = if node.is_empty() { machine_name } else { node };
        Some((self.node_cluster(namespace, cluster_name), node.to_string()))
    }
}

/// A kind of the scenario as the engine reads it: not served when the scenario has none of it.
fn served_if_any<'a, T>(objects: &'a [&'a T]) -> Observed<'a, &'a [&'a T]> {
    if objects.is_empty() { Observed::NotServed } else { Observed::Known(objects) }
}

fn object_details(key: &Key) -> Map<String, Value> {
    let mut d = Map::new();
    d.insert("kind".into(), json!(key.kind));
    d.insert("namespace".into(), json!(key.namespace));
    d.insert("name".into(), json!(key.name));
    d
}

/// The engine's view of per-template remediation maps: one lookup each.
fn lookups(maps: &[HashMap<String, RemediationView>]) -> Vec<&dyn vigil_engine::Lookup<RemediationView>> {
    maps.iter().map(|m| m as &dyn vigil_engine::Lookup<RemediationView>).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_api::reason::Reason;

    /// The simulator names every notice as the controller's Event for it is named, so a scenario
    /// shows what `kubectl get events` will.
    #[test]
    fn every_notice_is_named_by_its_event_reason() {
        let scenario = Scenario::parse("name: names\nduration: 1m\n").expect("a scenario");
        let mut sim = Sim::new(&scenario);
        let checks =
            [CheckRef::Machine { namespace: "ns".into(), name: "m".into() }, CheckRef::Node { name: "n".into() }];
        for kind in NoticeKind::ALL {
            for check in &checks {
                let notice = Notice { kind, target: None, reason: Reason::NodeHealthy, message: String::new() };
                sim.notice(check, &notice);
                let named = sim.events.last().map(|e| e.event.clone()).unwrap_or_default();
                assert_eq!(named, kind.event_reason(check), "{kind:?} on {check}");
            }
        }
    }

    /// A plan's order is obeyed as the controller obeys it: a create the plan puts after an
    /// annotation is not made when that annotation could not be written (here, its object is
    /// gone), and a create after a written one is.
    #[test]
    fn a_create_after_an_annotation_that_was_not_written_is_not_made() {
        let scenario = Scenario::parse("name: order\nduration: 1m\n").expect("a scenario");
        let mut sim = Sim::new(&scenario);
        let check = CheckRef::Node { name: "n".into() };
        let object = |name: &str| ObjectRef {
            api_version: "self-node-remediation.medik8s.io/v1alpha1".into(),
            kind: "SelfNodeRemediation".into(),
            namespace: "medik8s".into(),
            name: name.into(),
        };
        let next = |name: &str, after: ObjectRef| Action::CreateRemediation {
            object: json!({"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1", "kind": "FenceAgentsRemediation",
                           "metadata": {"name": name, "namespace": "medik8s"}}),
            target: Target::local_node(name),
            lease: None,
            after: vec![after],
        };
        let annotate = |name: &str| Action::AnnotateRemediation {
            object: object(name),
            target: Target::local_node(name),
            key: "remediation.medik8s.io/nhc-timed-out".into(),
            value: "now".into(),
            seen: vigil_engine::plan::Seen::default(),
        };
        sim.store
            .create(
                LOCAL_CLUSTER,
                json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                                          "metadata": {"name": "kept", "namespace": "medik8s"}}),
                sim.now,
            )
            .expect("created");
        let plan = Plan {
            status: json!({}),
            actions: vec![
                annotate("gone"),
                next("gone", object("gone")),
                annotate("kept"),
                next("kept", object("kept")),
            ],
            notices: Vec::new(),
            next_wake: None,
            held_elsewhere: Vec::new(),
            short_circuited: false,
            remediating: 0,
        };
        sim.apply(&check, plan);
        let created: Vec<Option<String>> =
            sim.events.iter().filter(|e| e.event == "RemediationCreated").map(|e| e.target.clone()).collect();
        assert_eq!(created, [Some("kept".to_string())]);
        let refused: Vec<Option<String>> =
            sim.events.iter().filter(|e| e.event == "WriteFailed").map(|e| e.target.clone()).collect();
        assert_eq!(refused, [Some("gone".to_string())]);
    }

    /// A Node change wakes the MachineHealthChecks its Machines concern, not every check of
    /// their namespace (as the controller routes it): `a` selects pool a, `b` pool b; Node
    /// `na` (Machine `ma`, pool a) turning NotReady wakes `a` only.
    #[test]
    fn a_node_change_wakes_only_the_checks_its_machines_concern() {
        let scenario = Scenario::parse("name: route\nduration: 1m\n").expect("a scenario");
        let mut sim = Sim::new(&scenario);
        let check = |name: &str, pool: &str| {
            json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": pool}},
                            "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]}})
        };
        let machine = |name: &str, pool: &str| {
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                   "metadata": {"name": name, "namespace": "default",
                                "labels": {"cluster.x-k8s.io/cluster-name": "prod", "pool": pool}},
                   "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"name": format!("n{pool}")}}})
        };
        let node = |name: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                   "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "lastTransitionTime": "2029-12-01T00:00:00Z"}]}})
        };
        let objects =
            [check("a", "a"), check("b", "b"), machine("ma", "a"), machine("mb", "b"), node("na"), node("nb")];
        for (i, o) in objects.into_iter().enumerate() {
            sim.put(LOCAL_CLUSTER, o, &format!("objects[{i}]")).expect("put");
        }
        sim.loading = false;
        let key = Key {
            cluster: LOCAL_CLUSTER.into(),
            group: String::new(),
            kind: "Node".into(),
            namespace: String::new(),
            name: "na".into(),
        };
        sim.set_node_condition(&key, "Ready", "False", Some("KubeletNotReady"), None);
        let woken: Vec<String> = sim.dirty.iter().map(ToString::to_string).collect();
        assert_eq!(woken, ["MachineHealthCheck/default/a"]);
    }
}
