//! The one place the controller writes to the API server: the [`Writer`] holds the client its
//! writes go through, the right to write (the leader's, or each shard's), the permits of
//! verdict-only writes, the event lane and its Event series, and the discovery cache. Every write —
//! status patches, Machine conditions, remediation objects created, deleted and annotated, node
//! Leases, Events, the lease namespace — is one of its methods. It keeps no state of the
//! cluster: each method answers with what the API server said (the object written, whether it is
//! gone, the error), and the caller ([`crate::apply`], [`crate::medik8s`]) puts that answer into
//! the index. Each write is bounded by what is left of the right to write ([`crate::fenced`]).

use crate::events::{EventSeriesBook, Reporting};
use crate::leader::{Leadership, ShardRights};
use crate::metrics::Metrics;
use crate::wire::WireObject;
use crate::writes::{FIELD_MANAGER, VERDICT_WRITES_IN_FLIGHT, WRITE_TIMEOUT, WriteError, api_error, at_version};
use crate::writes::{is_code, patch_params};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PostParams, Preconditions};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::events::Event;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tracing::debug;
use vigil_api::api_version::ApiVersion;
use vigil_api::conditions::DesiredCondition;
use vigil_api::views::{CapiVersion, MachineView};
use vigil_engine::machine_write::{WriteBasis, machine_status_patch};
use vigil_engine::{ObjectRef, Seen};

/// How many events are sent at once. Events are the largest share of a failure wave's requests
/// (two per remediation: the target found unhealthy, its remediation requested); sent one after
/// another on a narrow lane they reach the API server after the remediations, not among them
/// (docs/DECISIONS.md, "Events on their own lane").
pub const EVENT_LANE: usize = 2;

/// How often a conflicting Machine write is recomputed and retried.
const CONFLICT_RETRIES: usize = 5;

/// Everything a write needs and nothing a decision reads: the one way out to the API server.
pub struct Writer {
    /// Client of the cluster Vigil runs in, for writes (and the reads a refused write makes).
    client: Client,
    /// Event publisher (a report whose note changed is a new Event).
    events_sent: EventSeriesBook,
    /// The event lane: at most [`EVENT_LANE`] events are sent at once, so a wave's events queue
    /// behind each other instead of competing with its remediations at the API server.
    events: tokio::sync::Semaphore,
    /// Discovered API resources.
    resources: tokio::sync::Mutex<HashMap<GroupVersionKind, ApiResource>>,
    /// Whether this replica may write now (fencing: checked before every write).
    leadership: Arc<Leadership>,
    /// Sharded mode: the right to write per shard (none: one shard, fenced by `leadership`).
    shards: Option<Arc<ShardRights>>,
    /// Permits for verdict-only Machine writes ([`VERDICT_WRITES_IN_FLIGHT`]).
    verdict_writes: tokio::sync::Semaphore,
    /// Where writes and the event lane are counted.
    metrics: Arc<Metrics>,
}

/// What a delete the API server took left.
#[derive(Debug)]
pub enum Deleted {
    /// Finalizers hold the object (with `deletionTimestamp`) until their owners let it go.
    Finalizing(Box<DynamicObject>),
    /// The object no longer exists.
    Gone,
}

/// One Machine conditions write: what the decision wants and what it read the Machine at.
#[derive(Clone, Copy)]
pub struct ConditionsWrite<'a> {
    /// The Machine.
    pub machine: &'a ObjectRef,
    /// Its Cluster API version (where the conditions live).
    pub version: CapiVersion,
    /// Vigil's conditions, each with the time it takes effect.
    pub conditions: &'a [(DesiredCondition, Timestamp)],
    /// Where its condition lists stood when the decision read it, with its `resourceVersion`
    /// (none: the Machine is read first).
    pub basis: Option<(&'a WriteBasis, Option<&'a str>)>,
    /// Whether the write remediates the Machine (a conflict is then decided again, not retried).
    pub remediating: bool,
}

/// Runs a write if `right` holds, with no more time than it has left (fencing) and at most
/// [`WRITE_TIMEOUT`]: the client gives up then, every request of the write asks the API server
/// to give up by then too, and none goes out with less than [`crate::fenced::MIN_LEFT`] left
/// ([`crate::fenced::within`]).
pub(crate) async fn bounded<T>(
    right: &Leadership,
    what: impl FnOnce() -> String,
    fut: impl std::future::Future<Output = Result<T, WriteError>>,
) -> Result<T, WriteError> {
    let Some(left) = right.remaining() else { return Err(WriteError::NotLeader(what())) };
    match crate::fenced::within(WRITE_TIMEOUT.min(left), fut).await {
        Ok(r) => r,
        Err(crate::fenced::Cut::TimedOut) => Err(WriteError::Timeout(what())),
        Err(crate::fenced::Cut::TooLittleLeft) => {
            Err(WriteError::RightEnding(format!("{} (less than {:?} left)", what(), crate::fenced::MIN_LEFT)))
        }
    }
}

impl Writer {
    /// A writer through `client`, fenced by `leadership` or, sharded, by each shard's right.
    pub fn new(
        client: Client,
        leadership: Leadership,
        shards: Option<Arc<ShardRights>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporting = Reporting { controller: "vigil".into(), instance: std::env::var("POD_NAME").ok() };
        Writer {
            events_sent: EventSeriesBook::new(client.clone(), reporting),
            events: tokio::sync::Semaphore::new(EVENT_LANE),
            client,
            resources: tokio::sync::Mutex::new(HashMap::new()),
            leadership: Arc::new(leadership),
            shards,
            verdict_writes: tokio::sync::Semaphore::new(VERDICT_WRITES_IN_FLIGHT),
            metrics,
        }
    }

    /// The one leader's right to write (always held without election), which the run loop and
    /// the election share.
    pub fn leadership(&self) -> &Arc<Leadership> {
        &self.leadership
    }

    /// The rights per shard in sharded mode, which the election keeps.
    pub fn shards(&self) -> Option<&Arc<ShardRights>> {
        self.shards.as_ref()
    }

    /// The right to write for `shard`: its shard's right in sharded mode (none: never held),
    /// the leader's otherwise. Checked before every write.
    pub fn right(&self, shard: Option<u32>) -> &Leadership {
        match &self.shards {
            Some(shards) => shards.right(shard),
            None => &self.leadership,
        }
    }

    /// The API resource of an object kind, from discovery (cached).
    pub async fn resource(&self, api_version: &str, kind: &str) -> Result<ApiResource, WriteError> {
        let ApiVersion { group, version } = ApiVersion::parse(api_version);
        let gvk = GroupVersionKind::gvk(group, version, kind);
        // Held across the lookup: the writes of a plan that all miss the cache at once make one
        // discovery request, not one each.
        let mut resources = self.resources.lock().await;
        if let Some(ar) = resources.get(&gvk) {
            return Ok(ar.clone());
        }
        let (ar, _) = kube::discovery::pinned_kind(&self.client, &gvk).await.map_err(|e| {
            WriteError::Discovery(format!("{kind}.{group}/{version} is not served by the API server: {e}"))
        })?;
        resources.insert(gvk, ar.clone());
        Ok(ar)
    }

    /// One of the [`VERDICT_WRITES_IN_FLIGHT`] permits a verdict-only Machine write waits for.
    pub async fn verdict_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.verdict_writes.acquire().await.ok()
    }

    fn dynamic(&self, ar: &ApiResource, namespace: &str) -> Api<DynamicObject> {
        if namespace.is_empty() {
            Api::all_with(self.client.clone(), ar)
        } else {
            Api::namespaced_with(self.client.clone(), namespace, ar)
        }
    }

    /// Sends one event through the event lane (waiting for a place on it), if `may_send` still
    /// says so when its turn comes; a failure is logged only: an event is a report, never a
    /// condition for a decision.
    pub async fn send_event(&self, event: &Event, reference: &ObjectReference, may_send: impl FnOnce() -> bool) {
        // The semaphore is never closed; were it, the event goes unqueued rather than lost.
        self.metrics.events_waiting(1);
        let _place = self.events.acquire().await.ok();
        self.metrics.events_waiting(-1);
        if !may_send() {
            return;
        }
        match self.events_sent.publish(event, reference, Timestamp::now()).await {
            Ok(()) => self.metrics.writes("event"),
            Err(e) => debug!(error = %e, "event not published"),
        }
    }

    /// Patches the status subresource of `name` with the merge patch `patch` (a check's, of
    /// kind `ar`); the object as written, or `None` when it is gone.
    pub async fn patch_status<T: serde::de::DeserializeOwned>(
        &self,
        ar: &ApiResource,
        namespace: &str,
        name: &str,
        patch: &Value,
        what: impl FnOnce() -> String,
    ) -> Result<Option<T>, WriteError> {
        let requests = crate::fenced::requests::<DynamicObject>(ar, namespace);
        let patch = Patch::Merge(patch);
        let written: Result<T, _> =
            crate::fenced::patch(&self.client, &requests, name, Some("status"), &patch_params(), &patch).await;
        match written {
            Ok(written) => {
                self.metrics.writes("status");
                Ok(Some(written))
            }
            Err(e) if is_code(&e, 404) => Ok(None),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    /// Reads `name` again after a write about it was refused because it changed, so the next
    /// decision is made on what is there now: `Some(None)` when it is gone, `None` when it could
    /// not be read in time.
    pub async fn read_again(&self, ar: &ApiResource, namespace: &str, name: &str) -> Option<Option<DynamicObject>> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.dynamic(ar, namespace).get_opt(name)).await {
            Ok(Ok(fresh)) => Some(fresh),
            _ => None,
        }
    }

    /// Creates a remediation object; its reference and the object created, or `None` when it
    /// exists already.
    pub async fn create_remediation(&self, object: &Value) -> Result<Option<(ObjectRef, DynamicObject)>, WriteError> {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let namespace = object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
        let ar = self.resource(api_version, kind).await?;
        let dynamic: DynamicObject = serde_json::from_value(object.clone())
            .map_err(|e| WriteError::Discovery(format!("remediation object: {e}")))?;
        let requests = crate::fenced::requests::<DynamicObject>(&ar, namespace);
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match crate::fenced::create(&self.client, &requests, &pp, &dynamic).await {
            Ok(created) => {
                self.metrics.writes("remediation_create");
                let reference = ObjectRef {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    namespace: namespace.into(),
                    name: created.metadata.name.clone().unwrap_or_default(),
                };
                Ok(Some((reference, created)))
            }
            Err(e) if is_code(&e, 409) => Ok(None),
            Err(e) => Err(api_error(format!("create {kind} in {namespace}"))(e)),
        }
    }

    /// Deletes a remediation object, only the one `seen` at that version (preconditions); what
    /// the delete left, or `None` when it was gone already.
    ///
    /// A remediator's finalizer keeps the object (with `deletionTimestamp`) while it finishes,
    /// fencing included: the API server then answers with the object. Only an answer without
    /// finalizers means the object no longer exists.
    pub async fn delete_remediation(&self, object: &ObjectRef, seen: &Seen) -> Result<Option<Deleted>, WriteError> {
        let ar = self.resource(&object.api_version, &object.kind).await?;
        let requests = crate::fenced::requests::<DynamicObject>(&ar, &object.namespace);
        let dp = DeleteParams { preconditions: preconditions(seen), ..DeleteParams::background() };
        match crate::fenced::delete::<DynamicObject>(&self.client, &requests, &object.name, &dp).await {
            Ok(answer) => {
                self.metrics.writes("remediation_delete");
                Ok(Some(match answer.left().filter(still_finalizing) {
                    Some(terminating) => Deleted::Finalizing(Box::new(terminating)),
                    None => Deleted::Gone,
                }))
            }
            Err(e) if is_code(&e, 404) => Ok(None),
            Err(e) => Err(api_error(format!("delete {object}"))(e)),
        }
    }

    /// Sets one annotation on a remediation object, only while it is still at the version
    /// `seen`; the object as annotated, or `None` when it is gone.
    pub async fn annotate_remediation(
        &self,
        object: &ObjectRef,
        (key, value): (&str, &str),
        seen: &Seen,
    ) -> Result<Option<DynamicObject>, WriteError> {
        let ar = self.resource(&object.api_version, &object.kind).await?;
        let patch = at_version(json!({"metadata": {"annotations": {key: value}}}), seen.resource_version.as_deref());
        let requests = crate::fenced::requests::<DynamicObject>(&ar, &object.namespace);
        let written: Result<DynamicObject, _> =
            crate::fenced::patch(&self.client, &requests, &object.name, None, &patch_params(), &Patch::Merge(&patch))
                .await;
        match written {
            Ok(annotated) => {
                self.metrics.writes("remediation_annotate");
                Ok(Some(annotated))
            }
            Err(e) if is_code(&e, 404) => Ok(None),
            Err(e) => Err(api_error(format!("annotate {object}"))(e)),
        }
    }

    /// Reads a remediation object again after a write about it was refused because it changed
    /// ([`Self::read_again`]).
    pub async fn read_object(&self, object: &ObjectRef) -> Option<Option<DynamicObject>> {
        let ar = self.resource(&object.api_version, &object.kind).await.ok()?;
        self.read_again(&ar, &object.namespace, &object.name).await
    }

    /// Takes or renews a node Lease: a create (refused when the Lease exists) or an update of
    /// the version decided on (refused when anyone changed it since), so two holders never both
    /// take it. The Lease as written.
    pub async fn write_lease(&self, lease: &vigil_engine::plan::LeaseWrite) -> Result<Lease, WriteError> {
        let what = || format!("Lease {}/{} of Node {}", lease.namespace, lease.name, lease.node);
        let object: Lease =
            serde_json::from_value(lease.manifest()).map_err(|e| WriteError::Discovery(format!("{}: {e}", what())))?;
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let requests = crate::fenced::requests::<Lease>(&(), &lease.namespace);
        let written = match &lease.resource_version {
            None => crate::fenced::create(&self.client, &requests, &pp, &object).await,
            Some(_) => crate::fenced::replace(&self.client, &requests, &lease.name, &pp, &object).await,
        }
        .map_err(api_error(what()))?;
        self.metrics.writes("lease");
        Ok(written)
    }

    /// Releases a node Lease: deleted only if it is still the version (and object) decided on;
    /// `false` when one changed or gone since is left as it is.
    pub async fn delete_lease(
        &self,
        lease: &ObjectRef,
        uid: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<bool, WriteError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: uid.map(str::to_string),
                resource_version: resource_version.map(str::to_string),
            }),
            ..Default::default()
        };
        let requests = crate::fenced::requests::<Lease>(&(), &lease.namespace);
        match crate::fenced::delete::<Lease>(&self.client, &requests, &lease.name, &dp).await {
            Ok(_) => {
                self.metrics.writes("lease");
                Ok(true)
            }
            Err(e) if is_code(&e, 404) || is_code(&e, 409) => Ok(false),
            Err(e) => Err(api_error(format!("delete {lease}"))(e)),
        }
    }

    /// Creates the lease namespace (not fenced: every replica keeps it, whoever leads); `false`
    /// when it exists already.
    pub async fn create_namespace(&self, namespace: &Namespace) -> Result<bool, kube::Error> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), namespace).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// What the first attempt of a Machine condition write left to do.
enum FirstWrite {
    /// Written (the Machine as written, without its managed fields), or the Machine is gone
    /// (`None`).
    Done(Option<Box<Value>>),
    /// A merge patch on this Machine (its JSON as just read).
    Retry(Value),
}

/// One Machine conditions write, as both its phases see it.
#[derive(Clone, Copy)]
struct Phase<'a> {
    api: &'a Api<DynamicObject>,
    requests: &'a kube::core::Request,
    write: ConditionsWrite<'a>,
}

impl Writer {
    /// Patches a Machine's conditions; on a conflict (unless `remediating`) the patch is
    /// recomputed on the fresh Machine and sent again. The Machine as written, or `None` when it
    /// is gone.
    ///
    /// The first attempt is a JSON patch built from the write's [`WriteBasis`]
    /// (`vigil_engine::machine_write`): it tests the `resourceVersion` the decision read and
    /// writes only Vigil's conditions at the positions recorded. When the Machine changed since,
    /// the test fails the whole patch (the API server answers 422, not 409): that is a conflict,
    /// told apart from a patch the server refuses for another reason by reading the Machine.
    /// Without a basis the Machine is read first. A retry sends the merge patch of the whole
    /// condition lists of the Machine just read, with its `resourceVersion`. The Machine as
    /// written is decoded as the watch decodes it (`WireObject`: no managed fields, no typed copy).
    pub async fn set_machine_conditions(&self, write: ConditionsWrite<'_>) -> Result<Option<Value>, WriteError> {
        let machine = write.machine;
        let ar = self.resource(&machine.api_version, "Machine").await?;
        let api = self.dynamic(&ar, &machine.namespace);
        let requests = crate::fenced::requests::<DynamicObject>(&ar, &machine.namespace);
        let phase = Phase { api: &api, requests: &requests, write };
        let current = match self.patch_from_basis(&phase).await? {
            FirstWrite::Done(written) => return Ok(written.map(|w| *w)),
            FirstWrite::Retry(current) => current,
        };
        self.merge_patch_conditions(&phase, current).await
    }

    /// The first attempt of [`Writer::set_machine_conditions`]: the JSON patch from the
    /// basis, or (without one) a read of the Machine for the merge patch.
    async fn patch_from_basis(&self, phase: &Phase<'_>) -> Result<FirstWrite, WriteError> {
        let Phase { api, requests, write } = *phase;
        let ConditionsWrite { machine, version, conditions, basis, remediating } = write;
        let json_patch = basis.and_then(|(basis, resource_version)| {
            let ops = basis.json_patch(version, resource_version, conditions)?;
            serde_json::from_value::<json_patch::Patch>(ops).ok().map(|p| (p, resource_version.map(str::to_string)))
        });
        let Some((patch, tested)) = json_patch else {
            return read_machine(api, machine).await;
        };
        let refused = api_error(format!("conditions of {machine}"));
        let status = Some("status");
        let written: Result<WireObject, _> = crate::fenced::patch(
            &self.client,
            requests,
            &machine.name,
            status,
            &patch_params(),
            &Patch::<()>::Json(patch),
        )
        .await;
        match written {
            Ok(written) => {
                self.metrics.writes("machine_conditions");
                Ok(FirstWrite::Done(Some(Box::new(written.raw))))
            }
            Err(e) if is_code(&e, 404) => Ok(FirstWrite::Done(None)),
            // The resourceVersion test failed, or the server refused the patch: the Machine's
            // version tells which.
            Err(e) if is_code(&e, 422) => match read_machine(api, machine).await? {
                FirstWrite::Retry(fresh)
                    if fresh.pointer("/metadata/resourceVersion").and_then(Value::as_str) == tested.as_deref() =>
                {
                    Err(refused(e))
                }
                FirstWrite::Retry(_) if remediating => Err(refused(stale_version(machine, tested))),
                other => Ok(other),
            },
            Err(e) if is_code(&e, 409) && !remediating => read_machine(api, machine).await,
            Err(e) => Err(refused(e)),
        }
    }

    /// The merge patches of [`Writer::set_machine_conditions`] after its first attempt, each
    /// on the Machine as just read (`current`).
    async fn merge_patch_conditions(&self, phase: &Phase<'_>, mut current: Value) -> Result<Option<Value>, WriteError> {
        let Phase { api, requests, write } = *phase;
        let ConditionsWrite { machine, version, conditions, remediating, .. } = write;
        for attempt in 0..=CONFLICT_RETRIES {
            let conditions = recomputed(conditions, &current);
            let patch = machine_status_patch(&current, version, &conditions);
            let written: Result<WireObject, _> = crate::fenced::patch(
                &self.client,
                requests,
                &machine.name,
                Some("status"),
                &patch_params(),
                &Patch::Merge(&patch),
            )
            .await;
            match written {
                Ok(written) => {
                    self.metrics.writes("machine_conditions");
                    return Ok(Some(written.raw));
                }
                // A remediating write that conflicts is decided (and confirmed) again:
                // the Machine changed since it was read.
                Err(e) if is_code(&e, 409) && attempt < CONFLICT_RETRIES && !remediating => {
                    match read_machine(api, machine).await? {
                        FirstWrite::Retry(fresh) => current = fresh,
                        FirstWrite::Done(gone) => return Ok(gone.map(|w| *w)),
                    }
                }
                Err(e) if is_code(&e, 404) => return Ok(None),
                Err(e) => return Err(api_error(format!("conditions of {machine}"))(e)),
            }
        }
        Ok(None)
    }
}

/// Whether an object a DELETE answered with still exists: finalizers hold it until their owners
/// remove them (an object deleted at once comes back without any).
fn still_finalizing(o: &DynamicObject) -> bool {
    o.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty())
}

/// The preconditions of a delete decided on the object `seen`.
pub(crate) fn preconditions(seen: &Seen) -> Option<Preconditions> {
    (seen.uid.is_some() || seen.resource_version.is_some())
        .then(|| Preconditions { uid: seen.uid.clone(), resource_version: seen.resource_version.clone() })
}

/// Reads a Machine for a merge patch; [`FirstWrite::Done`] when it is gone.
async fn read_machine(api: &Api<DynamicObject>, machine: &ObjectRef) -> Result<FirstWrite, WriteError> {
    match api.get(&machine.name).await {
        Ok(fresh) => Ok(FirstWrite::Retry(serde_json::to_value(&fresh).unwrap_or(Value::Null))),
        Err(e) if is_code(&e, 404) => Ok(FirstWrite::Done(None)),
        Err(e) => Err(api_error(format!("get {machine}"))(e)),
    }
}

/// The conflict a JSON patch's failed `resourceVersion` test stands for: the Machine is no
/// longer at the version `tested` (counted and handled as the 409 a merge patch would get).
fn stale_version(machine: &ObjectRef, tested: Option<String>) -> kube::Error {
    let message = format!(
        "Operation cannot be fulfilled on {machine}: the object has been modified since resourceVersion {}",
        tested.unwrap_or_default()
    );
    kube::Error::Api(kube::core::Status::failure(&message, "Conflict").with_code(409).boxed())
}

/// The desired conditions recomputed on a fresh Machine: a condition whose status did not
/// change keeps its transition time.
fn recomputed(conditions: &[(DesiredCondition, Timestamp)], current: &Value) -> Vec<(DesiredCondition, Timestamp)> {
    let view = MachineView::read(current);
    conditions
        .iter()
        .map(|(d, at)| {
            let cur = view.as_ref().and_then(|v| vigil_api::conditions::find(&v.conditions, &d.type_));
            (d.clone(), if cur.is_some() { d.transition_time(cur, *at) } else { *at })
        })
        .collect()
}
