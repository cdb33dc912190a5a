//! The scenario file, format v1: objects present at the start, a timeline of changes on a virtual
//! clock, and optional stand-ins for the controllers around Vigil. The shape is a public contract
//! (docs/scenario.md); it only grows by optional fields.

use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use vigil_api::conditions::ConditionStatus;
use vigil_api::duration::parse_go_duration;
use vigil_api::well_known::DEFAULT_LEASE_NAMESPACE;

/// Where the virtual clock starts when a scenario does not say.
pub const DEFAULT_START: &str = "2030-01-01T00:00:00Z";

/// A scenario as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    start: Option<String>,
    duration: String,
    #[serde(default)]
    objects: Vec<Value>,
    #[serde(default)]
    workload_clusters: BTreeMap<String, Vec<Value>>,
    #[serde(default)]
    lease_namespace: Option<String>,
    #[serde(default)]
    timeline: Vec<RawStep>,
    #[serde(default)]
    models: Option<RawModels>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawStep {
    at: String,
    #[serde(default)]
    apply: Option<Value>,
    #[serde(default)]
    delete: Option<ObjectId>,
    #[serde(default)]
    set_node_condition: Option<NodeConditionChange>,
    #[serde(default)]
    cluster: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawModels {
    #[serde(default)]
    owner: Option<RawOwner>,
    #[serde(default)]
    remediators: Vec<RawRemediator>,
    #[serde(default)]
    heartbeats: Vec<RawHeartbeat>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHeartbeat {
    #[serde(rename = "type")]
    type_: String,
    every: String,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    until: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawOwner {
    replace_after: String,
    node_ready_after: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRemediator {
    kind: String,
    #[serde(default)]
    recover_after: Option<String>,
    #[serde(default)]
    succeeded: Option<bool>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    holds_deletion: Option<String>,
}

/// Names an object to delete.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectId {
    /// apiVersion of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// Namespace (omit for cluster-scoped objects).
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Sets one condition on a Node, as a kubelet would.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConditionChange {
    /// Node name (or use `node_selector`).
    #[serde(default)]
    pub node: String,
    /// Every Node carrying all these labels at that time (e.g. a zone), instead of one `node`.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Condition type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Reason to record.
    #[serde(default)]
    pub reason: Option<String>,
    /// Message to record.
    #[serde(default)]
    pub message: Option<String>,
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name, for output.
    pub name: String,
    /// Virtual time at the start.
    pub start: Timestamp,
    /// How long the run lasts.
    pub duration: SignedDuration,
    /// Objects present at the start (management cluster).
    pub objects: Vec<Value>,
    /// Nodes of workload clusters, keyed `namespace/clusterName`.
    pub workload_clusters: BTreeMap<String, Vec<Value>>,
    /// Where the medik8s node Leases are (`medik8s-leases` unless the scenario says).
    pub lease_namespace: String,
    /// Changes, in time order (stable for equal times).
    pub timeline: Vec<Step>,
    /// Stand-ins for other controllers.
    pub models: Models,
}

/// One change of the timeline.
#[derive(Debug, Clone)]
pub struct Step {
    /// Position in the file, for messages.
    pub index: usize,
    /// Offset from the start.
    pub at: SignedDuration,
    /// What changes.
    pub change: Change,
    /// Workload cluster it happens in (`namespace/clusterName`), or the management cluster.
    pub cluster: Option<String>,
}

/// What a step changes.
#[derive(Debug, Clone)]
pub enum Change {
    /// Create or replace an object whole.
    Apply(Value),
    /// Delete an object.
    Delete(ObjectId),
    /// Set a Node condition.
    SetNodeCondition(NodeConditionChange),
}

/// Stand-ins for the controllers around Vigil.
#[derive(Debug, Clone, Default)]
pub struct Models {
    /// A MachineSet-like owner that replaces Machines marked `OwnerRemediated=False`.
    pub owner: Option<OwnerModel>,
    /// Remediators by remediation kind.
    pub remediators: Vec<RemediatorModel>,
    /// Reporters that renew a condition's `lastHeartbeatTime` (a detector, the kubelet).
    pub heartbeats: Vec<HeartbeatModel>,
}

/// A reporter that renews one condition type's `lastHeartbeatTime`, as a detector does while it
/// is alive; after `until` it is dead and the heartbeats stop (the stale-signal guard's input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatModel {
    /// The condition type it reports, e.g. `KernelDeadlock`.
    pub type_: String,
    /// Time between two heartbeats.
    pub every: SignedDuration,
    /// Only Nodes with all these labels (every Node when empty).
    pub node_selector: BTreeMap<String, String>,
    /// Workload cluster (`namespace/clusterName`), or the management cluster.
    pub cluster: Option<String>,
    /// First heartbeat, from the start.
    pub from: SignedDuration,
    /// From this offset on, no heartbeat (the reporter died); `None`: never stops.
    pub until: Option<SignedDuration>,
}

/// The owner model's timings.
#[derive(Debug, Clone, Copy)]
pub struct OwnerModel {
    /// Delay between the request and the replacement Machine.
    pub replace_after: SignedDuration,
    /// Delay between the replacement and its Node being Ready.
    pub node_ready_after: SignedDuration,
}

/// What a remediator model does with the objects of its kind.
#[derive(Debug, Clone)]
pub struct RemediatorModel {
    /// Remediation kind it handles, e.g. `SelfNodeRemediation`.
    pub kind: String,
    /// What it does, and after how long.
    pub outcome: RemediatorOutcome,
    /// With it, the remediator puts its finalizer on each object and, once the object is
    /// deleted, removes it only after this long (self node remediation finishing its fencing).
    pub holds_deletion: Option<SignedDuration>,
}

/// A remediator model's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemediatorOutcome {
    /// The Node is Ready again after this long (and the object reports `Succeeded=True`).
    Recovers(SignedDuration),
    /// The object reports `Succeeded=False` after this long; the Node stays as it is.
    Fails(SignedDuration),
}

/// Why a scenario was refused: the entry and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScenarioError {
    /// The file is not valid YAML of the scenario's shape.
    #[error("not a valid scenario: {0}")]
    Syntax(String),
    /// One entry is wrong.
    #[error("{entry}: {message}")]
    Entry {
        /// Path of the entry, e.g. `timeline[2].at`.
        entry: String,
        /// What is wrong.
        message: String,
    },
}

fn entry(entry: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Entry { entry: entry.into(), message: message.into() }
}

fn duration(path: &str, text: &str) -> Result<SignedDuration, ScenarioError> {
    let d = parse_go_duration(text).map_err(|e| entry(path, format!("invalid value {text:?}: {e}")))?;
    if d.is_negative() {
        return Err(entry(path, format!("invalid value {text:?}: must not be negative")));
    }
    Ok(d)
}

impl Scenario {
    /// Parses and checks a scenario file's text.
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::checked(read(text)?)
    }

    /// Checks a scenario as read and fills in its defaults, whichever reader read it.
    fn checked(mut raw: RawScenario) -> Result<Scenario, ScenarioError> {
        let start_text = raw.start.as_deref().unwrap_or(DEFAULT_START);
        let start: Timestamp = start_text.parse().map_err(|_| {
            entry("start", format!("invalid value {start_text:?}: expected an RFC 3339 time such as {DEFAULT_START}"))
        })?;
        let duration_value = duration("duration", &raw.duration)?;
        if duration_value.is_zero() {
            return Err(entry("duration", "must be greater than zero"));
        }
        checked_objects(&mut raw.objects)?;
        checked_workload_clusters(&raw.workload_clusters)?;
        let timeline = checked_timeline(raw.timeline, (duration_value, &raw.duration), &raw.workload_clusters)?;
        let models = match raw.models {
            None => Models::default(),
            Some(m) => checked_models(m, &raw.workload_clusters)?,
        };
        Ok(Scenario {
            name: raw.name,
            start,
            duration: duration_value,
            objects: raw.objects,
            workload_clusters: raw.workload_clusters,
            lease_namespace: raw.lease_namespace.unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.to_string()),
            timeline,
            models,
        })
    }
}

/// Checks the objects (each a manifest, a health check as admission would take it, and once
/// only) and puts a namespaced object without a namespace in `default`.
fn checked_objects(objects: &mut [Value]) -> Result<(), ScenarioError> {
    let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (i, o) in objects.iter_mut().enumerate() {
        let path = format!("objects[{i}]");
        check_manifest(&path, o)?;
        default_namespace(o);
        check_health_check(&path, o)?;
        let (kind, namespace, name) =
            (text_at(o, "/kind"), text_at(o, "/metadata/namespace"), text_at(o, "/metadata/name"));
        let id = if namespace.is_empty() { format!("{kind} {name}") } else { format!("{kind} {namespace}/{name}") };
        if let Some(first) = seen.insert((kind, namespace, name), i) {
            return Err(entry(
                path,
                format!(
                    "{id} is already defined by objects[{first}]: each object may appear once (the API server would keep only the last)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks the workload clusters: each keyed `namespace/clusterName`, holding Nodes only.
fn checked_workload_clusters(clusters: &BTreeMap<String, Vec<Value>>) -> Result<(), ScenarioError> {
    for (key, nodes) in clusters {
        check_cluster_key(&format!("workloadClusters[{key:?}]"), key)?;
        for (i, n) in nodes.iter().enumerate() {
            let path = format!("workloadClusters[{key:?}][{i}]");
            check_manifest(&path, n)?;
            if n.get("kind").and_then(Value::as_str) != Some("Node") {
                return Err(entry(path, "a workload cluster holds Nodes only"));
            }
        }
    }
    Ok(())
}

/// Checks the timeline (each step within the scenario's `end` and in a known cluster) and sorts
/// it by time, steps at the same time in file order.
fn checked_timeline(
    steps: Vec<RawStep>,
    (end, end_text): (SignedDuration, &str),
    clusters: &BTreeMap<String, Vec<Value>>,
) -> Result<Vec<Step>, ScenarioError> {
    let mut timeline = Vec::with_capacity(steps.len());
    for (index, step) in steps.into_iter().enumerate() {
        let path = format!("timeline[{index}]");
        let at = duration(&format!("{path}.at"), &step.at)?;
        if at > end {
            return Err(entry(
                format!("{path}.at"),
                format!("invalid value {:?}: after the end of the scenario ({end_text})", step.at),
            ));
        }
        if let Some(cluster) = &step.cluster {
            check_cluster_key(&format!("{path}.cluster"), cluster)?;
            if !clusters.contains_key(cluster) {
                return Err(entry(
                    format!("{path}.cluster"),
                    format!("invalid value {cluster:?}: no such workload cluster in workloadClusters"),
                ));
            }
        }
        let cluster = step.cluster.clone();
        let change = checked_change(&path, step)?;
        timeline.push(Step { index, at, change, cluster });
    }
    timeline.sort_by_key(|s| s.at);
    Ok(timeline)
}

/// The one change a step makes: exactly one of `apply`, `delete`, `setNodeCondition`.
fn checked_change(path: &str, step: RawStep) -> Result<Change, ScenarioError> {
    match (step.apply, step.delete, step.set_node_condition) {
        (Some(mut m), None, None) => {
            check_manifest(&format!("{path}.apply"), &m)?;
            default_namespace(&mut m);
            check_health_check(&format!("{path}.apply"), &m)?;
            Ok(Change::Apply(m))
        }
        (None, Some(mut d), None) => {
            if d.namespace.as_deref().is_none_or(str::is_empty) && is_namespaced(&d.kind) {
                d.namespace = Some(DEFAULT_NAMESPACE.into());
            }
            Ok(Change::Delete(d))
        }
        (None, None, Some(c)) => {
            if c.node.is_empty() == c.node_selector.is_empty() {
                return Err(entry(format!("{path}.setNodeCondition"), "needs exactly one of node, nodeSelector"));
            }
            if ConditionStatus::parse(&c.status).is_none() {
                return Err(entry(
                    format!("{path}.setNodeCondition.status"),
                    format!("invalid value {:?}: must be True, False or Unknown (quote it in YAML)", c.status),
                ));
            }
            Ok(Change::SetNodeCondition(c))
        }
        _ => Err(entry(path, "needs exactly one of apply, delete, setNodeCondition")),
    }
}

/// Checks the models: the owner's delays, each remediator, each heartbeat reporter.
fn checked_models(m: RawModels, clusters: &BTreeMap<String, Vec<Value>>) -> Result<Models, ScenarioError> {
    let owner = match m.owner {
        None => None,
        Some(o) => Some(OwnerModel {
            replace_after: duration("models.owner.replaceAfter", &o.replace_after)?,
            node_ready_after: duration("models.owner.nodeReadyAfter", &o.node_ready_after)?,
        }),
    };
    let mut remediators = Vec::new();
    for (i, r) in m.remediators.into_iter().enumerate() {
        remediators.push(remediator_model(&format!("models.remediators[{i}]"), r)?);
    }
    let mut heartbeats = Vec::new();
    for (i, h) in m.heartbeats.into_iter().enumerate() {
        heartbeats.push(heartbeat_model(&format!("models.heartbeats[{i}]"), h, clusters)?);
    }
    Ok(Models { owner, remediators, heartbeats })
}

/// Checks one remediator model: a kind, and either `recoverAfter` or `succeeded: false` with
/// `after`.
fn remediator_model(path: &str, r: RawRemediator) -> Result<RemediatorModel, ScenarioError> {
    if r.kind.is_empty() {
        return Err(entry(format!("{path}.kind"), "must not be empty"));
    }
    let outcome = match (r.recover_after, r.succeeded, r.after) {
        (Some(d), None | Some(true), None) => {
            RemediatorOutcome::Recovers(duration(&format!("{path}.recoverAfter"), &d)?)
        }
        (None, Some(false), Some(d)) => RemediatorOutcome::Fails(duration(&format!("{path}.after"), &d)?),
        _ => return Err(entry(path, "needs either recoverAfter, or succeeded: false with after")),
    };
    let holds_deletion = match r.holds_deletion {
        Some(d) => Some(duration(&format!("{path}.holdsDeletion"), &d)?),
        None => None,
    };
    Ok(RemediatorModel { kind: r.kind, outcome, holds_deletion })
}

/// Checks one heartbeat model: a type, a positive period, a known cluster, `from` ≤ `until`.
fn heartbeat_model(
    path: &str,
    h: RawHeartbeat,
    workload_clusters: &BTreeMap<String, Vec<Value>>,
) -> Result<HeartbeatModel, ScenarioError> {
    if h.type_.trim().is_empty() {
        return Err(entry(format!("{path}.type"), "must not be empty"));
    }
    let every = duration(&format!("{path}.every"), &h.every)?;
    if every.is_zero() {
        return Err(entry(format!("{path}.every"), format!("invalid value {:?}: must be greater than zero", h.every)));
    }
    if let Some(cluster) = &h.cluster {
        check_cluster_key(&format!("{path}.cluster"), cluster)?;
        if !workload_clusters.contains_key(cluster) {
            return Err(entry(
                format!("{path}.cluster"),
                format!("invalid value {cluster:?}: no such workload cluster in workloadClusters"),
            ));
        }
    }
    let from = match &h.from {
        Some(text) => duration(&format!("{path}.from"), text)?,
        None => SignedDuration::ZERO,
    };
    let until = match &h.until {
        Some(text) => {
            let until = duration(&format!("{path}.until"), text)?;
            if until < from {
                return Err(entry(format!("{path}.until"), format!("invalid value {text:?}: before from")));
            }
            Some(until)
        }
        None => None,
    };
    Ok(HeartbeatModel { type_: h.type_, every, node_selector: h.node_selector, cluster: h.cluster, from, until })
}

/// The namespace kubectl uses for a namespaced object that names none.
const DEFAULT_NAMESPACE: &str = "default";

/// Kinds that have no namespace (the others the simulator meets are namespaced).
const CLUSTER_SCOPED_KINDS: [&str; 5] = ["Node", "NodeHealthCheck", "Namespace", "NodeMaintenance", "ClusterVersion"];

fn is_namespaced(kind: &str) -> bool {
    !CLUSTER_SCOPED_KINDS.contains(&kind)
}

fn text_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Puts a namespaced object that names no namespace in `default`, as kubectl would.
fn default_namespace(v: &mut Value) {
    if !is_namespaced(&text_at(v, "/kind")) || !text_at(v, "/metadata/namespace").is_empty() {
        return;
    }
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), Value::String(DEFAULT_NAMESPACE.into()));
    }
}

/// A health check in a scenario must pass the admission rules, as the API server would demand:
/// a policy test that passes with a policy the cluster refuses would be worse than none.
fn check_health_check(path: &str, v: &Value) -> Result<(), ScenarioError> {
    use vigil_api::manifest;
    if !matches!(text_at(v, "/kind").as_str(), "MachineHealthCheck" | "NodeHealthCheck") {
        return Ok(());
    }
    let check = manifest::health_check_from_value(v).map_err(|e| entry(path, e.to_string()))?;
    check.validate().map_err(|e| entry(path, manifest::as_written(v, e).to_string()))
}

/// Reads a scenario's text. JSON (first character `{`) goes to a JSON reader, many times faster on
/// a fleet; a text it refuses, or one over the YAML reader's limits, goes to the YAML reader, so a
/// YAML flow mapping reads as before and every refusal keeps its message.
fn read(text: &str) -> Result<RawScenario, ScenarioError> {
    if text.trim_start().starts_with('{')
        && let Some(raw) = read_json(text)
    {
        return Ok(raw);
    }
    read_yaml(text)
}

/// The JSON reader: only for a text within the limits the YAML reader would apply to it, and with
/// no mapping that repeats a key (YAML refuses those; serde_json would keep the last).
fn read_json(text: &str) -> Option<RawScenario> {
    let budget = yaml_options().budget?;
    if !json_fits(text.as_bytes(), &budget) {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// The YAML reader, with its limits and messages.
fn read_yaml(text: &str) -> Result<RawScenario, ScenarioError> {
    serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| match e.without_snippet() {
        serde_saphyr::Error::Budget { breach, .. } => ScenarioError::Syntax(too_large(breach)),
        _ => ScenarioError::Syntax(e.to_string()),
    })
}

/// Longest key the JSON reader takes; a longer one goes to the YAML reader, which limits how far
/// it looks for the `:` after a key (1024 characters).
const JSON_MAX_KEY_BYTES: usize = 512;

/// Counts in a JSON text what the YAML reader would count in it — values (keys included), events
/// (a scalar one, a mapping or list two, four for the stream and document), nesting and text — and
/// says whether all stay within `budget`, no mapping repeats a key, and no key is escaped or long.
/// Only meaningful for valid JSON: on anything else serde_json refuses the text afterwards.
fn json_fits(text: &[u8], budget: &serde_saphyr::Budget) -> bool {
    if text.len() > budget.max_total_scalar_bytes || budget.max_reader_input_bytes.is_some_and(|m| text.len() > m) {
        return false;
    }
    let mut scan = JsonScan { nodes: 0, events: 4, open: Vec::new(), keys: Vec::new(), expect_key: false };
    let mut i = 0;
    while i < text.len() {
        let byte = text[i];
        i += 1;
        let fits = match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b':' => true,
            b'{' | b'[' => scan.open(byte == b'{', budget),
            b'}' | b']' => scan.close(),
            b',' => {
                scan.expect_key = scan.open.last() == Some(&true);
                true
            }
            b'"' => {
                let start = i;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                let end = i.min(text.len());
                i += 1;
                scan.scalar(&text[start..end], budget)
            }
            _ => {
                while i < text.len() && !matches!(text[i], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r' | b':') {
                    i += 1;
                }
                scan.expect_key = false;
                scan.count(1, budget)
            }
        };
        if !fits {
            return false;
        }
    }
    true
}

/// The state of [`json_fits`]: the counts, the open mappings (`true`) and lists, and the keys of
/// each open level.
struct JsonScan<'a> {
    nodes: usize,
    events: usize,
    open: Vec<bool>,
    keys: Vec<Vec<&'a [u8]>>,
    expect_key: bool,
}

impl<'a> JsonScan<'a> {
    fn count(&mut self, events: usize, budget: &serde_saphyr::Budget) -> bool {
        self.nodes += 1;
        self.events += events;
        self.nodes <= budget.max_nodes && self.events <= budget.max_events
    }

    fn open(&mut self, mapping: bool, budget: &serde_saphyr::Budget) -> bool {
        self.open.push(mapping);
        if self.keys.len() < self.open.len() {
            self.keys.push(Vec::new());
        }
        self.keys[self.open.len() - 1].clear();
        self.expect_key = mapping;
        self.open.len() <= budget.max_depth && self.count(2, budget)
    }

    fn close(&mut self) -> bool {
        self.expect_key = false;
        let Some(mapping) = self.open.pop() else { return false };
        if !mapping {
            return true;
        }
        let keys = &mut self.keys[self.open.len()];
        keys.sort_unstable();
        keys.windows(2).all(|pair| pair[0] != pair[1])
    }

    fn scalar(&mut self, raw: &'a [u8], budget: &serde_saphyr::Budget) -> bool {
        if self.expect_key {
            self.expect_key = false;
            if raw.contains(&b'\\') || raw.len() > JSON_MAX_KEY_BYTES {
                return false;
            }
            if let Some(keys) = self.keys.get_mut(self.open.len().wrapping_sub(1)) {
                keys.push(raw);
            }
        }
        self.count(1, budget)
    }
}

/// Reading limits of scenario files: far above any fleet Vigil is tested with (20 000 Nodes with
/// anchors and merge keys), while a file built to exhaust memory is still refused.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 40_000_000;
    budget.max_nodes = 20_000_000;
    budget.max_aliases = 2_000_000;
    budget.max_anchors = 2_000_000;
    budget.max_merge_keys = 2_000_000;
    budget.max_total_scalar_bytes = 512 * 1024 * 1024;
    budget.max_reader_input_bytes = Some(512 * 1024 * 1024);
    // Many merges of one anchored Node is how a fleet is written; the limits above bound what
    // aliases can expand to.
    budget.enforce_alias_anchor_ratio = false;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// A limit of the YAML reader, said in a user's words.
fn too_large(breach: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    let what = match breach {
        B::Events { .. } | B::Nodes { .. } => "more than 20 000 000 YAML values (keys, values, lists)".to_string(),
        B::Aliases { .. } => "more than 2 000 000 aliases (*name)".to_string(),
        B::Anchors { .. } => "more than 2 000 000 anchors (&name)".to_string(),
        B::MergeKeys { .. } => "more than 2 000 000 merge keys (<<)".to_string(),
        B::ScalarBytes { .. } | B::InputBytes { .. } => "more than 512 MiB of text".to_string(),
        B::Depth { depth } => format!("values nested {depth} deep (the limit is 64)"),
        B::RecordedAnchorEvents { .. } | B::RecordedAnchorBytes { .. } => {
            "anchored values too large to repeat (an anchor holding a whole fleet?)".to_string()
        }
        other => format!("a YAML reading limit ({other:?})"),
    };
    format!(
        "the file is too large for the simulator: it has {what}; split the fleet into several scenarios, \
         or anchor one Node and merge it (<<: *node) rather than repeating fields"
    )
}

fn check_cluster_key(path: &str, key: &str) -> Result<(), ScenarioError> {
    match key.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(()),
        _ => Err(entry(path, format!("invalid value {key:?}: expected <namespace>/<clusterName>"))),
    }
}

/// Every manifest needs apiVersion, kind and metadata.name; timestamps must be RFC 3339.
fn check_manifest(path: &str, v: &Value) -> Result<(), ScenarioError> {
    if !v.is_object() {
        return Err(entry(path, "must be a manifest (a mapping with apiVersion, kind, metadata)"));
    }
    for field in ["apiVersion", "kind"] {
        if v.get(field).and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(entry(path, format!("{field} must be set")));
        }
    }
    let id = format!(
        "{} {}",
        v.get("kind").and_then(Value::as_str).unwrap_or(""),
        v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<unnamed>")
    );
    if v.pointer("/metadata/name").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(entry(path, format!("{id}: metadata.name must be set")));
    }
    if let Some(ts) = v.pointer("/metadata/creationTimestamp")
        && ts.as_str().is_none_or(|s| s.parse::<Timestamp>().is_err())
    {
        return Err(entry(
            path,
            format!("{id}: metadata.creationTimestamp: invalid value {ts}: expected an RFC 3339 time"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Scenario::parse(text).expect_err("invalid").to_string()
    }

    #[test]
    fn parses_the_documented_shape() {
        let s = Scenario::parse(
            r#"
name: demo
duration: 10m
objects:
  - {apiVersion: v1, kind: Node, metadata: {name: n1}}
timeline:
  - at: 3m
    setNodeCondition: {node: n1, type: Ready, status: "False"}
  - at: 90s
    delete: {apiVersion: v1, kind: Node, name: n1}
models:
  owner: {replaceAfter: 2m, nodeReadyAfter: 5m}
  remediators:
    - {kind: SelfNodeRemediation, recoverAfter: 3m}
    - {kind: FenceAgentsRemediation, succeeded: false, after: 2m}
  heartbeats:
    - {type: KernelDeadlock, every: 30s, nodeSelector: {role: worker}, until: 8m}
"#,
        )
        .expect("valid");
        assert_eq!(s.start, DEFAULT_START.parse::<Timestamp>().expect("ts"));
        assert_eq!(s.timeline[0].at, SignedDuration::from_secs(90), "sorted by time");
        assert_eq!(s.timeline[0].index, 1, "keeps its position in the file for messages");
        assert_eq!(s.models.remediators[1].outcome, RemediatorOutcome::Fails(SignedDuration::from_secs(120)));
        let h = &s.models.heartbeats[0];
        assert_eq!(
            (h.every, h.from, h.until),
            (SignedDuration::from_secs(30), SignedDuration::ZERO, Some(SignedDuration::from_secs(480)))
        );
    }

    fn examples() -> Vec<(String, String)> {
        let dir = format!("{}/../../examples", env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        for file in std::fs::read_dir(&dir).expect("examples") {
            let path = file.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                out.push((path.display().to_string(), std::fs::read_to_string(&path).expect("example")));
            }
        }
        assert!(out.len() > 5, "the examples are found");
        out
    }

    /// A YAML scenario written as JSON, as a converting tool would (anchors and merges expanded).
    pub(crate) fn as_json(yaml: &str) -> String {
        let value: Value = serde_saphyr::from_str_with_options(yaml, yaml_options()).expect("valid YAML");
        serde_json::to_string_pretty(&value).expect("JSON")
    }

    #[test]
    fn every_example_as_json_is_read_by_the_json_reader_as_the_same_scenario() {
        for (name, yaml) in examples() {
            let json = as_json(&yaml);
            let from_yaml = read_yaml(&yaml).expect("example reads");
            assert_eq!(read_json(&json).as_ref(), Some(&from_yaml), "{name}");
            assert_eq!(read_yaml(&json).as_ref(), Ok(&from_yaml), "{name}: the YAML reader agrees on the JSON");
        }
    }

    #[test]
    fn json_values_read_as_the_yaml_reader_reads_them() {
        let text = r#"{"name": "e\u00e9\n\t\"\/\\ ü", "duration": "5m", "objects": [{"apiVersion": "v1",
            "kind": "Node", "metadata": {"name": "n", "labels": {"a/b": "", "c": "1"}},
            "x": [0, -1, 1.5, -2.5e3, 1E2, 0.1, 18446744073709551615, -9223372036854775808, true, false, null, "", {}, []],
            "y": "\ud83d\ude00 \b\f\r"}]}"#;
        let json = read_json(text).expect("the JSON reader reads it");
        assert_eq!(Ok(json), read_yaml(text));
    }

    #[test]
    fn a_flow_mapping_that_is_not_json_is_read_as_yaml() {
        let text = "{name: flow, duration: 5m, objects: [{apiVersion: v1, kind: Node, metadata: {name: n1}}]} # note\n";
        assert_eq!(read_json(text), None);
        let s = Scenario::parse(text).expect("valid YAML");
        assert_eq!((s.name.as_str(), s.objects.len()), ("flow", 1));
    }

    #[test]
    fn a_json_scenario_is_checked_and_defaulted_as_a_yaml_one() {
        let text = r#"{"name": "x", "duration": "5 minutes"}"#;
        assert!(read_json(text).is_some(), "read as JSON, refused by the checks after");
        assert_eq!(
            err(text),
            r#"duration: invalid value "5 minutes": is not a duration; expected a number with a unit (ns, us, ms, s, m, h), e.g. 300s, 10m or 1h30m"#
        );
        let text = r#"{"name": "x", "duration": "5m", "objects": [
            {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m"}},
            {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m", "namespace": "default"}}]}"#;
        assert_eq!(
            err(text),
            "objects[1]: Machine default/m is already defined by objects[0]: each object may appear once (the API server would keep only the last)"
        );
        let s = Scenario::parse(
            r#"{"name": "x", "duration": "5m", "objects": [
            {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m"}}]}"#,
        )
        .expect("valid");
        assert_eq!(s.objects[0].pointer("/metadata/namespace"), Some(&Value::from("default")));
        assert_eq!(
            (s.start, s.lease_namespace.as_str()),
            (DEFAULT_START.parse().expect("ts"), DEFAULT_LEASE_NAMESPACE)
        );
    }

    #[test]
    fn a_json_scenario_the_json_reader_refuses_keeps_the_yaml_readers_message() {
        let deep = format!(r#"{{"name": "x", "duration": "5m", "objects": [{}1{}]}}"#, "[".repeat(70), "]".repeat(70));
        let cases = [
            (r#"{"name": "x", "duration": "5m", "bogus": 1}"#.to_string(), "bogus"),
            (r#"{"name": "x", "duration": "5m","#.to_string(), ""),
            (r#"{"name": "x", "duration": "5m", "duration": "6m"}"#.to_string(), "duplicate"),
            (
                r#"{"name": "x", "duration": "5m", "objects": [{"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "a", "name": "b"}}]}"#
                    .to_string(),
                "duplicate",
            ),
            (deep, "values nested 65 deep"),
        ];
        for (text, says) in cases {
            assert_eq!(read_json(&text), None, "{text}");
            let before = read_yaml(&text).map(|_| ()).expect_err("the YAML reader refuses it");
            assert!(before.to_string().to_lowercase().contains(says), "{before}");
            assert_eq!(read(&text).map(|_| ()), Err(before), "{text}");
        }
        // What serde_json refuses and the YAML reader takes reads as before.
        let text = r#"{"name": "x", "duration": "5m", "models": {"remediators": [{"kind": "X", "succeeded": "false", "after": "1m"}]}}"#;
        assert_eq!(read_json(text), None);
        assert_eq!(read(text), read_yaml(text));
    }

    /// Whether the YAML reader takes `text` within `budget`.
    fn yaml_fits(text: &str, budget: &serde_saphyr::Budget) -> bool {
        let mut options = yaml_options();
        options.budget = Some(budget.clone());
        serde_saphyr::from_str_with_options::<Value>(text, options).is_ok()
    }

    #[test]
    fn the_json_reader_counts_as_the_yaml_reader_does() {
        let text = r#"{"a": [1, "x", {"b": null}], "c": true}"#;
        // The text bounds its scalars' bytes: that limit is applied early (the YAML reader decides).
        type SetLimit = fn(&mut serde_saphyr::Budget, usize);
        let limits: [(SetLimit, usize, bool); 4] = [
            (|b, n| b.max_nodes = n, 10, true),
            (|b, n| b.max_events = n, 17, true),
            (|b, n| b.max_depth = n, 3, true),
            (|b, n| b.max_total_scalar_bytes = n, text.len(), false),
        ];
        for (set, limit, exact) in limits {
            for n in [limit - 1, limit] {
                let mut budget = yaml_options().budget.expect("budget");
                set(&mut budget, n);
                assert_eq!(json_fits(text.as_bytes(), &budget), n == limit, "limit {n}");
                assert!(yaml_fits(text, &budget) || n < limit, "the YAML reader takes it at {n}");
                assert!(!exact || yaml_fits(text, &budget) == (n == limit), "the YAML reader's limit is {limit}");
            }
        }
        let budget = yaml_options().budget.expect("budget");
        for (text, fits) in [
            (r#"{"a": {"b": 1, "b": 2}}"#, false),
            (r#"{"a": {"b": 1}, "c": {"b": 2}, "d": [{"b": 1}, {"b": 1}]}"#, true),
            (r#"{"\u0061": 1}"#, false),
            (r#"{"a\"b": 1, "c": "\"{["}"#, false),
            (r#"{"c": "\"{[\\", "d": "]}"}"#, true),
        ] {
            assert_eq!(json_fits(text.as_bytes(), &budget), fits, "{text}");
        }
    }

    #[test]
    fn errors_name_the_entry() {
        assert_eq!(
            err("name: x\nduration: 5 minutes\n"),
            r#"duration: invalid value "5 minutes": is not a duration; expected a number with a unit (ns, us, ms, s, m, h), e.g. 300s, 10m or 1h30m"#
        );
        assert_eq!(
            err("name: x\nduration: 5m\ntimeline:\n  - at: 6m\n    delete: {apiVersion: v1, kind: Node, name: n}\n"),
            r#"timeline[0].at: invalid value "6m": after the end of the scenario (5m)"#
        );
        assert_eq!(
            err("name: x\nduration: 5m\ntimeline:\n  - at: 1m\n"),
            "timeline[0]: needs exactly one of apply, delete, setNodeCondition"
        );
        assert_eq!(
            err("name: x\nduration: 5m\nobjects:\n  - {apiVersion: v1, kind: Node, metadata: {}}\n"),
            "objects[0]: Node <unnamed>: metadata.name must be set"
        );
        assert_eq!(
            err("name: x\nduration: 5m\nstart: tomorrow\n"),
            r#"start: invalid value "tomorrow": expected an RFC 3339 time such as 2030-01-01T00:00:00Z"#
        );
        assert_eq!(
            err(
                "name: x\nduration: 5m\ntimeline:\n  - at: 1m\n    cluster: default/nope\n    delete: {apiVersion: v1, kind: Node, name: n}\n"
            ),
            r#"timeline[0].cluster: invalid value "default/nope": no such workload cluster in workloadClusters"#
        );
        assert_eq!(
            err("name: x\nduration: 5m\nmodels:\n  remediators:\n    - {kind: X}\n"),
            "models.remediators[0]: needs either recoverAfter, or succeeded: false with after"
        );
        assert!(err("name: x\nduration: 5m\nbogus: 1\n").contains("bogus"));
        // A scenario larger than the parser's default budget (250 000 nodes) still parses.
        let mut big = String::from("name: big\nduration: 5m\nobjects:\n");
        for i in 0..30_000 {
            big.push_str(&format!(
                "  - {{apiVersion: v1, kind: Node, metadata: {{name: n{i}, labels: {{a: b, c: d, e: f}}}}}}\n"
            ));
        }
        assert_eq!(Scenario::parse(&big).map(|s| s.objects.len()), Ok(30_000));
        assert_eq!(
            err("name: x\nduration: 5m\nmodels:\n  heartbeats:\n    - {type: KernelDeadlock, every: 0s}\n"),
            r#"models.heartbeats[0].every: invalid value "0s": must be greater than zero"#
        );
        assert_eq!(
            err(
                "name: x\nduration: 5m\nmodels:\n  heartbeats:\n    - {type: KernelDeadlock, every: 1m, from: 3m, until: 2m}\n"
            ),
            r#"models.heartbeats[0].until: invalid value "2m": before from"#
        );
        assert_eq!(
            err(
                "name: x\nduration: 5m\ntimeline:\n  - at: 1m\n    setNodeCondition: {node: n, nodeSelector: {zone: b}, type: Ready, status: Unknown}\n"
            ),
            "timeline[0].setNodeCondition: needs exactly one of node, nodeSelector"
        );
    }
}
