//! Stand-in remediators and a stand-in node maintenance operator, each a small kube-rs
//! controller (a tokio task) on the test's real API server, so that Vigil's end-to-end tests see
//! what medik8s' remediators do to the objects a health check makes. Their sources are not served
//! by the module registries this project can reach, so they are written from the facts their
//! users can observe (conditions, reasons, finalizers, taints, timings), not from their code:
//!
//! - [`reboot`]: like self node remediation (`SelfNodeRemediation`, the real CRD);
//! - [`fence`]: like fence agents remediation (`FenceAgentsRemediation`), with an agent that can
//!   be told to fail or to time out;
//! - [`replace`]: like machine deletion remediation (`MachineDeletionRemediation`) with OpenShift
//!   Machine API Machines (the real CRD);
//! - [`maintenance`]: like the node maintenance operator (`NodeMaintenance`): the node Lease,
//!   then the cordon.
//!
//! Each stops when its [`StandIn`] is dropped. Their timings are settings, so tests stay short:
//! the real self node remediation needs about a minute from creation to `Succeeded=True`.

pub mod fence;
pub mod maintenance;
pub mod reboot;
pub mod replace;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

/// Annotation naming the Node a remediation object is for (else its name is the Node's).
pub const NODE_NAME_ANNOTATION: &str = "remediation.medik8s.io/node-name";
/// Annotation the health check puts on an object it gave up on.
pub const NHC_TIMED_OUT_ANNOTATION: &str = "remediation.medik8s.io/nhc-timed-out";
/// Taint of a Node whose workloads may be deleted at once (it is fenced, powered off).
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// Field manager of the stand-ins' writes.
const MANAGER: &str = "vigil-standin";

/// A running stand-in: stops when dropped.
pub struct StandIn {
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Stops the stand-in (its controller task).
    pub fn stop(self) {}
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a reconcile failed (it is retried at the next tick).
#[derive(Debug)]
pub struct Failed(pub String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

impl From<kube::Error> for Failed {
    fn from(e: kube::Error) -> Self {
        Failed(e.to_string())
    }
}

/// What every stand-in's reconcile is given: the client, and how often to look again.
pub struct Base {
    /// The admin client of the test's API server.
    pub client: Client,
    /// How soon an object is reconciled again (timed steps are checked this often).
    pub tick: Duration,
}

/// Runs a kube-rs controller over every object of `gvk`, calling `reconcile` with the stand-in's
/// state `ctx`; an error is retried after `tick`.
fn spawn<C, F, Fut>(client: &Client, gvk: &GroupVersionKind, tick: Duration, ctx: Arc<C>, reconcile: F) -> StandIn
where
    C: Send + Sync + 'static,
    F: FnMut(Arc<DynamicObject>, Arc<C>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, Failed>> + Send + 'static,
{
    let ar = ApiResource::from_gvk(gvk);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let controller = Controller::new_with(api, watcher::Config::default(), ar)
        .run(reconcile, move |_, _, _| Action::requeue(tick), ctx)
        .for_each(|_| async {});
    StandIn { task: tokio::spawn(controller) }
}

/// An API for objects like `o` (its kind, in its namespace).
fn api_of(client: &Client, o: &DynamicObject) -> Result<Api<DynamicObject>, Failed> {
    let types = o.types.as_ref().ok_or_else(|| Failed(format!("{} has no apiVersion/kind", o.name_any())))?;
    let (group, version) = types.api_version.rsplit_once('/').unwrap_or(("", &types.api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    Ok(match o.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    })
}

/// The Node a remediation object is for: its node-name annotation, else its name.
pub fn node_of(o: &DynamicObject) -> String {
    o.annotations().get(NODE_NAME_ANNOTATION).cloned().unwrap_or_else(|| o.name_any())
}

/// The current time, as the API server writes it (whole seconds).
fn now() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now())
}

/// The object's `status.conditions`.
fn conditions(o: &DynamicObject) -> Vec<Value> {
    o.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The status of condition `type_` on `o`, if any.
pub fn condition_status(o: &DynamicObject, type_: &str) -> Option<String> {
    conditions(o).iter().find(|c| c["type"] == type_).and_then(|c| c["status"].as_str().map(str::to_string))
}

/// `list` with condition `type_` set to `status`/`reason`, keeping its `lastTransitionTime`
/// while its status does not change.
fn with_condition(mut list: Vec<Value>, type_: &str, status: &str, reason: &str, message: &str) -> Vec<Value> {
    let since = list
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
        .unwrap_or_else(|| now().to_string());
    list.retain(|c| c["type"] != type_);
    list.push(
        json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}),
    );
    list
}

/// Conditions as `(type, status, reason)`, applied in order to `o`'s.
fn set_conditions(o: &DynamicObject, set: &[(&str, &str, &str)]) -> Vec<Value> {
    set.iter().fold(conditions(o), |list, (t, s, r)| with_condition(list, t, s, r, &format!("{t}: {r}")))
}

/// Merge-patches `o`'s status with `status`.
async fn patch_status(client: &Client, o: &DynamicObject, status: Value) -> Result<(), Failed> {
    let api = api_of(client, o)?;
    api.patch_status(&o.name_any(), &PatchParams::apply(MANAGER), &Patch::Merge(json!({"status": status}))).await?;
    Ok(())
}

/// Adds or removes `finalizer` on `o` (against the version read).
async fn set_finalizer(client: &Client, o: &DynamicObject, finalizer: &str, present: bool) -> Result<(), Failed> {
    let mut list: Vec<String> = o.finalizers().to_vec();
    let has = list.iter().any(|f| f == finalizer);
    if has == present {
        return Ok(());
    }
    match present {
        true => list.push(finalizer.to_string()),
        false => list.retain(|f| f != finalizer),
    }
    let patch = json!({"metadata": {"finalizers": list, "resourceVersion": o.resource_version()}});
    api_of(client, o)?.patch(&o.name_any(), &PatchParams::apply(MANAGER), &Patch::Merge(patch)).await?;
    Ok(())
}

/// Whether the health check gave `o` up (`nhc-timed-out`).
fn timed_out_by_nhc(o: &DynamicObject) -> bool {
    o.annotations().contains_key(NHC_TIMED_OUT_ANNOTATION)
}

/// Reads a Node; `None` when it does not exist.
async fn node(client: &Client, name: &str) -> Result<Option<k8s_openapi::api::core::v1::Node>, Failed> {
    Ok(Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()).get_opt(name).await?)
}

/// Puts taint `key` (`effect`, `value`) on Node `name`, or takes it off; against the version
/// read. Nothing when the Node is gone.
async fn set_taint(
    client: &Client,
    name: &str,
    (key, value, effect): (&str, &str, &str),
    present: bool,
) -> Result<(), Failed> {
    let Some(n) = node(client, name).await? else { return Ok(()) };
    let mut taints: Vec<Value> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().filter_map(|t| serde_json::to_value(t).ok()).collect())
        .unwrap_or_default();
    let has = taints.iter().any(|t| t["key"] == key && t["effect"] == effect);
    if has == present {
        return Ok(());
    }
    match present {
        true => taints.push(json!({"key": key, "value": value, "effect": effect, "timeAdded": now().to_string()})),
        false => taints.retain(|t| !(t["key"] == key && t["effect"] == effect)),
    }
    let patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}});
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// The keys of Node `name`'s taints (none when it is gone).
pub async fn taints(client: &Client, name: &str) -> Result<Vec<String>, Failed> {
    let n = node(client, name).await?;
    Ok(n.and_then(|n| n.spec).and_then(|s| s.taints).unwrap_or_default().into_iter().map(|t| t.key).collect())
}

/// When `o` was created (now when it does not say).
fn created(o: &DynamicObject) -> Timestamp {
    o.metadata.creation_timestamp.as_ref().map_or_else(now, |t| t.0)
}

/// `t + d`.
fn plus(t: Timestamp, d: Duration) -> Timestamp {
    let d = k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or_default();
    t.checked_add(d).unwrap_or(t)
}
