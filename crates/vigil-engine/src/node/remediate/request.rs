//! Making a remediation object for one step of a Node's remediation: its name (computed, never
//! server-generated), its manifest, and what keeps it from being made (an unusable template,
//! another check's object of that name, an owner Machine that cannot be read).

use super::{Incident, Pass, Requested};
use crate::node::objects::{Book, OWNER_KIND};
use crate::node::templates::Usable;
use crate::plan::{Action, LeaseWrite, NoticeKind, after};
use crate::target::{Target, is_control_plane};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};
use vigil_api::node_health_check::{NodeRemediation, RemediationReference};
use vigil_api::reason::Reason;
use vigil_api::validate::{RemediationStep, TemplateRef};
use vigil_api::views::NodeView;
use vigil_api::well_known::{
    CONTROL_PLANE_NODE_OBJECT_LABEL, MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION, NODE_NAME_ANNOTATION, PART_OF_LABEL,
    PART_OF_NODE_HEALTHCHECK, RULE_ANNOTATION, TEMPLATE_NAME_ANNOTATION,
};

impl Pass<'_> {
    /// Asks for an object of step `s` of the incident's remediation for Node `name` (the caller
    /// checked every other rule).
    pub(super) fn request(
        &mut self,
        node: &NodeView,
        s: usize,
        book: &mut Book<'_>,
        incident: &Incident<'_>,
        lease: Option<LeaseWrite>,
    ) -> Requested {
        let name = node.name.as_str();
        let Some(step) = incident.ladder.steps.get(s) else {
            return Requested::Skipped(Reason::RemediationTemplateNotFound, format!("no remediation step {s}"));
        };
        let (view, spec) =
            match self.setting.templates.get(incident.ladder.offset + s).copied().unwrap_or(Usable::Missing) {
                Usable::Yes(view, spec) => (view, spec),
                Usable::Missing => {
                    return Requested::Skipped(
                        Reason::RemediationTemplateNotFound,
                        format!("Cannot remediate node {name}: remediation template {} not found", step.template),
                    );
                }
                Usable::Invalid(why) => {
                    return Requested::Skipped(
                        Reason::RemediationTemplateInvalid,
                        format!("Cannot remediate node {name}: remediation template {} {why}", step.template),
                    );
                }
            };
        let mut earlier = book.take_in_flight(step);
        if let Some(r) = earlier.filter(|r| r.resource.name.is_empty()) {
            // A request with a server-generated name (`generateName`), recorded by a version
            // that made them, not seen yet: repeating it could make a second object, so it is
            // awaited, unless its step's timeout passed without any object showing up (the
            // request was lost; a single template has no timeout and waits).
            let lost = step.timeout.and_then(|d| after(r.started.0, d)).is_some_and(|end| end < self.cx.now);
            if !lost {
                book.records.push(r.clone());
                self.offer_step_timeout(step, r.started.0);
                return Requested::Done;
            }
            earlier = None;
        }
        let several = view.meta.annotations.get(MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION).is_some_and(|v| v == "true");
        let object_name = match several {
            true => several_per_node_name(name, self.setting.check_name, &step.template, s),
            false => name.to_string(),
        };
        let kind = step.template.remediation_kind();
        if let Some(skipped) = self.taken_by_another(name, &object_name, step) {
            return skipped;
        }
        let machine = match self.gates.machine_owner(node, &step.template.namespace) {
            Ok(machine) => machine,
            Err(wait) => {
                // Kept, to be made once the owner can be read.
                book.records.extend(earlier.cloned());
                self.hold(name, wait, NoticeKind::RemediationSkipped);
                return Requested::Held;
            }
        };
        let object = self.manifest(node, &object_name, step, spec, (incident.rule.as_deref(), machine));
        let started = earlier.map_or(self.cx.now, |r| r.started.0);
        self.offer_step_timeout(step, started);
        book.records.push(NodeRemediation {
            resource: RemediationReference {
                api_version: step.template.api_version.clone(),
                kind: kind.to_string(),
                namespace: step.template.namespace.clone(),
                name: object_name,
                uid: None,
            },
            started: Time(started),
            timed_out: None,
            template_name: Some(step.template.name.clone()),
        });
        let target = Target::local_node(name);
        let after = self.out.annotated_for(&target);
        self.out.act(Action::CreateRemediation { object, target, lease, after });
        Requested::Done
    }

    /// The object `object_name` this check would make for Node `name` exists and is not ours:
    /// leave it alone, and do not list it in the status as a remediation this check started.
    fn taken_by_another(&self, name: &str, object_name: &str, step: &RemediationStep) -> Option<Requested> {
        let kind = step.template.remediation_kind();
        let other = self.setting.foreign.iter().find(|r| {
            r.meta.kind == kind && r.meta.namespace == step.template.namespace && r.meta.name == object_name
        })?;
        let owner = other
            .meta
            .owners
            .first()
            .map_or_else(|| "no owner".to_string(), |o| format!("owner {} {}", o.kind, o.name));
        Some(Requested::Skipped(
            Reason::RemediationObjectExists,
            format!(
                "Cannot remediate node {name}: {kind} {}/{object_name} already exists and belongs to another check ({owner})",
                step.template.namespace
            ),
        ))
    }

    /// The remediation object `object_name` for `node` from `step`'s template, as medik8s makes
    /// it but never with a server-generated name (see [`several_per_node_name`]): annotated with
    /// the Node and template (and with remediation per condition the incident's `rule`),
    /// labelled `app.kubernetes.io/part-of: node-healthcheck-controller` (and
    /// `remediation.medik8s.io/isControlPlaneNode` for a control-plane Node), owned by the check
    /// (an owner reference that is neither controller nor blocks deletion) and by the Node's
    /// OpenShift `machine` when there is one ([`Gates::machine_owner`]).
    fn manifest(
        &self,
        node: &NodeView,
        object_name: &str,
        step: &RemediationStep,
        spec: &Value,
        (rule, machine): (Option<&str>, Option<Value>),
    ) -> Value {
        let name = node.name.as_str();
        let kind = step.template.remediation_kind();
        let mut metadata = Map::new();
        metadata.insert("namespace".into(), Value::String(step.template.namespace.clone()));
        metadata.insert("name".into(), Value::String(object_name.to_string()));
        let mut annotations = json!({ NODE_NAME_ANNOTATION: name, TEMPLATE_NAME_ANNOTATION: step.template.name });
        if let Some(rule) = rule {
            annotations[RULE_ANNOTATION] = Value::String(rule.to_string());
        }
        metadata.insert("annotations".into(), annotations);
        let mut labels = json!({ PART_OF_LABEL: PART_OF_NODE_HEALTHCHECK });
        if is_control_plane(node) {
            labels[CONTROL_PLANE_NODE_OBJECT_LABEL] = Value::String(String::new());
        }
        metadata.insert("labels".into(), labels);
        let mut owner = Map::new();
        owner.insert("apiVersion".into(), Value::String(self.cx.policy.api.api_version().into()));
        owner.insert("kind".into(), Value::String(OWNER_KIND.into()));
        owner.insert("name".into(), Value::String(self.setting.check_name.to_string()));
        if let Some(uid) = self.setting.check_uid {
            owner.insert("uid".into(), Value::String(uid.to_string()));
        }
        owner.insert("controller".into(), Value::Bool(false));
        owner.insert("blockOwnerDeletion".into(), Value::Bool(false));
        let owners = std::iter::once(Value::Object(owner)).chain(machine).collect();
        metadata.insert("ownerReferences".into(), Value::Array(owners));
        let object = json!({
            "apiVersion": step.template.api_version,
            "kind": kind,
            "metadata": Value::Object(metadata),
            "spec": spec.clone(),
        });
        object
    }
}

/// The longest name [`several_per_node_name`] gives: what upstream's `generateName` gave (the
/// API server keeps a generated name within 63 characters), so no remediator meets a longer one.
const SEVERAL_PER_NODE_NAME_MAX: usize = 63;

/// The name of the object of step `step` (made from `template`) of check `check` for Node `node`,
/// when the template supports several objects per Node (`multiple-templates-support`, where
/// upstream lets the API server generate a name): `<node>-<suffix>`, the suffix a hash of the
/// check, the template, the Node and the step, the Node's name cut (at a character that may end
/// a name) so the whole stays within [`SEVERAL_PER_NODE_NAME_MAX`].
///
/// Every decider computes the same name for the same step of the same Node, so a create repeated
/// — a retry, or a deposed replica's request landing after another replica made the object — is
/// refused (409) while the object exists: at most one object per check, Node and step at a time.
/// The incident's start is deliberately not part of it: two deciders need not observe the same
/// start (each decides at its own instant, and a Node's condition can change its transition time
/// within one incident), and a name that differs between them is a second object. Incidents
/// are told apart by deletion instead: an incident's objects are deleted when it ends, and a new
/// one waits while one is still being deleted. Remediators that support several objects per
/// Node find the Node through the `remediation.medik8s.io/node-name` annotation, not the name.
pub fn several_per_node_name(node: &str, check: &str, template: &TemplateRef, step: usize) -> String {
    let key = format!(
        "{check}\0{}\0{}\0{}\0{}\0{node}\0{step}",
        template.api_version, template.kind, template.namespace, template.name
    );
    // The top 40 bits, as 10 hexadecimal digits.
    let suffix = format!("{:010x}", crate::shard::fnv1a(key.as_bytes()) >> 24);
    let room = SEVERAL_PER_NODE_NAME_MAX - suffix.len() - 1;
    let cut = node.char_indices().nth(room).map_or(node, |(i, _)| &node[..i]);
    let prefix = cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() { suffix } else { format!("{prefix}-{suffix}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str) -> TemplateRef {
        TemplateRef {
            api_version: "self-node-remediation.medik8s.io/v1alpha1".into(),
            kind: "SelfNodeRemediationTemplate".into(),
            namespace: "medik8s".into(),
            name: name.into(),
        }
    }

    /// A DNS-1123 subdomain name of at most 63 characters.
    fn valid(name: &str) -> bool {
        name.len() <= SEVERAL_PER_NODE_NAME_MAX
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn several_per_node_names_are_the_same_for_every_decider_and_differ_per_step_check_and_template() {
        let name = several_per_node_name("w1", "workers", &template("reboot"), 0);
        assert_eq!(name, several_per_node_name("w1", "workers", &template("reboot"), 0), "deterministic");
        assert!(name.starts_with("w1-") && name.len() == "w1-".len() + 10, "{name}");
        let others = [
            several_per_node_name("w1", "workers", &template("reboot"), 1),
            several_per_node_name("w1", "other", &template("reboot"), 0),
            several_per_node_name("w1", "workers", &template("fence"), 0),
            several_per_node_name("w2", "workers", &template("reboot"), 0),
        ];
        for other in &others {
            assert_ne!(&name, other);
        }
        // Pinned: a change would give an object made before it another name (a second object).
        assert_eq!(name, "w1-e5b7c699b4");
    }

    #[test]
    fn several_per_node_names_stay_valid_and_within_what_generate_name_gave() {
        let long = format!("{}.example.com", "a".repeat(60));
        let cut_at_dot = format!("{}.b", "a".repeat(51));
        let cut_at_dash = format!("{}-b", "a".repeat(51));
        for node in ["w1", "node-1.zone-a.example.com", long.as_str(), cut_at_dot.as_str(), cut_at_dash.as_str(), "-"] {
            let name = several_per_node_name(node, "workers", &template("reboot"), 2);
            assert!(valid(&name), "{node}: {name}");
        }
        // Two long names sharing their first 52 characters still differ (the hash has the whole name).
        let a = several_per_node_name(&format!("{}-x", "a".repeat(60)), "c", &template("t"), 0);
        let b = several_per_node_name(&format!("{}-y", "a".repeat(60)), "c", &template("t"), 0);
        assert_ne!(a, b);
        assert_eq!(a.len(), SEVERAL_PER_NODE_NAME_MAX);
    }
}
