//! The simulation loop. It does what the controller does, on a virtual clock: a change wakes the
//! checks it concerns (the engine's `concerns` predicates), each woken check gathers its observed
//! state, calls the engine and applies the plan, and a plan's `next_wake` is honoured to the
//! nanosecond. Between changes the clock jumps to the next timeline step, wake-up or model timer.

use crate::feed::{CAPI_GROUP, Feed, check_key};
use crate::output::{Event, seconds};
use crate::owner;
use crate::scenario::{Change, RemediatorOutcome, Scenario, ScenarioError, Step};
use crate::store::{Key, Store, api_time};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::GROUP;
use vigil_api::conditions::ConditionStatus;
use vigil_api::manifest::{HealthCheck, health_check_from_value};
use vigil_api::reason::Reason;
use vigil_api::well_known::{NODE_NAME_ANNOTATION, OWNER_REMEDIATED};
use vigil_engine::assemble::{self};
use vigil_engine::concerns::group_of;
use vigil_engine::machine_write::machine_status_patch;
use vigil_engine::plan::ObjectRef;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};
use vigil_engine::{Action, Notice, NoticeKind, Plan};
use vigil_index::{decision, gather};

/// How many decisions one check may take in one instant before the run is declared unsettled (a
/// plan that keeps changing what it looks at would otherwise loop forever).
const MAX_ROUNDS_PER_INSTANT: usize = 50;

/// The finalizer a remediator model puts on its objects (`holdsDeletion`).
const SIMULATED_FINALIZER: &str = "simulator.vigil.dev/remediator";

/// Work the models do later.
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

impl Report {
    /// Lets the report go without freeing its objects one by one, for a process that ends next
    /// (`vigil simulate`, `vigil check`): the operating system takes the memory back at once,
    /// while freeing a 10 000-Node store object by object took a sixth of the run.
    pub fn discard(self) {
        std::mem::forget(self);
    }
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
    /// Targets held by more than one check, as last reported (each tie is told once).
    ties_reported: BTreeSet<String>,
    /// While the scenario's objects are loaded: every check is decided afterwards anyway, so
    /// the checks each object concerns are not marked.
    loading: bool,
    /// The read side the decisions are gathered from, as the controller's.
    feed: Feed,
    /// The check whose plan is being applied: its own writes do not wake it.
    applying: Option<CheckRef>,
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
    let objects = scenario.objects.iter().cloned().map(Ok);
    let workload = scenario.workload_clusters.iter().map(|(cluster, nodes)| (cluster.clone(), nodes.clone()));
    let workload = workload.map(|(cluster, nodes)| (cluster, nodes.into_iter().map(Ok)));
    run_with(scenario, objects, workload.collect(), |_| ()).map(|(_, report)| report)
}

/// [`simulate`], taking the scenario's objects into the store instead of copying them (a caller
/// done with the scenario holds a 10 000-Node fleet once, not twice); `at_start` is shown the run
/// once its start instant settled, so `vigil check` learns "now" and "next" from one run.
pub fn simulate_owned<T>(
    mut scenario: Scenario,
    at_start: impl FnOnce(Start<'_>) -> T,
) -> Result<(T, Report), ScenarioError> {
    let objects = std::mem::take(&mut scenario.objects).into_iter().map(Ok);
    // The clusters stay named (where a check's Nodes live is read from them); their Nodes move.
    let workload =
        scenario.workload_clusters.iter_mut().map(|(cluster, nodes)| (cluster.clone(), std::mem::take(nodes)));
    let workload: Vec<_> = workload.map(|(cluster, nodes)| (cluster, nodes.into_iter().map(Ok))).collect();
    run_with(&scenario, objects, workload, at_start)
}

/// [`simulate_owned`] for objects read as JSON text (`vigil check`, from the list pages): each is
/// read into a tree only to be stored, so the fleet is never in memory as trees all at once.
/// `scenario`'s own objects and workload clusters' Nodes come first.
pub fn simulate_packed<T>(
    mut scenario: Scenario,
    objects: Vec<Box<RawValue>>,
    workload_clusters: BTreeMap<String, Vec<Box<RawValue>>>,
    at_start: impl FnOnce(Start<'_>) -> T,
) -> Result<(T, Report), ScenarioError> {
    let read = |text: Box<RawValue>| serde_json::from_str::<Value>(text.get()).map_err(|e| e.to_string());
    let objects = std::mem::take(&mut scenario.objects).into_iter().map(Ok).chain(objects.into_iter().map(read));
    let mut packed = workload_clusters;
    for cluster in packed.keys() {
        scenario.workload_clusters.entry(cluster.clone()).or_default();
    }
    let workload: Vec<_> = scenario
        .workload_clusters
        .iter_mut()
        .map(|(cluster, own)| {
            let packed = packed.remove(cluster).unwrap_or_default().into_iter().map(read);
            (cluster.clone(), std::mem::take(own).into_iter().map(Ok).chain(packed))
        })
        .collect();
    run_with(&scenario, objects, workload, at_start)
}

/// Loads `objects` (management cluster) and each workload cluster's Nodes, then runs, showing
/// `at_start` the start instant.
fn run_with<T>(
    scenario: &Scenario,
    objects: impl Iterator<Item = Result<Value, String>>,
    workload: Vec<(String, impl Iterator<Item = Result<Value, String>>)>,
    at_start: impl FnOnce(Start<'_>) -> T,
) -> Result<(T, Report), ScenarioError> {
    let mut sim = Sim::new(scenario);
    for (i, object) in objects.enumerate() {
        let entry = format!("objects[{i}]");
        let object = object.map_err(|message| ScenarioError::Entry { entry: entry.clone(), message })?;
        sim.put(LOCAL_CLUSTER, object, &entry)?;
    }
    for (cluster, nodes) in workload {
        for (i, node) in nodes.enumerate() {
            let entry = format!("workloadClusters[{cluster:?}][{i}]");
            let node = node.map_err(|message| ScenarioError::Entry { entry: entry.clone(), message })?;
            sim.put(&cluster, node, &entry)?;
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
            ties_reported: BTreeSet::new(),
            loading: true,
            feed: Feed::new(&scenario.lease_namespace, scenario.workload_clusters.keys().cloned().collect()),
            applying: None,
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
        self.feed.index.all_checks()
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
        let key = self.store.apply(cluster, object, self.now);
        self.changed(&key);
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
                self.store
                    .delete(&key)
                    .ok_or_else(|| err(format!("{} {} does not exist at this time", id.kind, key.object_name())))?;
                self.emit("Deleted", None, Some(key.object_name()), object_details(&key));
                self.changed(&key);
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
                    if !self.store.contains(&key(&c.node)) {
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
        let now = api_time(self.now);
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
        self.changed(key);
    }

    /// Puts the change of the object under `key` into the read side and marks the checks the
    /// index says it concerns. While a check's plan is applied, what its writes made or changed
    /// wakes only the others, as in the controller (the API server's answer goes into its index
    /// at once, and the watch's echo of it is not newer); an object its write removed wakes it
    /// too, as the watch's delete event does in the controller.
    fn changed(&mut self, key: &Key) {
        let concerned = self.feed.put(&self.store, key, self.now);
        // The index holds what the decisions read of it: the object itself is kept as its text.
        self.store.pack(key);
        if self.loading {
            return;
        }
        let writer = self.applying.as_ref().filter(|_| self.store.contains(key));
        self.dirty.extend(concerned.into_iter().filter(|c| Some(c) != writer));
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

    /// One check's turn, as the controller takes it ([`vigil_index::decision`]): decided on the
    /// cached claims; a plan that remediates decided again with the others' claims about its
    /// targets derived now (the store is the truth: every target is confirmed); applied; its
    /// claims cached, and the checks that must decide again marked.
    fn reconcile(&mut self, id: &CheckRef) {
        let Some(job) = gather::job(&self.feed.index, id, self.now) else {
            self.wakeups.remove(id);
            return;
        };
        if self.feed.watch(&self.store, &job.needs, self.now) {
            // Decided before the kinds it reads were listed: nothing of it is applied.
            self.dirty.insert(id.clone());
            return;
        }
        let targets = decision::targets_of(&job);
        let job = if targets.is_empty() {
            job
        } else {
            let index = &self.feed.index;
            let keyed: Vec<(Target, Target)> =
                targets.iter().map(|t| (t.clone(), decision::lock_target(index, t))).collect();
            // The store is the truth: every target is confirmed as if read again, none on the
            // strength of its write alone.
            let Some(job) = decision::confirmed_job(index, id, self.now, &keyed, &targets, &BTreeSet::new()) else {
                self.wakeups.remove(id);
                return;
            };
            job
        };
        let again = job.again;
        self.applying = Some(id.clone());
        self.apply(id, job.plan);
        self.applying = None;
        let wake = decision::cache_claims(&mut self.feed.index, id);
        self.dirty.extend(wake);
        self.report_ties();
        if again {
            self.dirty.insert(id.clone());
        }
    }

    /// Tells once about each target more than one check holds (from before the
    /// one-check-at-a-time rule, or made so by hand), on its holder: nothing is deleted to
    /// resolve it. Read from the claims the read side caches for every check.
    fn report_ties(&mut self) {
        let cached = self.feed.index.claims().iter().flat_map(|(_, c)| c);
        let holders = assemble::holders(None, Vec::new(), cached, None);
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
                d.insert("reason".into(), json!(Reason::TargetHeldByMoreThanOneCheck.as_str()));
                d.insert("message".into(), json!(message));
                self.emit("TargetHeldTwice", Some(holder.check.to_string()), Some(name), d);
            }
            now_tied.insert(message);
        }
        self.ties_reported = now_tied;
    }

    /// Applies a plan: status, writes, notices, wake-up.
    fn apply<S: serde::Serialize>(&mut self, id: &CheckRef, plan: Plan<S>) {
        let key = check_key(id);
        let status = serde_json::to_value(&plan.status).unwrap_or(json!({}));
        if self.store.get(&key).and_then(|o| o.get("status")) != Some(&status) {
            self.history.push((self.t(), id.to_string(), status.clone()));
            self.store.set_status(&key, status);
            self.changed(&key);
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
        let Some(current) = self.store.get(&key) else { return };
        let patch = machine_status_patch(current, version, conditions);
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
        self.changed(&key);
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
        self.changed(&key);
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
        let Some((_, gone)) = self.store.request_delete(&key, self.now) else { return };
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
        self.changed(&key);
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
            && self.store.delete(&key).is_some()
        {
            self.changed(&key);
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
        if !self.store.contains(&key) {
            return false;
        }
        if self.store.patch(&key, &json!({"metadata": {"annotations": {annotation: value}}})).is_err() {
            return false;
        }
        self.changed(&key);
        true
    }

    /// Takes or renews a node Lease as the API server would let a writer: a create only when
    /// there is none, an update only of the version decided on. `false` (and an event) when it
    /// was refused.
    fn write_lease(&mut self, id: &CheckRef, lease: &vigil_engine::plan::LeaseWrite) -> bool {
        let manifest = lease.manifest();
        let key = Key::of(LOCAL_CLUSTER, &manifest);
        let written = match &lease.resource_version {
            None => self.store.create(LOCAL_CLUSTER, manifest, self.now).map_err(|_| "it exists already".to_string()),
            Some(rv) => self.store.replace_at(manifest, rv, self.now),
        };
        match written {
            Ok(_) => {
                self.changed(&key);
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
                if let Some((_, gone)) = self.store.remove_finalizer(&key, SIMULATED_FINALIZER) {
                    if gone {
                        let mut d = object_details(&key);
                        d.insert("message".into(), json!("the remediator finished and let go of its object"));
                        self.emit("RemediationFinished", None, Some(key.object_name()), d);
                    }
                    self.changed(&key);
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
        let now = api_time(self.now);
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
            let Some(list) = node.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { continue };
            let Some(c) = list.iter_mut().find(|c| c["type"] == h.type_.as_str()) else { continue };
            c["lastHeartbeatTime"] = json!(now);
            self.store.apply(&key.cluster, node, self.now);
            self.changed(&key);
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
        if !owner::asked(&old) {
            return;
        }
        if self.owner_paused(key, &old) {
            if let Some(model) = self.scenario.models.owner
                && self.scheduled_replacements.insert(key.clone())
            {
                self.schedule(model.replace_after, Task::ReplaceMachine(key.clone()));
            }
            return;
        }
        self.store.delete(key);
        self.changed(key);
        let node_name = text(&old, "/status/nodeRef/name").to_string();
        let node_cluster = self.node_cluster(&key.namespace, owner::cluster_name(&old));
        if !node_name.is_empty() {
            let node_key = Key {
                cluster: node_cluster,
                group: String::new(),
                kind: "Node".into(),
                namespace: String::new(),
                name: node_name,
            };
            if self.store.delete(&node_key).is_some() {
                self.changed(&node_key);
            }
        }
        self.task_seq += 1;
        let new_name = owner::replacement_name(&key.name, self.task_seq);
        let fresh = owner::replacement(&old, &new_name, &key.namespace);
        let new_key = self.store.apply(LOCAL_CLUSTER, fresh, self.now);
        let mut d = Map::new();
        d.insert("replacement".into(), json!(new_key.object_name()));
        self.emit("MachineReplaced", None, Some(key.object_name()), d);
        self.changed(&new_key);
        if let Some(model) = self.scenario.models.owner {
            self.schedule(model.node_ready_after, Task::JoinNode(new_key));
        }
    }

    /// Whether Cluster API's controllers leave `machine` alone for now ([`owner::paused`]).
    fn owner_paused(&self, key: &Key, machine: &Value) -> bool {
        let cluster_key = Key {
            cluster: key.cluster.clone(),
            group: key.group.clone(),
            kind: "Cluster".into(),
            namespace: key.namespace.clone(),
            name: owner::cluster_name(machine).to_string(),
        };
        owner::paused(machine, self.store.get(&cluster_key))
    }

    /// The new Machine's Node joins, Ready.
    fn join_node(&mut self, key: &Key) {
        let Some(machine) = self.store.get(key).cloned() else { return };
        let node_cluster = self.node_cluster(&key.namespace, owner::cluster_name(&machine));
        let node = owner::joined_node(&key.name, &api_time(self.now));
        let node_key = self.store.apply(&node_cluster, node, self.now);
        self.changed(&node_key);
        let node_ref = owner::node_ref(text(&machine, "/apiVersion"), &key.name);
        if self.store.patch(key, &json!({"status": {"nodeRef": node_ref}})).is_ok() {
            self.changed(key);
        }
        self.emit("NodeJoined", None, Some(key.name.clone()), Map::new());
    }

    /// A remediator model acts on its object: the Node recovers, or the object reports failure.
    fn remediator_acts(&mut self, key: &Key, outcome: RemediatorOutcome) {
        let Some(object) = self.store.get(key).cloned() else { return };
        let now = api_time(self.now);
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
                if !self.store.contains(&node_key) {
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
                self.changed(key);
                let mut d = object_details(key);
                d.insert("message".into(), json!(format!("{} {} brought the Node back", key.kind, key.object_name())));
                self.emit("NodeRecovered", None, Some(node), d);
            }
            RemediatorOutcome::Fails(_) => {
                let _ = self.store.patch(key, &json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "RemediationFailed", "message": "the remediator gave up", "lastTransitionTime": now}]}}));
                self.changed(key);
                let target = object["metadata"]["annotations"][NODE_NAME_ANNOTATION].as_str().map(str::to_string);
                self.emit("RemediationFailed", None, target, object_details(key));
            }
        }
    }

    /// The Node a remediation object is about: its node-name annotation (NodeHealthCheck), or
    /// the Node of the Machine that owns it (MachineHealthCheck).
    fn node_of(&self, object: &Value) -> Option<(String, String)> {
        if let Some(node) = object["metadata"]["annotations"][NODE_NAME_ANNOTATION].as_str() {
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
        let cluster_name = owner::cluster_name(machine);
        let node = text(machine, "/status/nodeRef/name");
        let node = if node.is_empty() { machine_name } else { node };
        Some((self.node_cluster(namespace, cluster_name), node.to_string()))
    }
}

fn object_details(key: &Key) -> Map<String, Value> {
    let mut d = Map::new();
    d.insert("kind".into(), json!(key.kind));
    d.insert("namespace".into(), json!(key.namespace));
    d.insert("name".into(), json!(key.name));
    d
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
