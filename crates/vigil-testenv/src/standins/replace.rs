//! A stand-in for machine deletion remediation (`MachineDeletionRemediation`,
//! `machine-deletion-remediation.medik8s.io/v1alpha1`, a stand-in CRD) with OpenShift Machine API
//! Machines (`machine.openshift.io/v1beta1`, the real CRD from `github.com/openshift/api`).
//!
//! What it does with an object, from what machine deletion remediation is seen to do:
//! - it finds its Node by the object's **name** only (so the health check must name the object
//!   after the Node), the Node's Machine by the Node's `machine.openshift.io/machine` annotation
//!   (`namespace/name`), and the Machine's controlling owner (its MachineSet);
//! - it cannot start without them: `Processing=False` / `Succeeded=False` with reason
//!   `RemediationCannotStartNodeNotFound`, `RemediationCannotStartMachineNotFound` or
//!   `RemediationCannotStartNoControllerOwner`;
//! - it deletes the Machine at once and reports `Processing=True` / `Succeeded=Unknown` (reason
//!   `MachineDeleted`) and `PermanentNodeDeletionExpected=True` (the replacement Machine brings a
//!   Node of another name; `False` with [`ReplaceSettings::node_name_kept`]; `Unknown` until the
//!   Machine is deleted); a delete the API server refuses gives `Succeeded=False`,
//!   `RemediationFailed`;
//! - `Succeeded=True` (reason `MachineDeleted`) only once a replacement appears: another Machine of
//!   the same controlling owner;
//! - given up by the health check (`nhc-timed-out`) first: `Processing=False`, reason
//!   `RemediationStoppedByNHC`;
//! - it keeps no finalizer.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

use super::{Base, Failed, StandIn};

/// Its API version.
pub const API_VERSION: &str = "machine-deletion-remediation.medik8s.io/v1alpha1";
/// The Node annotation naming its OpenShift Machine.
pub const MACHINE_ANNOTATION: &str = "machine.openshift.io/machine";

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct ReplaceSettings {
    /// The replacement's Node keeps the old Node's name (`PermanentNodeDeletionExpected=False`).
    pub node_name_kept: bool,
    /// How often objects are looked at again.
    pub tick: Duration,
}

impl Default for ReplaceSettings {
    fn default() -> Self {
        ReplaceSettings { node_name_kept: false, tick: Duration::from_millis(100) }
    }
}

struct ReplaceState {
    base: Base,
    settings: ReplaceSettings,
}

/// Starts the stand-in on every `MachineDeletionRemediation` of the API server.
pub fn start(client: &Client, settings: ReplaceSettings) -> StandIn {
    let gvk =
        GroupVersionKind::gvk("machine-deletion-remediation.medik8s.io", "v1alpha1", "MachineDeletionRemediation");
    let tick = settings.tick;
    let state = Arc::new(ReplaceState { base: Base { client: client.clone(), tick }, settings });
    super::spawn(client, &gvk, tick, state, reconcile)
}

fn machines(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("machine.openshift.io", "v1beta1", "Machine"));
    Api::namespaced_with(client.clone(), namespace, &ar)
}

/// The uid of a Machine's controlling owner.
fn controller_uid(m: &DynamicObject) -> Option<String> {
    m.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| o.uid.clone())
}

async fn reconcile(o: Arc<DynamicObject>, s: Arc<ReplaceState>) -> Result<Action, Failed> {
    let client = &s.base.client;
    let again = Action::requeue(s.base.tick);
    if o.metadata.deletion_timestamp.is_some()
        || super::condition_status(&o, "Succeeded").is_some_and(|st| st != "Unknown")
    {
        return Ok(again);
    }
    if super::timed_out_by_nhc(&o) {
        if super::condition_status(&o, "Processing").as_deref() != Some("False") {
            let c = super::set_conditions(&o, &[("Processing", "False", "RemediationStoppedByNHC")]);
            super::patch_status(client, &o, json!({"conditions": c})).await?;
        }
        return Ok(again);
    }
    match o.data.pointer("/status/machine").cloned() {
        Some(deleted) => await_replacement(&o, &s, &deleted).await?,
        None => delete_machine(&o, &s).await?,
    }
    Ok(again)
}

/// Reports that it cannot start, with `reason`.
async fn cannot_start(client: &Client, o: &DynamicObject, reason: &str) -> Result<(), Failed> {
    let c = super::set_conditions(
        o,
        &[
            ("Processing", "False", reason),
            ("Succeeded", "False", reason),
            ("PermanentNodeDeletionExpected", "Unknown", reason),
        ],
    );
    super::patch_status(client, o, json!({"conditions": c})).await
}

/// Finds the Node (by the object's name), its Machine and that Machine's owner, and deletes the
/// Machine.
async fn delete_machine(o: &DynamicObject, s: &ReplaceState) -> Result<(), Failed> {
    let client = &s.base.client;
    let Some(node) = super::node(client, &o.name_any()).await? else {
        return cannot_start(client, o, "RemediationCannotStartNodeNotFound").await;
    };
    let annotated = node.metadata.annotations.as_ref().and_then(|a| a.get(MACHINE_ANNOTATION)).cloned();
    let Some((ns, name)) = annotated.as_deref().and_then(|m| m.split_once('/')) else {
        return cannot_start(client, o, "RemediationCannotStartMachineNotFound").await;
    };
    let api = machines(client, ns);
    let Some(machine) = api.get_opt(name).await? else {
        return cannot_start(client, o, "RemediationCannotStartMachineNotFound").await;
    };
    let Some(owner) = controller_uid(&machine) else {
        return cannot_start(client, o, "RemediationCannotStartNoControllerOwner").await;
    };
    let record = json!({"namespace": ns, "name": name, "uid": machine.uid(), "ownerUid": owner});
    // Recorded first, so that a retry never deletes the replacement.
    super::patch_status(client, o, json!({"machine": record})).await?;
    if let Err(e) = api.delete(name, &DeleteParams::default()).await
        && !matches!(&e, kube::Error::Api(s) if s.code == 404)
    {
        let failed = "RemediationFailed";
        let c = super::set_conditions(o, &[("Processing", "False", failed), ("Succeeded", "False", failed)]);
        return super::patch_status(client, o, json!({"conditions": c, "lastError": e.to_string()})).await;
    }
    let permanent = if s.settings.node_name_kept { "False" } else { "True" };
    let deleted = "MachineDeleted";
    let c = super::set_conditions(
        o,
        &[
            ("Processing", "True", deleted),
            ("Succeeded", "Unknown", deleted),
            ("PermanentNodeDeletionExpected", permanent, deleted),
        ],
    );
    super::patch_status(client, o, json!({"conditions": c})).await
}

/// `Succeeded=True` once another Machine of the deleted one's owner exists.
async fn await_replacement(o: &DynamicObject, s: &ReplaceState, deleted: &Value) -> Result<(), Failed> {
    let client = &s.base.client;
    let ns = deleted["namespace"].as_str().unwrap_or_default();
    let list = machines(client, ns).list(&Default::default()).await?;
    let replaced = list.items.iter().any(|m| {
        controller_uid(m).as_deref() == deleted["ownerUid"].as_str()
            && m.metadata.uid.as_deref() != deleted["uid"].as_str()
            && m.metadata.deletion_timestamp.is_none()
    });
    if !replaced {
        return Ok(());
    }
    let deleted = "MachineDeleted";
    let c = super::set_conditions(o, &[("Processing", "False", deleted), ("Succeeded", "True", deleted)]);
    super::patch_status(client, o, json!({"conditions": c})).await
}
