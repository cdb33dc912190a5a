//! One decision: gather a check's observed state from the indexes, call the engine, and turn the
//! plan into owned write jobs. Everything here runs under the index read lock, without I/O.

use crate::index::{Index, SourceState};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use vigil_api::MachineHealthCheck;
use vigil_api::conditions::ConditionStatus;
use vigil_api::reason::Reason;
use vigil_api::validate;
use vigil_api::views::{MachineView, RemediationView, TemplateView};
use vigil_engine::concerns::group_of;
use vigil_engine::holders::{self, Claim, Holders};
use vigil_engine::lookup::Lookup;
use vigil_engine::machine::{self, MhcInput, NodeSource};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::peers::{MhcPeer, MhcPeers};
use vigil_engine::target::Target;
use vigil_engine::target::{CheckRef, LOCAL_CLUSTER};
use vigil_engine::{Action, Notice};

/// Something a check needs watched before it can be decided.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Objects of a kind (group, version, kind), e.g. a template kind.
    Kind {
        /// API group.
        group: String,
        /// API version.
        version: String,
        /// Kind.
        kind: String,
        /// Whether objects of this kind are templates (keep `spec.template`).
        template: bool,
    },
    /// The Nodes of a workload cluster (`namespace`, `clusterName`).
    WorkloadCluster(String, String),
}

/// A decided plan, with everything its writes need, owned.
pub struct Job {
    /// The check.
    pub key: CheckRef,
    /// The check's status as it should be, when it differs from what it is.
    pub status: Option<Value>,
    /// The writes.
    pub actions: Vec<Action>,
    /// Current (slim) JSON of the Machines the actions patch, by `namespace/name`.
    pub machines: HashMap<String, Arc<Value>>,
    /// Notices for events.
    pub notices: Vec<Notice>,
    /// When to decide again.
    pub next_wake: Option<Timestamp>,
    /// Watches the check needs.
    pub needs: BTreeSet<Need>,
    /// UID of the check, for events.
    pub uid: Option<String>,
    /// For each target the plan writes to, when its unhealthy condition's timeout ran out (for
    /// the detection-latency metric), by Node name or Machine `namespace/name`.
    pub expiries: HashMap<String, Timestamp>,
    /// The check's counts, for the per-check gauges.
    pub gauges: Gauges,
    /// Targets this check waits for, to tell their holders.
    pub held_elsewhere: Vec<vigil_engine::plan::HeldElsewhere>,
    /// Whether the check must be decided again right after this job (some of its remediations
    /// were left out while confirming).
    pub again: bool,
}

/// A check's counts as its status reports them, for the per-check gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Targets selected.
    pub targets: i64,
    /// Healthy targets.
    pub healthy: i64,
    /// Unhealthy targets.
    pub unhealthy: i64,
    /// How many more may be remediated now (MachineHealthCheck), or 1/0 (NodeHealthCheck).
    pub remediations_allowed: i64,
    /// Whether the short-circuit (too many unhealthy, too few healthy, storm cool-down) holds.
    pub short_circuited: bool,
    /// Targets a check in dry-run would remediate now.
    pub would_remediate: i64,
    /// Pools `spec.backoff` holds back now.
    pub backoff_pools: i64,
    /// Failure domains where no new remediation starts (`status.failureDomains[].paused`).
    pub failure_domains_paused: i64,
    /// Targets with a matching Node condition set aside as stale (`maxConditionAge`).
    pub stale_conditions: i64,
}

fn condition_false_with<'c>(
    conditions: &'c [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'c str> {
    conditions.iter().find(|c| c.type_ == type_ && c.status == ConditionStatus::False).map(|c| c.reason.as_str())
}

fn mhc_gauges(s: &vigil_api::MachineHealthCheckStatus) -> Gauges {
    let targets = i64::from(s.expected_machines);
    let healthy = i64::from(s.current_healthy);
    Gauges {
        targets,
        healthy,
        unhealthy: (targets - healthy).max(0),
        remediations_allowed: i64::from(s.remediations_allowed),
        short_circuited: condition_false_with(&s.conditions, "RemediationAllowed") == Some("TooManyUnhealthy"),
        would_remediate: s.would_remediate.len() as i64,
        backoff_pools: s.backed_off_pools.len() as i64,
        failure_domains_paused: paused_domains(&s.failure_domains),
        stale_conditions: i64::from(s.stale_target_count),
    }
}

/// Paused failure domains of a status list (every paused domain is listed, up to the list's cap).
fn paused_domains(list: &[vigil_api::failure_domains::FailureDomainStatus]) -> i64 {
    list.iter().filter(|d| d.paused).count() as i64
}

fn nhc_gauges(s: &vigil_api::NodeHealthCheckStatus) -> Gauges {
    let blocked = condition_false_with(&s.conditions, "RemediationAllowed");
    Gauges {
        targets: i64::from(s.observed_nodes),
        healthy: i64::from(s.healthy_nodes),
        unhealthy: s.unhealthy_nodes.len() as i64,
        remediations_allowed: i64::from(blocked.is_none()),
        short_circuited: matches!(blocked, Some("TooFewHealthy" | "StormCooldown")),
        would_remediate: s.would_remediate.len() as i64,
        backoff_pools: s.backed_off_pools.len() as i64,
        failure_domains_paused: paused_domains(&s.failure_domains),
        stale_conditions: i64::from(s.stale_target_count),
    }
}

/// When a Node's matching unhealthy condition ran past its timeout (the earliest such instant at
/// or before `now`), for the detection-latency metric: `None` when none did (the verdict came
/// from something else, e.g. a deleted Node or `nodeStartupTimeout`).
pub fn expiry(rules: &[vigil_api::validate::ConditionRule], node: &Node, now: Timestamp) -> Option<Timestamp> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    rules
        .iter()
        .flat_map(|r| {
            conditions
                .iter()
                .filter(move |c| c.type_ == r.type_ && c.status == r.status)
                .filter_map(move |c| c.last_transition_time.as_ref().and_then(|t| t.0.checked_add(r.timeout).ok()))
        })
        .filter(|d| *d <= now)
        .min()
}

impl Job {
    /// Leaves out `actions` that were not confirmed or failed: the status no longer reports
    /// the remediation objects they would have created, nor are their requests announced.
    pub fn leave_out(&mut self, actions: &[Action]) {
        let unsent: Vec<(&str, &Value)> = actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateRemediation { object, target } => Some((target.as_str(), object)),
                _ => None,
            })
            .collect();
        let targets: BTreeSet<&str> = actions
            .iter()
            .map(|a| match a {
                Action::CreateRemediation { target, .. } | Action::DeleteRemediation { target, .. } => target.as_str(),
                Action::SetMachineConditions { machine, .. } => machine.name.as_str(),
                Action::AnnotateRemediation { object, .. } => object.name.as_str(),
            })
            .collect();
        self.notices.retain(|n| {
            !(n.kind == vigil_engine::NoticeKind::RemediationRequested
                && n.target.as_deref().is_some_and(|t| targets.contains(t.rsplit('/').next().unwrap_or(t))))
        });
        if let (CheckRef::Node { .. }, false) = (&self.key, unsent.is_empty()) {
            // The plan's status differs from the one stored whenever it records a new request.
            if let Some(mut status) =
                self.status.take().and_then(|v| serde_json::from_value::<vigil_api::NodeHealthCheckStatus>(v).ok())
            {
                node::forget_requests(&mut status, &unsent);
                self.status = serde_json::to_value(&status).ok();
            }
        }
    }
}

struct RemediationIndex<'a>(Option<&'a BTreeMap<String, Arc<RemediationView>>>);

impl Lookup<RemediationView> for RemediationIndex<'_> {
    fn lookup(&self, key: &str) -> Option<&RemediationView> {
        self.0.and_then(|m| m.get(key)).map(|a| a.as_ref())
    }
}

fn split_api_version(api_version: &str) -> (String, String) {
    match api_version.rsplit_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    }
}

fn kind_needs(api_version: &str, template_kind: &str, remediation_kind: &str) -> [Need; 2] {
    let (group, version) = split_api_version(api_version);
    [
        Need::Kind { group: group.clone(), version: version.clone(), kind: template_kind.to_string(), template: true },
        Need::Kind { group, version, kind: remediation_kind.to_string(), template: false },
    ]
}

fn waiting(state: &SourceState, what: &str) -> Option<String> {
    match state {
        SourceState::Synced => None,
        SourceState::Syncing => Some(format!("waiting for the first complete list of {what}")),
        SourceState::Failed(e) => Some(format!("the watch of {what} failed ({e}); the cache may be stale")),
    }
}

/// Reason of `RemediationAllowed=False` when no decision can be made.
pub const REASON_WAITING: Reason = Reason::WaitingForCaches;
/// Reason when the spec cannot be read or validated.
pub const REASON_INVALID: Reason = Reason::InvalidSpec;

/// The status to send as a merge patch when it changed: a field the new status leaves out (an
/// emptied list such as `wouldRemediate` or `unhealthyNodes`, a cleared time) is sent as `null`,
/// since a merge patch keeps every field it does not name.
fn status_if_changed<S: serde::Serialize>(current: Option<&S>, new: &S) -> Option<Value> {
    let mut new = serde_json::to_value(new).ok()?;
    let cur = current.and_then(|c| serde_json::to_value(c).ok());
    if cur.as_ref() == Some(&new) {
        return None;
    }
    if let (Some(Value::Object(cur)), Value::Object(patch)) = (&cur, &mut new) {
        for key in cur.keys() {
            if !patch.contains_key(key) {
                patch.insert(key.clone(), Value::Null);
            }
        }
    }
    Some(new)
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
    let uid = check.metadata.uid.clone();
    let finish = |plan: vigil_engine::Plan<vigil_api::MachineHealthCheckStatus>, needs, machines| Job {
        key: key.clone(),
        expiries: HashMap::new(),
        gauges: mhc_gauges(&plan.status),
        held_elsewhere: plan.held_elsewhere,
        status: status_if_changed(check.status.as_ref(), &plan.status),
        actions: plan.actions,
        machines,
        notices: plan.notices,
        next_wake: plan.next_wake,
        needs,
        uid: uid.clone(),
        again: false,
    };
    if let Some(error) = idx.mhc_errors.get(&(namespace.to_string(), name.to_string())) {
        return Some(finish(machine::refuse(check, REASON_INVALID, error, now), BTreeSet::new(), HashMap::new()));
    }
    let policy = match validate::machine_health_check(check) {
        Ok(p) => validate::MhcPolicy { dry_run: p.dry_run || idx.dry_run, ..p },
        Err(e) => {
            return Some(finish(
                machine::refuse(check, REASON_INVALID, &e.to_string(), now),
                BTreeSet::new(),
                HashMap::new(),
            ));
        }
    };
    // A workload cluster's kubeconfig Secret is read only for a Cluster that exists in the
    // check's own namespace: a check naming any cluster must not make Vigil read any Secret.
    let mut needs = BTreeSet::new();
    if idx.clusters.contains_key(&(namespace.to_string(), policy.cluster_name.clone())) {
        needs.insert(Need::WorkloadCluster(namespace.to_string(), policy.cluster_name.clone()));
    }
    let template_cache = policy.remediation_template.as_ref().map(|t| {
        needs.extend(kind_needs(&t.api_version, &t.kind, t.remediation_kind()));
        let group = group_of(&t.api_version).to_string();
        (
            idx.objects.get(&(group.clone(), t.kind.clone())),
            idx.objects.get(&(group, t.remediation_kind().to_string())),
            t,
        )
    });
    let mut unsure = [
        waiting(&idx.mhc_state, "MachineHealthChecks"),
        waiting(&idx.machine_state, "Cluster API Machines"),
        waiting(&idx.cluster_state, "Cluster API Clusters"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    let mut template: Option<&TemplateView> = None;
    let mut remediations = RemediationIndex(None);
    if let Some((templates, objects, t)) = &template_cache {
        match (templates.map(|c| &c.state), objects.map(|c| &c.state)) {
            (Some(SourceState::Synced), Some(SourceState::Synced)) => {
                template =
                    templates.and_then(|c| c.templates.get(namespace)).and_then(|m| m.get(&t.name)).map(|a| a.as_ref());
                remediations = RemediationIndex(objects.and_then(|c| c.remediations.get(namespace)));
            }
            // A kind the API server does not serve: the template counts as missing, which the
            // engine reports on every unhealthy Machine and in the check's conditions.
            (Some(SourceState::Failed(_)), _) | (_, Some(SourceState::Failed(_))) => {}
            _ => unsure.push(format!("waiting for the first complete list of {} and {}", t.kind, t.remediation_kind())),
        }
    }
    if !unsure.is_empty() {
        return Some(finish(machine::refuse(check, REASON_WAITING, &unsure.join("; "), now), needs, HashMap::new()));
    }
    let workload = format!("{namespace}/{}", policy.cluster_name);
    let unreachable;
    let nodes = match idx.nodes.get(&workload) {
        Some(cache) if cache.state == SourceState::Synced => NodeSource::Reachable(&cache.nodes),
        Some(cache) => {
            unreachable = waiting(&cache.state, &format!("Nodes of workload cluster {workload}")).unwrap_or_default();
            NodeSource::Unreachable(&unreachable)
        }
        None => {
            unreachable = format!(
                "no connection to workload cluster {workload} yet (Secret {namespace}/{}-kubeconfig)",
                policy.cluster_name
            );
            NodeSource::Unreachable(&unreachable)
        }
    };
    let machines: Vec<&MachineView> =
        idx.machines.get(namespace).map(|ms| ms.values().map(|e| e.view.as_ref()).collect()).unwrap_or_default();
    let cluster = idx.clusters.get(&(namespace.to_string(), policy.cluster_name.clone())).map(|c| c.as_ref());
    let input =
        MhcInput { check, policy: &policy, cluster, machines: &machines, nodes, template, remediations: &remediations };
    let node_cluster = node_cluster(idx, namespace, &policy.cluster_name);
    let holders = holders_for(idx, &key, fresh);
    let peer_checks = mhc_peers(idx, namespace);
    let peers = peers_of(&peer_checks);
    let plan = machine::decide_among_peers(&input, &holders, &peers, &node_cluster, now);
    let mut expiries = HashMap::new();
    for action in &plan.actions {
        let machine = match action {
            Action::SetMachineConditions { machine, .. } => Some((machine.namespace.clone(), machine.name.clone())),
            Action::CreateRemediation { target, .. } => {
                target.split_once('/').map(|(ns, n)| (ns.to_string(), n.to_string()))
            }
            _ => None,
        };
        let Some((ns, name)) = machine else { continue };
        let node = idx
            .machines
            .get(&ns)
            .and_then(|ms| ms.get(&name))
            .and_then(|e| e.view.node_name.clone())
            .and_then(|n| idx.nodes.get(&workload).and_then(|c| c.nodes.get(&n)).cloned());
        if let Some(at) = node.and_then(|n| expiry(&policy.node_conditions, &n, now)) {
            expiries.insert(format!("{ns}/{name}"), at);
        }
    }
    let raws = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::SetMachineConditions { machine, .. } => idx
                .machines
                .get(&machine.namespace)
                .and_then(|ms| ms.get(&machine.name))
                .map(|e| (format!("{}/{}", machine.namespace, machine.name), Arc::new(e.raw_value()))),
            _ => None,
        })
        .collect();
    let mut job = finish(plan, needs, raws);
    job.expiries = expiries;
    Some(job)
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
    let uid = check.metadata.uid.clone();
    let finish = |plan: vigil_engine::Plan<vigil_api::NodeHealthCheckStatus>, needs| Job {
        key: key.clone(),
        expiries: HashMap::new(),
        gauges: nhc_gauges(&plan.status),
        held_elsewhere: plan.held_elsewhere,
        status: status_if_changed(check.status.as_ref(), &plan.status),
        actions: plan.actions,
        machines: HashMap::new(),
        notices: plan.notices,
        next_wake: plan.next_wake,
        needs,
        uid: uid.clone(),
        again: false,
    };
    if let Some(error) = idx.nhc_errors.get(name) {
        return Some(finish(node::refuse(check, REASON_INVALID, error, now), BTreeSet::new()));
    }
    let policy = match validate::node_health_check(check) {
        Ok(p) => validate::NhcPolicy { dry_run: p.dry_run || idx.dry_run, ..p },
        Err(e) => return Some(finish(node::refuse(check, REASON_INVALID, &e.to_string(), now), BTreeSet::new())),
    };
    let mut needs = BTreeSet::new();
    for step in &policy.steps {
        needs.extend(kind_needs(&step.template.api_version, &step.template.kind, step.template.remediation_kind()));
    }
    let mut unsure: Vec<String> = [waiting(&idx.nhc_state, "NodeHealthChecks")].into_iter().flatten().collect();
    match idx.nodes.get(LOCAL_CLUSTER) {
        Some(cache) => unsure.extend(waiting(&cache.state, "Nodes")),
        None => unsure.push("waiting for the first complete list of Nodes".into()),
    }
    let mut templates = Vec::with_capacity(policy.steps.len());
    let mut remediations: Vec<&RemediationView> = Vec::new();
    let mut seen_kinds = BTreeSet::new();
    for step in &policy.steps {
        let t = &step.template;
        let group = group_of(&t.api_version).to_string();
        let template_cache = idx.objects.get(&(group.clone(), t.kind.clone()));
        let object_cache = idx.objects.get(&(group.clone(), t.remediation_kind().to_string()));
        match (template_cache.map(|c| &c.state), object_cache.map(|c| &c.state)) {
            (Some(SourceState::Synced), Some(SourceState::Synced)) => {
                templates.push(
                    template_cache
                        .and_then(|c| c.templates.get(&t.namespace))
                        .and_then(|m| m.get(&t.name))
                        .map(|a| a.as_ref()),
                );
                if seen_kinds.insert((group, t.remediation_kind().to_string(), t.namespace.clone())) {
                    remediations.extend(
                        object_cache
                            .and_then(|c| c.remediations.get(&t.namespace))
                            .into_iter()
                            .flat_map(|m| m.values().map(|a| a.as_ref())),
                    );
                }
            }
            (Some(SourceState::Failed(_)), _) | (_, Some(SourceState::Failed(_))) => templates.push(None),
            _ => unsure.push(format!("waiting for the first complete list of {} and {}", t.kind, t.remediation_kind())),
        }
    }
    if !unsure.is_empty() {
        return Some(finish(node::refuse(check, REASON_WAITING, &unsure.join("; "), now), needs));
    }
    // Only the Nodes the decision reads (see `NhcInput::nodes`), sorted by name.
    let named = remediations.iter().map(|r| vigil_engine::target::remediation_node_name(&r.meta));
    let listed = check.status.iter().flat_map(|s| s.unhealthy_nodes.iter().map(|u| u.name.as_str()));
    let nodes: Vec<&Node> = idx.nhc_decision_nodes(name, named.chain(listed));
    let input = NhcInput { check, policy: &policy, nodes: &nodes, templates: &templates, remediations: &remediations };
    let holders = holders_for(idx, &key, fresh);
    let plan = node::decide_among(&input, &holders, now);
    let management = idx.nodes.get(LOCAL_CLUSTER);
    let expiries = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateRemediation { target, .. } => management
                .and_then(|c| c.nodes.get(target))
                .and_then(|n| expiry(&policy.conditions, n, now))
                .map(|at| (target.clone(), at)),
            _ => None,
        })
        .collect();
    let mut job = finish(plan, needs);
    job.expiries = expiries;
    Some(job)
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

/// The valid MachineHealthChecks of a namespace with their policies (who may own a Machine's
/// conditions: [`vigil_engine::peers`]). Per decision and per namespace: a namespace holds a
/// few checks, and validating one costs microseconds.
fn mhc_peers(idx: &Index, namespace: &str) -> Vec<(Arc<MachineHealthCheck>, validate::MhcPolicy)> {
    idx.mhcs
        .range((namespace.to_string(), String::new())..)
        .take_while(|((ns, _), _)| ns == namespace)
        .filter(|(k, c)| c.metadata.deletion_timestamp.is_none() && !idx.mhc_errors.contains_key(*k))
        .filter_map(|(_, c)| validate::machine_health_check(c).ok().map(|p| (Arc::clone(c), p)))
        .collect()
}

fn peers_of(checks: &[(Arc<MachineHealthCheck>, validate::MhcPolicy)]) -> MhcPeers<'_> {
    MhcPeers::new(checks.iter().map(|(c, p)| MhcPeer::of(c, p)))
}

/// The cluster key the engine uses for an MHC's Nodes: the cluster Vigil runs in when the
/// workload cluster is that same cluster (so an MHC and an NHC see one Node as one target).
pub fn node_cluster(idx: &Index, namespace: &str, cluster: &str) -> String {
    let workload = format!("{namespace}/{cluster}");
    if idx.self_hosted.contains(&workload) { LOCAL_CLUSTER.to_string() } else { workload }
}

/// Who holds which target: `key`'s own claims derived now and the others' as cached after their
/// last decision; with `fresh`, the others' claims about those targets derived now instead.
fn holders_for(idx: &Index, key: &CheckRef, fresh: Option<&BTreeSet<Target>>) -> Holders {
    let mut claims: Vec<Claim> = claims_of(idx, key);
    let Some(about) = fresh else {
        claims.extend(idx.claims.iter().filter(|(k, _)| *k != key).flat_map(|(_, c)| c.iter().cloned()));
        return Holders::from_claims(claims);
    };
    let scope = Scope::of(idx, about);
    let mut rederived: BTreeSet<CheckRef> = BTreeSet::new();
    for other in idx.all_checks().into_iter().filter(|o| o != key) {
        if let Some(fresh_claims) = claims_within(idx, &other, Some(&scope)) {
            claims.extend(fresh_claims);
            rederived.insert(other);
        }
    }
    // Cached claims of the others stand for everything else; a check that cannot select a
    // target of `about` keeps even its cached claims about one (when unsure, wait).
    for (other, cached) in idx.claims.iter().filter(|(k, _)| *k != key) {
        let replaced = rederived.contains(other);
        claims.extend(cached.iter().filter(|c| !(replaced && about.contains(&c.target))).cloned());
    }
    Holders::from_claims(claims)
}

/// What a confirming decision derives claims about: its targets, and the Machines that can
/// stand for one of them (the Machine itself, or any Machine referencing a Node of the set), so
/// that a MachineHealthCheck looks at these instead of every Machine of its namespace.
struct Scope<'a> {
    about: &'a BTreeSet<Target>,
    machines: BTreeMap<String, BTreeSet<String>>,
}

impl<'a> Scope<'a> {
    /// The scope of `about`: one pass over the Node-to-Machine index, per confirmation.
    fn of(idx: &Index, about: &'a BTreeSet<Target>) -> Self {
        let mut machines: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut node_names = BTreeSet::new();
        for t in about {
            match t {
                Target::Machine { namespace, name } => {
                    machines.entry(namespace.clone()).or_default().insert(name.clone());
                }
                Target::Node { name, .. } => {
                    node_names.insert(name.as_str());
                }
            }
        }
        // A check's cluster key for a Machine's Node is its own (or the local cluster when
        // self-hosted), not the Machine's label: match on the Node name in every cluster.
        if !node_names.is_empty() {
            for ((_, node), ms) in &idx.machines_by_node {
                if node_names.contains(node.as_str()) {
                    for (ns, m) in ms {
                        machines.entry(ns.clone()).or_default().insert(m.clone());
                    }
                }
            }
        }
        Scope { about, machines }
    }

    fn machines_of<'i>(&self, idx: &'i Index, namespace: &str) -> Vec<&'i MachineView> {
        let (Some(names), Some(all)) = (self.machines.get(namespace), idx.machines.get(namespace)) else {
            return Vec::new();
        };
        names.iter().filter_map(|n| all.get(n)).map(|e| e.view.as_ref()).collect()
    }
}

/// The targets check `key` is remediating, derived from the indexes (its remediation objects,
/// its Machines' conditions, its status' requests in flight).
pub fn claims_of(idx: &Index, key: &CheckRef) -> Vec<Claim> {
    claims_within(idx, key, None).unwrap_or_default()
}

/// [`claims_of`], or within `scope` only its claims about the scope's targets (looking only at
/// the scope's Machines and remediation objects naming its Nodes); `None` when the check cannot
/// hold any target of the scope (another namespace or cluster).
fn claims_within(idx: &Index, key: &CheckRef, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let claims = match key {
        CheckRef::Machine { namespace: ns, name: n } => mhc_claims_within(idx, ns, n, scope)?,
        CheckRef::Node { name: n } => nhc_claims_within(idx, n, scope)?,
    };
    Some(match scope {
        Some(s) => claims.into_iter().filter(|c| s.about.contains(&c.target)).collect(),
        None => claims,
    })
}

fn mhc_claims_within(idx: &Index, ns: &str, n: &str, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let Some(check) = idx.mhcs.get(&(ns.to_string(), n.to_string())) else { return Some(Vec::new()) };
    let Ok(policy) = validate::machine_health_check(check) else { return Some(Vec::new()) };
    let node_cluster = node_cluster(idx, ns, &policy.cluster_name);
    let machines: Vec<&MachineView> = match scope {
        None => idx.machines.get(ns).map(|ms| ms.values().map(|e| e.view.as_ref()).collect()).unwrap_or_default(),
        Some(s) => {
            let can_hold = s.about.iter().any(|t| match t {
                Target::Node { cluster, .. } => *cluster == node_cluster,
                Target::Machine { namespace, .. } => namespace == ns,
            });
            if !can_hold {
                return None;
            }
            s.machines_of(idx, ns)
        }
    };
    let objects = policy
        .remediation_template
        .as_ref()
        .and_then(|t| idx.objects.get(&(group_of(&t.api_version).to_string(), t.remediation_kind().to_string())));
    let remediations = RemediationIndex(objects.and_then(|c| c.remediations.get(ns)));
    let peer_checks = mhc_peers(idx, ns);
    let peers = peers_of(&peer_checks);
    Some(holders::mhc_claims_among(check, &policy, &peers, &node_cluster, &machines, &remediations))
}

fn nhc_claims_within(idx: &Index, n: &str, scope: Option<&Scope<'_>>) -> Option<Vec<Claim>> {
    let Some(check) = idx.nhcs.get(n) else { return Some(Vec::new()) };
    let Ok(policy) = validate::node_health_check(check) else { return Some(Vec::new()) };
    let local: Option<BTreeSet<&str>> = scope.map(|s| {
        s.about
            .iter()
            .filter_map(|t| match t {
                Target::Node { cluster, name } if cluster == LOCAL_CLUSTER => Some(name.as_str()),
                _ => None,
            })
            .collect()
    });
    if local.as_ref().is_some_and(BTreeSet::is_empty) {
        return None;
    }
    let names_a_scoped_node = |v: &RemediationView| {
        local.as_ref().is_none_or(|l| {
            v.meta.annotations.get(vigil_api::well_known::NODE_NAME_ANNOTATION).is_some_and(|n| l.contains(n.as_str()))
        })
    };
    let mut seen = BTreeSet::new();
    let mut views: Vec<&RemediationView> = Vec::new();
    for step in &policy.steps {
        let t = &step.template;
        let gk = (group_of(&t.api_version).to_string(), t.remediation_kind().to_string());
        if seen.insert((gk.clone(), t.namespace.clone()))
            && let Some(m) = idx.objects.get(&gk).and_then(|c| c.remediations.get(&t.namespace))
        {
            views.extend(m.values().map(|a| a.as_ref()).filter(|v| names_a_scoped_node(v)));
        }
    }
    Some(holders::nhc_claims(check, &views))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use vigil_api::validate::ConditionRule;

    type Cond<'a> = (&'a str, &'a str, Option<Timestamp>);

    fn node(conditions: &[Cond<'_>]) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s, at)| NodeCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            last_transition_time: at.map(Time),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn expiry_is_when_the_first_matching_timeout_ran_out() {
        let now: Timestamp = "2030-01-01T00:10:00Z".parse().expect("time");
        let rule = |t: &str, s: &str, secs| ConditionRule {
            type_: t.into(),
            status: s.into(),
            timeout: SignedDuration::from_secs(secs),
            max_age: None,
        };
        let rules = [rule("Ready", "False", 300), rule("Ready", "Unknown", 60), rule("DiskPressure", "True", 30)];
        let since: Timestamp = "2030-01-01T00:02:00Z".parse().expect("time");
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        let cases: [(Vec<Cond<'_>>, Option<Timestamp>); 5] = [
            (vec![("Ready", "False", Some(since))], Some(at("2030-01-01T00:07:00Z"))),
            (vec![("Ready", "Unknown", Some(since))], Some(at("2030-01-01T00:03:00Z"))),
            (
                vec![("Ready", "False", Some(since)), ("DiskPressure", "True", Some(since))],
                Some(at("2030-01-01T00:02:30Z")),
            ),
            (vec![("Ready", "False", Some(at("2030-01-01T00:09:00Z")))], None),
            (vec![("Ready", "False", None), ("Ready", "True", Some(since))], None),
        ];
        for (conditions, want) in cases {
            assert_eq!(expiry(&rules, &node(&conditions), now), want, "{conditions:?}");
        }
    }

    #[test]
    fn a_status_field_that_goes_away_is_sent_as_null() {
        use vigil_api::NodeHealthCheckStatus;
        use vigil_api::machine_health_check::WouldRemediate;
        let before = NodeHealthCheckStatus {
            observed_nodes: 3,
            would_remediate: vec![WouldRemediate {
                name: "w1".into(),
                action: "create SelfNodeRemediation".into(),
                since: Time(Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        };
        let after = NodeHealthCheckStatus { observed_nodes: 3, ..Default::default() };
        let patch = status_if_changed(Some(&before), &after).expect("changed");
        assert_eq!(patch["wouldRemediate"], Value::Null, "{patch}");
        assert_eq!(patch["observedNodes"], 3);
        assert_eq!(status_if_changed(Some(&after), &after), None, "unchanged: nothing to send");
        let first = status_if_changed(None, &after).expect("new");
        assert!(first.get("wouldRemediate").is_none(), "{first}");
    }
}

/// Confirming decisions derive other checks' claims only about the confirmed targets: that must
/// lose nothing a full derivation would find about them.
#[cfg(test)]
mod scoped_claims {
    use super::*;
    use crate::confirm::{self, keep_confirmed};
    use crate::index::slim_node;
    use serde_json::json;
    use vigil_api::well_known::NODE_NAME_ANNOTATION;

    const SNR: &str = "self-node-remediation.medik8s.io/v1alpha1";
    const FAR: &str = "fence-agents-remediation.medik8s.io/v1alpha1";

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn nhc(name: &str, api_version: &str, kind: &str) -> vigil_api::NodeHealthCheck {
        serde_json::from_value(json!({
            "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1", "generation": 1},
            "spec": {"selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
                     "minHealthy": "51%",
                     "remediationTemplate": {"apiVersion": api_version, "kind": kind, "name": "t", "namespace": "medik8s"}}
        }))
        .expect("NodeHealthCheck")
    }

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "r",
                "lastHeartbeatTime": "2030-01-01T00:00:00Z", "lastTransitionTime": "2029-12-01T00:00:00Z"}]}
        }))
        .expect("Node")
    }

    fn synced_kind(idx: &mut Index, api_version: &str, kind: &str) {
        let (group, _) = split_api_version(api_version);
        for (k, is_template) in [(format!("{kind}Template"), true), (kind.to_string(), false)] {
            let gk = (group.clone(), k.clone());
            if is_template {
                let t = json!({"apiVersion": api_version, "kind": k, "metadata": {"name": "t", "namespace": "medik8s"},
                               "spec": {"template": {"spec": {}}}});
                idx.put_object(&gk, true, Some(&t), None);
            }
            idx.objects.entry(gk).or_default().state = SourceState::Synced;
        }
    }

    /// Three workers, w-2 `Ready=False` for a month; NodeHealthChecks `reboot` (SelfNode-) and
    /// `fence` (FenceAgentsRemediation), `fence` remediating w-2 already (its object exists),
    /// while the cached claims, from before that object was seen, say nobody holds anything.
    fn two_nhcs() -> Index {
        let mut idx = Index::default();
        idx.nhc_state = SourceState::Synced;
        idx.put_nhc(Some(nhc("reboot", SNR, "SelfNodeRemediationTemplate")), None);
        idx.put_nhc(Some(nhc("fence", FAR, "FenceAgentsRemediationTemplate")), None);
        for (n, ready) in [("w-1", "True"), ("w-2", "False"), ("w-3", "True")] {
            idx.put_node(LOCAL_CLUSTER, Some(slim_node(&node(n, ready))), None, at("2030-01-01T00:00:00Z"));
        }
        idx.nodes.entry(LOCAL_CLUSTER.to_string()).or_default().state = SourceState::Synced;
        synced_kind(&mut idx, SNR, "SelfNodeRemediation");
        synced_kind(&mut idx, FAR, "FenceAgentsRemediation");
        let object = json!({"apiVersion": FAR, "kind": "FenceAgentsRemediation",
            "metadata": {"name": "w-2", "namespace": "medik8s", "creationTimestamp": "2029-12-31T23:00:00Z",
                         "annotations": {NODE_NAME_ANNOTATION: "w-2"},
                         "ownerReferences": [{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
                                              "name": "fence", "uid": "uid-fence"}]}});
        idx.put_object(
            &("fence-agents-remediation.medik8s.io".into(), "FenceAgentsRemediation".into()),
            false,
            Some(&object),
            None,
        );
        idx.claims.clear();
        idx
    }

    fn creates_for(job: &Job) -> Vec<String> {
        job.actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateRemediation { target, .. } => Some(target.clone()),
                _ => None,
            })
            .collect()
    }

    fn about(nodes: &[&str]) -> BTreeSet<Target> {
        nodes.iter().map(|n| Target::local_node(n)).collect()
    }

    #[test]
    fn another_checks_fresh_claim_on_a_confirmed_target_blocks_it_whatever_the_cache_says() {
        let idx = two_nhcs();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        let cached = job(&idx, &reboot, now).expect("decided");
        assert_eq!(creates_for(&cached), ["w-2"], "the cached claims say nobody holds w-2");
        let fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-2"])).expect("decided");
        assert_eq!(creates_for(&fresh), Vec::<String>::new(), "fence's object holds w-2");
        assert!(fresh.held_elsewhere.iter().any(|h| h.target == "w-2"), "{:?}", fresh.held_elsewhere);
    }

    #[test]
    fn a_remediation_outside_what_was_confirmed_is_left_out_and_decided_again() {
        let idx = two_nhcs();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        // Confirmed about w-1 only: w-2 is decided on cached claims, which miss fence's hold.
        let mut fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-1"])).expect("decided");
        assert_eq!(creates_for(&fresh), ["w-2"]);
        keep_confirmed(&mut fresh, &[confirm::Target::Node("w-1".into())].into());
        assert_eq!(creates_for(&fresh), Vec::<String>::new());
        assert!(fresh.again, "the check is decided again");
    }

    fn machine(name: &str, node: &str, owner_remediated: bool) -> Value {
        let conditions = if owner_remediated {
            json!([{"type": "HealthCheckSucceeded", "status": "False", "reason": "r", "message": "", "lastTransitionTime": "2029-12-31T22:00:00Z"},
                   {"type": "OwnerRemediated", "status": "False", "reason": "r", "message": "", "lastTransitionTime": "2029-12-31T22:00:00Z"}])
        } else {
            json!([])
        };
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": name, "namespace": "default", "resourceVersion": "1",
                            "labels": {"cluster.x-k8s.io/cluster-name": "prod", "pool": "workers"}},
               "spec": {"clusterName": "prod"},
               "status": {"nodeRef": {"name": node}, "conditions": conditions}})
    }

    /// [`two_nhcs`] without fence's object, plus a self-hosted cluster `default/prod` whose
    /// MachineHealthCheck asked the owner to remediate the Machine of w-2 (the same target), a
    /// check of another cluster, and 50 healthy Machines.
    fn self_hosted() -> Index {
        let mut idx = two_nhcs();
        idx.put_object(
            &("fence-agents-remediation.medik8s.io".into(), "FenceAgentsRemediation".into()),
            false,
            None,
            Some(("medik8s".into(), "w-2".into())),
        );
        idx.self_hosted.insert("default/prod".into());
        for (ns, name, cluster) in [("default", "workers", "prod"), ("other", "elsewhere", "far")] {
            let mhc: MachineHealthCheck = serde_json::from_value(json!({
                "apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": "1", "generation": 1},
                "spec": {"clusterName": cluster, "selector": {"matchLabels": {"pool": "workers"}},
                         "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "8m"}]}
            }))
            .expect("MachineHealthCheck");
            idx.put_mhc(Some(mhc), None);
        }
        idx.put_machine(Some(&machine("m-2", "w-2", true)), None);
        for i in 0..50 {
            idx.put_machine(Some(&machine(&format!("m-x{i}"), &format!("x{i}"), false)), None);
        }
        idx.claims.clear();
        idx
    }

    #[test]
    fn a_self_hosted_machine_claim_on_a_confirmed_node_is_found_without_walking_the_namespace() {
        let idx = self_hosted();
        let now = at("2030-01-01T00:00:10Z");
        let reboot = CheckRef::Node { name: "reboot".into() };
        assert_eq!(creates_for(&job(&idx, &reboot, now).expect("decided")), ["w-2"]);
        let fresh = job_with_fresh_holders(&idx, &reboot, now, &about(&["w-2"])).expect("decided");
        assert_eq!(creates_for(&fresh), Vec::<String>::new(), "the Machine of w-2 is held by the MHC");
        // Scoped derivation equals the full one restricted to the scope, for every check, and
        // a check that cannot select a target of the scope is not derived at all.
        for targets in [about(&["w-2"]), about(&["w-1", "w-2"]), about(&["x3"])] {
            let scope = Scope::of(&idx, &targets);
            for key in idx.all_checks() {
                let full: Vec<Claim> =
                    claims_of(&idx, &key).into_iter().filter(|c| targets.contains(&c.target)).collect();
                match claims_within(&idx, &key, Some(&scope)) {
                    Some(scoped) => assert_eq!(scoped, full, "{key:?} about {targets:?}"),
                    None => assert!(full.is_empty(), "{key:?} skipped but claims {full:?}"),
                }
            }
            assert!(scope.machines.get("default").is_some_and(|m| m.len() <= 2), "{:?}", scope.machines);
        }
        let other = CheckRef::Machine { namespace: "other".into(), name: "elsewhere".into() };
        assert!(claims_within(&idx, &other, Some(&Scope::of(&idx, &about(&["w-2"])))).is_none());
        assert!(
            !claims_of(&idx, &CheckRef::Machine { namespace: "default".into(), name: "workers".into() }).is_empty()
        );
    }
}
