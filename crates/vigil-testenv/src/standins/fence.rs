//! A stand-in for fence agents remediation (`FenceAgentsRemediation`,
//! `fence-agents-remediation.medik8s.io/v1alpha1`, a stand-in CRD), with a fence agent a test
//! can tell to succeed, fail or time out ([`Agent`]).
//!
//! What it does with an object, from what fence agents remediation is seen to do:
//! - it takes the object with its finalizer `fence-agents-remediation.medik8s.io/far-finalizer` and
//!   reports `Processing=True`, `FenceAgentActionSucceeded=Unknown`, `Succeeded=Unknown` (reason
//!   `RemediationStarted`);
//! - it runs the agent every [`FenceSettings::attempt_every`]: when it succeeds, the Node gets the
//!   `node.kubernetes.io/out-of-service:NoExecute` taint and the object
//!   `FenceAgentActionSucceeded=True` (`FenceAgentSucceeded`), `Processing=False` and
//!   `Succeeded=True` (`RemediationFinishedSuccessfully`); when it fails (or times out) more than
//!   [`FenceSettings::retries`] times: `FenceAgentActionSucceeded=False`, `Processing=False` and
//!   `Succeeded=False`, all with reason `FenceAgentFailed` (or `FenceAgentTimedOut`);
//! - given up by the health check (`nhc-timed-out`) first: `Processing=False`, reason
//!   `RemediationInterruptedByNHC`, and the agent is not run again;
//! - no Node of that name: `Processing=False` / `Succeeded=False`, reason
//!   `RemediationFinishedNodeNotFound` (the stand-in's reading: nothing was fenced);
//! - deleted: the out-of-service taint comes off the Node, then the finalizer.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

use super::{Base, Failed, OUT_OF_SERVICE_TAINT, StandIn};

/// The finalizer fence agents remediation keeps on its objects until it has finished.
pub const FINALIZER: &str = "fence-agents-remediation.medik8s.io/far-finalizer";
/// Its API version.
pub const API_VERSION: &str = "fence-agents-remediation.medik8s.io/v1alpha1";

/// What the fence agent does when run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// Fences the Node.
    Succeeds,
    /// Fails (the BMC refuses).
    Fails,
    /// Gets no answer in time.
    TimesOut,
}

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct FenceSettings {
    /// What the agent does.
    pub agent: Agent,
    /// Time between two runs of the agent (the first runs this long after the object is taken).
    pub attempt_every: Duration,
    /// How many failed runs are tried again before the remediation fails.
    pub retries: u32,
    /// How often objects are looked at again.
    pub tick: Duration,
}

impl Default for FenceSettings {
    fn default() -> Self {
        FenceSettings {
            agent: Agent::Succeeds,
            attempt_every: Duration::from_millis(300),
            retries: 2,
            tick: Duration::from_millis(100),
        }
    }
}

/// The running stand-in: its agent can be changed, and it says when it last failed an object.
pub struct Fence {
    /// Stops the stand-in when dropped.
    pub stand_in: StandIn,
    state: Arc<FenceState>,
}

impl Fence {
    /// Tells the agent what to do from now on.
    pub fn set_agent(&self, agent: Agent) {
        *self.state.agent.lock().unwrap_or_else(PoisonError::into_inner) = agent;
    }

    /// When the stand-in last wrote `Succeeded=False` on an object (`namespace/name`), if it did.
    pub fn failed_at(&self, object: &str) -> Option<Instant> {
        let failures = self.state.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.iter().rev().find(|(o, _)| o == object).map(|(_, at)| *at)
    }
}

struct FenceState {
    base: Base,
    settings: FenceSettings,
    agent: Mutex<Agent>,
    failures: Mutex<Vec<(String, Instant)>>,
}

/// Starts the stand-in on every `FenceAgentsRemediation` of the API server.
pub fn start(client: &Client, settings: FenceSettings) -> Fence {
    let gvk = GroupVersionKind::gvk("fence-agents-remediation.medik8s.io", "v1alpha1", "FenceAgentsRemediation");
    let tick = settings.tick;
    let state = Arc::new(FenceState {
        base: Base { client: client.clone(), tick },
        agent: Mutex::new(settings.agent),
        settings,
        failures: Mutex::new(Vec::new()),
    });
    let stand_in = super::spawn(client, &gvk, tick, state.clone(), reconcile);
    Fence { stand_in, state }
}

async fn reconcile(o: Arc<DynamicObject>, s: Arc<FenceState>) -> Result<Action, Failed> {
    let client = &s.base.client;
    let again = Action::requeue(s.base.tick);
    let node = super::node_of(&o);
    if o.metadata.deletion_timestamp.is_some() {
        if o.finalizers().iter().any(|f| f == FINALIZER) {
            super::set_taint(client, &node, (OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"), false).await?;
            super::set_finalizer(client, &o, FINALIZER, false).await?;
        }
        return Ok(Action::await_change());
    }
    if super::condition_status(&o, "Succeeded").is_some_and(|st| st != "Unknown") {
        return Ok(again);
    }
    if super::timed_out_by_nhc(&o) {
        if super::condition_status(&o, "Processing").as_deref() != Some("False") {
            let c = super::set_conditions(&o, &[("Processing", "False", "RemediationInterruptedByNHC")]);
            super::patch_status(client, &o, json!({"conditions": c})).await?;
        }
        return Ok(again);
    }
    if super::node(client, &node).await?.is_none() {
        let gone = "RemediationFinishedNodeNotFound";
        let c = super::set_conditions(&o, &[("Processing", "False", gone), ("Succeeded", "False", gone)]);
        super::patch_status(client, &o, json!({"conditions": c})).await?;
        return Ok(again);
    }
    if !o.finalizers().iter().any(|f| f == FINALIZER) {
        super::set_finalizer(client, &o, FINALIZER, true).await?;
        let started = "RemediationStarted";
        let c = super::set_conditions(
            &o,
            &[
                ("Processing", "True", started),
                ("FenceAgentActionSucceeded", "Unknown", started),
                ("Succeeded", "Unknown", started),
            ],
        );
        super::patch_status(
            client,
            &o,
            json!({"conditions": c, "attempts": 0, "lastAttempt": Timestamp::now().to_string()}),
        )
        .await?;
        return Ok(again);
    }
    run_agent(&o, &s, &node).await?;
    Ok(again)
}

/// Runs the agent when its next run is due, and reports what it did.
async fn run_agent(o: &DynamicObject, s: &FenceState, node: &str) -> Result<(), Failed> {
    let client = &s.base.client;
    let last = o
        .data
        .pointer("/status/lastAttempt")
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| super::created(o));
    if Timestamp::now() < super::plus(last, s.settings.attempt_every) {
        return Ok(());
    }
    let agent = *s.agent.lock().unwrap_or_else(PoisonError::into_inner);
    let reason = match agent {
        Agent::Succeeds => {
            super::set_taint(client, node, (OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"), true).await?;
            let done = "RemediationFinishedSuccessfully";
            let c = super::set_conditions(
                o,
                &[
                    ("FenceAgentActionSucceeded", "True", "FenceAgentSucceeded"),
                    ("Processing", "False", done),
                    ("Succeeded", "True", done),
                ],
            );
            return super::patch_status(client, o, json!({"conditions": c})).await;
        }
        Agent::Fails => "FenceAgentFailed",
        Agent::TimesOut => "FenceAgentTimedOut",
    };
    let attempts = o.data.pointer("/status/attempts").and_then(Value::as_u64).unwrap_or(0) + 1;
    if attempts <= u64::from(s.settings.retries) {
        let status = json!({"attempts": attempts, "lastAttempt": Timestamp::now().to_string()});
        return super::patch_status(client, o, status).await;
    }
    let c = super::set_conditions(
        o,
        &[
            ("FenceAgentActionSucceeded", "False", reason),
            ("Processing", "False", reason),
            ("Succeeded", "False", reason),
        ],
    );
    super::patch_status(client, o, json!({"conditions": c, "attempts": attempts})).await?;
    let key = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
    s.failures.lock().unwrap_or_else(PoisonError::into_inner).push((key, Instant::now()));
    Ok(())
}
