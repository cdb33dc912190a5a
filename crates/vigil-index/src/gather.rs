//! Gather: one decision. A check's observed state is read from the indexes into the engine's
//! input, the engine decides, and the plan becomes an owned [`Job`] (typed: what a partly sent
//! plan leaves out is the engine's [`vigil_engine::partial::leave_out`]). Everything here runs
//! under the index read lock, without I/O. Who holds which target is [`crate::claims`].

use crate::claims::{RemediationIndex, as_lookups, holders_for, node_cluster};
use crate::index::{Candidate, Index, WorkloadCluster};
use crate::sources::Need;
use crate::sources::SourceState;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use vigil_api::api_version::ApiVersion;
use vigil_api::reason::Reason;
use vigil_api::validate::{self, MhcPolicy, NhcPolicy};
use vigil_api::views::{MachineView, RemediationView, TemplateView};
use vigil_api::{MachineHealthCheck, MachineHealthCheckStatus, NodeHealthCheck, NodeHealthCheckStatus};
use vigil_engine::concerns::group_of;
use vigil_engine::expiry::expiry;
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::partial::{self, Requests};
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER, Target};
use vigil_engine::{Action, Plan};

/// A check's status as a plan says it should be, of either kind, so one [`Job`] carries either
/// plan typed (serialized as the status itself).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum CheckStatus {
    /// A MachineHealthCheck's status.
    Machine(MachineHealthCheckStatus),
    /// A NodeHealthCheck's status.
    Node(NodeHealthCheckStatus),
}

impl Requests for CheckStatus {
    fn forget(&mut self, unsent: &[(&str, &Value)]) {
        match self {
            CheckStatus::Machine(s) => s.forget(unsent),
            CheckStatus::Node(s) => s.forget(unsent),
        }
    }
}

/// A decided plan, with everything its writes need, owned.
pub struct Job {
    /// The check.
    pub key: CheckRef,
    /// The engine's plan; actions left out while confirming or applying are taken out of it
    /// with [`Job::leave_out`].
    pub plan: Plan<CheckStatus>,
    /// The check as stored when it was decided (shared with the index, nothing copied): its
    /// status is read to send only what changed, and only when the plan's differs.
    pub current: Option<StoredCheck>,
    /// The cached entries of the Machines the actions patch, by their target
    /// ([`vigil_engine::plan::ObjectRef::machine_target`]): what each condition write is built
    /// from (`MachineEntry::basis`).
    pub machines: HashMap<Target, crate::index::MachineEntry>,
    /// Watches the check needs.
    pub needs: BTreeSet<Need>,
    /// UID of the check, for events.
    pub uid: Option<String>,
    /// The check's `resourceVersion` when it was decided: the status write carries it, so a
    /// status written since (by another replica, or a late write) refuses it.
    pub resource_version: Option<String>,
    /// For each target the plan writes to, when its unhealthy condition's timeout ran out (for
    /// the detection-latency metric), by the target the plan names (a Machine or a local Node).
    pub expiries: HashMap<Target, Timestamp>,
    /// Whether the check must be decided again right after this job (some of its remediations
    /// were left out while confirming).
    pub again: bool,
}

/// A check as the index stores it, of either kind: what a [`Job`]'s status is compared with.
#[derive(Debug, Clone)]
pub enum StoredCheck {
    /// A MachineHealthCheck.
    Machine(Arc<MachineHealthCheck>),
    /// A NodeHealthCheck.
    Node(Arc<NodeHealthCheck>),
}

impl StoredCheck {
    /// Whether the stored status is `status` exactly (typed: no copy, no JSON); a check without
    /// one says the empty status.
    fn says(&self, status: &CheckStatus) -> bool {
        match (self, status) {
            (StoredCheck::Machine(c), CheckStatus::Machine(s)) => {
                c.status.as_ref().map_or(*s == Default::default(), |c| c == s)
            }
            (StoredCheck::Node(c), CheckStatus::Node(s)) => {
                c.status.as_ref().map_or(*s == Default::default(), |c| c == s)
            }
            _ => false,
        }
    }

    /// Whether the check has a status yet (a decided job of one that has none sends it whole).
    fn has_status(&self) -> bool {
        match self {
            StoredCheck::Machine(c) => c.status.is_some(),
            StoredCheck::Node(c) => c.status.is_some(),
        }
    }

    /// The stored status as JSON, for the merge patch (`None`: the check has none yet).
    fn status_json(&self) -> Option<Value> {
        match self {
            StoredCheck::Machine(c) => c.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
            StoredCheck::Node(c) => c.status.as_ref().and_then(|s| serde_json::to_value(s).ok()),
        }
    }
}

impl Job {
    /// A job for `key`'s `plan`, the check as stored being `current` (`wrap` says which kind).
    fn new<S>(key: CheckRef, plan: Plan<S>, current: Option<StoredCheck>, wrap: fn(S) -> CheckStatus) -> Self {
        let plan = Plan {
            status: wrap(plan.status),
            actions: plan.actions,
            notices: plan.notices,
            next_wake: plan.next_wake,
            held_elsewhere: plan.held_elsewhere,
            short_circuited: plan.short_circuited,
            remediating: plan.remediating,
        };
        Job {
            key,
            plan,
            current,
            machines: HashMap::new(),
            needs: BTreeSet::new(),
            uid: None,
            resource_version: None,
            expiries: HashMap::new(),
            again: false,
        }
    }

    /// Leaves out `actions` that were not confirmed or failed: the status no longer reports
    /// the remediation objects they would have created, nor are their requests announced.
    pub fn leave_out(&mut self, actions: &[Action]) {
        partial::leave_out(&mut self.plan, actions);
    }

    /// The check's status to send as a merge patch, when it differs from the stored one.
    pub fn status_patch(&self) -> Option<Value> {
        let current = match &self.current {
            Some(stored) if stored.says(&self.plan.status) => return None,
            Some(stored) => stored,
            None => return status_if_changed(None, &self.plan.status),
        };
        // A MachineHealthCheck's `targets` names every Machine it selects: when the list did not
        // change, the rest is compared without it, so moving one count does not render
        // thousands of names twice only to find them equal.
        if let (StoredCheck::Machine(check), CheckStatus::Machine(new)) = (current, &self.plan.status)
            && let Some(stored) = check.status.as_ref().filter(|s| s.targets == new.targets)
        {
            let stored = serde_json::to_value(without_targets(stored)).ok();
            return status_if_changed(stored.as_ref(), &without_targets(new));
        }
        status_if_changed(current.status_json().as_ref(), &self.plan.status)
    }

    /// Leaves out every remediation of a target that was not confirmed (not locked, not read,
    /// or outside what the plan was confirmed about: decided on cached claims), and says to
    /// decide the check again if any was.
    pub fn keep_confirmed(&mut self, confirmed: &BTreeSet<Target>) {
        let mut left_out: Vec<Action> = Vec::new();
        let mut kept = Vec::with_capacity(self.plan.actions.len());
        for action in std::mem::take(&mut self.plan.actions) {
            match action.remediates() {
                Some(t) if !confirmed.contains(&t) => left_out.push(action),
                _ => kept.push(action),
            }
        }
        self.plan.actions = kept;
        if !left_out.is_empty() {
            self.again = true;
            self.leave_out(&left_out);
        }
    }
}

fn kind_needs(api_version: &str, template_kind: &str, remediation_kind: &str) -> [Need; 2] {
    let ApiVersion { group, version } = ApiVersion::parse(api_version);
    let (group, version) = (group.to_string(), version.to_string());
    [
        Need::Kind { group: group.clone(), version: version.clone(), kind: template_kind.to_string(), template: true },
        Need::Kind { group, version, kind: remediation_kind.to_string(), template: false },
    ]
}

/// Why a check cannot be decided now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unsure {
    /// A source is being listed (at start, a template kind newly watched, a shard just taken):
    /// nothing is decided and nothing written until the list is in, as the last decision's status
    /// still stands (a failed list turns into [`Unsure::Failed`]).
    Listing(String),
    /// A watch failed and the cache may be stale: said in the check's status and an Event.
    Failed(String),
}

impl Unsure {
    fn why(&self) -> &str {
        match self {
            Unsure::Listing(w) | Unsure::Failed(w) => w,
        }
    }
}

fn waiting(state: &SourceState, what: &str) -> Option<Unsure> {
    match state {
        SourceState::Synced => None,
        SourceState::Syncing => Some(Unsure::Listing(format!("waiting for the first complete list of {what}"))),
        SourceState::Failed(e) => {
            Some(Unsure::Failed(format!("the watch of {what} failed ({e}); the cache may be stale")))
        }
    }
}

/// Why a check that cannot be decided for `unsure` (not empty) says so, with every reason; `None`
/// while its sources are only listing (nothing is decided, nothing written).
fn failed_sources(unsure: &[Unsure]) -> Option<String> {
    if unsure.iter().all(|u| matches!(u, Unsure::Listing(_))) {
        return None;
    }
    Some(unsure.iter().map(Unsure::why).collect::<Vec<_>>().join("; "))
}

/// The job of a check decided on nothing: its status as stored (none written, none told).
fn unchanged_job<S: Clone + Default>(
    key: &CheckRef,
    meta: &ObjectMeta,
    (status, stored): (Option<&S>, StoredCheck),
    wrap: fn(S) -> CheckStatus,
) -> Job {
    let status = status.cloned().unwrap_or_default();
    Job {
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Job::new(key.clone(), Plan::unchanged(status), Some(stored), wrap)
    }
}

/// `status` with an empty `targets` list and the rest copied (every field named, so one added
/// later cannot be left out of the comparison unnoticed).
fn without_targets(status: &MachineHealthCheckStatus) -> MachineHealthCheckStatus {
    let MachineHealthCheckStatus {
        expected_machines,
        current_healthy,
        remediations_allowed,
        targets: _,
        conditions,
        observed_generation,
        features,
    } = status;
    MachineHealthCheckStatus {
        expected_machines: *expected_machines,
        current_healthy: *current_healthy,
        remediations_allowed: *remediations_allowed,
        targets: Vec::new(),
        conditions: conditions.clone(),
        observed_generation: *observed_generation,
        features: features.clone(),
    }
}

/// Reason of `RemediationAllowed=False` when no decision can be made.
pub const REASON_WAITING: Reason = Reason::WaitingForCaches;
/// Reason when the spec cannot be read or validated.
pub const REASON_INVALID: Reason = Reason::InvalidSpec;

/// The status to send as a merge patch when it changed: only what differs from the stored
/// status (RFC 7386), so a decision that moves one target's verdict does not send the check's
/// whole `targets` list again. A field the new status leaves out (an emptied list such as
/// `wouldRemediate`, a cleared time) is sent as `null`, since a merge patch keeps every field it
/// does not name; lists are sent whole when they changed (a merge patch replaces a list).
fn status_if_changed<S: serde::Serialize>(current: Option<&Value>, new: &S) -> Option<Value> {
    let new = serde_json::to_value(new).ok()?;
    match current {
        Some(current) => merge_diff(current, &new),
        None => Some(new),
    }
}

/// The merge patch that turns `current` into `new`; `None` when they are equal.
pub fn merge_diff(current: &Value, new: &Value) -> Option<Value> {
    if current == new {
        return None;
    }
    let (Value::Object(cur), Value::Object(new)) = (current, new) else { return Some(new.clone()) };
    let mut patch = serde_json::Map::new();
    for (key, value) in new {
        match cur.get(key) {
            Some(old) => {
                if let Some(changed) = merge_diff(old, value) {
                    patch.insert(key.clone(), changed);
                }
            }
            None => {
                patch.insert(key.clone(), value.clone());
            }
        }
    }
    for key in cur.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    Some(Value::Object(patch))
}

/// What a decided plan's status is compared with: the stored check, unless it has no status yet
/// (the plan's is then sent whole, even when empty).
fn decided_on(stored: StoredCheck) -> Option<StoredCheck> {
    Some(stored).filter(StoredCheck::has_status)
}

/// A MachineHealthCheck's job from its plan.
fn mhc_job(check: &Arc<MachineHealthCheck>, key: &CheckRef, plan: Plan<MachineHealthCheckStatus>) -> Job {
    Job {
        uid: check.metadata.uid.clone(),
        resource_version: check.metadata.resource_version.clone(),
        ..Job::new(key.clone(), plan, decided_on(StoredCheck::Machine(Arc::clone(check))), CheckStatus::Machine)
    }
}

/// A NodeHealthCheck's job from its plan.
fn nhc_job(check: &Arc<NodeHealthCheck>, key: &CheckRef, plan: Plan<NodeHealthCheckStatus>) -> Job {
    Job {
        uid: check.metadata.uid.clone(),
        resource_version: check.metadata.resource_version.clone(),
        ..Job::new(key.clone(), plan, decided_on(StoredCheck::Node(Arc::clone(check))), CheckStatus::Node)
    }
}

/// What a MachineHealthCheck's decision reads besides the Machines: its template and remediation
/// objects (when their caches are synced), the watches it needs, and why it cannot be decided
/// yet (caches not listed).
struct MhcSources<'i> {
    needs: BTreeSet<Need>,
    /// Each of the policy's templates ([`MhcPolicy::templates`]), as found.
    templates: Vec<Option<&'i TemplateView>>,
    /// Each template's remediation objects, same order.
    remediations: Vec<RemediationIndex<'i>>,
    unsure: Vec<Unsure>,
}

fn mhc_sources<'i>(idx: &'i Index, namespace: &str, policy: &MhcPolicy) -> MhcSources<'i> {
    // A workload cluster's kubeconfig Secret is read only for a Cluster that exists in the
    // check's own namespace: a check naming any cluster must not make Vigil read any Secret.
    let mut needs = BTreeSet::new();
    if idx.clusters.contains_key(&WorkloadCluster::new(namespace, &policy.cluster_name)) {
        needs.insert(Need::WorkloadCluster(WorkloadCluster::new(namespace, &policy.cluster_name)));
    }
    let unsure = [
        waiting(&idx.sources.mhcs, "MachineHealthChecks"),
        waiting(&idx.sources.machines, "Cluster API Machines"),
        waiting(&idx.sources.clusters, "Cluster API Clusters"),
        idx.capi_unlisted(&vigil_engine::shard::machine_check_key(namespace, &policy.cluster_name))
            .map(Unsure::Listing),
        idx.rule_unlisted().map(Unsure::Listing),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    let mut sources = MhcSources { needs, templates: Vec::new(), remediations: Vec::new(), unsure };
    // The check's own template and every rule's: each is watched, and read once synced.
    for t in policy.templates() {
        sources.needs.extend(kind_needs(&t.api_version, &t.kind, t.remediation_kind()));
        let group = group_of(&t.api_version).to_string();
        let templates = idx.objects.get(&(group.clone(), t.kind.clone()));
        let objects = idx.objects.get(&(group, t.remediation_kind().to_string()));
        let (mut template, mut remediations) = (None, RemediationIndex(None));
        match (templates.map(|c| &c.state), objects.map(|c| &c.state)) {
            (Some(SourceState::Synced), Some(SourceState::Synced)) => {
                template =
                    templates.and_then(|c| c.templates.get(namespace)).and_then(|m| m.get(&t.name)).map(|a| a.as_ref());
                remediations = RemediationIndex(objects.and_then(|c| c.remediations.get(namespace)));
            }
            // A kind the API server does not serve: the template counts as missing, which the
            // engine reports on every unhealthy Machine and in the check's conditions.
            (Some(SourceState::Failed(_)), _) | (_, Some(SourceState::Failed(_))) => {}
            _ => sources.unsure.push(Unsure::Listing(format!(
                "waiting for the first complete list of {} and {}",
                t.kind,
                t.remediation_kind()
            ))),
        }
        sources.templates.push(template);
        sources.remediations.push(remediations);
    }
    sources
}

/// The Nodes of a MachineHealthCheck's workload cluster `workload`, or why they cannot be read.
fn workload_nodes<'i>(
    idx: &'i Index,
    (namespace, workload): (&str, &str),
    policy: &MhcPolicy,
    unreachable: &'i mut String,
) -> NodeSource<'i> {
    match idx.nodes.get(idx.node_source(workload)) {
        Some(cache) if cache.state == SourceState::Synced => NodeSource::Reachable(&cache.nodes),
        Some(cache) => {
            *unreachable = waiting(&cache.state, &format!("Nodes of workload cluster {workload}"))
                .map(|u| u.why().to_string())
                .unwrap_or_default();
            NodeSource::Unreachable(unreachable)
        }
        None => {
            *unreachable = format!(
                "no connection to workload cluster {workload} yet (Secret {namespace}/{}-kubeconfig)",
                policy.cluster_name
            );
            NodeSource::Unreachable(unreachable)
        }
    }
}

/// The policy the index stored for a check, or (for a check it has not stored) validated now.
fn stored_or<P, E: std::fmt::Display>(
    stored: Option<&Result<Arc<P>, String>>,
    validate: impl FnOnce() -> Result<P, E>,
) -> Result<Arc<P>, String> {
    match stored {
        Some(stored) => stored.clone(),
        None => validate().map(Arc::new).map_err(|e| e.to_string()),
    }
}

/// Decides a MachineHealthCheck; `None` when it no longer exists.
/// With `fresh`, the other checks' claims about those targets are derived from the indexes now
/// (see [`job_with_fresh_holders`]).
pub fn machine_job(
    idx: &Index,
    namespace: &str,
    name: &str,
    now: Timestamp,
    fresh: Option<&BTreeSet<Target>>,
) -> Option<Job> {
    let key = CheckRef::Machine { namespace: namespace.to_string(), name: name.to_string() };
    let check = idx.mhcs.get(&(namespace.to_string(), name.to_string()))?;
    if check.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let refuse = |message: &str| mhc_job(check, &key, machine::refuse(check, REASON_INVALID, message, now));
    if let Some(error) = idx.mhcs.read_error(&(namespace.to_string(), name.to_string())) {
        return Some(refuse(error));
    }
    // Validated when the index stored the check; `vigil run --dry-run` shadows every policy.
    let validated = stored_or(idx.mhc_policy(namespace, name), || validate::machine_health_check(check));
    let policy: Cow<'_, MhcPolicy> = match &validated {
        Ok(p) if idx.dry_run && !p.dry_run => Cow::Owned(MhcPolicy { dry_run: true, ..(**p).clone() }),
        Ok(p) => Cow::Borrowed(p.as_ref()),
        Err(e) => return Some(refuse(e)),
    };
    let sources = mhc_sources(idx, namespace, &policy);
    if !sources.unsure.is_empty() {
        let job = match failed_sources(&sources.unsure) {
            Some(why) => mhc_job(check, &key, machine::refuse(check, REASON_WAITING, &why, now)),
            None => unchanged_job(
                &key,
                &check.metadata,
                (check.status.as_ref(), StoredCheck::Machine(Arc::clone(check))),
                CheckStatus::Machine,
            ),
        };
        return Some(Job { needs: sources.needs, ..job });
    }
    let workload = format!("{namespace}/{}", policy.cluster_name);
    let mut unreachable = String::new();
    let nodes = workload_nodes(idx, (namespace, &workload), &policy, &mut unreachable);
    // The check's own targets, kept by the index (the engine selects them again, cheaply).
    let machines: Vec<&MachineView> = idx.mhc_machines(namespace, name);
    let cluster = idx.clusters.get(&WorkloadCluster::new(namespace, &policy.cluster_name)).map(|c| c.as_ref());
    let remediations = as_lookups(&sources.remediations);
    let input = MhcInput {
        check,
        policy: &policy,
        cluster,
        machines: &machines,
        machines_selected: true,
        nodes,
        templates: &sources.templates,
        remediations: &remediations,
    };
    let node_cluster = node_cluster(idx, namespace, &policy.cluster_name);
    let candidates = machines.iter().map(|m| Candidate::of_machine(&node_cluster, m));
    let holders = holders_for(idx, &key, candidates, fresh);
    let peers = idx.mhc_peers(namespace);
    let plan = machine::decide_among_peers(&input, &holders, &peers, &node_cluster, now);
    let expiries = mhc_expiries(idx, &workload, &policy, &plan.actions, now);
    let machines = patched_machines(idx, &plan.actions);
    Some(Job { needs: sources.needs, expiries, machines, ..mhc_job(check, &key, plan) })
}

/// When each Machine the actions write to had its Node's unhealthy condition run out, by the
/// Machine's target (see [`expiry`]).
fn mhc_expiries(
    idx: &Index,
    workload: &str,
    policy: &MhcPolicy,
    actions: &[Action],
    now: Timestamp,
) -> HashMap<Target, Timestamp> {
    let mut expiries = HashMap::new();
    for action in actions {
        let target = match action {
            Action::SetMachineConditions { machine, .. } => machine.machine_target(),
            Action::CreateRemediation { target, .. } => target.clone(),
            _ => continue,
        };
        let Target::Machine { namespace, name } = &target else { continue };
        let node = idx
            .machines
            .get(namespace)
            .and_then(|ms| ms.get(name))
            .and_then(|e| e.view.node_name.clone())
            .and_then(|n| idx.nodes.get(idx.node_source(workload)).and_then(|c| c.nodes.get(&n)).cloned());
        if let Some(at) = node.and_then(|n| expiry(&policy.node_conditions, &n, now)) {
            expiries.insert(target, at);
        }
    }
    expiries
}

/// The cached entry of each Machine whose conditions the actions set, by its target.
fn patched_machines(idx: &Index, actions: &[Action]) -> HashMap<Target, crate::index::MachineEntry> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SetMachineConditions { machine, .. } => idx
                .machines
                .get(&machine.namespace)
                .and_then(|ms| ms.get(&machine.name))
                .map(|e| (machine.machine_target(), e.clone())),
            _ => None,
        })
        .collect()
}

/// What a NodeHealthCheck's decision reads besides the Nodes: each step's template and the
/// remediation objects of their kinds (when their caches are synced), and why it cannot be
/// decided yet.
struct NhcSources<'i> {
    templates: Vec<Option<&'i TemplateView>>,
    remediations: Vec<&'i RemediationView>,
    unsure: Vec<Unsure>,
}

fn nhc_sources<'i>(idx: &'i Index, policy: &NhcPolicy) -> NhcSources<'i> {
    let leases = format!("Leases in {}", idx.around.lease_namespace);
    let mut unsure: Vec<Unsure> = [
        waiting(&idx.sources.nhcs, "NodeHealthChecks"),
        idx.rule_unlisted().map(Unsure::Listing),
        waiting(&idx.around.leases.state, &leases),
    ]
    .into_iter()
    .flatten()
    .collect();
    // With medik8s' checks served, a Node one of them holds is known only once they are listed.
    unsure.extend(idx.medik8s.as_ref().and_then(|u| waiting(&u.state, crate::upstream::SOURCE)));
    match idx.nodes.get(LOCAL_CLUSTER) {
        Some(cache) => unsure.extend(waiting(&cache.state, "Nodes")),
        None => unsure.push(Unsure::Listing("waiting for the first complete list of Nodes".into())),
    }
    let mut sources = NhcSources { templates: Vec::new(), remediations: Vec::new(), unsure };
    let mut seen_kinds = BTreeSet::new();
    // The check's own steps and every rule's, in `NhcPolicy::all_steps` order (the engine's).
    for step in policy.all_steps() {
        let t = &step.template;
        let group = group_of(&t.api_version).to_string();
        let template_cache = idx.objects.get(&(group.clone(), t.kind.clone()));
        let object_cache = idx.objects.get(&(group.clone(), t.remediation_kind().to_string()));
        match (template_cache.map(|c| &c.state), object_cache.map(|c| &c.state)) {
            (Some(SourceState::Synced), Some(SourceState::Synced)) => {
                sources.templates.push(
                    template_cache
                        .and_then(|c| c.templates.get(&t.namespace))
                        .and_then(|m| m.get(&t.name))
                        .map(|a| a.as_ref()),
                );
                if seen_kinds.insert((group, t.remediation_kind().to_string(), t.namespace.clone())) {
                    sources.remediations.extend(
                        object_cache
                            .and_then(|c| c.remediations.get(&t.namespace))
                            .into_iter()
                            .flat_map(|m| m.values().map(|a| a.as_ref())),
                    );
                }
            }
            (Some(SourceState::Failed(_)), _) | (_, Some(SourceState::Failed(_))) => sources.templates.push(None),
            _ => sources.unsure.push(Unsure::Listing(format!(
                "waiting for the first complete list of {} and {}",
                t.kind,
                t.remediation_kind()
            ))),
        }
    }
    sources
}

/// Decides a NodeHealthCheck; `None` when it no longer exists.
/// With `fresh`, the other checks' claims about those targets are derived from the indexes now
/// (see [`job_with_fresh_holders`]).
pub fn node_job(idx: &Index, name: &str, now: Timestamp, fresh: Option<&BTreeSet<Target>>) -> Option<Job> {
    let key = CheckRef::Node { name: name.to_string() };
    let check = idx.nhcs.get(name)?;
    if check.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let refuse = |message: &str| nhc_job(check, &key, node::refuse(check, REASON_INVALID, message, now));
    if let Some(error) = idx.nhcs.read_error(name) {
        return Some(refuse(error));
    }
    let validated = stored_or(idx.nhc_policy(name), || validate::node_health_check(check));
    let policy: Cow<'_, NhcPolicy> = match &validated {
        Ok(p) if idx.dry_run && !p.dry_run => Cow::Owned(NhcPolicy { dry_run: true, ..(**p).clone() }),
        Ok(p) => Cow::Borrowed(p.as_ref()),
        Err(e) => return Some(refuse(e)),
    };
    let mut needs = BTreeSet::new();
    for step in policy.all_steps() {
        needs.extend(kind_needs(&step.template.api_version, &step.template.kind, step.template.remediation_kind()));
    }
    let sources = nhc_sources(idx, &policy);
    if !sources.unsure.is_empty() {
        let job = match failed_sources(&sources.unsure) {
            Some(why) => nhc_job(check, &key, node::wait(check, REASON_WAITING, &why, now)),
            None => unchanged_job(
                &key,
                &check.metadata,
                (check.status.as_ref(), StoredCheck::Node(Arc::clone(check))),
                CheckStatus::Node,
            ),
        };
        return Some(Job { needs, ..job });
    }
    // Only the Nodes the decision reads (see `NhcInput::nodes`), sorted by name.
    let named = sources.remediations.iter().map(|r| vigil_engine::target::remediation_node_name(&r.meta));
    let listed = check.status.iter().flat_map(|s| s.unhealthy_nodes.iter().map(|u| u.name.as_str()));
    let nodes: Vec<&vigil_api::views::NodeView> = idx.nhc_decision_nodes(name, named.chain(listed));
    let around = &idx.around;
    let (leases, maintenances, versions, machines) = (
        around.leases.refs(),
        around.maintenances.refs(),
        around.cluster_versions.refs(),
        around.openshift_machines.refs(),
    );
    let (mut maintenance_why, mut version_why, mut machine_why) = (String::new(), String::new(), String::new());
    let input = NhcInput {
        check,
        policy: &policy,
        nodes: &nodes,
        templates: &sources.templates,
        remediations: &sources.remediations,
        around: node::Around {
            leases: &leases,
            lease_namespace: &around.lease_namespace,
            maintenances: around.maintenances.observed("NodeMaintenances", &maintenances, &mut maintenance_why),
            cluster_versions: around.cluster_versions.observed("ClusterVersions", &versions, &mut version_why),
            machines: around.openshift_machines.observed("OpenShift Machines", &machines, &mut machine_why),
        },
    };
    let holders = holders_for(idx, &key, nodes.iter().map(|n| Candidate::local_node(&n.name)), fresh);
    let plan = node::decide_among(&input, &holders, now);
    let expiries = nhc_expiries(idx, &policy, &plan.actions, now);
    Some(Job { needs, expiries, ..nhc_job(check, &key, plan) })
}

/// When each Node the actions remediate had its unhealthy condition run out, by its target.
fn nhc_expiries(idx: &Index, policy: &NhcPolicy, actions: &[Action], now: Timestamp) -> HashMap<Target, Timestamp> {
    let local = idx.nodes.get(LOCAL_CLUSTER);
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { target: target @ Target::Node { cluster, name }, .. }
                if cluster == LOCAL_CLUSTER =>
            {
                local
                    .and_then(|c| c.nodes.get(name))
                    .and_then(|n| expiry(&policy.conditions, n, now))
                    .map(|at| (target.clone(), at))
            }
            _ => None,
        })
        .collect()
}

/// Decides the check `key` with the other checks' claims as of their last decisions (cheap).
/// Remediating plans are decided again by [`job_with_fresh_holders`] before anything is sent.
pub fn job(idx: &Index, key: &CheckRef, now: Timestamp) -> Option<Job> {
    match key {
        CheckRef::Machine { namespace: ns, name: n } => machine_job(idx, ns, n, now, None),
        CheckRef::Node { name: n } => node_job(idx, n, now, None),
    }
}

/// Decides the check `key` for confirming remediations of the targets `about`: every other
/// check's claims about them are derived from the indexes now (exact, where it matters), its
/// claims about anything else are as cached after its last decision, as in [`job`]. The
/// caller sends no remediation of a target outside `about` from this plan.
pub fn job_with_fresh_holders(idx: &Index, key: &CheckRef, now: Timestamp, about: &BTreeSet<Target>) -> Option<Job> {
    match key {
        CheckRef::Machine { namespace: ns, name: n } => machine_job(idx, ns, n, now, Some(about)),
        CheckRef::Node { name: n } => node_job(idx, n, now, Some(about)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A decision that changes one field sends that field: a check's `targets` list (thousands
    /// of names) is sent only when membership changed, and a nested object only with what
    /// changed in it (a key it lost as `null`), so applying the patch to the stored status
    /// gives exactly the new status.
    #[test]
    fn only_what_changed_is_sent_and_applying_it_gives_the_new_status() {
        let targets: Vec<String> = (0..2000).map(|i| format!("m{i:04}")).collect();
        let before = json!({"targets": targets, "currentHealthy": 2000, "expectedMachines": 2000,
                            "conditions": [{"type": "RemediationAllowed", "status": "True"}],
                            "nested": {"a": 1, "b": 2}});
        let mut after = before.clone();
        after["currentHealthy"] = json!(1999);
        after["nested"] = json!({"a": 1});
        let patch = status_if_changed(Some(&before), &after).expect("changed");
        assert_eq!(patch, json!({"currentHealthy": 1999, "nested": {"b": null}}));
        // RFC 7386 applied to the stored status gives the new status.
        let mut applied = before.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, after);
        // Membership changed: the list is sent whole (a merge patch replaces lists).
        let mut grown = after.clone();
        grown["targets"].as_array_mut().expect("list").push(json!("m9999"));
        let patch = status_if_changed(Some(&after), &grown).expect("changed");
        assert_eq!(patch.as_object().map(|o| o.len()), Some(1), "only the list");
        assert_eq!(patch["targets"].as_array().map(Vec::len), Some(2001));
        assert_eq!(status_if_changed(Some(&grown), &grown), None);
    }

    #[test]
    fn a_status_field_that_goes_away_is_sent_as_null() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use vigil_api::shared::WouldRemediate;
        let before = NodeHealthCheckStatus {
            observed_nodes: 3,
            features: vigil_api::shared::FeatureStatus {
                would_remediate: vec![WouldRemediate {
                    name: "w1".into(),
                    action: "create SelfNodeRemediation".into(),
                    since: Time(Timestamp::UNIX_EPOCH),
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let after = NodeHealthCheckStatus { observed_nodes: 3, ..Default::default() };
        let json = |s: &NodeHealthCheckStatus| serde_json::to_value(s).expect("json");
        let patch = status_if_changed(Some(&json(&before)), &after).expect("changed");
        assert_eq!(patch["wouldRemediate"], Value::Null, "{patch}");
        assert!(patch.get("observedNodes").is_none(), "an unchanged field is not sent: {patch}");
        assert_eq!(status_if_changed(Some(&json(&after)), &after), None, "unchanged: nothing to send");
        let first = status_if_changed(None, &after).expect("new");
        assert!(first.get("wouldRemediate").is_none(), "{first}");
    }

    /// A check's status is sent whole the first time, then only when a decision changed it: the
    /// stored check is compared typed (nothing copied while it is the same) and, once it
    /// differs, only what differs is sent.
    #[test]
    fn the_status_is_sent_whole_first_then_only_when_a_decision_changed_it() {
        use crate::index::{Source, WorkloadCluster};
        use vigil_api::views::NodeView;
        let now: Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let check = |status: Option<MachineHealthCheckStatus>, version: &str| -> MachineHealthCheck {
            let mut c: MachineHealthCheck = serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": "workers", "namespace": "ns", "uid": "u1", "resourceVersion": version},
                "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": "a"}},
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]}}))
            .expect("check");
            c.status = status;
            c
        };
        let node = |name: &str, ready: &str| {
            let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
                "metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready,
                    "lastTransitionTime": "2029-12-31T23:59:00Z"}]}}))
            .expect("Node");
            NodeView::from(&node)
        };
        let mut idx = Index::default();
        idx.put_mhc(Some(check(None, "1")), None);
        let key = CheckRef::Machine { namespace: "ns".into(), name: "workers".into() };
        assert_eq!(job(&idx, &key, now).and_then(|j| j.status_patch()), None, "listing: nothing sent");

        for source in [Source::Mhcs, Source::Machines, Source::Clusters] {
            *idx.state_mut(&source) = SourceState::Synced;
        }
        idx.put_cluster(
            Some(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "prod", "namespace": "ns", "uid": "uc"},
            "status": {"initialization": {"controlPlaneInitialized": true, "infrastructureProvisioned": true}}})),
            None,
        );
        idx.connected(&WorkloadCluster::new("ns", "prod"), false);
        for i in 0..3 {
            idx.put_machine(Some(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": format!("m{i}"), "namespace": "ns", "uid": format!("um{i}"), "resourceVersion": "1",
                             "labels": {"pool": "a", "cluster.x-k8s.io/cluster-name": "prod"}},
                "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"name": format!("n{i}")}}})), None);
            idx.put_node("ns/prod", Some(node(&format!("n{i}"), "True")), None, now);
        }
        *idx.state_mut(&Source::Nodes("ns/prod".into())) = SourceState::Synced;

        let first = job(&idx, &key, now).expect("decided");
        let whole = first.status_patch().expect("no status yet: sent whole");
        assert_eq!(whole["targets"], json!(["m0", "m1", "m2"]), "{whole}");
        let CheckStatus::Machine(written) = first.plan.status else { panic!("a MachineHealthCheck") };
        idx.put_mhc(Some(check(Some(written), "2")), None);
        assert_eq!(job(&idx, &key, now).and_then(|j| j.status_patch()), None, "the same status: nothing sent");

        idx.put_node("ns/prod", Some(node("n1", "False")), None, now);
        let patch = job(&idx, &key, now).and_then(|j| j.status_patch()).expect("a Node failed: sent");
        assert!(patch.get("targets").is_none() && patch.get("expectedMachines").is_none(), "{patch}");
        assert_eq!(patch["currentHealthy"], json!(2), "{patch}");
        let whole_diff = |idx: &Index, j: &Job| {
            let CheckStatus::Machine(new) = &j.plan.status else { panic!("a MachineHealthCheck") };
            let stored = idx.mhcs.get(&("ns".to_string(), "workers".to_string())).and_then(|c| c.status.clone());
            merge_diff(&serde_json::to_value(stored).expect("json"), &serde_json::to_value(new).expect("json"))
        };
        let failed = job(&idx, &key, now).expect("decided");
        assert_eq!(
            failed.status_patch(),
            whole_diff(&idx, &failed),
            "the same patch as the whole statuses' difference"
        );

        // A Machine joins: the list changed, and is sent whole.
        idx.put_machine(
            Some(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m3", "namespace": "ns", "uid": "um3", "resourceVersion": "1",
                         "labels": {"pool": "a", "cluster.x-k8s.io/cluster-name": "prod"}},
            "spec": {"clusterName": "prod"}, "status": {"nodeRef": {"name": "n3"}}})),
            None,
        );
        idx.put_node("ns/prod", Some(node("n3", "True")), None, now);
        let joined = job(&idx, &key, now).expect("decided");
        let patch = joined.status_patch().expect("a Machine joined: sent");
        assert_eq!(patch["targets"], json!(["m0", "m1", "m2", "m3"]), "{patch}");
        assert_eq!(Some(patch), whole_diff(&idx, &joined));
    }

    /// While its sources are being listed (a start), a check is not decided and nothing is
    /// written or told: the last decision's status stands, phase and `Disabled` included. Once a
    /// watch failed, it says so with `RemediationAllowed=False/WaitingForCaches` and a
    /// `NoDecision` notice, and still leaves its phase and `Disabled` as they were.
    #[test]
    fn a_check_waits_in_silence_while_listing_and_says_so_when_a_watch_failed() {
        use vigil_engine::plan::NoticeKind;
        let check: NodeHealthCheck = serde_json::from_value(json!({
            "apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers", "uid": "u1"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1, "remediationTemplate":
                     {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "t", "namespace": "ns"}},
            "status": {"phase": "Enabled", "observedNodes": 3, "healthyNodes": 3,
                       "conditions": [{"type": "Disabled", "status": "False", "reason": "NodeHealthCheckEnabled",
                                       "message": "", "lastTransitionTime": "2026-11-01T00:00:00Z"}]}}))
        .expect("check");
        let mut idx = Index::default();
        idx.put_nhc(Some(check), None);
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let job = node_job(&idx, "workers", now, None).expect("a job");
        assert_eq!(job.status_patch(), None, "nothing written while listing");
        assert!(job.plan.notices.is_empty() && job.plan.actions.is_empty());
        assert!(!job.needs.is_empty(), "the template's kinds are still asked to be watched");

        idx.sources.nhcs = SourceState::Failed("connection reset".into());
        let job = node_job(&idx, "workers", now, None).expect("a job");
        let patch = job.status_patch().expect("said in the status");
        assert!(patch.get("phase").is_none(), "the phase stays: {patch}");
        let CheckStatus::Node(status) = &job.plan.status else { panic!("a NodeHealthCheck") };
        let c = |t: &str| status.conditions.iter().find(|c| c.type_ == t).cloned().expect(t);
        assert_eq!((c("Disabled").status.as_str(), status.phase.as_deref()), ("False", Some("Enabled")));
        let allowed = c("RemediationAllowed");
        assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("False", "WaitingForCaches"));
        assert!(
            allowed.message.contains("the watch of NodeHealthChecks failed (connection reset)"),
            "{}",
            allowed.message
        );
        let kinds: Vec<_> = job.plan.notices.iter().map(|n| (n.kind, n.reason.as_str())).collect();
        assert_eq!(kinds, vec![(NoticeKind::NoDecision, "WaitingForCaches")]);
    }
}
