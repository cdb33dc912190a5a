//! The admission rules of [`crate::validate`] that the API server can check, as schema transforms:
//! OpenAPI bounds and CEL rules (`x-kubernetes-validations`) whose messages come from
//! [`crate::admission`], shared with `validate.rs`. The type definitions attach them with
//! `#[schemars(transform = crate::schema::...)]`, so every rule of the CRDs lives in this file.
//!
//! What the API server cannot check stays enforced by the controller alone, which refuses such a
//! spec and says why in a condition: a MachineHealthCheck template's `namespace` (CEL sees only
//! the object's `metadata.name`), numbers beyond 32 bits inside `unhealthyRange` or a threshold
//! string, and a `healthyDelay` beyond Go's duration range (other durations that large are
//! refused by the API server, with CEL's conversion error as the message). The API server is
//! stricter in two ways: no spaces around values (`validate.rs` trims them), and the bounds below.
//!
//! Every rule is guarded so that it does not fail to evaluate on a value another check already
//! refuses (a CEL evaluation error would read as noise next to the real message), and every
//! string or list a rule reads is bounded (`maxLength`, `maxItems`) so that the API server's
//! CEL cost estimate stays far below its budget.

use schemars::Schema;

use crate::admission::{
    EMPTY_REASONS, MACHINE_DELETION_REMEDIATION_TEMPLATE, MAX_BACKOFF_REMEDIATIONS, MAX_CONDITION_AGE_ON_MACHINE,
    MAX_CONDITION_AGE_ON_READY, MAX_CONDITION_AGE_TOO_SHORT, MAX_IN_FLIGHT_ZERO, MHC_POOL_LABEL_MESSAGE,
    NHC_POOL_LABEL_MESSAGE, REASON_MAX_LENGTH, REASONS_MAX_ITEMS, RESERVED_MACHINE_CONDITIONS, RULE_REMEDIATION_BOTH,
    VOLUNTARY_DISRUPTIONS_MESSAGE,
};
use crate::admission::{EXPRESSION_MAX_LENGTH, MAX_EXPRESSIONS};
use crate::admission::{
    FLAPPING_EPISODES_MESSAGE, FLAPPING_WINDOW_BOUNDS, FLAPPING_WINDOW_SHORT, MAX_FLAPPING_EPISODES,
    MIN_FLAPPING_EPISODES,
};
use crate::selector::{LABEL_KEY_RULE, LABEL_VALUE_RULE};
use crate::well_known::{CLUSTER_NAME_LABEL, MACHINE_FAILURE_DOMAIN_KEY};
use serde_json::{Map, Value, json};

/// Go's `time.ParseDuration` grammar (what `validate.rs` and CEL's `duration()` accept): an
/// optional sign, then `0` or numbers each with a unit. Written without backslashes so the same
/// text works as an OpenAPI `pattern` and inside a CEL string literal.
pub const GO_DURATION_PATTERN: &str = r"^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// `unhealthyRange` as Cluster API writes it: `[min-max]` with whole numbers.
pub const UNHEALTHY_RANGE_PATTERN: &str = r"^\[[0-9]+-[0-9]+\]$";

/// Longest duration string accepted; far longer than any real duration (`1h2m3.5s` is 8).
const DURATION_MAX_LENGTH: u32 = 64;
/// Longest condition type, as for `metav1.Condition`.
const CONDITION_TYPE_MAX_LENGTH: u32 = 316;
/// Longest `apiVersion`: a DNS subdomain group (253), `/`, a DNS label version (63).
const API_VERSION_MAX_LENGTH: u32 = 317;
/// Longest DNS label: kinds, namespaces, label values.
const DNS_LABEL_MAX_LENGTH: u32 = 63;
/// Longest DNS subdomain: object names.
const DNS_SUBDOMAIN_MAX_LENGTH: u32 = 253;
/// Longest label key: a DNS subdomain prefix (253), `/`, a name (63).
const LABEL_KEY_MAX_LENGTH: u32 = 317;
/// Longest value of a closed set (a condition status, a selector operator); longer values are
/// refused as too long before any rule runs.
const ENUM_MAX_LENGTH: u32 = 16;
/// Longest `unhealthyRange` (`[min-max]`).
const RANGE_MAX_LENGTH: u32 = 32;
/// Longest threshold string (`100%` is 4; a count fits in 10 digits).
const THRESHOLD_MAX_LENGTH: u32 = 16;
/// Most condition rules per list (Cluster API's limit).
const CONDITIONS_MAX_ITEMS: u32 = 100;
/// Most selector expressions; real selectors have a handful.
const MATCH_EXPRESSIONS_MAX_ITEMS: u32 = 100;
/// Most escalation steps; there are only a few kinds of remediator.
const ESCALATION_MAX_ITEMS: u32 = 16;
/// Most pause requests.
const PAUSE_REQUESTS_MAX_ITEMS: u32 = 100;
/// Longest pause request (who paused the check and why).
const PAUSE_REQUEST_MAX_LENGTH: u32 = 1024;

// ---------------------------------------------------------------------------------------------
// Schema transforms, attached to fields with `#[schemars(transform = crate::schema::...)]`.
// ---------------------------------------------------------------------------------------------

/// One CEL rule (an entry of `x-kubernetes-validations`), built up with its optional parts.
struct Rule(Map<String, Value>);

impl Rule {
    /// The message is the one shown when `rule` is false, after the path of the field.
    fn new(rule: &str, message: &str) -> Self {
        let mut r = Map::new();
        r.insert("rule".into(), rule.into());
        r.insert("message".into(), message.into());
        Rule(r)
    }

    /// Reports the failure on a child field (`.values`) rather than on the field holding the
    /// rule, so the error names the field to fix.
    fn at(mut self, field_path: &str) -> Self {
        self.0.insert("fieldPath".into(), field_path.into());
        self
    }

    /// A machine-readable reason: `FieldValueRequired` or `FieldValueForbidden` (the default is
    /// `FieldValueInvalid`; `FieldValueDuplicate` would make the API server drop the message).
    fn reason(mut self, reason: &str) -> Self {
        self.0.insert("reason".into(), reason.into());
        self
    }

    /// A message computed from the value, shown instead of the fixed one when it evaluates.
    fn message_expression(mut self, expression: &str) -> Self {
        self.0.insert("messageExpression".into(), expression.into());
        self
    }
}

/// Appends rules to a schema's `x-kubernetes-validations`, keeping the rules already there.
fn push_rules(schema: &mut Map<String, Value>, rules: impl IntoIterator<Item = Rule>) {
    let list = schema.entry("x-kubernetes-validations").or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = list {
        list.extend(rules.into_iter().map(|r| Value::Object(r.0)));
    }
}

/// The schema as a JSON object (a boolean schema becomes `{}` first, which never happens for
/// the types used here).
fn object(schema: &mut Schema) -> &mut Map<String, Value> {
    schema.ensure_object()
}

/// The sub-schema at `path` (property names, or `items` for a list's elements), if present.
fn child<'a>(schema: &'a mut Map<String, Value>, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut node = schema;
    for step in path {
        node = match *step {
            "items" => node.get_mut("items")?.as_object_mut()?,
            name => node.get_mut("properties")?.get_mut(name)?.as_object_mut()?,
        };
    }
    Some(node)
}

/// `self` matches the Go duration grammar; guards every `duration(self)` so that a malformed
/// value is reported once, by the `pattern`, not again as a CEL evaluation error.
pub(crate) fn is_duration() -> String {
    format!("self.matches('{GO_DURATION_PATTERN}')")
}

/// A string that must not be blank (`validate.rs` trims before checking), bounded for CEL.
fn not_blank(schema: &mut Schema, max_length: u32) {
    let s = object(schema);
    s.insert("maxLength".into(), max_length.into());
    push_rules(s, [Rule::new("self.trim() != ''", "must not be empty")]);
}

/// A Go duration of any sign (e.g. `healthyDelay`, where negative means "wait for a person").
pub(crate) fn go_duration(schema: &mut Schema) {
    let s = object(schema);
    s.insert("pattern".into(), GO_DURATION_PATTERN.into());
    s.insert("maxLength".into(), DURATION_MAX_LENGTH.into());
}

/// A Go duration that must not be negative (condition timeouts, `stormCooldownDuration`).
pub(crate) fn non_negative_duration(schema: &mut Schema) {
    go_duration(schema);
    let rule = format!("!{} || duration(self) >= duration('0s')", is_duration());
    push_rules(object(schema), [Rule::new(&rule, "must not be negative")]);
}

/// `plannedMaintenance.grace`: from 0 to 24h (a longer grace hides a Node that did not come back).
pub(crate) fn maintenance_grace(schema: &mut Schema) {
    non_negative_duration(schema);
    let rule = format!("!{} || duration(self) <= duration('24h')", is_duration());
    push_rules(
        object(schema),
        [Rule::new(&rule, "must be at most 24h: a longer grace hides a Node that did not come back")],
    );
}

/// `nodeStartupTimeout`: `0` disables it; anything else is at least 30s, because a shorter
/// timeout remediates Machines that are still booting.
pub(crate) fn node_startup_timeout(schema: &mut Schema) {
    non_negative_duration(schema);
    let rule = format!("!{} || duration(self) <= duration('0s') || duration(self) >= duration('30s')", is_duration());
    push_rules(
        object(schema),
        [Rule::new(
            &rule,
            "must be 0 (disabled) or at least 30s: a shorter timeout remediates Machines that are still booting",
        )],
    );
}

/// An escalation step's `timeout`: at least 1m, because a remediator needs time to act.
pub(crate) fn escalation_timeout(schema: &mut Schema) {
    non_negative_duration(schema);
    let rule = format!("!{} || duration(self) < duration('0s') || duration(self) >= duration('1m')", is_duration());
    push_rules(object(schema), [Rule::new(&rule, "must be at least 1m: a remediator needs time to act")]);
}

/// `maxUnhealthy` / `minHealthy`: a non-negative count, or a percentage `N%` with N ≤ 100. The
/// value is an int-or-string (CEL sees `dyn`), so each rule first asks which one it got; an int
/// must also fit the 32 bits the controller reads it into.
pub(crate) fn threshold(schema: &mut Schema) {
    let s = object(schema);
    // Without a bound, the API server estimates every `matches` on an int-or-string as if the
    // string filled a whole request.
    s.insert("maxLength".into(), THRESHOLD_MAX_LENGTH.into());
    push_rules(
        s,
        [
            Rule::new(
                "type(self) == int || self.matches('^-?[0-9]+%?$')",
                "must be a whole number or a percentage such as 40%",
            ),
            Rule::new("type(self) == int ? self >= 0 : !self.matches('^-[0-9]+%?$')", "must not be negative"),
            Rule::new("type(self) != int || self <= 2147483647", "must be at most 2147483647"),
            Rule::new(
                "type(self) == int || !self.matches('^[0-9]+%$') || self.matches('^0*([0-9]{1,2}|100)%$')",
                "must be a percentage between 0% and 100%",
            ),
        ],
    );
}

/// A MachineHealthCheck's `maxUnhealthy`: as [`threshold`], and a string must be a percentage
/// (Cluster API reads a string as a percentage only, so `"10"` is refused, not taken as 10).
pub(crate) fn mhc_threshold(schema: &mut Schema) {
    threshold(schema);
    push_rules(
        object(schema),
        [Rule::new(
            "type(self) == int || self.endsWith('%')",
            "a string must be a percentage such as 40%; write a count as a number",
        )],
    );
}

/// `maxInFlight` (either kind): as [`mhc_threshold`] (a string is a percentage, as Kubernetes
/// reads an int-or-string limit such as `maxUnavailable`), and not `0` / `0%`, which would never
/// remediate anything.
pub(crate) fn max_in_flight(schema: &mut Schema) {
    mhc_threshold(schema);
    push_rules(
        object(schema),
        [Rule::new("type(self) == int ? self != 0 : !self.matches('^0+%$')", MAX_IN_FLIGHT_ZERO)],
    );
}

/// `voluntaryDisruptions` (either kind): `Ignore` or `Count`.
pub(crate) fn voluntary_disruptions(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxLength".into(), ENUM_MAX_LENGTH.into());
    push_rules(s, [Rule::new("self in ['Ignore', 'Count']", VOLUNTARY_DISRUPTIONS_MESSAGE)]);
}

/// `flapping`: `episodes` from 2 to 20.
pub(crate) fn flapping(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new(
            &format!("self.episodes >= {MIN_FLAPPING_EPISODES} && self.episodes <= {MAX_FLAPPING_EPISODES}"),
            FLAPPING_EPISODES_MESSAGE,
        )
        .at(".episodes")],
    );
}

/// `flapping.window`: a Go duration from 1m to 24h (not shorter than the longest rule duration:
/// [`nhc_spec`]).
pub(crate) fn flapping_window(schema: &mut Schema) {
    go_duration(schema);
    let rule =
        format!("!{0} || (duration(self) >= duration('1m') && duration(self) <= duration('24h'))", is_duration());
    push_rules(object(schema), [Rule::new(&rule, FLAPPING_WINDOW_BOUNDS)]);
}

/// `failureDomains.key`: a label key (on a MachineHealthCheck `spec.failureDomain` also passes:
/// it has a label key's shape; a NodeHealthCheck refuses it in [`nhc_spec`]).
pub(crate) fn failure_domain_key(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    push_rules(s, [Rule::new(&format!("self.matches(r'{LABEL_KEY_PATTERN}')"), LABEL_KEY_RULE)]);
}

/// A MachineHealthCheck's `failureDomains`: `maxUnhealthy` as the check's own (Cluster API reads
/// a string as a percentage only).
pub(crate) fn mhc_failure_domains(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new(
            "type(self.maxUnhealthy) == int || self.maxUnhealthy.endsWith('%')",
            "a string must be a percentage such as 40%; write a count as a number",
        )
        .at(".maxUnhealthy")],
    );
}

/// A NodeHealthCheck's `failureDomains`: the key must be a Node label (`spec.failureDomain` is a
/// Machine field).
pub(crate) fn nhc_failure_domains(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new(
            &format!("self.key != '{MACHINE_FAILURE_DOMAIN_KEY}'"),
            "spec.failureDomain is a Machine field; a NodeHealthCheck groups Nodes by a Node label",
        )
        .at(".key")
        .reason("FieldValueForbidden")],
    );
}

/// `failureDomains.minAllowed`: a count, not negative.
pub(crate) fn min_allowed(schema: &mut Schema) {
    push_rules(object(schema), [Rule::new("self >= 0", "must not be negative")]);
}

/// A MachineHealthCheck spec: a `cluster.x-k8s.io/cluster-name` label in the selector must name
/// `clusterName` (a selector for another cluster's Machines would select nothing).
pub(crate) fn mhc_spec(schema: &mut Schema) {
    let label = format!("self.selector.matchLabels['{CLUSTER_NAME_LABEL}']");
    push_rules(
        object(schema),
        [
            flapping_window_covers(&[
                ("unhealthyConditions", "timeout"),
                ("unhealthyMachineConditions", "timeout"),
                ("unhealthyExpressions", "timeout"),
            ]),
            Rule::new(
                &format!(
                    "!has(self.selector.matchLabels) || !('{CLUSTER_NAME_LABEL}' in self.selector.matchLabels) || \
                 {label} == self.clusterName"
                ),
                "the cluster.x-k8s.io/cluster-name label must equal clusterName",
            )
            .at(".selector")
            .message_expression(&format!(
                "'matchLabels {CLUSTER_NAME_LABEL} ' + {label} + ' must equal spec.clusterName ' + self.clusterName + \
             ': the check only looks at the Machines of that cluster'"
            )),
        ],
    );
}

/// `flapping.window` not shorter than any rule's timeout, for each `(list, timeout field)` of
/// rules: an episode that lasts a rule's timeout is an incident already, not a flap.
fn flapping_window_covers(lists: &[(&str, &str)]) -> Rule {
    let each = lists
        .iter()
        .map(|(list, field)| {
            format!(
                "(!has(self.{list}) || self.{list}.all(r, !r.{field}.matches('{P}') || \
                 duration(r.{field}) <= duration(self.flapping.window)))",
                P = GO_DURATION_PATTERN
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let rule = format!("!has(self.flapping) || !self.flapping.window.matches('{GO_DURATION_PATTERN}') || ({each})");
    Rule::new(&rule, &format!("window {FLAPPING_WINDOW_SHORT}")).at(".flapping")
}

/// `unhealthyRange`: `[min-max]` with min ≤ max (CEL, with the strings
/// extension's `indexOf` / `substring`). Numbers of more than 18 digits are left to the
/// controller, as `int()` could not hold them.
pub(crate) fn unhealthy_range(schema: &mut Schema) {
    let s = object(schema);
    // A CEL rule rather than an OpenAPI `pattern`: the API server words a pattern failure as
    // "should match '^\[[0-9]+-[0-9]+\]$'", which does not tell the user what to write.
    s.insert("maxLength".into(), RANGE_MAX_LENGTH.into());
    let min = "self.substring(1, self.indexOf('-'))";
    let max = "self.substring(self.indexOf('-') + 1, size(self) - 1)";
    let rule = format!("!self.matches(r'^\\[[0-9]{{1,18}}-[0-9]{{1,18}}\\]$') || int({min}) <= int({max})");
    let message = format!("'is inverted: the minimum ' + {min} + ' is greater than the maximum ' + {max}");
    let shape = format!("self.matches(r'{UNHEALTHY_RANGE_PATTERN}')");
    push_rules(
        s,
        [
            Rule::new(&shape, "must have the form [min-max] with whole numbers, e.g. [1-3]"),
            Rule::new(&rule, "is inverted: the minimum is greater than the maximum").message_expression(&message),
        ],
    );
}

/// Kubernetes' label key syntax (`[dns-subdomain/]name`), as `selector::check_label_key`.
pub(crate) const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Kubernetes' label value syntax (empty allowed), as `selector::check_label_value`.
pub(crate) const LABEL_VALUE_PATTERN: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";
/// The most `matchLabels` entries a selector may have (bounds the CEL rule over its keys).
const MATCH_LABELS_MAX_PROPERTIES: u32 = 64;

/// A label selector: must select something, and each expression must be well formed (as
/// `Selector::compile`). The expression list and the strings the rules read are bounded.
pub(crate) fn label_selector(schema: &mut Schema) {
    let s = object(schema);
    push_rules(
        s,
        [Rule::new(
            "(has(self.matchLabels) && size(self.matchLabels) > 0) || \
             (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
            "must not be empty: an empty selector would select every object",
        )],
    );
    if let Some(labels) = child(s, &["matchLabels"]) {
        labels.insert("maxProperties".into(), MATCH_LABELS_MAX_PROPERTIES.into());
        if let Some(value) = labels.get_mut("additionalProperties").and_then(Value::as_object_mut) {
            value.insert("maxLength".into(), DNS_LABEL_MAX_LENGTH.into());
            push_rules(value, [Rule::new(&format!("self.matches(r'{LABEL_VALUE_PATTERN}')"), LABEL_VALUE_RULE)]);
        }
        push_rules(
            labels,
            [Rule::new(
                &format!("self.all(k, size(k) <= {LABEL_KEY_MAX_LENGTH} && k.matches(r'{LABEL_KEY_PATTERN}'))"),
                LABEL_KEY_RULE,
            )],
        );
    }
    if let Some(list) = child(s, &["matchExpressions"]) {
        list.insert("maxItems".into(), MATCH_EXPRESSIONS_MAX_ITEMS.into());
    }
    if let Some(values) = child(s, &["matchExpressions", "items", "values"]) {
        values.insert("maxItems".into(), MATCH_EXPRESSIONS_MAX_ITEMS.into());
        if let Some(value) = child(values, &["items"]) {
            value.insert("maxLength".into(), DNS_LABEL_MAX_LENGTH.into());
            push_rules(value, [Rule::new(&format!("self.matches(r'{LABEL_VALUE_PATTERN}')"), LABEL_VALUE_RULE)]);
        }
    }
    if let Some(key) = child(s, &["matchExpressions", "items", "key"]) {
        key.insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    }
    if let Some(operator) = child(s, &["matchExpressions", "items", "operator"]) {
        operator.insert("maxLength".into(), ENUM_MAX_LENGTH.into());
    }
    if let Some(item) = child(s, &["matchExpressions", "items"]) {
        push_rules(
            item,
            [
                Rule::new("self.key != ''", "must not be empty").at(".key").reason("FieldValueRequired"),
                Rule::new(&format!("self.key == '' || self.key.matches(r'{LABEL_KEY_PATTERN}')"), LABEL_KEY_RULE)
                    .at(".key"),
                Rule::new(
                    "self.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist']",
                    "must be one of In, NotIn, Exists, DoesNotExist",
                )
                .at(".operator"),
                Rule::new(
                    "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                    "must not be empty for operator In or NotIn",
                )
                .at(".values")
                .reason("FieldValueRequired")
                .message_expression("'must not be empty for operator ' + self.operator"),
                Rule::new(
                    "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                    "must be empty for operator Exists or DoesNotExist",
                )
                .at(".values")
                .reason("FieldValueForbidden")
                .message_expression("'must be empty for operator ' + self.operator"),
            ],
        );
    }
}

/// `unhealthyMachineConditions`: bounded, no `maxConditionAge` (Machine conditions carry no
/// heartbeat), and no rule may name a condition that summarises the Machine or that the health
/// check writes (Cluster API's rule).
pub(crate) fn machine_condition_list(schema: &mut Schema) {
    object(schema).insert("maxItems".into(), CONDITIONS_MAX_ITEMS.into());
    if let Some(item) = child(object(schema), &["items"]) {
        push_rules(
            item,
            [Rule::new("!has(self.maxConditionAge)", MAX_CONDITION_AGE_ON_MACHINE)
                .at(".maxConditionAge")
                .reason("FieldValueForbidden")],
        );
    }
    let reserved = RESERVED_MACHINE_CONDITIONS.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ");
    if let Some(type_) = child(object(schema), &["items", "type"]) {
        push_rules(
            type_,
            [Rule::new(
                &format!("!(self in [{reserved}])"),
                &format!(
                    "must not be one of {}: they summarise the Machine or are written by the health check itself",
                    RESERVED_MACHINE_CONDITIONS.join(", ")
                ),
            )],
        );
    }
}

/// A list of Node condition rules (`unhealthyConditions` of both kinds), bounded; a `Ready`
/// rule may not set `maxConditionAge`.
pub(crate) fn condition_list(schema: &mut Schema) {
    object(schema).insert("maxItems".into(), CONDITIONS_MAX_ITEMS.into());
    if let Some(item) = child(object(schema), &["items"]) {
        push_rules(
            item,
            [Rule::new("!has(self.maxConditionAge) || self.type != 'Ready'", MAX_CONDITION_AGE_ON_READY)
                .at(".maxConditionAge")
                .reason("FieldValueForbidden")],
        );
    }
}

/// A NodeHealthCheck's `unhealthyConditions`: as [`condition_list`], and a rule names at most one
/// of its own `remediationTemplate` / `escalatingRemediations` (neither: the check's own).
pub(crate) fn nhc_condition_list(schema: &mut Schema) {
    condition_list(schema);
    if let Some(item) = child(object(schema), &["items"]) {
        push_rules(
            item,
            [Rule::new(
                "!has(self.remediationTemplate) || !has(self.escalatingRemediations) || \
                 size(self.escalatingRemediations) == 0",
                RULE_REMEDIATION_BOTH,
            )
            .at(".remediationTemplate")
            .reason("FieldValueForbidden")],
        );
    }
}

/// A rule's `reasons`: at least one (absent matches any reason), none blank, none twice (a
/// `set` list: the API server refuses a repeated entry as a duplicate value, naming it, at no CEL
/// cost — a CEL uniqueness rule over 100 rules' lists exceeds the cost budget); bounded.
pub(crate) fn condition_reasons(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxItems".into(), REASONS_MAX_ITEMS.into());
    s.insert("x-kubernetes-list-type".into(), "set".into());
    if let Some(item) = child(s, &["items"]) {
        item.insert("maxLength".into(), REASON_MAX_LENGTH.into());
        push_rules(item, [Rule::new("self.trim() != ''", "must not be empty: name a condition reason")]);
    }
    push_rules(s, [Rule::new("size(self) > 0", EMPTY_REASONS).reason("FieldValueRequired")]);
}

/// A rule's `maxConditionAge`: a Go duration of at least 1m.
pub(crate) fn max_condition_age(schema: &mut Schema) {
    go_duration(schema);
    let rule = format!("!{} || duration(self) >= duration('1m')", is_duration());
    push_rules(object(schema), [Rule::new(&rule, MAX_CONDITION_AGE_TOO_SHORT)]);
}

/// A condition rule's `type`: not blank.
pub(crate) fn condition_type(schema: &mut Schema) {
    not_blank(schema, CONDITION_TYPE_MAX_LENGTH);
}

/// A condition rule's `status`: a condition status.
pub(crate) fn condition_status(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxLength".into(), ENUM_MAX_LENGTH.into());
    push_rules(s, [Rule::new("self in ['True', 'False', 'Unknown']", "must be one of True, False, Unknown")]);
}

/// `clusterName`: not blank; at most 63 characters, as it is also a label value
/// (`cluster.x-k8s.io/cluster-name`) that selects the Machines.
pub(crate) fn cluster_name(schema: &mut Schema) {
    not_blank(schema, DNS_LABEL_MAX_LENGTH);
}

/// A template's `apiVersion`: not blank, and `group/version` since templates are custom
/// resources.
pub(crate) fn template_api_version(schema: &mut Schema) {
    not_blank(schema, API_VERSION_MAX_LENGTH);
    push_rules(
        object(schema),
        [Rule::new(
            "self == '' || self.contains('/')",
            "must be group/version: remediation templates are custom resources",
        )],
    );
}

/// A template's `kind`: not blank, and ending in `Template`, the remediation objects' kind
/// being the rest.
pub(crate) fn template_kind(schema: &mut Schema) {
    not_blank(schema, DNS_LABEL_MAX_LENGTH);
    push_rules(
        object(schema),
        [Rule::new(
            "self == '' || (self.endsWith('Template') && self != 'Template')",
            "must name a template kind ending in Template, e.g. SelfNodeRemediationTemplate",
        )],
    );
}

/// A template's `name`: not blank.
pub(crate) fn template_name(schema: &mut Schema) {
    not_blank(schema, DNS_SUBDOMAIN_MAX_LENGTH);
}

/// A template's `namespace`: bounded (whether it is required depends on the resource).
pub(crate) fn template_namespace(schema: &mut Schema) {
    object(schema).insert("maxLength".into(), DNS_LABEL_MAX_LENGTH.into());
}

/// A NodeHealthCheck's template reference: a NodeHealthCheck is cluster-scoped, so the
/// template's `namespace` is required.
pub(crate) fn nhc_template(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new(
            "has(self.namespace) && self.namespace != ''",
            "must not be empty: a NodeHealthCheck is cluster-scoped, so its templates need a namespace",
        )
        .at(".namespace")
        .reason("FieldValueRequired")],
    );
}

/// `escalatingRemediations`: bounded, with unique orders and unique templates.
pub(crate) fn escalating_remediations(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxItems".into(), ESCALATION_MAX_ITEMS.into());
    // No `FieldValueDuplicate` reason: the API server would then drop the message.
    push_rules(
        s,
        [
            Rule::new(
                "self.all(x, self.exists_one(y, y.order == x.order))",
                "order must be unique: two steps have the same order",
            ),
            Rule::new(
                "self.all(x, self.exists_one(y, y.remediationTemplate == x.remediationTemplate))",
                "remediationTemplate must be unique: two steps use the same template",
            ),
        ],
    );
}

/// An escalation step's `order`: not negative, and within the 32 bits the controller reads.
pub(crate) fn escalation_order(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new("self >= 0", "must not be negative"), Rule::new("self <= 2147483647", "must be at most 2147483647")],
    );
}

/// `unhealthyExpressions`: at most [`MAX_EXPRESSIONS`] (each is evaluated for every Node at
/// every decision); what each may say is checked by the controller's compiler alone.
pub(crate) fn expression_list(schema: &mut Schema) {
    object(schema).insert("maxItems".into(), MAX_EXPRESSIONS.into());
}

/// `unhealthyExpressions[].expression`: not blank, and no longer than the compiler accepts (the
/// API server's own CEL cannot check it: it has no `node` binding of Vigil's shape).
pub(crate) fn expression(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxLength".into(), EXPRESSION_MAX_LENGTH.into());
    s.insert("minLength".into(), 1.into());
}

/// `pauseRequests`: bounded, and no entry blank (a pause must say who paused the check and why).
pub(crate) fn pause_requests(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxItems".into(), PAUSE_REQUESTS_MAX_ITEMS.into());
    if let Some(item) = child(s, &["items"]) {
        item.insert("maxLength".into(), PAUSE_REQUEST_MAX_LENGTH.into());
    }
    push_rules(
        s,
        [Rule::new("self.all(p, p.trim() != '')", "entries must not be empty: say who paused the check and why")],
    );
}

/// A NodeHealthCheck spec: exactly one of `minHealthy` / `maxUnhealthy`, exactly one of
/// `remediationTemplate` / a non-empty `escalatingRemediations`.
pub(crate) fn nhc_spec(schema: &mut Schema) {
    push_rules(
        object(schema),
        [
            flapping_window_covers(&[("unhealthyConditions", "duration"), ("unhealthyExpressions", "duration")]),
            Rule::new(
                "!has(self.minHealthy) || !has(self.maxUnhealthy)",
                "only one of minHealthy and maxUnhealthy may be set",
            )
            .at(".minHealthy")
            .reason("FieldValueForbidden"),
            Rule::new(
                "has(self.minHealthy) || has(self.maxUnhealthy)",
                "one of minHealthy and maxUnhealthy must be set",
            )
            .at(".minHealthy")
            .reason("FieldValueRequired"),
            Rule::new(
                "!has(self.remediationTemplate) || !has(self.escalatingRemediations) || \
                 size(self.escalatingRemediations) == 0",
                "only one of remediationTemplate and escalatingRemediations may be set",
            )
            .at(".remediationTemplate")
            .reason("FieldValueForbidden"),
            Rule::new(
                "has(self.remediationTemplate) || \
                 (has(self.escalatingRemediations) && size(self.escalatingRemediations) > 0)",
                "one of remediationTemplate and escalatingRemediations must be set",
            )
            .at(".remediationTemplate")
            .reason("FieldValueRequired"),
            Rule::new(
                &format!(
                    "!has(self.maxUnhealthy) || \
                     ((!has(self.remediationTemplate) || self.remediationTemplate.kind != '{M}') && \
                     (!has(self.escalatingRemediations) || \
                     !self.escalatingRemediations.exists(e, e.remediationTemplate.kind == '{M}')) && \
                     (!has(self.unhealthyConditions) || !self.unhealthyConditions.exists(r, \
                     (has(r.remediationTemplate) && r.remediationTemplate.kind == '{M}') || \
                     (has(r.escalatingRemediations) && \
                     r.escalatingRemediations.exists(e, e.remediationTemplate.kind == '{M}')))) && \
                     (!has(self.unhealthyExpressions) || !self.unhealthyExpressions.exists(r, \
                     (has(r.remediationTemplate) && r.remediationTemplate.kind == '{M}') || \
                     (has(r.escalatingRemediations) && \
                     r.escalatingRemediations.exists(e, e.remediationTemplate.kind == '{M}')))))",
                    M = MACHINE_DELETION_REMEDIATION_TEMPLATE
                ),
                "cannot be combined with a MachineDeletionRemediationTemplate; use minHealthy",
            )
            .at(".maxUnhealthy")
            .reason("FieldValueForbidden"),
        ],
    );
}

/// `backoff.maxRemediations`: 1 to [`MAX_BACKOFF_REMEDIATIONS`] (the history keeps that many
/// records per pool).
pub(crate) fn max_remediations(schema: &mut Schema) {
    push_rules(
        object(schema),
        [
            Rule::new("self >= 1", "must be at least 1"),
            Rule::new(
                &format!("self <= {MAX_BACKOFF_REMEDIATIONS}"),
                &format!("must be at most {MAX_BACKOFF_REMEDIATIONS}"),
            ),
        ],
    );
}

/// `backoff.window`: a Go duration greater than zero.
pub(crate) fn backoff_window(schema: &mut Schema) {
    go_duration(schema);
    let rule = format!("!{} || duration(self) > duration('0s')", is_duration());
    push_rules(object(schema), [Rule::new(&rule, "must be greater than zero")]);
}

/// `backoff.poolLabel`: a label key.
pub(crate) fn pool_label(schema: &mut Schema) {
    let s = object(schema);
    s.insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    push_rules(s, [Rule::new(&format!("self.matches(r'{LABEL_KEY_PATTERN}')"), LABEL_KEY_RULE)]);
}

/// A MachineHealthCheck's `backoff`: no `poolLabel`, since its pools are the Machines' owners.
pub(crate) fn mhc_backoff(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new("!has(self.poolLabel)", MHC_POOL_LABEL_MESSAGE).at(".poolLabel").reason("FieldValueForbidden")],
    );
}

/// A NodeHealthCheck's `backoff`: `poolLabel` is required, as Nodes have no owner to group them.
pub(crate) fn nhc_backoff(schema: &mut Schema) {
    push_rules(
        object(schema),
        [Rule::new("has(self.poolLabel)", NHC_POOL_LABEL_MESSAGE).at(".poolLabel").reason("FieldValueRequired")],
    );
}

/// A status `conditions` list: one entry per type, as for every `metav1.Condition` list, so
/// server-side apply merges them by type.
pub(crate) fn status_conditions(schema: &mut Schema) {
    let s = object(schema);
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
}
