//! Applying a plan: which writes it makes, in which order and how many at once, and what their
//! answers change. The actions go first (Machine conditions, remediation objects and their node
//! Leases), the check's status with or after them, the Events in the background; each write is
//! a [`crate::writer::Writer`] method, fenced by the check's right to write and bounded by what
//! is left of it, and its answer (the object written, gone, or refused and read again) is put
//! into the index here at once. Writes of one plan run concurrently; every write is idempotent,
//! and harmless if it lands late (after the right to make it moved to another replica): each
//! carries a guard the API server checks (docs/DECISIONS.md, "Writes that land late").

use crate::context::Context;
use crate::wire::WireObject;
use crate::writer::{ConditionsWrite, Deleted, bounded};
use crate::writes::{WriteError, at_version};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::runtime::events::{Event, EventType};
use serde_json::{Value, json};
use std::sync::Arc;
use tracing::warn;
use vigil_api::api_version::group_of;
use vigil_engine::target::{CheckRef, Target};
use vigil_engine::{Action, Notice, NoticeKind, ObjectRef, Seen};

/// What a plan's writes came to.
struct Outcome {
    /// Actions that failed, to leave out of the plan.
    failed: Vec<Action>,
    /// What the writes tell (created, deleted, failed), after the plan's own notices, each with
    /// the remediation object it is about, if any.
    notices: Vec<(Notice, Option<ObjectRef>)>,
    /// The first error, which the whole apply reports.
    first_error: Option<WriteError>,
}

/// How many writes of one plan run at once.
const WRITE_CONCURRENCY: usize = 32;

/// The check `key` as an event's object.
fn check_reference(key: &CheckRef, uid: Option<&str>) -> ObjectReference {
    let (namespace, name, kind) = match key {
        CheckRef::Machine { namespace: ns, name: n } => (Some(ns.clone()), n.clone(), "MachineHealthCheck"),
        CheckRef::Node { name: n } => (None, n.clone(), "NodeHealthCheck"),
    };
    ObjectReference {
        api_version: Some(vigil_api::API_VERSION.into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace,
        uid: uid.map(str::to_string),
        ..Default::default()
    }
}

impl Context {
    /// Puts the API server's answer to one of `writer`'s writes into the index at once, so the
    /// check's next decision sees it even before the watch delivers it (and does not write it
    /// again), and wakes the other checks the change concerns: the watch, finding the index
    /// already at that version, wakes nobody, and a check waiting for `writer` to let a target
    /// go would wait on. `writer` itself is not woken: the decision that wrote it knows of it.
    fn remember(
        &self,
        writer: &CheckRef,
        written: &DynamicObject,
        put: impl FnOnce(&mut vigil_index::index::Index, &Value) -> std::collections::BTreeSet<CheckRef>,
    ) {
        if let Ok(value) = serde_json::to_value(written) {
            let concerned = put(&mut self.write_index(), &value);
            self.wake_others(writer, concerned);
        }
    }

    /// Takes a remediation object the API server says is gone out of the index, and wakes the
    /// other checks it concerns (see [`Self::remember`]).
    fn forget_object(&self, writer: &CheckRef, object: &ObjectRef) {
        let gk = group_kind(&object.api_version, &object.kind);
        let key = (object.namespace.clone(), object.name.clone());
        let concerned = self.write_index().put_object(&gk, false, None, Some(key));
        self.wake_others(writer, concerned);
    }

    /// Marks the checks of `concerned` but `writer` to be decided again.
    fn wake_others(&self, writer: &CheckRef, concerned: std::collections::BTreeSet<CheckRef>) {
        self.scheduler.mark(concerned.into_iter().filter(|c| c != writer));
    }

    /// Applies a decided plan's writes and publishes its events. The actions go first (the
    /// remediation request must not wait for the status round-trip); the status follows, and
    /// leaves out what an action that failed would have made, so it never reports a remediation
    /// object that does not exist.
    pub async fn apply(self: &Arc<Self>, mut job: vigil_index::gather::Job) -> Result<(), WriteError> {
        let started = self.clock.instant();
        let key = job.key.clone();
        // Only a created object can be left out of the status (`partial::leave_out`); a plan that
        // creates none has its status fixed already, so it is sent with the actions, not after
        // them: a wave's next decision of this check waits one round trip less.
        let status_fixed = !job.plan.actions.iter().any(|a| matches!(a, Action::CreateRemediation { .. }));
        let (results, early_status) = if status_fixed {
            let (results, status) = futures::join!(self.write_actions(&job), self.bounded_status(&job));
            (results, Some(status))
        } else {
            (self.write_actions(&job).await, None)
        };
        let Outcome { failed, notices, mut first_error } = self.account(&job, results).await;
        if !failed.is_empty() {
            job.leave_out(&failed);
        }
        // The plan's own notices (less the requests that failed) come before what the writes told;
        // a step given up is told about its object.
        let plan_notices = std::mem::take(&mut job.plan.notices);
        let notices: Vec<(Notice, Option<ObjectRef>)> = plan_notices
            .into_iter()
            .map(|n| {
                let about = job.plan.given_up_object(&n).cloned();
                (n, about)
            })
            .chain(notices)
            .collect();
        let status = match early_status {
            Some(status) => status,
            None => self.bounded_status(&job).await,
        };
        if let Err(e) = status {
            warn!(check = %key, error = %e, category = e.category(), "status not written");
            self.metrics.write_error(e.category());
            first_error.get_or_insert(e);
        }
        self.metrics.apply_seconds(self.clock.instant().saturating_duration_since(started).as_secs_f64());
        // Events are published in the background, in order: the next decision (another
        // Machine's remediation) must not wait for them.
        if !notices.is_empty() {
            let this = self.clone();
            let uid = job.uid.clone();
            tokio::spawn(async move {
                for (notice, about) in notices {
                    this.publish_about(&key, uid.as_deref(), &notice, about.as_ref()).await;
                }
            });
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends the plan's actions: first the `nhc-timed-out` annotations of remediation steps given
    /// up, then the rest, [`WRITE_CONCURRENCY`] at a time, each fenced and bounded. An action the
    /// plan puts after annotations ([`Action::after`]: a Node's next step) is sent only once the
    /// API server has written them, so that the previous remediator stops before the next one
    /// starts and two steps are never live at once; when one fails, the action is not sent.
    async fn write_actions(
        self: &Arc<Self>,
        job: &vigil_index::gather::Job,
    ) -> Vec<(Action, Result<Option<ObjectRef>, WriteError>)> {
        let (annotations, rest): (Vec<Action>, Vec<Action>) =
            job.plan.actions.iter().cloned().partition(|a| matches!(a, Action::AnnotateRemediation { .. }));
        if annotations.is_empty() {
            return self.send_actions(job, rest).await;
        }
        let mut results = self.send_actions(job, annotations).await;
        // What the plan says must come after an annotation waits for it; a refused one holds it.
        let refused: Vec<&ObjectRef> = results
            .iter()
            .filter_map(|(a, r)| match (a, r) {
                (Action::AnnotateRemediation { object, .. }, Err(_)) => Some(object),
                _ => None,
            })
            .collect();
        let (held, rest): (Vec<Action>, Vec<Action>) =
            rest.into_iter().partition(|a| a.after().iter().any(|o| refused.contains(&o)));
        results.extend(self.send_actions(job, rest).await);
        results.extend(held.into_iter().map(|a| {
            let what = format!("{a:?}").chars().take(200).collect::<String>();
            (a, Err(WriteError::Unconfirmed(what)))
        }));
        results
    }

    /// Sends `actions` of the plan, [`WRITE_CONCURRENCY`] at a time, each fenced and bounded.
    async fn send_actions(
        self: &Arc<Self>,
        job: &vigil_index::gather::Job,
        actions: Vec<Action>,
    ) -> Vec<(Action, Result<Option<ObjectRef>, WriteError>)> {
        futures::stream::iter(actions)
            .map(|action| {
                let this = self.clone();
                let cached = match &action {
                    Action::SetMachineConditions { machine, .. } => {
                        job.machines.get(&machine.machine_target()).cloned()
                    }
                    _ => None,
                };
                let remediating = action.remediates().is_some();
                let job_key = job.key.clone();
                async move {
                    // Taken before the write's time bound starts: waiting for a permit is not
                    // the API server being slow.
                    let _permit = match holds_a_verdict_permit(&action, remediating) {
                        true => this.writer.verdict_permit().await,
                        false => None,
                    };
                    let what = || format!("{action:?}").chars().take(200).collect::<String>();
                    let result =
                        bounded(this.right(&job_key), what, this.act(&job_key, &action, cached, remediating)).await;
                    (action, result)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await
    }

    /// Counts what the writes did (metrics, the notices they tell) and collects the ones that
    /// failed, to leave them out of the plan.
    async fn account(
        &self,
        job: &vigil_index::gather::Job,
        results: Vec<(Action, Result<Option<ObjectRef>, WriteError>)>,
    ) -> Outcome {
        let key = &job.key;
        let mut out = Outcome { failed: Vec::new(), notices: Vec::new(), first_error: None };
        for (action, result) in results {
            let remediating = action.remediates().is_some();
            match (&action, result) {
                (Action::CreateRemediation { target, object, .. }, Ok(Some(created))) => {
                    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
                    self.metrics.remediation(key, kind, "created");
                    if let Some(at) = job.expiries.get(target) {
                        self.metrics.detected(seconds_since(*at, self.clock.now()));
                    }
                    let notice = Notice {
                        kind: NoticeKind::RemediationCreated,
                        target: Some(target.clone()),
                        reason: vigil_api::reason::Reason::RemediationCreated,
                        message: format!("Created {kind} {}/{} for {}", created.namespace, created.name, target.key()),
                    };
                    out.notices.push((notice, Some(created)));
                }
                (Action::DeleteRemediation { target, object, .. }, Ok(Some(_))) => {
                    let notice = Notice {
                        kind: NoticeKind::RemediationDeleted,
                        target: Some(target.clone()),
                        reason: vigil_api::reason::Reason::RemediationRemoved,
                        message: format!("Deleted {object} for {}: it is healthy again or gone", target.key()),
                    };
                    out.notices.push((notice, Some(object.clone())));
                }
                (Action::SetMachineConditions { machine, .. }, Ok(_)) if remediating => {
                    self.metrics.remediation(key, "Machine", "marked");
                    if let Some(at) = job.expiries.get(&machine.machine_target()) {
                        self.metrics.detected(seconds_since(*at, self.clock.now()));
                    }
                }
                (_, Ok(_)) => {}
                (_, Err(e)) => self.failed(key, action, e, &mut out).await,
            }
        }
        out
    }

    /// Records a failed write: logged and counted, a failed create told and its object looked
    /// for when the outcome is unknown.
    async fn failed(&self, key: &CheckRef, action: Action, e: WriteError, out: &mut Outcome) {
        warn!(check = %key, error = %e, category = e.category(), "write failed");
        self.metrics.write_error(e.category());
        if let Action::CreateRemediation { target, object, .. } = &action {
            let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
            self.metrics.remediation(key, kind, "failed");
            let notice = Notice {
                kind: NoticeKind::RemediationFailed,
                target: Some(target.clone()),
                reason: vigil_api::reason::Reason::RemediationFailed,
                message: format!("Could not create {kind} for {} ({e}); retried with back-off", target.key()),
            };
            out.notices.push((notice, None));
            // Whether or not it was made, the retry is safe: it has the same name (a 409 if the
            // first one was made after all).
        }
        out.failed.push(action);
        out.first_error.get_or_insert(e);
    }

    /// [`Self::write_status`], fenced and bounded like every write.
    async fn bounded_status(self: &Arc<Self>, job: &vigil_index::gather::Job) -> Result<(), WriteError> {
        let key = &job.key;
        bounded(self.right(key), || format!("status of {key}"), self.write_status(job)).await
    }

    /// Writes the check's status when the plan changed it (merge patch on the status subresource).
    async fn write_status(self: &Arc<Self>, job: &vigil_index::gather::Job) -> Result<(), WriteError> {
        match self.route(&job.key, job.uid.as_deref()) {
            crate::medik8s::Route::Vigil => {}
            crate::medik8s::Route::Medik8s => return crate::medik8s::write_status(self, job).await,
            crate::medik8s::Route::Drop => return Ok(()),
        }
        let Some(status) = job.status_patch() else { return Ok(()) };
        // The version decided on: a status written over since (another replica's, a late one
        // of ours) refuses it, and the check is decided again on what is there now.
        let patch = at_version(json!({ "status": status }), job.resource_version.as_deref());
        // Untyped: a check whose spec does not parse still gets its status (InvalidSpec), and
        // the answer is read as leniently as the watch reads it.
        let (ar, namespace, name) = match &job.key {
            CheckRef::Machine { namespace: ns, name: n } => {
                (ApiResource::erase::<vigil_api::MachineHealthCheck>(&()), ns.as_str(), n)
            }
            CheckRef::Node { name: n } => (ApiResource::erase::<vigil_api::NodeHealthCheck>(&()), "", n),
        };
        let what = || format!("status of {}", job.key);
        match self.writer.patch_status::<WireObject>(&ar, namespace, name, &patch, what).await {
            Ok(Some(written)) => {
                self.put_check(&job.key, written);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                if e.is_conflict() {
                    // Read what is there now, so the next decision is made on it.
                    if let Some(Some(fresh)) = self.writer.read_again(&ar, namespace, name).await {
                        self.put_check(&job.key, WireObject::from(fresh));
                    }
                }
                Err(e)
            }
        }
    }

    /// Puts a check as the API server answered with it into the index (read before the index
    /// is locked).
    fn put_check(&self, key: &CheckRef, answer: WireObject) {
        match key {
            CheckRef::Machine { .. } => {
                let read = crate::wire::read_mhc(answer);
                self.write_index().put_mhc_read(Some(read), None)
            }
            CheckRef::Node { .. } => {
                let read = crate::wire::read_nhc(answer);
                self.write_index().put_nhc_read(Some(read), None)
            }
        };
    }

    /// Publishes one notice as an event on the check `key` (only while leading, checked again
    /// when its turn on the event lane comes).
    pub async fn publish(&self, key: &CheckRef, uid: Option<&str>, notice: &Notice) {
        self.publish_about(key, uid, notice, None).await;
    }

    /// [`Self::publish`] for a notice about one remediation object (`about`): the event's
    /// related object is that object, not its target, so that a reader filtering Events by
    /// object finds each of a Node's successive remediation objects.
    pub async fn publish_about(&self, key: &CheckRef, uid: Option<&str>, notice: &Notice, about: Option<&ObjectRef>) {
        if !self.right(key).is_leader() {
            return;
        }
        if let CheckRef::Node { name } = key
            && self.route(key, uid) != crate::medik8s::Route::Vigil
        {
            return crate::medik8s::publish_served(self, name, uid, notice, about).await;
        }
        let note = match &notice.target {
            Some(t) if !notice.message.contains(t.name()) => format!("{}: {}", t.key(), notice.message),
            _ => notice.message.clone(),
        };
        let event = Event {
            type_: if notice.kind.is_warning() { EventType::Warning } else { EventType::Normal },
            reason: notice.kind.event_reason(key).into(),
            note: Some(note.chars().take(1000).collect()),
            action: format!("{:?}", notice.kind),
            secondary: match about {
                Some(object) => Some(object_reference(object)),
                None => notice.target.as_ref().map(related),
            },
        };
        self.send_event(&event, &check_reference(key, uid), Some(key)).await;
    }

    /// One write, through the writer, and its answer into the index; `Ok(Some(object))` when
    /// an object was created or deleted.
    async fn act(
        &self,
        writer: &CheckRef,
        action: &Action,
        cached: Option<vigil_index::index::MachineEntry>,
        remediating: bool,
    ) -> Result<Option<ObjectRef>, WriteError> {
        match action {
            Action::SetMachineConditions { machine, version, conditions } => {
                let basis = cached.as_ref().map(|e| (&e.basis, e.resource_version.as_deref()));
                let write = ConditionsWrite { machine, version: *version, conditions, basis, remediating };
                if let Some(written) = self.writer.set_machine_conditions(write).await? {
                    // Its entry is built before the index is locked for writing, as the watch
                    // builds one (unless the watch's echo of the same version came first).
                    let entry = self.machine_entry(&written);
                    let concerned = self.write_index().put_machine_entry(entry, None);
                    self.wake_others(writer, concerned);
                }
                Ok(None)
            }
            Action::CreateRemediation { object, lease, .. } => {
                // The Node's Lease first: when it cannot be taken, the object is not created.
                if let Some(lease) = lease {
                    self.write_lease(lease).await?;
                }
                self.create_remediation(writer, object).await
            }
            Action::WriteLease(lease) => self.write_lease(lease).await.map(|()| None),
            Action::DeleteLease { lease, uid, resource_version, .. } => {
                if self.writer.delete_lease(lease, uid.as_deref(), resource_version.as_deref()).await? {
                    self.write_index().remember_lease(&lease.name, None);
                }
                Ok(None)
            }
            Action::DeleteRemediation { object, seen, .. } => self.delete_remediation(writer, object, seen).await,
            Action::AnnotateRemediation { object, key, value, seen, .. } => {
                self.annotate_remediation(writer, object, (key, value), seen).await.map(|()| None)
            }
        }
    }

    /// Takes or renews a node Lease; the answer goes into the index at once.
    async fn write_lease(&self, lease: &vigil_engine::plan::LeaseWrite) -> Result<(), WriteError> {
        let written = self.writer.write_lease(lease).await?;
        let value = serde_json::to_value(&written).ok();
        self.write_index().remember_lease(&lease.name, value.as_ref());
        Ok(())
    }

    /// Creates a remediation object and puts it into the index; `Ok(None)` when it exists
    /// already.
    async fn create_remediation(&self, writer: &CheckRef, object: &Value) -> Result<Option<ObjectRef>, WriteError> {
        let Some((created, answer)) = self.writer.create_remediation(object).await? else { return Ok(None) };
        let gk = group_kind(&created.api_version, &created.kind);
        self.remember(writer, &answer, |idx, v| idx.put_object(&gk, false, Some(v), None));
        Ok(Some(created))
    }

    /// Deletes a remediation object; `Ok(None)` when it is gone already.
    ///
    /// An object its remediator's finalizer keeps stays in the index and keeps counting (its
    /// Node unhealthy, in every budget) until the watch says it is gone. A delete refused
    /// because the object changed (or another took its name) reads it again, and the check is
    /// decided again.
    async fn delete_remediation(
        &self,
        writer: &CheckRef,
        object: &ObjectRef,
        seen: &Seen,
    ) -> Result<Option<ObjectRef>, WriteError> {
        let gk = group_kind(&object.api_version, &object.kind);
        match self.writer.delete_remediation(object, seen).await {
            Ok(Some(Deleted::Finalizing(terminating))) => {
                self.remember(writer, &terminating, |idx, v| idx.put_object(&gk, false, Some(v), None));
                Ok(Some(object.clone()))
            }
            Ok(Some(Deleted::Gone)) => {
                self.forget_object(writer, object);
                Ok(Some(object.clone()))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.refresh_if_conflict(writer, object, e).await),
        }
    }

    /// Sets one annotation on a remediation object, only while it is still at the version
    /// `seen` (a late one finds it changed and is refused; the object is then read again and
    /// the check decided again).
    async fn annotate_remediation(
        &self,
        writer: &CheckRef,
        object: &ObjectRef,
        (key, value): (&str, &str),
        seen: &Seen,
    ) -> Result<(), WriteError> {
        match self.writer.annotate_remediation(object, (key, value), seen).await {
            Ok(Some(annotated)) => {
                let gk = group_kind(&object.api_version, &object.kind);
                self.remember(writer, &annotated, |idx, v| idx.put_object(&gk, false, Some(v), None));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(self.refresh_if_conflict(writer, object, e).await),
        }
    }

    /// Reads a remediation object again into the index when a write about it was refused
    /// because it changed (`e` a conflict), so the next decision is made on what is there now;
    /// `e` back.
    async fn refresh_if_conflict(&self, writer: &CheckRef, object: &ObjectRef, e: WriteError) -> WriteError {
        if !e.is_conflict() {
            return e;
        }
        let gk = group_kind(&object.api_version, &object.kind);
        match self.writer.read_object(object).await {
            Some(Some(fresh)) => self.remember(writer, &fresh, |idx, v| idx.put_object(&gk, false, Some(v), None)),
            Some(None) => self.forget_object(writer, object),
            None => {}
        }
        e
    }
}

/// Whether a write waits for one of the [`crate::writes::VERDICT_WRITES_IN_FLIGHT`] permits: a Machine's
/// conditions written without remediating it (a remediation is never held back).
fn holds_a_verdict_permit(action: &Action, remediating: bool) -> bool {
    matches!(action, Action::SetMachineConditions { .. }) && !remediating
}

/// The Machine or Node an event is about (its `related` object), so a target's Events can be
/// found by the target.
fn related(target: &Target) -> ObjectReference {
    match target {
        Target::Machine { namespace, name } => ObjectReference {
            kind: Some("Machine".into()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            ..Default::default()
        },
        Target::Node { name, .. } => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            ..Default::default()
        },
    }
}

/// An object reference to a remediation object, for an event's related object.
pub(crate) fn object_reference(object: &ObjectRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(object.api_version.clone()),
        kind: Some(object.kind.clone()),
        namespace: Some(object.namespace.clone()).filter(|n| !n.is_empty()),
        name: Some(object.name.clone()),
        ..Default::default()
    }
}

/// The index key of a kind: (group, kind).
fn group_kind(api_version: &str, kind: &str) -> vigil_index::index::GroupKind {
    (group_of(api_version).to_string(), kind.to_string())
}

/// Seconds from `deadline` to `now`, for the detection-delay metric.
pub fn seconds_since(deadline: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(deadline).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::preconditions;

    #[test]
    fn every_write_error_category_is_listed() {
        let api = |code: u16| WriteError::Api {
            what: "w".into(),
            source: kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() })),
        };
        let errors = [
            api(409),
            api(403),
            api(422),
            WriteError::Api { what: "w".into(), source: kube::Error::LinesCodecMaxLineLengthExceeded },
            WriteError::Discovery("d".into()),
            WriteError::Timeout("t".into()),
            WriteError::NotLeader("n".into()),
            WriteError::Unconfirmed("u".into()),
        ];
        let categories: Vec<&str> = errors.iter().map(WriteError::category).collect();
        assert_eq!(categories, WriteError::CATEGORIES);
    }

    #[test]
    fn only_verdicts_wait_for_a_write_permit() {
        let machine = ObjectRef {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            namespace: "ns".into(),
            name: "m1".into(),
        };
        let verdict = Action::SetMachineConditions {
            machine: machine.clone(),
            version: vigil_api::views::CapiVersion::V1Beta2,
            conditions: Vec::new(),
        };
        assert!(holds_a_verdict_permit(&verdict, false));
        assert!(!holds_a_verdict_permit(&verdict, true), "a remediating write is never held back");
        let target = Target::Machine { namespace: "ns".into(), name: "m1".into() };
        let delete = Action::DeleteRemediation { target, object: machine, seen: Default::default() };
        assert!(!holds_a_verdict_permit(&delete, false));
    }

    #[test]
    fn events_name_the_target_they_are_about() {
        let r = related(&Target::Machine { namespace: "ns".into(), name: "m1".into() });
        assert_eq!(
            (r.kind.as_deref(), r.namespace.as_deref(), r.name.as_deref()),
            (Some("Machine"), Some("ns"), Some("m1"))
        );
        let r = related(&Target::local_node("n1"));
        assert_eq!((r.kind.as_deref(), r.name.as_deref(), r.namespace), (Some("Node"), Some("n1"), None));
        let check_wide: Option<&Target> = None;
        assert!(check_wide.map(related).is_none(), "a check-wide notice is about the check alone");
    }

    #[test]
    fn a_guarded_write_names_the_version_decided_on() {
        let patch = at_version(json!({"status": {"phase": "Enabled"}}), Some("42"));
        assert_eq!(patch, json!({"status": {"phase": "Enabled"}, "metadata": {"resourceVersion": "42"}}));
        let patch = at_version(json!({"metadata": {"annotations": {"a": "b"}}}), Some("7"));
        assert_eq!(patch, json!({"metadata": {"annotations": {"a": "b"}, "resourceVersion": "7"}}));
        assert_eq!(at_version(json!({"status": {}}), None), json!({"status": {}}));
        let seen = Seen { uid: Some("u".into()), resource_version: Some("9".into()) };
        let p = preconditions(&seen).expect("preconditions");
        assert_eq!((p.uid.as_deref(), p.resource_version.as_deref()), (Some("u"), Some("9")));
        assert!(preconditions(&Seen::default()).is_none());
    }

    #[test]
    fn group_kind_of_core_and_grouped_kinds() {
        assert_eq!(group_kind("v1", "Node"), (String::new(), "Node".to_string()));
        assert_eq!(
            group_kind("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediation"),
            ("self-node-remediation.medik8s.io".to_string(), "SelfNodeRemediation".to_string())
        );
    }
}
