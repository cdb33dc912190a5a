//! A stand-in for self node remediation, on its real `SelfNodeRemediation` CRD
//! (`self-node-remediation.medik8s.io/v1alpha1`, committed under `upstream-crds/medik8s`).
//!
//! What it does with an object, from what self node remediation is seen to do:
//! - it takes the object with its finalizer `self-node-remediation.medik8s.io/snr-finalizer`,
//!   taints the Node `remediation.medik8s.io/self-node-remediation:NoSchedule`, and reports
//!   `Processing=True` / `Succeeded=Unknown` (reason `RemediationStarted`), `status.phase`
//!   `Pre-Reboot-Completed` and `status.timeAssumedRebooted`;
//! - once the Node is assumed rebooted ([`RebootSettings::assumed_rebooted_after`] after the
//!   object was made: about a minute for the real one, a setting here so tests stay short) it
//!   fences: the `node.kubernetes.io/out-of-service:NoExecute` taint, phase `Fencing-Completed`,
//!   `Processing=False` / `Succeeded=True` (reason `RemediationFinishedSuccessfully`);
//! - given up by the health check (`nhc-timed-out`) before that: `Processing=False`, reason
//!   `RemediationTimeoutByNHC`, and nothing more;
//! - no Node of that name: `Processing=False` / `Succeeded=False`, reason
//!   `RemediationSkippedNodeNotFound`;
//! - not configured ([`RebootSettings::configured`] false, as without its configuration object):
//!   `Disabled=True`, reason `ConfigurationNotFound`, and nothing else;
//! - deleted: it keeps the object (finalizer) for [`RebootSettings::release_after_delete`] while it
//!   finishes, then takes both taints off the Node and lets the object go;
//! - a write that fails is reported in `status.lastError` and tried again.

use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt as _};
use serde_json::json;

use super::{Base, Failed, OUT_OF_SERVICE_TAINT, StandIn};

/// The finalizer self node remediation keeps on its objects until it has finished.
pub const FINALIZER: &str = "self-node-remediation.medik8s.io/snr-finalizer";
/// The taint it puts on a Node it remediates.
pub const NO_SCHEDULE_TAINT: &str = "remediation.medik8s.io/self-node-remediation";
/// Its API version.
pub const API_VERSION: &str = "self-node-remediation.medik8s.io/v1alpha1";

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct RebootSettings {
    /// From the object's creation to the Node assumed rebooted and `Succeeded=True` (about a
    /// minute for the real remediator).
    pub assumed_rebooted_after: Duration,
    /// How long a deleted object is kept (finalizer) while the remediator finishes.
    pub release_after_delete: Duration,
    /// Whether it has its configuration (else `Disabled=True`, `ConfigurationNotFound`).
    pub configured: bool,
    /// How often objects are looked at again.
    pub tick: Duration,
}

impl Default for RebootSettings {
    fn default() -> Self {
        RebootSettings {
            assumed_rebooted_after: Duration::from_secs(60),
            release_after_delete: Duration::ZERO,
            configured: true,
            tick: Duration::from_millis(200),
        }
    }
}

struct RebootState {
    base: Base,
    settings: RebootSettings,
}

/// Starts the stand-in on every `SelfNodeRemediation` of the API server.
pub fn start(client: &Client, settings: RebootSettings) -> StandIn {
    let gvk = GroupVersionKind::gvk("self-node-remediation.medik8s.io", "v1alpha1", "SelfNodeRemediation");
    let tick = settings.tick;
    let state = Arc::new(RebootState { base: Base { client: client.clone(), tick }, settings });
    super::spawn(client, &gvk, tick, state, reconcile)
}

async fn reconcile(o: Arc<DynamicObject>, s: Arc<RebootState>) -> Result<Action, Failed> {
    match step(&o, &s).await {
        Ok(a) => Ok(a),
        Err(e) => {
            // Best effort: the error is what is returned.
            let _ = super::patch_status(&s.base.client, &o, json!({"lastError": e.0})).await;
            Err(e)
        }
    }
}

/// One look at an object: what the remediator does next.
async fn step(o: &DynamicObject, s: &RebootState) -> Result<Action, Failed> {
    let client = &s.base.client;
    let again = Action::requeue(s.base.tick);
    let node = super::node_of(o);
    if o.metadata.deletion_timestamp.is_some() {
        return finish(o, s, &node).await;
    }
    if !s.settings.configured {
        let c = super::set_conditions(o, &[("Disabled", "True", "ConfigurationNotFound")]);
        super::patch_status(client, o, json!({"conditions": c})).await?;
        return Ok(again);
    }
    if super::condition_status(o, "Succeeded").is_some_and(|st| st != "Unknown") {
        return Ok(again); // finished: kept until the health check deletes it
    }
    if super::timed_out_by_nhc(o) {
        if super::condition_status(o, "Processing").as_deref() != Some("False") {
            let c = super::set_conditions(o, &[("Processing", "False", "RemediationTimeoutByNHC")]);
            super::patch_status(client, o, json!({"conditions": c})).await?;
        }
        return Ok(again);
    }
    if super::node(client, &node).await?.is_none() {
        let skipped = "RemediationSkippedNodeNotFound";
        let c = super::set_conditions(o, &[("Processing", "False", skipped), ("Succeeded", "False", skipped)]);
        super::patch_status(client, o, json!({"conditions": c})).await?;
        return Ok(again);
    }
    let rebooted = super::plus(super::created(o), s.settings.assumed_rebooted_after);
    if !o.finalizers().iter().any(|f| f == FINALIZER) {
        super::set_finalizer(client, o, FINALIZER, true).await?;
        super::set_taint(client, &node, (NO_SCHEDULE_TAINT, "", "NoSchedule"), true).await?;
        let started = "RemediationStarted";
        let c = super::set_conditions(o, &[("Processing", "True", started), ("Succeeded", "Unknown", started)]);
        let status =
            json!({"conditions": c, "phase": "Pre-Reboot-Completed", "timeAssumedRebooted": rebooted.to_string()});
        super::patch_status(client, o, status).await?;
        return Ok(again);
    }
    if super::now() < rebooted {
        return Ok(again);
    }
    super::set_taint(client, &node, (OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"), true).await?;
    let done = "RemediationFinishedSuccessfully";
    let c = super::set_conditions(o, &[("Processing", "False", done), ("Succeeded", "True", done)]);
    super::patch_status(client, o, json!({"conditions": c, "phase": "Fencing-Completed", "lastError": ""})).await?;
    Ok(again)
}

/// A deleted object: kept while the remediator finishes, then the taints go and so does it.
async fn finish(o: &DynamicObject, s: &RebootState, node: &str) -> Result<Action, Failed> {
    let client = &s.base.client;
    if !o.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let since = o.metadata.deletion_timestamp.as_ref().map_or_else(super::now, |t| t.0);
    if super::now() < super::plus(since, s.settings.release_after_delete) {
        return Ok(Action::requeue(s.base.tick));
    }
    super::set_taint(client, node, (OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"), false).await?;
    super::set_taint(client, node, (NO_SCHEDULE_TAINT, "", "NoSchedule"), false).await?;
    super::set_finalizer(client, o, FINALIZER, false).await?;
    Ok(Action::await_change())
}
