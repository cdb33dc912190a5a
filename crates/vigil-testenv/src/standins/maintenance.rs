//! A stand-in for the node maintenance operator (`NodeMaintenance`,
//! `nodemaintenance.medik8s.io/v1beta1`, cluster-scoped, a stand-in CRD).
//!
//! What it does with a NodeMaintenance for `spec.nodeName`, from what the operator is seen to do:
//! - it takes the Node's medik8s Lease first: `node-<node>` in the lease namespace
//!   ([`MaintenanceSettings::lease_namespace`], `medik8s-leases` as shipped), holder
//!   `node-maintenance`, 3 600 s, owned by the Node, renewed while the maintenance lasts;
//! - it cannot take a Lease another holder has and has not let run out (a NodeHealthCheck
//!   remediating the Node): it then reports `status.phase: Running` with the holder in
//!   `status.lastError`, does not cordon, and tries again;
//! - with the Lease, it cordons the Node (`spec.unschedulable`, taint `medik8s.io/drain`) and
//!   reports `status.phase: Succeeded` (there is nothing to drain in a test);
//! - deleted: it uncordons the Node, releases the Lease and lets the object go (finalizer
//!   `foregroundDeleteNodeMaintenance`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

use super::{Base, Failed, StandIn};

/// The holder identity of the operator's node Leases.
pub const HOLDER: &str = "node-maintenance";
/// The finalizer the operator keeps on a NodeMaintenance until the Node is given back.
pub const FINALIZER: &str = "foregroundDeleteNodeMaintenance";
/// The taint it puts on a Node it drains.
pub const DRAIN_TAINT: &str = "medik8s.io/drain";
/// How long its Lease lasts (renewed while the maintenance lasts).
pub const LEASE_SECONDS: i32 = 3600;

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct MaintenanceSettings {
    /// Where the node Leases live.
    pub lease_namespace: String,
    /// How often objects are looked at again.
    pub tick: Duration,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        MaintenanceSettings { lease_namespace: "medik8s-leases".into(), tick: Duration::from_millis(200) }
    }
}

struct MaintenanceState {
    base: Base,
    settings: MaintenanceSettings,
}

/// Starts the stand-in on every `NodeMaintenance` of the API server.
pub fn start(client: &Client, settings: MaintenanceSettings) -> StandIn {
    let gvk = GroupVersionKind::gvk("nodemaintenance.medik8s.io", "v1beta1", "NodeMaintenance");
    let tick = settings.tick;
    let state = Arc::new(MaintenanceState { base: Base { client: client.clone(), tick }, settings });
    super::spawn(client, &gvk, tick, state, reconcile)
}

async fn reconcile(o: Arc<DynamicObject>, s: Arc<MaintenanceState>) -> Result<Action, Failed> {
    let client = &s.base.client;
    let node = o.data.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default().to_string();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &s.settings.lease_namespace);
    if o.metadata.deletion_timestamp.is_some() {
        if o.finalizers().iter().any(|f| f == FINALIZER) {
            cordon(client, &node, false).await?;
            release(&leases, &node).await?;
            super::set_finalizer(client, &o, FINALIZER, false).await?;
        }
        return Ok(Action::await_change());
    }
    super::set_finalizer(client, &o, FINALIZER, true).await?;
    let Some(n) = super::node(client, &node).await? else {
        let status = json!({"phase": "Failed", "lastError": format!("node {node} not found")});
        super::patch_status(client, &o, status).await?;
        return Ok(Action::requeue(s.base.tick));
    };
    if let Err(holder) = take(&leases, &n).await? {
        let status = json!({"phase": "Running", "lastError": format!("node lease is held by {holder}")});
        super::patch_status(client, &o, status).await?;
        return Ok(Action::requeue(s.base.tick));
    }
    cordon(client, &node, true).await?;
    if o.data.pointer("/status/phase").and_then(Value::as_str) != Some("Succeeded") {
        let status = json!({"phase": "Succeeded", "drainProgress": 100, "lastError": ""});
        super::patch_status(client, &o, status).await?;
    }
    Ok(Action::requeue(s.base.tick))
}

fn micro(t: Timestamp) -> String {
    format!("{}.000000Z", t.strftime("%Y-%m-%dT%H:%M:%S"))
}

/// Takes (or renews) the Node's Lease; `Err(holder)` when another holder has it unexpired.
async fn take(leases: &Api<Lease>, node: &Node) -> Result<Result<(), String>, Failed> {
    let name = format!("node-{}", node.name_any());
    let now = Timestamp::now();
    let current = leases.get_opt(&name).await?;
    let spec = current.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let until = renewed
        .and_then(|r| r.checked_add(SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into())).ok());
    let expired = until.is_none_or(|u| u < now);
    if current.is_some() && holder != HOLDER && !holder.is_empty() && !expired {
        return Ok(Err(holder));
    }
    if current.is_some() && holder == HOLDER && renewed.is_some_and(|r| r + SignedDuration::from_secs(30) > now) {
        return Ok(Ok(())); // held, renewed lately
    }
    let acquired = match holder == HOLDER {
        true => spec.acquire_time.as_ref().map_or_else(|| micro(now), |t| micro(t.0)),
        false => micro(now),
    };
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "resourceVersion": current.as_ref().and_then(|l| l.metadata.resource_version.clone()),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name_any(), "uid": node.uid()}]},
        "spec": {"holderIdentity": HOLDER, "leaseDurationSeconds": LEASE_SECONDS, "acquireTime": acquired, "renewTime": micro(now)}
    }))
    .map_err(|e| Failed(e.to_string()))?;
    match current {
        Some(_) => leases.replace(&name, &PostParams::default(), &lease).await?,
        None => leases.create(&PostParams::default(), &lease).await?,
    };
    Ok(Ok(()))
}

/// Deletes the Node's Lease when this operator holds it.
async fn release(leases: &Api<Lease>, node: &str) -> Result<(), Failed> {
    let name = format!("node-{node}");
    let Some(l) = leases.get_opt(&name).await? else { return Ok(()) };
    if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(HOLDER) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: l.metadata.uid.clone(),
            resource_version: l.metadata.resource_version,
        }),
        ..DeleteParams::default()
    };
    match leases.delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Cordons the Node (and taints it `medik8s.io/drain`), or gives it back.
async fn cordon(client: &Client, node: &str, on: bool) -> Result<(), Failed> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(n) = nodes.get_opt(node).await? else { return Ok(()) };
    if n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) != on {
        let patch = json!({"spec": {"unschedulable": on}});
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await?;
    }
    super::set_taint(client, node, (DRAIN_TAINT, "", "NoSchedule"), on).await
}
