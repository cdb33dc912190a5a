//! medik8s' NodeHealthCheck as Vigil reads and writes it: its group and kind, a check read
//! leniently into Vigil's types, its status converted both ways, and what the index keeps of
//! every medik8s check ([`Upstream`]). Pure conversions and state: no I/O, nothing of the
//! controller above the sources, so the index can hold it.

use crate::sources::SourceState;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use vigil_api::conditions::get_condition;
use vigil_api::manifest::{self, HealthCheck, ManifestError};
use vigil_api::node_health_check::{NodeHealthCheck, NodeHealthCheckStatus};
use vigil_api::reason::Reason;
use vigil_api::well_known::{DISABLED, REMEDIATION_ALLOWED};

/// API group of medik8s' NodeHealthCheck.
pub const GROUP: &str = "remediation.medik8s.io";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// Its kind.
pub const KIND: &str = "NodeHealthCheck";
/// The name under which the medik8s NodeHealthCheck watch is registered (`/readyz`, metrics).
pub const SOURCE: &str = "medik8s NodeHealthChecks";
/// medik8s' condition types and reasons (api/v1alpha1/nodehealthcheck_types.go, v0.12.0): a
/// storm is on.
pub const STORM_ACTIVE: &str = "StormActive";
/// The storm ended and its cool-down runs.
pub const STORM_COOLDOWN_ACTIVE: &str = "StormCooldownActive";
/// Why a storm condition changed.
pub const STORM_REASON: &str = "HealthyNodeThresholdChange";
/// Why a check is enabled.
pub const ENABLED_REASON: &str = "NodeHealthCheckEnabled";
/// The fields of medik8s' `NodeHealthCheckStatus` that Vigil's status has too (same names, same
/// shapes); medik8s' other field, the deprecated `inFlightRemediations`, is cleared as the
/// operator itself clears it.
pub const SHARED_FIELDS: [&str; 7] =
    ["observedNodes", "healthyNodes", "unhealthyNodes", "conditions", "phase", "reason", "lastUpdateTime"];

/// Why no medik8s check is decided now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The operator's Lease has not been listed yet: nothing is decided, nothing is told.
    Starting,
    /// Whether the operator runs cannot be told (the watch of its Lease failed).
    Unsure(String),
    /// The operator runs (what its Lease says).
    Operator(String),
}

impl Stop {
    /// The reason and message a refused check's status and event carry (`None`: not told).
    pub fn told(&self) -> Option<(Reason, String)> {
        match self {
            Stop::Starting => None,
            Stop::Unsure(why) => Some((Reason::WaitingForCaches, why.clone())),
            Stop::Operator(what) => Some((
                Reason::OperatorRunning,
                format!(
                    "the NodeHealthCheck operator runs ({what}): Vigil does not decide this check while it does, so \
                     that two controllers never remediate the same Nodes"
                ),
            )),
        }
    }

    /// Whether two stops are of the same kind (a change of kind is told again).
    pub fn same_kind(&self, other: &Stop) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// What the index keeps of medik8s' NodeHealthChecks (`Index::medik8s`).
#[derive(Debug)]
pub struct Upstream {
    /// Every medik8s NodeHealthCheck as read, by name, served or not.
    pub(crate) checks: BTreeMap<String, Entry>,
    /// Whether the watch of them can be trusted.
    pub(crate) state: SourceState,
    /// Names of Vigil's own NodeHealthChecks (such a check wins over a medik8s one of its name).
    pub(crate) vigil: BTreeSet<String>,
    /// Names whose entry in `Index::nhcs` is the medik8s check.
    pub(crate) served: BTreeSet<String>,
    /// Why no medik8s check is decided now, if so.
    pub(crate) stop: Option<Stop>,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            checks: BTreeMap::new(),
            state: SourceState::Syncing,
            vigil: BTreeSet::new(),
            served: BTreeSet::new(),
            stop: Some(Stop::Starting),
        }
    }
}

impl Upstream {
    /// Every medik8s NodeHealthCheck as read, by name, served or not.
    pub fn checks(&self) -> &BTreeMap<String, Entry> {
        &self.checks
    }

    /// Whether the medik8s check `name` is the one the index holds under its name.
    pub fn is_served(&self, name: &str) -> bool {
        self.served.contains(name)
    }

    /// Whether the medik8s check `name` is decided now: it exists, no `vigil.dev` check has its
    /// name, and the operator is known not to run.
    pub fn serves(&self, name: &str) -> bool {
        self.checks.contains_key(name) && !self.vigil.contains(name) && self.stop.is_none()
    }

    /// Why the medik8s check `name` is not decided, as its status and event tell it (`None`: it
    /// is decided, there is none, or nothing is told yet).
    pub fn refusal(&self, name: &str) -> Option<(Reason, String)> {
        if !self.checks.contains_key(name) || self.serves(name) {
            return None;
        }
        if self.vigil.contains(name) {
            return Some((
                Reason::NameTakenByVigilCheck,
                format!(
                    "the vigil.dev/v1alpha1 NodeHealthCheck {name} is served instead of this one (one name, one \
                     check); delete one of the two"
                ),
            ));
        }
        self.stop.as_ref().and_then(Stop::told)
    }
}

/// One medik8s NodeHealthCheck as read.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The check as the engine reads it: the spec converted, the status read from medik8s'
    /// schema (an empty spec when it cannot be read).
    pub check: NodeHealthCheck,
    /// Why its spec cannot be read, if so.
    pub error: Option<String>,
    /// Its `status` as stored, in medik8s' schema: what a status write is a patch against.
    pub status: Value,
}

/// Reads a medik8s NodeHealthCheck leniently: a spec that cannot be read still gives an entry
/// (with the error, which its status then says), never a panic.
pub fn read(raw: &Value) -> Entry {
    let status = raw.get("status").cloned().unwrap_or(Value::Null);
    let metadata = raw.get("metadata").and_then(|m| serde_json::from_value(m.clone()).ok()).unwrap_or_default();
    let (mut check, error) = match manifest::health_check_from_value(raw) {
        Ok(HealthCheck::Node(check)) => (check, None),
        Ok(HealthCheck::Machine(_)) => (empty_check(), Some("not a NodeHealthCheck".to_string())),
        Err(ManifestError::Shape { path, message, .. }) if !path.is_empty() => {
            (empty_check(), Some(format!("{path}: {message}")))
        }
        Err(e) => (empty_check(), Some(e.to_string())),
    };
    check.metadata = metadata;
    check.status = status_from_upstream(&status);
    Entry { check, error: error.map(|e| format!("spec cannot be read: {e}")), status }
}

fn empty_check() -> NodeHealthCheck {
    NodeHealthCheck::new("", crate::lenient::empty_nhc_spec())
}

/// A stored medik8s status as the engine's previous status: the shared fields, the reasons
/// translated back, the storm cool-down's start from `StormCooldownActive`, and a storm the
/// operator was in (`StormActive=True`) as the engine says it (`RemediationAllowed=False`,
/// `TooFewHealthy`), so a swap in the middle of a storm keeps its cool-down. `None` when it
/// cannot be read (as for a Vigil check: the engine starts from no status).
pub fn status_from_upstream(stored: &Value) -> Option<NodeHealthCheckStatus> {
    let stored = stored.as_object()?;
    let mut shared: Map<String, Value> =
        SHARED_FIELDS.iter().filter_map(|k| Some((k.to_string(), stored.get(*k)?.clone()))).collect();
    // An ObjectReference's fields are all optional in medik8s' schema (a cluster-scoped
    // remediation kind has no namespace); Vigil's reference spells them out.
    let resources = shared
        .get_mut("unhealthyNodes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(|n| n.get_mut("remediations").and_then(Value::as_array_mut))
        .flatten()
        .filter_map(|r| r.get_mut("resource").and_then(Value::as_object_mut));
    for resource in resources {
        for field in ["apiVersion", "kind", "namespace", "name"] {
            resource.entry(field).or_insert_with(|| Value::String(String::new()));
        }
    }
    let mut status: NodeHealthCheckStatus = serde_json::from_value(Value::Object(shared)).ok()?;
    for c in status.conditions.iter_mut().filter(|c| c.type_ == DISABLED && c.reason == ENABLED_REASON) {
        c.reason = Reason::Enabled.as_str().to_string();
    }
    let cooldown = get_condition(&status.conditions, STORM_COOLDOWN_ACTIVE).filter(|c| c.status == "True");
    status.storm_recovery_start_time = cooldown.map(|c| c.last_transition_time.clone());
    let storm = get_condition(&status.conditions, STORM_ACTIVE).filter(|c| c.status == "True").cloned();
    if let Some(storm) = storm
        && cooldown.is_none()
        && get_condition(&status.conditions, REMEDIATION_ALLOWED).is_none()
    {
        status.conditions.push(Condition {
            type_: REMEDIATION_ALLOWED.into(),
            status: "False".into(),
            reason: Reason::TooFewHealthy.as_str().into(),
            message: storm.message.clone(),
            last_transition_time: storm.last_transition_time.clone(),
            observed_generation: storm.observed_generation,
        });
        status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    }
    status.observed_generation = get_condition(&status.conditions, DISABLED).and_then(|c| c.observed_generation);
    Some(status)
}

/// A status as medik8s' schema holds it: the shared fields, medik8s' reason for an enabled
/// check, and the storm conditions medik8s keeps (`StormCooldownActive` always, since it is
/// the cool-down's durable start; `StormActive` when `storm`, the check having a
/// `stormCooldownDuration`, or when it is there already). The rest of Vigil's status is left
/// out (the API server would prune it). `stored` is the status as stored now.
pub fn status_to_upstream(status: &NodeHealthCheckStatus, stored: &Value, storm: bool) -> Value {
    let full = serde_json::to_value(status).unwrap_or(Value::Null);
    let mut out: Map<String, Value> =
        SHARED_FIELDS.iter().filter_map(|k| Some((k.to_string(), full.get(*k)?.clone()))).collect();
    let mut conditions = status.conditions.clone();
    for c in conditions.iter_mut().filter(|c| c.type_ == DISABLED && c.reason == Reason::Enabled.as_str()) {
        c.reason = ENABLED_REASON.to_string();
    }
    let at = status
        .last_update_time
        .clone()
        .or_else(|| stored.get("lastUpdateTime").and_then(|t| serde_json::from_value::<Time>(t.clone()).ok()));
    // StormCooldownActive: True from the cool-down's start while it lasts, False once it ended.
    match (&status.storm_recovery_start_time, get_condition(&conditions, STORM_COOLDOWN_ACTIVE)) {
        (Some(start), current) => {
            if current.is_none_or(|c| c.status != "True" || c.last_transition_time != *start) {
                let message = "Storm cooldown delay started - waiting before resuming remediation";
                set_storm_condition(&mut conditions, STORM_COOLDOWN_ACTIVE, "True", start.clone(), message);
            }
        }
        (None, Some(c)) if c.status != "False" => {
            if let Some(at) = at.clone() {
                set_storm_condition(&mut conditions, STORM_COOLDOWN_ACTIVE, "False", at, "Storm cooldown completed");
            }
        }
        (None, _) => {}
    }
    // StormActive: True while the threshold is not met or the cool-down lasts (a check with a
    // stormCooldownDuration), False once that ended.
    let allowed = get_condition(&conditions, REMEDIATION_ALLOWED);
    let stormy = allowed.filter(|c| {
        c.status == "False"
            && (c.reason == Reason::TooFewHealthy.as_str() || c.reason == Reason::StormCooldown.as_str())
    });
    let active = get_condition(&conditions, STORM_ACTIVE).map(|c| c.status == "True");
    match (stormy.map(|c| c.last_transition_time.clone()), active) {
        (Some(since), None | Some(false)) if storm => {
            let message = "Storm mode is active: no new remediation until the storm is over and its cooldown passed";
            set_storm_condition(&mut conditions, STORM_ACTIVE, "True", since, message);
        }
        (None, Some(true)) => {
            if let Some(at) = at {
                set_storm_condition(&mut conditions, STORM_ACTIVE, "False", at, "Storm mode is not active");
            }
        }
        _ => {}
    }
    if !conditions.is_empty() {
        out.insert("conditions".into(), serde_json::to_value(&conditions).unwrap_or(Value::Null));
    }
    Value::Object(out)
}

/// Sets one of medik8s' storm conditions (reason `HealthyNodeThresholdChange`, as medik8s).
fn set_storm_condition(conditions: &mut Vec<Condition>, type_: &str, state: &str, since: Time, message: &str) {
    let condition = Condition {
        type_: type_.into(),
        status: state.into(),
        reason: STORM_REASON.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: None,
    };
    match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => conditions[i] = condition,
        None => {
            conditions.push(condition);
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
}
