//! The check's own remediation objects (owned by it, one per Node and step) and the book of
//! in-flight requests a decision keeps per Node.

use super::input::NhcInput;
use crate::plan::ObjectRef;
use crate::target::entry;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::node_health_check::{NodeRemediation, RemediationReference, UnhealthyNode};
use vigil_api::validate::RemediationStep;
use vigil_api::views::RemediationView;
use vigil_api::well_known::{NHC_TIMED_OUT_ANNOTATION, NODE_NAME_ANNOTATION, TEMPLATE_NAME_ANNOTATION};

/// Kind of the owner reference that marks the check's own remediation objects.
pub(super) const OWNER_KIND: &str = "NodeHealthCheck";

/// A handful of flags, without allocating for the usual few.
#[derive(Default)]
pub(super) struct Flags {
    pub(super) small: u64,
    pub(super) large: Vec<bool>,
}

impl Flags {
    pub(super) fn get(&self, i: usize) -> bool {
        match i.checked_sub(64) {
            None => self.small >> i & 1 == 1,
            Some(j) => self.large.get(j).copied().unwrap_or(false),
        }
    }

    pub(super) fn set(&mut self, i: usize) {
        match i.checked_sub(64) {
            None => self.small |= 1 << i,
            Some(j) => {
                if self.large.len() <= j {
                    self.large.resize(j + 1, false);
                }
                self.large[j] = true;
            }
        }
    }
}

/// A remediation object owned by the check, with the Node it remediates and its step.
pub(super) struct Owned<'a> {
    pub(super) node: &'a str,
    pub(super) view: &'a RemediationView,
    /// Its template-name annotation.
    pub(super) template: Option<&'a str>,
}

pub(super) fn object_ref(view: &RemediationView) -> ObjectRef {
    ObjectRef {
        api_version: view.meta.api_version.clone(),
        kind: view.meta.kind.clone(),
        namespace: view.meta.namespace.clone(),
        name: view.meta.name.clone(),
    }
}

/// The step of `steps` (one remediation's) an object was made for: its kind, namespace and
/// template-name annotation (the last such step, as medik8s).
pub(super) fn step_of(view: &RemediationView, template: Option<&str>, steps: &[RemediationStep]) -> Option<usize> {
    let template = template?;
    steps.iter().rposition(|s| {
        s.template.name == template
            && s.template.remediation_kind() == view.meta.kind
            && s.template.namespace == view.meta.namespace
    })
}

/// The `status.unhealthyNodes[].remediations` of one Node being rebuilt: one record per object
/// seen (index-aligned with the Node's objects), then the records of this plan's requests.
pub(super) struct Book<'p> {
    pub(super) prev: &'p [NodeRemediation],
    pub(super) taken: Flags,
    pub(super) records: Vec<NodeRemediation>,
    /// Per object: whether the previous status already said it timed out.
    pub(super) prev_timed_out: Flags,
}

impl<'p> Book<'p> {
    pub(super) fn new(objs: &[Owned<'_>], prev: Option<&'p UnhealthyNode>, now: Timestamp) -> Self {
        let prev = prev.map_or(&[][..], |p| p.remediations.as_slice());
        let mut book = Book {
            prev,
            taken: Flags::default(),
            records: Vec::with_capacity(objs.len()),
            prev_timed_out: Flags::default(),
        };
        for (k, o) in objs.iter().enumerate() {
            let meta = &o.view.meta;
            let template = o.template;
            let same_place =
                |r: &NodeRemediation| r.resource.kind == meta.kind && r.resource.namespace == meta.namespace;
            let found = (0..prev.len())
                .find(|&i| !book.taken.get(i) && same_place(&prev[i]) && prev[i].resource.name == meta.name)
                .or_else(|| {
                    (0..prev.len()).find(|&i| {
                        !book.taken.get(i)
                            && same_place(&prev[i])
                            && prev[i].resource.name.is_empty()
                            && prev[i].template_name.as_deref() == template
                    })
                });
            let earlier = found.map(|i| {
                book.taken.set(i);
                &prev[i]
            });
            let annotated = entry(&meta.annotations, NHC_TIMED_OUT_ANNOTATION).map(|v| v.parse().unwrap_or(now));
            if earlier.is_some_and(|r| r.timed_out.is_some()) {
                book.prev_timed_out.set(k);
            }
            book.records.push(NodeRemediation {
                resource: RemediationReference {
                    api_version: meta.api_version.clone(),
                    kind: meta.kind.clone(),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    uid: meta.uid.clone(),
                },
                started: earlier.map(|r| r.started.clone()).or_else(|| meta.created.map(Time)).unwrap_or(Time(now)),
                timed_out: earlier.and_then(|r| r.timed_out.clone()).or_else(|| annotated.map(Time)),
                template_name: template.map(str::to_string).or_else(|| earlier.and_then(|r| r.template_name.clone())),
            });
        }
        book
    }

    /// The index of an earlier plan's request for `step` whose object has not been seen yet
    /// (no uid: never observed), not taken by this decision, not timed out.
    fn in_flight(&self, step: &RemediationStep) -> Option<usize> {
        (0..self.prev.len()).find(|&i| {
            let r = &self.prev[i];
            !self.taken.get(i)
                && r.timed_out.is_none()
                && r.resource.uid.is_none()
                && r.template_name.as_deref() == Some(step.template.name.as_str())
                && r.resource.kind == step.template.remediation_kind()
                && r.resource.namespace == step.template.namespace
        })
    }

    /// An earlier plan's request for `step` still in flight, taken so that it is continued
    /// rather than made anew.
    pub(super) fn take_in_flight(&mut self, step: &RemediationStep) -> Option<&'p NodeRemediation> {
        let i = self.in_flight(step)?;
        self.taken.set(i);
        Some(&self.prev[i])
    }

    /// Whether an earlier plan's request for `step` is still in flight.
    pub(super) fn has_in_flight(&self, step: &RemediationStep) -> bool {
        self.in_flight(step).is_some()
    }

    /// The records, oldest first.
    pub(super) fn finish(mut self) -> Vec<NodeRemediation> {
        self.records.sort_by(|a, b| {
            (&a.started, &a.resource.kind, &a.resource.namespace, &a.resource.name).cmp(&(
                &b.started,
                &b.resource.kind,
                &b.resource.namespace,
                &b.resource.name,
            ))
        });
        self.records
    }
}

pub(super) fn owned_by_check(view: &RemediationView, name: &str, uid: Option<&str>) -> bool {
    view.meta
        .owners
        .iter()
        .any(|o| o.kind == OWNER_KIND && o.name == name && (o.uid.is_empty() || uid.is_none_or(|u| u == o.uid)))
}

/// The check's own remediation objects, sorted by Node then identity.
pub(super) fn own_objects<'a>(input: &NhcInput<'a>, check_name: &str, check_uid: Option<&str>) -> Vec<Owned<'a>> {
    let mut owned: Vec<Owned<'a>> = input
        .remediations
        .iter()
        .filter(|r| owned_by_check(r, check_name, check_uid))
        .filter_map(|r| {
            let node = entry(&r.meta.annotations, NODE_NAME_ANNOTATION)?;
            let template = entry(&r.meta.annotations, TEMPLATE_NAME_ANNOTATION);
            Some(Owned { node, view: r, template })
        })
        .collect();
    owned.sort_unstable_by(|a, b| {
        (a.node, &a.view.meta.kind, &a.view.meta.namespace, &a.view.meta.name).cmp(&(
            b.node,
            &b.view.meta.kind,
            &b.view.meta.namespace,
            &b.view.meta.name,
        ))
    });
    owned
}
