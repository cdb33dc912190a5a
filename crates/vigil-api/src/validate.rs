//! Every admission rule of Vigil's resources, in one place. A spec that passes becomes a typed
//! policy; only policies reach the engine, so an invalid spec can never cause remediation.
//! `vigil validate`, the simulator and the controller all call these functions.

use crate::admission::*;
use crate::duration::{format_go_duration, parse_go_duration};
use crate::failure_domains::FailureDomains;
use crate::machine_health_check::{
    MachineHealthCheck, MachineHealthCheckSpec, MachineUnhealthyExpression, UnhealthyCondition,
};
use crate::node_health_check::{
    EscalatingRemediation, NodeHealthCheck, NodeHealthCheckSpec, NodeUnhealthyCondition, UnhealthyExpression,
};
use crate::selector::{Selector, check_label_key};
use crate::shared::{FeatureSpec, RemediationBackoff, TemplateReference};
use crate::threshold::{IntOrPercent, UnhealthyRange};
use crate::well_known::{CLUSTER_NAME_LABEL, MACHINE_FAILURE_DOMAIN_KEY};
use jiff::SignedDuration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::fmt;

/// One refused field: where, what value, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.unhealthyConditions[1].timeout`.
    pub path: String,
    /// The offending value as written (empty when the field is missing).
    pub value: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.path, self.message)
        } else {
            write!(f, "{}: invalid value {:?}: {}", self.path, self.value, self.message)
        }
    }
}

/// All the problems found in one object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object} is invalid: {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
pub struct ValidationErrors {
    /// `Kind/namespace/name` of the object.
    pub object: String,
    /// Every refused field, in spec order.
    pub errors: Vec<FieldError>,
}

/// A condition rule with its timeout parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConditionRule {
    /// Condition type.
    pub type_: String,
    /// Condition status that counts as unhealthy.
    pub status: String,
    /// How long the condition must hold.
    pub timeout: SignedDuration,
    /// `maxConditionAge`: a matching condition whose heartbeat is older is stale (matches no
    /// rule); `None` when the guard is off for this rule.
    pub max_age: Option<SignedDuration>,
    /// `reasons`: the condition's reason must be one of these; `None` matches any reason.
    pub reasons: Option<Vec<String>>,
    /// Where the rule is written, e.g. `spec.unhealthyConditions[1]`: how status, events and
    /// remediation objects name it.
    pub path: String,
    /// The rule's own remediation for the targets it made unhealthy (`None`: the check's).
    pub remediation: Option<RuleRemediation>,
}

impl ConditionRule {
    /// Whether a condition of this type, status and reason matches the rule: the type and status
    /// are the rule's and, when the rule lists reasons, the reason is one of them (a condition
    /// without a reason then matches nothing). The one matching rule of both kinds.
    pub fn matches(&self, type_: &str, status: &str, reason: Option<&str>) -> bool {
        type_.len() == self.type_.len()
            && status.len() == self.status.len()
            && type_ == self.type_
            && status == self.status
            && self.reason_matches(reason)
    }

    /// Whether the reason passes the rule's `reasons` (always, without them).
    pub fn reason_matches(&self, reason: Option<&str>) -> bool {
        match &self.reasons {
            None => true,
            Some(list) => reason.is_some_and(|r| list.iter().any(|l| l == r)),
        }
    }

    /// `Type=Status`, and the reasons when the rule lists them: what the rule matches, for a
    /// person.
    pub fn describe(&self) -> String {
        match &self.reasons {
            None => format!("{}={}", self.type_, self.status),
            Some(list) => format!("{}={} with reason {}", self.type_, self.status, list.join(" or ")),
        }
    }

    /// How status, events and remediation objects name the rule: its place and `Type=Status`,
    /// e.g. `spec.unhealthyConditions[1] KernelDeadlock=True` (the condition guards against an
    /// edit that moves another rule to this place mid-incident).
    pub fn label(&self) -> String {
        format!("{} {}={}", self.path, self.type_, self.status)
    }
}

/// A rule's own remediation (remediation per condition), validated as the check's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRemediation {
    /// Its remediators, lowest order first: one that never times out for a
    /// `remediationTemplate`, several for `escalatingRemediations` (NodeHealthCheck only).
    pub steps: Vec<RemediationStep>,
    /// Whether the steps came from `escalatingRemediations`.
    pub escalating: bool,
}

impl RuleRemediation {
    /// Where the rule's remediation is written, under the rule's path.
    pub fn field(&self, rule_path: &str) -> String {
        let field = if self.escalating { "escalatingRemediations" } else { "remediationTemplate" };
        format!("{rule_path}.{field}")
    }
}

/// `where (Template ns/a, then Template ns/b)`: a remediation named by the field it is written
/// in and the templates it uses, as status and events show it.
pub fn describe_remediation(field: &str, steps: &[RemediationStep]) -> String {
    let templates = steps.iter().map(|s| s.template.to_string()).collect::<Vec<_>>().join(", then ");
    format!("{field} ({templates})")
}

/// A template reference with its namespace resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateRef {
    /// apiVersion of the template (and of the objects made from it).
    pub api_version: String,
    /// Kind of the template, ending in `Template`.
    pub kind: String,
    /// Namespace of the template.
    pub namespace: String,
    /// Name of the template.
    pub name: String,
}

impl TemplateRef {
    /// Kind of the remediation objects made from this template (`XTemplate` → `X`).
    pub fn remediation_kind(&self) -> &str {
        self.kind.strip_suffix("Template").unwrap_or(&self.kind)
    }
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The short-circuit of a MachineHealthCheck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MhcShortCircuit {
    /// `maxUnhealthy` (a percentage rounds down).
    MaxUnhealthy(IntOrPercent),
    /// `unhealthyRange`, inclusive.
    Range(UnhealthyRange),
}

/// A validated MachineHealthCheck spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MhcPolicy {
    /// Cluster whose Machines are checked.
    pub cluster_name: String,
    /// Selector including the cluster-name label.
    pub selector: Selector,
    /// Node condition rules.
    pub node_conditions: Vec<ConditionRule>,
    /// Machine condition rules.
    pub machine_conditions: Vec<ConditionRule>,
    /// `None` when disabled with `0`.
    pub node_startup_timeout: Option<SignedDuration>,
    /// When remediation stops.
    pub short_circuit: MhcShortCircuit,
    /// External remediation template, if any.
    pub remediation_template: Option<TemplateRef>,
    /// Shadow mode: decide and report, never remediate.
    pub dry_run: bool,
    /// Remediation back-off per pool, when enabled.
    pub backoff: Option<BackoffPolicy>,
    /// Failure-domain budgets, when asked for.
    pub failure_domains: Option<FailureDomainPolicy>,
    /// Pacing: most remediations in flight at once (a count or a percentage of the targets),
    /// when asked for.
    pub max_in_flight: Option<IntOrPercent>,
    /// Whether targets taken down on purpose count as unavailable in every budget
    /// (`voluntaryDisruptions: Count`).
    pub count_disruptions: bool,
    /// CEL expression rules (`spec.unhealthyExpressions`) over a Machine and its Node, ORed with
    /// the condition rules.
    pub expressions: Vec<ExpressionRule>,
    /// Flapping targets (`spec.flapping`), when asked for.
    pub flapping: Option<FlappingPolicy>,
}

impl MhcPolicy {
    /// Every rule in the order a verdict reads them: the Machine condition rules, the Node
    /// condition rules, then the expressions (a verdict's rule is an index into this order).
    pub fn rules(&self) -> impl Iterator<Item = RuleRef<'_>> + Clone {
        let conditions = self.machine_conditions.iter().chain(&self.node_conditions).map(RuleRef::Condition);
        conditions.chain(self.expressions.iter().map(RuleRef::Expression))
    }

    /// Where expression `i` is in [`Self::rules`].
    pub fn expression_rule(&self, i: usize) -> usize {
        self.machine_conditions.len() + self.node_conditions.len() + i
    }

    /// Whether some rule names its own remediation (remediation per rule is on).
    pub fn per_rule_remediation(&self) -> bool {
        self.rules().any(|r| r.remediation().is_some())
    }

    /// Every template the check may use, each once: its own, then each rule's in [`Self::rules`]
    /// order. Adapters read these templates and their remediation kinds (`MhcInput::templates`
    /// and `MhcInput::remediations` follow this order).
    pub fn templates(&self) -> Vec<&TemplateRef> {
        let mut out: Vec<&TemplateRef> = Vec::new();
        let rule_templates = self.rules().filter_map(|r| r.remediation()).flat_map(|r| &r.steps);
        for t in self.remediation_template.iter().chain(rule_templates.map(|s| &s.template)) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// The remediation a target made unhealthy by rule `rule` (an index into [`Self::rules`];
    /// `None`: no condition rule) gets: the rule's own template, else the check's (`None`: the
    /// owner), with where it is written.
    pub fn remediation_of(&self, rule: Option<usize>) -> (Option<&TemplateRef>, String) {
        let own = rule.and_then(|i| self.rules().nth(i)).and_then(|r| Some((r, r.remediation()?)));
        match (own, &self.remediation_template) {
            (Some((r, rem)), _) => {
                (rem.steps.first().map(|s| &s.template), describe_remediation(&rem.field(r.path()), &rem.steps))
            }
            (None, Some(t)) => (Some(t), format!("spec.remediationTemplate ({t})")),
            (None, None) => (None, "owner".to_string()),
        }
    }
}

/// Where a target's failure domain is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainKey {
    /// The value of this label on the target's Node (a Machine's Node for a MachineHealthCheck).
    NodeLabel(String),
    /// A Machine's own `spec.failureDomain` (MachineHealthCheck only).
    MachineField,
}

impl fmt::Display for DomainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainKey::NodeLabel(key) => write!(f, "{key}"),
            DomainKey::MachineField => write!(f, "{MACHINE_FAILURE_DOMAIN_KEY}"),
        }
    }
}

/// A validated `spec.failureDomains`: a separate unhealthy budget per domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureDomainPolicy {
    /// How a target's domain is found.
    pub key: DomainKey,
    /// Most targets of a domain that may be unhealthy (a percentage of the domain's targets,
    /// rounded as the check's own `maxUnhealthy`).
    pub max_unhealthy: IntOrPercent,
    /// A domain may always have this many unhealthy (the small-domain floor).
    pub min_allowed: u32,
}

/// A validated `spec.backoff`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Most remediations started in one pool within `window`.
    pub max_remediations: u32,
    /// How far back starts count (positive).
    pub window: SignedDuration,
    /// NodeHealthCheck: the label naming a Node's pool; `None` for a MachineHealthCheck.
    pub pool_label: Option<String>,
}

/// The threshold of a NodeHealthCheck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NhcThreshold {
    /// `minHealthy` (a percentage rounds up).
    MinHealthy(IntOrPercent),
    /// `maxUnhealthy` (a percentage rounds up, as medik8s: 75% of 10 allows 8).
    MaxUnhealthy(IntOrPercent),
}

/// One remediator of a NodeHealthCheck, in escalation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemediationStep {
    /// The template.
    pub template: TemplateRef,
    /// `order` as written (0 for a single `remediationTemplate`).
    pub order: i32,
    /// How long before escalating; `None` for a single template (it never times out).
    pub timeout: Option<SignedDuration>,
}

/// What a NodeHealthCheck does once a healthy Node still has remediation objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthyDelay {
    /// Remove them once the Node has been healthy this long (zero: at once).
    After(SignedDuration),
    /// Keep them until the Node carries the manually-confirmed-healthy annotation.
    UntilConfirmed,
}

/// The API a NodeHealthCheck is served from: its remediation objects' owner reference names it,
/// so remediators and the garbage collector find the check they belong to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NhcApi {
    /// Vigil's own, `vigil.dev/v1alpha1`.
    #[default]
    Vigil,
    /// medik8s', `remediation.medik8s.io/v1alpha1`, served in place (`vigil run --serve-medik8s`).
    Medik8s,
}

impl NhcApi {
    /// The `apiVersion` of checks served from this API.
    pub fn api_version(self) -> &'static str {
        match self {
            NhcApi::Vigil => crate::API_VERSION,
            NhcApi::Medik8s => crate::well_known::MEDIK8S_NHC_API_VERSION,
        }
    }
}

/// A validated `spec.flapping`: so many episodes within the window make a target unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlappingPolicy {
    /// Episodes within `window` that make a target flapping (2 to 20).
    pub episodes: usize,
    /// How far back episodes count (1m to 24h, not shorter than the longest rule duration).
    pub window: SignedDuration,
}

/// A validated `spec.unhealthyExpressions` entry: compiled once with the policy, so deciding
/// never parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpressionRule {
    /// The compiled expression (it keeps its source for messages).
    pub expression: vigil_expr::Expression,
    /// How long it must hold for a Node to be unhealthy.
    pub duration: SignedDuration,
    /// Where it is written, e.g. `spec.unhealthyExpressions[1]`: how status and events name it.
    pub path: String,
    /// The expression's own remediation for the targets it made unhealthy (`None`: the check's).
    pub remediation: Option<RuleRemediation>,
}

/// Longest expression source a rule's label carries whole; a longer one is cut and named by a
/// digest of its source.
const LABEL_SOURCE_CHARS: usize = 64;

impl ExpressionRule {
    /// How status, events and remediation objects name the rule: its place and its source (cut
    /// to [`LABEL_SOURCE_CHARS`] with a digest of the whole when longer), so an edit that puts
    /// another expression in this place mid-incident is told apart.
    pub fn label(&self) -> String {
        let source: String = self.expression.source().split_whitespace().collect::<Vec<_>>().join(" ");
        if source.chars().count() <= LABEL_SOURCE_CHARS {
            return format!("{} {source}", self.path);
        }
        let cut: String = source.chars().take(LABEL_SOURCE_CHARS - 8).collect();
        format!("{} {cut}… #{:016x}", self.path, fnv1a(self.expression.source().as_bytes()))
    }
}

/// FNV-1a, 64 bits: a digest that stays the same across builds and versions (a label written on
/// an object must read the same after an upgrade; std's hasher makes no such promise).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// One rule of a check, of either form: what remediation per rule reads of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleRef<'p> {
    /// A condition rule.
    Condition(&'p ConditionRule),
    /// An expression rule.
    Expression(&'p ExpressionRule),
}

impl<'p> RuleRef<'p> {
    /// How status, events and remediation objects name it.
    pub fn label(&self) -> String {
        match self {
            RuleRef::Condition(r) => r.label(),
            RuleRef::Expression(r) => r.label(),
        }
    }

    /// Where it is written, e.g. `spec.unhealthyConditions[1]`.
    pub fn path(&self) -> &'p str {
        match self {
            RuleRef::Condition(r) => &r.path,
            RuleRef::Expression(r) => &r.path,
        }
    }

    /// Its own remediation, if it names one.
    pub fn remediation(&self) -> Option<&'p RuleRemediation> {
        match self {
            RuleRef::Condition(r) => r.remediation.as_ref(),
            RuleRef::Expression(r) => r.remediation.as_ref(),
        }
    }
}

/// A validated NodeHealthCheck spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NhcPolicy {
    /// Which API the check is served from (what its remediation objects' owner reference names).
    pub api: NhcApi,
    /// Which Nodes are checked.
    pub selector: Selector,
    /// Node condition rules.
    pub conditions: Vec<ConditionRule>,
    /// CEL expression rules (`spec.unhealthyExpressions`), ORed with the condition rules.
    pub expressions: Vec<ExpressionRule>,
    /// When remediation stops.
    pub threshold: NhcThreshold,
    /// Remediators, lowest order first.
    pub steps: Vec<RemediationStep>,
    /// Whether `steps` came from `escalatingRemediations`.
    pub escalating: bool,
    /// Active pause requests.
    pub pause_requests: Vec<String>,
    /// What to do with a recovered Node's remediation objects.
    pub healthy_delay: HealthyDelay,
    /// How long to keep blocking after a storm.
    pub storm_cooldown: SignedDuration,
    /// Shadow mode: decide and report, never remediate.
    pub dry_run: bool,
    /// Remediation back-off per pool, when enabled.
    pub backoff: Option<BackoffPolicy>,
    /// Failure-domain budgets, when asked for.
    pub failure_domains: Option<FailureDomainPolicy>,
    /// Pacing: most remediations in flight at once (a count or a percentage of the selected
    /// Nodes), when asked for.
    pub max_in_flight: Option<IntOrPercent>,
    /// Whether Nodes taken down on purpose count as unavailable in every budget
    /// (`voluntaryDisruptions: Count`).
    pub count_disruptions: bool,
    /// Flapping targets (`spec.flapping`), when asked for.
    pub flapping: Option<FlappingPolicy>,
    /// Planned maintenance: the grace after a Node's maintenance ends; `None` when the check
    /// does not leave Nodes under maintenance alone (`plannedMaintenance.enabled: false`).
    pub maintenance_grace: Option<SignedDuration>,
}

impl NhcPolicy {
    /// Every rule in spec order: the condition rules, then the expressions (an incident's rule
    /// is an index into this order).
    pub fn rules(&self) -> impl Iterator<Item = RuleRef<'_>> + Clone {
        self.conditions.iter().map(RuleRef::Condition).chain(self.expressions.iter().map(RuleRef::Expression))
    }

    /// Whether some rule names its own remediation (remediation per rule is on).
    pub fn per_rule_remediation(&self) -> bool {
        self.rules().any(|r| r.remediation().is_some())
    }

    /// Every remediation step the check may use: its own (`steps`), then each rule's own in
    /// [`Self::rules`] order. Adapters read the templates and remediation objects of all of them
    /// (`NhcInput::templates` follows this order); a template may appear more than once.
    pub fn all_steps(&self) -> impl Iterator<Item = &RemediationStep> {
        self.steps.iter().chain(self.rules().filter_map(|r| r.remediation()).flat_map(|r| &r.steps))
    }

    /// The remediation of the Nodes rule `rule` (an index into [`Self::rules`]) made unhealthy
    /// (`None`: the check's own): its steps, where the first of them is in [`Self::all_steps`],
    /// and where it is written.
    pub fn ladder(&self, rule: Option<usize>) -> Ladder<'_> {
        let mut offset = self.steps.len();
        for (i, r) in self.rules().enumerate() {
            let Some(rem) = r.remediation() else { continue };
            if Some(i) == rule {
                return Ladder { steps: &rem.steps, offset, field: rem.field(r.path()) };
            }
            offset += rem.steps.len();
        }
        let field = if self.escalating { "spec.escalatingRemediations" } else { "spec.remediationTemplate" };
        Ladder { steps: &self.steps, offset: 0, field: field.to_string() }
    }
}

/// One remediation of a NodeHealthCheck: the check's own or a rule's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder<'p> {
    /// Its steps, lowest order first.
    pub steps: &'p [RemediationStep],
    /// The index of `steps[0]` in [`NhcPolicy::all_steps`] (where its templates are found).
    pub offset: usize,
    /// Where it is written, e.g. `spec.unhealthyConditions[1].escalatingRemediations`.
    pub field: String,
}

impl Ladder<'_> {
    /// The remediation as status and events show it.
    pub fn describe(&self) -> String {
        describe_remediation(&self.field, self.steps)
    }
}

#[derive(Default)]
struct Collector {
    errors: Vec<FieldError>,
}

impl Collector {
    fn push(&mut self, path: impl Into<String>, value: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { path: path.into(), value: value.into(), message: message.into() });
    }

    fn finish<T>(self, object: String, value: Option<T>) -> Result<T, ValidationErrors> {
        match value {
            Some(v) if self.errors.is_empty() => Ok(v),
            _ => Err(ValidationErrors { object, errors: self.errors }),
        }
    }

    fn selector(&mut self, path: &str, sel: &LabelSelector) -> Option<Selector> {
        match Selector::compile(sel) {
            Ok(s) => Some(s),
            Err(problems) => {
                for p in problems {
                    let full = if p.path.is_empty() { path.to_string() } else { format!("{path}.{}", p.path) };
                    self.push(full, p.value, p.message);
                }
                None
            }
        }
    }

    fn duration(&mut self, path: &str, text: &str) -> Option<SignedDuration> {
        match parse_go_duration(text) {
            Ok(d) => Some(d),
            Err(e) => {
                self.push(path, text, e.to_string());
                None
            }
        }
    }

    fn non_negative_duration(&mut self, path: &str, text: &str) -> Option<SignedDuration> {
        let d = self.duration(path, text)?;
        if d.is_negative() {
            self.push(path, text, "must not be negative");
            return None;
        }
        Some(d)
    }

    fn threshold(&mut self, path: &str, value: &IntOrString) -> Option<IntOrPercent> {
        match IntOrPercent::parse(value) {
            Ok(t) => Some(t),
            Err(e) => {
                self.push(path, render_int_or_string(value), e.to_string());
                None
            }
        }
    }

    fn condition_rule(
        &mut self,
        path: &str,
        type_: &str,
        status: &str,
        timeout_field: &str,
        timeout: &str,
    ) -> Option<ConditionRule> {
        let mut ok = true;
        if type_.trim().is_empty() {
            self.push(format!("{path}.type"), type_, "must not be empty");
            ok = false;
        }
        if crate::conditions::ConditionStatus::parse(status).is_none() {
            self.push(format!("{path}.status"), status, "must be one of True, False, Unknown");
            ok = false;
        }
        let timeout = self.non_negative_duration(&format!("{path}.{timeout_field}"), timeout);
        if !ok {
            return None;
        }
        Some(ConditionRule {
            type_: type_.to_string(),
            status: status.to_string(),
            timeout: timeout?,
            path: path.to_string(),
            ..ConditionRule::default()
        })
    }

    /// A Node condition rule's `maxConditionAge`: at least [`MIN_MAX_CONDITION_AGE`], and not on
    /// a `Ready` rule. `Some(None)` when absent; `None` when refused.
    fn max_condition_age(&mut self, path: &str, type_: &str, text: Option<&str>) -> Option<Option<SignedDuration>> {
        let Some(text) = text else { return Some(None) };
        let path = format!("{path}.maxConditionAge");
        let age = self.duration(&path, text)?;
        if age < MIN_MAX_CONDITION_AGE {
            self.push(&path, text, MAX_CONDITION_AGE_TOO_SHORT);
            return None;
        }
        if type_ == "Ready" {
            self.push(&path, text, MAX_CONDITION_AGE_ON_READY);
            return None;
        }
        Some(Some(age))
    }

    /// A rule's `reasons`: absent matches any reason; a list must name at least one, each once
    /// and none blank. `Some(None)` when absent; `None` when refused.
    fn reasons(&mut self, path: &str, reasons: Option<&[String]>) -> Option<Option<Vec<String>>> {
        let Some(list) = reasons else { return Some(None) };
        let path = format!("{path}.reasons");
        if list.is_empty() {
            self.push(&path, "", EMPTY_REASONS);
            return None;
        }
        let mut ok = true;
        if list.len() > REASONS_MAX_ITEMS {
            let value = format!("{} reasons", list.len());
            self.push(&path, &value, format!("must list at most {REASONS_MAX_ITEMS} reasons"));
            ok = false;
        }
        for (i, reason) in list.iter().enumerate() {
            let chars = reason.chars().count();
            if chars > REASON_MAX_LENGTH {
                let shown: String = reason.chars().take(40).collect();
                self.push(
                    format!("{path}[{i}]"),
                    format!("{shown}… ({chars} characters)"),
                    format!("must be at most {REASON_MAX_LENGTH} characters"),
                );
                ok = false;
            } else if reason.trim().is_empty() {
                self.push(format!("{path}[{i}]"), reason, "must not be empty: name a condition reason");
                ok = false;
            } else if let Some(first) = list[..i].iter().position(|r| r == reason) {
                self.push(format!("{path}[{i}]"), reason, format!("{DUPLICATE_REASON} ({path}[{first}])"));
                ok = false;
            }
        }
        ok.then(|| Some(list.to_vec()))
    }

    /// `remediationTemplate` / `escalatingRemediations` under `prefix` (`spec`, or a rule's
    /// path): exactly one of them when `required` (the check's own), at most one on a rule.
    /// A MachineHealthCheck (`namespace` given) has templates only, in its own namespace.
    /// `Some(None)` when neither is set on a rule; `None` when refused.
    fn remediation(
        &mut self,
        prefix: &str,
        template: Option<&TemplateReference>,
        escalating: &[EscalatingRemediation],
        required: bool,
        namespace: Option<&str>,
    ) -> Option<Option<RuleRemediation>> {
        let template_path = format!("{prefix}.remediationTemplate");
        match (template, escalating.is_empty()) {
            (Some(t), true) => self.template(&template_path, t, namespace).map(|template| {
                Some(RuleRemediation {
                    steps: vec![RemediationStep { template, order: 0, timeout: None }],
                    escalating: false,
                })
            }),
            (None, false) => escalation_steps(self, prefix, escalating)
                .map(|steps| Some(RuleRemediation { steps, escalating: true })),
            (Some(_), false) if required => {
                self.push(template_path, "", "only one of remediationTemplate and escalatingRemediations may be set");
                None
            }
            (Some(_), false) => {
                self.push(template_path, "", RULE_REMEDIATION_BOTH);
                None
            }
            (None, true) if required => {
                self.push(template_path, "", "one of remediationTemplate and escalatingRemediations must be set");
                None
            }
            (None, true) => Some(None),
        }
    }

    fn template(&mut self, path: &str, t: &TemplateReference, default_namespace: Option<&str>) -> Option<TemplateRef> {
        let mut ok = true;
        for (field, value) in [("apiVersion", &t.api_version), ("kind", &t.kind), ("name", &t.name)] {
            if value.trim().is_empty() {
                self.push(format!("{path}.{field}"), "", "must not be empty");
                ok = false;
            }
        }
        if !t.kind.is_empty() && (!t.kind.ends_with("Template") || t.kind == "Template") {
            self.push(
                format!("{path}.kind"),
                &t.kind,
                "must name a template kind ending in Template, e.g. SelfNodeRemediationTemplate",
            );
            ok = false;
        }
        if !t.api_version.is_empty() && !t.api_version.contains('/') {
            self.push(
                format!("{path}.apiVersion"),
                &t.api_version,
                "must be group/version: remediation templates are custom resources",
            );
            ok = false;
        }
        let namespace = match (default_namespace, t.namespace.as_deref()) {
            (Some(own), Some(given)) if !given.is_empty() && given != own => {
                self.push(
                    format!("{path}.namespace"),
                    given,
                    format!("must be the health check's own namespace {own:?}"),
                );
                ok = false;
                own.to_string()
            }
            (Some(own), _) => own.to_string(),
            (None, Some(given)) if !given.is_empty() => given.to_string(),
            (None, _) => {
                self.push(
                    format!("{path}.namespace"),
                    "",
                    "must not be empty: a NodeHealthCheck is cluster-scoped, so its templates need a namespace",
                );
                ok = false;
                String::new()
            }
        };
        ok.then(|| TemplateRef {
            api_version: t.api_version.clone(),
            kind: t.kind.clone(),
            namespace,
            name: t.name.clone(),
        })
    }
}

/// Which health check a rule is checking: the shared Vigil features differ in a few details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A MachineHealthCheck (Cluster API's field names and rules).
    Machine,
    /// A NodeHealthCheck (medik8s' field names and rules).
    Node,
}

/// Checks `spec.backoff`; `kind` says which kind asks (NodeHealthCheck: `poolLabel` required,
/// MachineHealthCheck: refused). `Some(None)` when absent, `None` when invalid.
fn backoff(c: &mut Collector, b: Option<&RemediationBackoff>, kind: Kind) -> Option<Option<BackoffPolicy>> {
    let Some(b) = b else { return Some(None) };
    let mut ok = true;
    if !(1..=MAX_BACKOFF_REMEDIATIONS).contains(&b.max_remediations) {
        c.push(
            "spec.backoff.maxRemediations",
            b.max_remediations.to_string(),
            format!("must be between 1 and {MAX_BACKOFF_REMEDIATIONS}"),
        );
        ok = false;
    }
    let window = c.duration("spec.backoff.window", &b.window);
    if window.is_some_and(|w| !w.is_positive()) {
        c.push("spec.backoff.window", &b.window, "must be greater than zero");
        ok = false;
    }
    match (kind, b.pool_label.as_deref()) {
        (Kind::Node, None) => {
            c.push("spec.backoff.poolLabel", "", crate::admission::NHC_POOL_LABEL_MESSAGE);
            ok = false;
        }
        (Kind::Node, Some(key)) => {
            if let Err(message) = crate::selector::check_label_key(key) {
                c.push("spec.backoff.poolLabel", key, message);
                ok = false;
            }
        }
        (Kind::Machine, Some(key)) => {
            c.push("spec.backoff.poolLabel", key, crate::admission::MHC_POOL_LABEL_MESSAGE);
            ok = false;
        }
        (Kind::Machine, None) => {}
    }
    let window = window?;
    ok.then(|| {
        Some(BackoffPolicy {
            max_remediations: u32::try_from(b.max_remediations).unwrap_or(1),
            window,
            pool_label: b.pool_label.clone(),
        })
    })
}

impl Collector {
    /// `spec.failureDomains`; a MachineHealthCheck may use the `spec.failureDomain` key and
    /// writes its `maxUnhealthy` as its own `maxUnhealthy` (a string is a percentage).
    fn failure_domains(&mut self, fd: &FailureDomains, kind: Kind) -> Option<FailureDomainPolicy> {
        let path = "spec.failureDomains";
        let key = if fd.key == MACHINE_FAILURE_DOMAIN_KEY {
            if kind == Kind::Machine {
                Some(DomainKey::MachineField)
            } else {
                self.push(
                    format!("{path}.key"),
                    &fd.key,
                    "spec.failureDomain is a Machine field; a NodeHealthCheck groups Nodes by a Node label such as topology.kubernetes.io/zone",
                );
                None
            }
        } else if fd.key.trim().is_empty() {
            self.push(
                format!("{path}.key"),
                "",
                "must not be empty: name a Node label such as topology.kubernetes.io/zone",
            );
            None
        } else {
            match check_label_key(&fd.key) {
                Ok(()) => Some(DomainKey::NodeLabel(fd.key.clone())),
                Err(why) => {
                    self.push(format!("{path}.key"), &fd.key, why);
                    None
                }
            }
        };
        let max_path = format!("{path}.maxUnhealthy");
        let max_unhealthy = match kind {
            Kind::Machine => self.capi_threshold(&max_path, "", &fd.max_unhealthy),
            Kind::Node => self.threshold(&max_path, &fd.max_unhealthy),
        };
        let min_allowed = match fd.min_allowed {
            None => Some(1),
            Some(n) => match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.push(format!("{path}.minAllowed"), n.to_string(), "must not be negative");
                    None
                }
            },
        };
        Some(FailureDomainPolicy { key: key?, max_unhealthy: max_unhealthy?, min_allowed: min_allowed? })
    }

    /// `spec.maxInFlight`: a count or a percentage of the targets as Kubernetes reads an
    /// int-or-string limit (a string is a percentage only), and never 0, which would mean
    /// "never remediate" (the short-circuit's job, not pacing's).
    fn max_in_flight(&mut self, value: &IntOrString) -> Option<IntOrPercent> {
        let path = "spec.maxInFlight";
        let limit = self.capi_threshold(path, "maxInFlight: ", value)?;
        if matches!(limit, IntOrPercent::Count(0) | IntOrPercent::Percent(0)) {
            self.push(path, render_int_or_string(value), MAX_IN_FLIGHT_ZERO);
            return None;
        }
        Some(limit)
    }

    /// `spec.voluntaryDisruptions`: whether disruptions count (`Count`), `Ignore` or absent not.
    fn voluntary_disruptions(&mut self, value: Option<&str>) -> Option<bool> {
        match value {
            None | Some("Ignore") => Some(false),
            Some("Count") => Some(true),
            Some(other) => {
                self.push("spec.voluntaryDisruptions", other, VOLUNTARY_DISRUPTIONS_MESSAGE);
                None
            }
        }
    }

    /// A threshold as Cluster API reads it: a string is a percentage only ("10" is refused, not
    /// taken as 10). `label` starts the count hint in the message (e.g. `maxUnhealthy: `).
    fn capi_threshold(&mut self, path: &str, label: &str, value: &IntOrString) -> Option<IntOrPercent> {
        match value {
            IntOrString::String(text) if !text.trim().ends_with('%') => {
                self.push(
                    path,
                    text,
                    format!(
                        "a string must be a percentage such as 40%; write a count as a number ({label}{}, not \"{}\")",
                        text.trim(),
                        text.trim()
                    ),
                );
                None
            }
            v => self.threshold(path, v),
        }
    }
}

/// Vigil's own features (upstream has none of them), validated alike for both kinds.
struct Features {
    /// `dryRun`.
    dry_run: bool,
    /// `backoff`, when enabled.
    backoff: Option<BackoffPolicy>,
    /// `failureDomains`, when asked for.
    failure_domains: Option<FailureDomainPolicy>,
    /// `maxInFlight`, when asked for.
    max_in_flight: Option<IntOrPercent>,
    /// `voluntaryDisruptions: Count`.
    count_disruptions: bool,
}

/// `dryRun`, `backoff`, `failureDomains`, `maxInFlight` and `voluntaryDisruptions`: one rule set for both kinds, so the
/// two cannot drift apart. `None` when any of them is refused.
fn features(c: &mut Collector, kind: Kind, fields: FeatureSpec<'_>) -> Option<Features> {
    let backoff = backoff(c, fields.backoff, kind);
    let failure_domains = match fields.failure_domains {
        None => Some(None),
        Some(fd) => c.failure_domains(fd, kind).map(Some),
    };
    let max_in_flight = match fields.max_in_flight {
        None => Some(None),
        Some(v) => c.max_in_flight(v).map(Some),
    };
    let count_disruptions = c.voluntary_disruptions(fields.voluntary_disruptions);
    Some(Features {
        dry_run: fields.dry_run,
        backoff: backoff?,
        failure_domains: failure_domains?,
        max_in_flight: max_in_flight?,
        count_disruptions: count_disruptions?,
    })
}

fn render_int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// `Kind/namespace/name` (`Kind/name` when cluster-scoped) naming an object in errors; manifests
/// name the objects they read the same way.
pub(crate) fn object_id(kind: &str, namespace: Option<&str>, name: Option<&str>) -> String {
    let name = name.unwrap_or("<unnamed>");
    match namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// A Node condition rule as either kind writes it (they name the timeout differently, and only
/// a NodeHealthCheck rule may escalate).
struct NodeRuleFields<'a> {
    type_: &'a str,
    status: &'a str,
    timeout: &'a str,
    max_age: Option<&'a str>,
    reasons: Option<&'a [String]>,
    template: Option<&'a TemplateReference>,
    escalating: &'a [EscalatingRemediation],
}

impl<'a> From<&'a UnhealthyCondition> for NodeRuleFields<'a> {
    fn from(u: &'a UnhealthyCondition) -> Self {
        NodeRuleFields {
            type_: &u.type_,
            status: &u.status,
            timeout: &u.timeout,
            max_age: u.max_condition_age.as_deref(),
            reasons: u.reasons.as_deref(),
            template: u.remediation_template.as_ref(),
            escalating: &[],
        }
    }
}

impl<'a> From<&'a NodeUnhealthyCondition> for NodeRuleFields<'a> {
    fn from(u: &'a NodeUnhealthyCondition) -> Self {
        NodeRuleFields {
            type_: &u.type_,
            status: &u.status,
            timeout: &u.duration,
            max_age: u.max_condition_age.as_deref(),
            reasons: u.reasons.as_deref(),
            template: u.remediation_template.as_ref(),
            escalating: &u.escalating_remediations,
        }
    }
}

/// Node condition rules, the same rule for both kinds (the stale guard `maxConditionAge`,
/// `reasons` and a rule's own remediation allowed); `timeout_field` is what the kind calls the
/// timeout; `namespace` is a MachineHealthCheck's own (its templates live there).
fn node_rules<'a>(
    c: &mut Collector,
    path: &str,
    timeout_field: &str,
    namespace: Option<&str>,
    list: impl IntoIterator<Item = NodeRuleFields<'a>>,
) -> Vec<ConditionRule> {
    list.into_iter()
        .enumerate()
        .filter_map(|(i, u)| {
            let path = format!("{path}[{i}]");
            let rule = c.condition_rule(&path, u.type_, u.status, timeout_field, u.timeout);
            let age = c.max_condition_age(&path, u.type_, u.max_age);
            let reasons = c.reasons(&path, u.reasons);
            let remediation = c.remediation(&path, u.template, u.escalating, false, namespace);
            Some(ConditionRule { max_age: age?, reasons: reasons?, remediation: remediation?, path, ..rule? })
        })
        .collect()
}

/// A MachineHealthCheck's Machine condition rules: Machine conditions carry no heartbeat, so
/// `maxConditionAge` is refused, and the reserved conditions are refused after all the rules.
fn machine_rules(c: &mut Collector, path: &str, namespace: &str, list: &[UnhealthyCondition]) -> Vec<ConditionRule> {
    let rules = list
        .iter()
        .enumerate()
        .filter_map(|(i, u)| {
            let path = format!("{path}[{i}]");
            if let Some(age) = &u.max_condition_age {
                c.push(format!("{path}.maxConditionAge"), age, MAX_CONDITION_AGE_ON_MACHINE);
            }
            let rule = c.condition_rule(&path, &u.type_, &u.status, "timeout", &u.timeout);
            let reasons = c.reasons(&path, u.reasons.as_deref());
            let remediation = c.remediation(&path, u.remediation_template.as_ref(), &[], false, Some(namespace));
            Some(ConditionRule { reasons: reasons?, remediation: remediation?, path, ..rule? })
        })
        .collect();
    for (i, u) in list.iter().enumerate() {
        if RESERVED_MACHINE_CONDITIONS.contains(&u.type_.as_str()) {
            c.push(
                format!("{path}[{i}].type"),
                &u.type_,
                format!(
                    "must not be one of {}: they summarise the Machine or are written by the health check itself",
                    RESERVED_MACHINE_CONDITIONS.join(", ")
                ),
            );
        }
    }
    rules
}

/// `nodeStartupTimeout`: defaulted, `0` disables it, and a short one would remediate booting
/// Machines. `Some(None)` when disabled, `None` when refused.
fn node_startup_timeout(c: &mut Collector, text: Option<&str>) -> Option<Option<SignedDuration>> {
    let Some(text) = text else { return Some(Some(DEFAULT_NODE_STARTUP_TIMEOUT)) };
    let d = c.non_negative_duration("spec.nodeStartupTimeout", text)?;
    if d.is_zero() {
        Some(None)
    } else if d < MIN_NODE_STARTUP_TIMEOUT {
        c.push(
            "spec.nodeStartupTimeout",
            text,
            format!(
                "must be 0 (disabled) or at least {}: a shorter timeout remediates Machines that are still booting",
                format_go_duration(MIN_NODE_STARTUP_TIMEOUT)
            ),
        );
        None
    } else {
        Some(Some(d))
    }
}

/// Cross-field: a cluster-name label in the selector must name `spec.clusterName`, since the
/// check only ever looks at that cluster's Machines.
fn cluster_label_matches(c: &mut Collector, spec: &MachineHealthCheckSpec) {
    if let Some(given) = spec.selector.match_labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL))
        && given != &spec.cluster_name
    {
        c.push(
            format!("spec.selector.matchLabels.{CLUSTER_NAME_LABEL}"),
            given,
            format!(
                "must equal spec.clusterName {:?}: the check only looks at that cluster's Machines",
                spec.cluster_name
            ),
        );
    }
}

/// A MachineHealthCheck's threshold: `unhealthyRange` wins over `maxUnhealthy` (default 100%),
/// as in Cluster API.
fn mhc_short_circuit(c: &mut Collector, spec: &MachineHealthCheckSpec) -> Option<MhcShortCircuit> {
    let max_unhealthy = match &spec.max_unhealthy {
        None => Some(IntOrPercent::Percent(100)),
        Some(v) => c.capi_threshold("spec.maxUnhealthy", "maxUnhealthy: ", v),
    };
    let range = match spec.unhealthy_range.as_deref() {
        None => Some(None),
        Some(text) => match UnhealthyRange::parse(text) {
            Ok(r) => Some(Some(r)),
            Err(e) => {
                c.push("spec.unhealthyRange", text, e.to_string());
                None
            }
        },
    };
    match (range, max_unhealthy) {
        (Some(Some(r)), _) => Some(MhcShortCircuit::Range(r)),
        (Some(None), Some(m)) => Some(MhcShortCircuit::MaxUnhealthy(m)),
        _ => None,
    }
}

/// Checks a MachineHealthCheck and returns its policy, or every problem found.
pub fn machine_health_check(mhc: &MachineHealthCheck) -> Result<MhcPolicy, ValidationErrors> {
    let spec = &mhc.spec;
    let namespace = mhc.metadata.namespace.as_deref().unwrap_or("default");
    let object = object_id("MachineHealthCheck", Some(namespace), mhc.metadata.name.as_deref());
    let mut c = Collector::default();

    if spec.cluster_name.trim().is_empty() {
        c.push("spec.clusterName", "", "must not be empty");
    }
    let selector = c.selector("spec.selector", &spec.selector);
    let node_conditions = node_rules(
        &mut c,
        "spec.unhealthyConditions",
        "timeout",
        Some(namespace),
        spec.unhealthy_conditions.iter().map(Into::into),
    );
    let machine_conditions =
        machine_rules(&mut c, "spec.unhealthyMachineConditions", namespace, &spec.unhealthy_machine_conditions);
    let node_startup_timeout = node_startup_timeout(&mut c, spec.node_startup_timeout.as_deref());
    cluster_label_matches(&mut c, spec);
    let short_circuit = mhc_short_circuit(&mut c, spec);
    let remediation_template = match &spec.remediation_template {
        None => Some(None),
        Some(t) => c.template("spec.remediationTemplate", t, Some(namespace)).map(Some),
    };
    let features = features(&mut c, Kind::Machine, spec.features());
    let expressions = expressions(&mut c, &spec.unhealthy_expressions, Some(namespace));
    let rules = machine_conditions.iter().chain(&node_conditions);
    let flapping = flapping(&mut c, spec.flapping.as_ref(), longest_timeout(rules, expressions.as_deref()));

    let policy = (|| {
        let Features { dry_run, backoff, failure_domains, max_in_flight, count_disruptions } = features?;
        Some(MhcPolicy {
            cluster_name: spec.cluster_name.clone(),
            selector: selector?.with_label(CLUSTER_NAME_LABEL, &spec.cluster_name),
            node_conditions,
            machine_conditions,
            node_startup_timeout: node_startup_timeout?,
            short_circuit: short_circuit?,
            remediation_template: remediation_template?,
            dry_run,
            backoff,
            failure_domains,
            max_in_flight,
            count_disruptions,
            expressions: expressions?,
            flapping: flapping?,
        })
    })();
    c.finish(object, policy)
}

/// The longest time any rule must hold (conditions, and the expressions when they were read):
/// `spec.flapping.window` may not be shorter.
fn longest_timeout<'r>(
    conditions: impl IntoIterator<Item = &'r ConditionRule>,
    expressions: Option<&[ExpressionRule]>,
) -> Option<SignedDuration> {
    let by_expressions = expressions.unwrap_or_default().iter().map(|e| e.duration);
    conditions.into_iter().map(|r| r.timeout).chain(by_expressions).max()
}

/// A NodeHealthCheck's threshold: exactly one of `minHealthy` and `maxUnhealthy`.
fn nhc_threshold(c: &mut Collector, spec: &NodeHealthCheckSpec) -> Option<NhcThreshold> {
    match (&spec.min_healthy, &spec.max_unhealthy) {
        (Some(v), None) => c.threshold("spec.minHealthy", v).map(NhcThreshold::MinHealthy),
        (None, Some(v)) => c.threshold("spec.maxUnhealthy", v).map(NhcThreshold::MaxUnhealthy),
        (Some(min), Some(max)) => {
            c.push(
                "spec.minHealthy",
                render_int_or_string(min),
                format!(
                    "only one of minHealthy and maxUnhealthy may be set (maxUnhealthy is {:?})",
                    render_int_or_string(max)
                ),
            );
            None
        }
        (None, None) => {
            c.push("spec.minHealthy", "", "one of minHealthy and maxUnhealthy must be set");
            None
        }
    }
}

/// A NodeHealthCheck's remediators: exactly one of `remediationTemplate` (one step that never
/// times out) and `escalatingRemediations` (the same rule as a rule's own, which may be neither).
fn remediation_steps(c: &mut Collector, spec: &NodeHealthCheckSpec) -> Option<Vec<RemediationStep>> {
    c.remediation("spec", spec.remediation_template.as_ref(), &spec.escalating_remediations, true, None)?
        .map(|r| r.steps)
}

/// What the earlier escalation steps used, so a repeated order or template names the first.
#[derive(Default)]
struct SeenSteps {
    orders: BTreeMap<i32, usize>,
    templates: BTreeMap<TemplateRef, usize>,
}

/// `escalatingRemediations` under `prefix` (`spec` or a rule's path), lowest order first; `None`
/// when any step is refused (every step is still checked, so all problems are reported).
fn escalation_steps(c: &mut Collector, prefix: &str, list: &[EscalatingRemediation]) -> Option<Vec<RemediationStep>> {
    let mut seen = SeenSteps::default();
    let mut steps = Vec::new();
    let mut ok = true;
    for (i, e) in list.iter().enumerate() {
        match escalation_step(c, &mut seen, &format!("{prefix}.escalatingRemediations"), i, e) {
            Some(step) => steps.push(step),
            None => ok = false,
        }
    }
    steps.sort_by_key(|s| s.order);
    ok.then_some(steps)
}

/// One escalation step: a non-negative unique order, a timeout long enough for a remediator to
/// act, and a template no other step uses.
fn escalation_step(
    c: &mut Collector,
    seen: &mut SeenSteps,
    list_path: &str,
    i: usize,
    e: &EscalatingRemediation,
) -> Option<RemediationStep> {
    let path = format!("{list_path}[{i}]");
    let mut ok = true;
    if e.order < 0 {
        c.push(format!("{path}.order"), e.order.to_string(), "must not be negative");
        ok = false;
    }
    if let Some(first) = seen.orders.insert(e.order, i) {
        c.push(
            format!("{path}.order"),
            e.order.to_string(),
            format!("must be unique: {list_path}[{first}] has the same order"),
        );
        ok = false;
    }
    let timeout = c.non_negative_duration(&format!("{path}.timeout"), &e.timeout);
    if let Some(t) = timeout
        && t < MIN_ESCALATION_TIMEOUT
    {
        c.push(format!("{path}.timeout"), &e.timeout, "must be at least 1m: a remediator needs time to act");
        ok = false;
    }
    let template = c.template(&format!("{path}.remediationTemplate"), &e.remediation_template, None);
    if let Some(t) = &template
        && let Some(first) = seen.templates.insert(t.clone(), i)
    {
        c.push(
            format!("{path}.remediationTemplate"),
            t.to_string(),
            format!("must be unique: {list_path}[{first}] uses the same template"),
        );
        ok = false;
    }
    let step = RemediationStep { template: template?, order: e.order, timeout: Some(timeout?) };
    ok.then_some(step)
}

/// Cross-field (medik8s): a MachineDeletionRemediation deletes Machines, and the MachineSet
/// replacing them makes the node count move under a maxUnhealthy limit; upstream allows only
/// minHealthy.
fn deletion_needs_min_healthy(c: &mut Collector, spec: &NodeHealthCheckSpec) {
    let Some(max) = &spec.max_unhealthy else { return };
    // The check's own templates and every rule's own (a rule's may delete Machines as well).
    let mut templates = Vec::new();
    with_paths("spec", spec.remediation_template.as_ref(), &spec.escalating_remediations, &mut templates);
    for (i, r) in spec.unhealthy_conditions.iter().enumerate() {
        let prefix = format!("spec.unhealthyConditions[{i}]");
        with_paths(&prefix, r.remediation_template.as_ref(), &r.escalating_remediations, &mut templates);
    }
    for (i, r) in spec.unhealthy_expressions.iter().enumerate() {
        let prefix = format!("spec.unhealthyExpressions[{i}]");
        with_paths(&prefix, r.remediation_template.as_ref(), &r.escalating_remediations, &mut templates);
    }
    let deleting = templates.into_iter().find(|(_, t)| t.kind == MACHINE_DELETION_REMEDIATION_TEMPLATE);
    if let Some((path, _)) = deleting {
        c.push(
            "spec.maxUnhealthy",
            render_int_or_string(max),
            format!("cannot be combined with a {MACHINE_DELETION_REMEDIATION_TEMPLATE} ({path}); use minHealthy"),
        );
    }
}

/// The templates of a `remediationTemplate` / `escalatingRemediations` pair under `prefix`, with
/// the path of each.
fn with_paths<'a>(
    prefix: &str,
    template: Option<&'a TemplateReference>,
    escalating: &'a [EscalatingRemediation],
    out: &mut Vec<(String, &'a TemplateReference)>,
) {
    out.extend(template.map(|t| (format!("{prefix}.remediationTemplate"), t)));
    out.extend(
        escalating.iter().enumerate().map(|(i, e)| {
            (format!("{prefix}.escalatingRemediations[{i}].remediationTemplate"), &e.remediation_template)
        }),
    );
}

/// `pauseRequests`: an empty entry would pause the check without saying who or why.
fn pause_requests(c: &mut Collector, requests: &[String]) {
    for (i, p) in requests.iter().enumerate() {
        if p.trim().is_empty() {
            c.push(format!("spec.pauseRequests[{i}]"), "", "must not be empty: say who paused the check and why");
        }
    }
}

/// `healthyDelay` (default zero; negative waits for the manual confirmation) and
/// `stormCooldownDuration` (default zero): when a recovered Node's remediation ends.
fn recovery_delays(c: &mut Collector, spec: &NodeHealthCheckSpec) -> (Option<HealthyDelay>, Option<SignedDuration>) {
    let healthy_delay = match spec.healthy_delay.as_deref() {
        None => Some(HealthyDelay::After(SignedDuration::ZERO)),
        Some(text) => c
            .duration("spec.healthyDelay", text)
            .map(|d| if d.is_negative() { HealthyDelay::UntilConfirmed } else { HealthyDelay::After(d) }),
    };
    let storm_cooldown = match spec.storm_cooldown_duration.as_deref() {
        None => Some(SignedDuration::ZERO),
        Some(text) => c.non_negative_duration("spec.stormCooldownDuration", text),
    };
    (healthy_delay, storm_cooldown)
}

/// `spec.flapping`: `episodes` from 2 to 20, `window` from 1m to 24h and not shorter than the
/// longest rule duration (`longest`, when a rule was read). `Some(None)` when off, `None` when
/// refused.
fn flapping(
    c: &mut Collector,
    spec: Option<&crate::shared::Flapping>,
    longest: Option<SignedDuration>,
) -> Option<Option<FlappingPolicy>> {
    let Some(f) = spec else {
        return Some(None);
    };
    let episodes = if (MIN_FLAPPING_EPISODES..=MAX_FLAPPING_EPISODES).contains(&f.episodes) {
        usize::try_from(f.episodes).ok()
    } else {
        c.push("spec.flapping.episodes", f.episodes.to_string(), FLAPPING_EPISODES_MESSAGE);
        None
    };
    let window = match c.duration("spec.flapping.window", &f.window) {
        Some(w) if w < SignedDuration::from_mins(1) || w > SignedDuration::from_hours(24) => {
            c.push("spec.flapping.window", &f.window, FLAPPING_WINDOW_BOUNDS);
            None
        }
        Some(w) => match longest.filter(|l| w < *l) {
            Some(l) => {
                let message = format!("{FLAPPING_WINDOW_SHORT} (the longest is {})", format_go_duration(l));
                c.push("spec.flapping.window", &f.window, message);
                None
            }
            None => Some(w),
        },
        None => None,
    };
    Some(Some(FlappingPolicy { episodes: episodes?, window: window? }))
}

/// One `spec.unhealthyExpressions` entry as written, of either kind.
struct ExpressionFields<'a> {
    expression: &'a str,
    /// What the kind calls the time it must hold (`duration`, `timeout`), and its value.
    timeout: (&'static str, &'a str),
    template: Option<&'a TemplateReference>,
    escalating: &'a [EscalatingRemediation],
}

impl<'a> From<&'a UnhealthyExpression> for ExpressionFields<'a> {
    fn from(e: &'a UnhealthyExpression) -> Self {
        ExpressionFields {
            expression: &e.expression,
            timeout: ("duration", &e.duration),
            template: e.remediation_template.as_ref(),
            escalating: &e.escalating_remediations,
        }
    }
}

impl<'a> From<&'a MachineUnhealthyExpression> for ExpressionFields<'a> {
    fn from(e: &'a MachineUnhealthyExpression) -> Self {
        ExpressionFields {
            expression: &e.expression,
            timeout: ("timeout", &e.timeout),
            template: e.remediation_template.as_ref(),
            escalating: &[],
        }
    }
}

/// `spec.unhealthyExpressions`: at most [`MAX_EXPRESSIONS`], each compiled (a refusal names
/// `…expression` and the source) with a non-negative Go duration and at most one remediation of
/// its own (`namespace`: a MachineHealthCheck's own, where its templates live). A
/// NodeHealthCheck's expression reads `node` alone (it has no Machine). `None` when any is refused.
fn expressions<'a, T>(c: &mut Collector, list: &'a [T], namespace: Option<&str>) -> Option<Vec<ExpressionRule>>
where
    ExpressionFields<'a>: From<&'a T>,
{
    if list.len() > MAX_EXPRESSIONS {
        c.push("spec.unhealthyExpressions", format!("{} items", list.len()), TOO_MANY_EXPRESSIONS);
        return None;
    }
    let mut rules = Some(Vec::with_capacity(list.len()));
    for (i, e) in list.iter().enumerate() {
        let e = ExpressionFields::from(e);
        let path = format!("spec.unhealthyExpressions[{i}]");
        let field = format!("{path}.expression");
        let compiled = match vigil_expr::Expression::compile(&field, e.expression) {
            Ok(x) if x.reads_machine() && namespace.is_none() => {
                c.push(field, e.expression, NO_MACHINE_ON_NODE_CHECK);
                None
            }
            Ok(x) => Some(x),
            Err(refusal) => {
                c.push(field, refusal.value(), refusal.reason());
                None
            }
        };
        let duration = c.non_negative_duration(&format!("{path}.{}", e.timeout.0), e.timeout.1);
        let remediation = c.remediation(&path, e.template, e.escalating, false, namespace);
        match (compiled, duration, remediation, rules.as_mut()) {
            (Some(expression), Some(duration), Some(remediation), Some(rules)) => {
                rules.push(ExpressionRule { expression, duration, path, remediation })
            }
            _ => rules = None,
        }
    }
    rules
}

/// `spec.plannedMaintenance`: on with [`DEFAULT_MAINTENANCE_GRACE`] unless `enabled: false`;
/// `Some(None)` when off, `None` when the grace is invalid.
fn maintenance_grace(c: &mut Collector, spec: &NodeHealthCheckSpec) -> Option<Option<SignedDuration>> {
    let pm = spec.planned_maintenance.clone().unwrap_or_default();
    let grace = match pm.grace.as_deref() {
        None => Some(DEFAULT_MAINTENANCE_GRACE),
        Some(text) => match c.non_negative_duration("spec.plannedMaintenance.grace", text) {
            Some(d) if d > MAX_MAINTENANCE_GRACE => {
                c.push(
                    "spec.plannedMaintenance.grace",
                    text,
                    "must be at most 24h: a longer grace hides a Node that did not come back",
                );
                None
            }
            d => d,
        },
    };
    match pm.enabled {
        Some(false) => Some(None),
        _ => grace.map(Some),
    }
}

/// [`node_health_check`] for a medik8s NodeHealthCheck served in place, read with
/// [`crate::manifest::health_check_from_value`]: the same rules, and a policy that says where the
/// check is served from.
pub fn medik8s_node_health_check(nhc: &NodeHealthCheck) -> Result<NhcPolicy, ValidationErrors> {
    node_health_check(nhc).map(|p| NhcPolicy { api: NhcApi::Medik8s, ..p })
}

/// Checks a NodeHealthCheck and returns its policy, or every problem found.
pub fn node_health_check(nhc: &NodeHealthCheck) -> Result<NhcPolicy, ValidationErrors> {
    let spec = &nhc.spec;
    let object = object_id("NodeHealthCheck", None, nhc.metadata.name.as_deref());
    let mut c = Collector::default();

    let selector = c.selector("spec.selector", &spec.selector);
    let conditions = node_rules(
        &mut c,
        "spec.unhealthyConditions",
        "duration",
        None,
        spec.unhealthy_conditions.iter().map(Into::into),
    );
    let threshold = nhc_threshold(&mut c, spec);
    let steps = remediation_steps(&mut c, spec);
    deletion_needs_min_healthy(&mut c, spec);
    pause_requests(&mut c, &spec.pause_requests);
    let (healthy_delay, storm_cooldown) = recovery_delays(&mut c, spec);
    let maintenance_grace = maintenance_grace(&mut c, spec);
    let features = features(&mut c, Kind::Node, spec.features());
    let expressions = expressions(&mut c, &spec.unhealthy_expressions, None);
    let longest = longest_timeout(&conditions, expressions.as_deref());
    let flapping = flapping(&mut c, spec.flapping.as_ref(), longest);

    let policy = (|| {
        let Features { dry_run, backoff, failure_domains, max_in_flight, count_disruptions } = features?;
        Some(NhcPolicy {
            api: NhcApi::Vigil,
            selector: selector?,
            conditions,
            expressions: expressions?,
            threshold: threshold?,
            escalating: !spec.escalating_remediations.is_empty(),
            steps: steps?,
            pause_requests: spec.pause_requests.clone(),
            healthy_delay: healthy_delay?,
            storm_cooldown: storm_cooldown?,
            dry_run,
            backoff,
            failure_domains,
            max_in_flight,
            count_disruptions,
            flapping: flapping?,
            maintenance_grace: maintenance_grace?,
        })
    })();
    c.finish(object, policy)
}
