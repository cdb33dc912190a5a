//! `vigil run --serve-medik8s`: medik8s' own NodeHealthChecks (`remediation.medik8s.io/v1alpha1`)
//! decided in place, so a fleet can swap the NodeHealthCheck operator for Vigil without
//! converting a single check first.
//!
//! - **Reading.** Each object is read with the code `vigil convert` and `vigil validate` use
//!   ([`manifest::health_check_from_value`], [`validate::medik8s_node_health_check`]); the
//!   engine decides it like any NodeHealthCheck, and an invalid one is refused in its status.
//! - **Status** is written in medik8s' schema ([`status_to_upstream`]): the fields both schemas
//!   have, medik8s' condition reasons, and the storm cool-down as medik8s keeps it (condition
//!   `StormCooldownActive`, whose transition time is when the cool-down started). That is all the
//!   durable state the engine reads back ([`status_from_upstream`]); Vigil's own status fields
//!   are pruned by the API server and are not needed (their features cannot be asked for in
//!   medik8s' spec).
//! - **Events** carry the operator's reasons where it has one ([`event`]).
//! - **Names** are one namespace across both groups: a `vigil.dev` NodeHealthCheck of the same
//!   name wins and the medik8s one is refused (the engine knows a check by its name).
//! - **The operator** must not run at the same time. Its leader-election Lease
//!   ([`OPERATOR_LEASE`], in whatever namespace it runs) tells: [`refuse_to_start`] refuses to
//!   start while it is held and renewed, and a watch of it stops every medik8s check while it is
//!   ([`Stop`]), saying so once in each check's status and an event.

pub use vigil_index::upstream::{
    Entry, GROUP, KIND, SOURCE, Stop, Upstream, VERSION, read, status_from_upstream, status_to_upstream,
};

/// The API resource of medik8s' NodeHealthCheck.
pub fn api_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(GROUP, VERSION, KIND),
        "nodehealthchecks",
    )
}

use crate::context::Context;
use crate::sources;
use crate::watch::{Op, feed};
use crate::writer::bounded;
use crate::writes::{WriteError, at_version};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};
use vigil_api::conditions::get_condition;
use vigil_api::node_health_check::{NodeHealthCheck, NodeHealthCheckStatus};
use vigil_api::reason::Reason;
use vigil_api::well_known::DISABLED;
use vigil_engine::target::CheckRef;
use vigil_engine::{Notice, NoticeKind, ObjectRef};
use vigil_index::gather::{CheckStatus, Job, merge_diff};
use vigil_index::index::{Index, Source};

/// The NodeHealthCheck operator's leader-election Lease (`LeaderElectionID` in its
/// `cmd/main.go`, v0.12.0); it lives in the namespace the operator runs in.
pub const OPERATOR_LEASE: &str = "e1f13584.medik8s.io";
/// How far the operator's clock may be behind Vigil's before a renewed Lease looks expired by
/// the wall clock alone (a Lease seen renewed while watched counts whatever the clocks say).
pub const CLOCK_SKEW: Duration = Duration::from_secs(10);
/// The operator's lease duration when the Lease does not say (controller-runtime's default).
const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long [`refuse_to_start`] watches a held Lease that looks expired for a renewal: the
/// operator renews every 2 s (controller-runtime's retry period).
pub const RENEWAL_WATCH: Duration = Duration::from_secs(5);
/// The name under which the watch of the operator's Lease is registered.
pub const LEASE_SOURCE: &str = "NodeHealthCheck operator Lease";
/// How often refusals not yet told are looked for again (a failed status write is retried).
const TELL_PERIOD: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------------------------------
// The operator's Lease
// ------------------------------------------------------------------------------------------

/// What one of the operator's leader-election Leases says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorLease {
    /// Its namespace (where the operator runs).
    pub namespace: String,
    /// `holderIdentity` (empty: released).
    pub holder: String,
    /// `renewTime`, else `acquireTime`.
    pub renewed: Option<Timestamp>,
    /// `leaseDurationSeconds` (15 s when unset).
    pub duration: Duration,
}

impl OperatorLease {
    /// Reads a Lease.
    pub fn read(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        OperatorLease {
            namespace: lease.metadata.namespace.clone().unwrap_or_default(),
            holder: spec.holder_identity.unwrap_or_default(),
            renewed: spec.renew_time.or(spec.acquire_time).map(|t| t.0),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(DEFAULT_LEASE_DURATION, Duration::from_secs),
        }
    }

    /// Whether it says the operator runs: held, and renewed within its duration plus
    /// [`CLOCK_SKEW`] by the wall clock at `now`, or seen renewed `renewal_seen` ago (within the
    /// same time) while watched, whatever the clocks say.
    pub fn running(&self, now: Timestamp, renewal_seen: Option<Duration>) -> bool {
        if self.holder.is_empty() {
            return false;
        }
        let window = self.duration + CLOCK_SKEW;
        let by_wall = self.renewed.is_some_and(|t| now.duration_since(t).as_secs_f64() < window.as_secs_f64());
        by_wall || renewal_seen.is_some_and(|ago| ago < window)
    }

    /// What it says, for a person.
    pub fn describe(&self) -> String {
        let renewed = self.renewed.map_or_else(|| "never renewed".to_string(), |t| format!("last renewed at {t}"));
        format!(
            "Lease {}/{OPERATOR_LEASE} held by {:?}, {renewed}, duration {}s",
            self.namespace,
            self.holder,
            self.duration.as_secs()
        )
    }
}

/// The operator's Leases in every namespace (one request; `list` may be limited to the name).
async fn operator_leases(client: &Client) -> Result<Vec<OperatorLease>, String> {
    let api: Api<Lease> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("metadata.name={OPERATOR_LEASE}"));
    match api.list(&params).await {
        Ok(list) => Ok(list.items.iter().map(OperatorLease::read).collect()),
        Err(e) => Err(format!("cannot list the NodeHealthCheck operator's Lease {OPERATOR_LEASE}: {e}")),
    }
}

/// Refuses to start `--serve-medik8s` when medik8s' NodeHealthCheck is not served, or while the
/// NodeHealthCheck operator runs: its Lease held and renewed within its duration, or, when it
/// looks expired by the wall clock (the operator's clock may be behind), renewed within
/// [`RENEWAL_WATCH`]. The error names what was found and what to do.
pub async fn refuse_to_start(client: &Client) -> Result<(), String> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    if let Err(e) = kube::discovery::pinned_kind(client, &gvk).await {
        return Err(format!(
            "--serve-medik8s: {KIND}.{GROUP}/{VERSION} is not served by the API server ({e}); install medik8s' \
             NodeHealthCheck CRD or run without --serve-medik8s"
        ));
    }
    let running = |lease: &OperatorLease| {
        format!(
            "--serve-medik8s: the NodeHealthCheck operator is running ({}); two controllers would remediate the \
             same Nodes. Scale its Deployment to 0 and start again once its Lease expired \
             (docs/MIGRATING-FROM-MEDIK8S.md), or run without --serve-medik8s",
            lease.describe()
        )
    };
    let first = operator_leases(client).await.map_err(|e| format!("--serve-medik8s: {e}"))?;
    if let Some(lease) = first.iter().find(|l| l.running(Timestamp::now(), None)) {
        return Err(running(lease));
    }
    if first.iter().all(|l| l.holder.is_empty()) {
        return Ok(());
    }
    tokio::time::sleep(RENEWAL_WATCH).await;
    let second = operator_leases(client).await.map_err(|e| format!("--serve-medik8s: {e}"))?;
    let renewed = second.iter().find(|now| {
        !now.holder.is_empty()
            && first.iter().any(|then| then.namespace == now.namespace && then.renewed != now.renewed)
    });
    match renewed {
        Some(lease) => Err(running(lease)),
        None => Ok(()),
    }
}

/// The operator's Leases as watched, each with when it was last seen renewed.
#[derive(Default)]
struct Watched {
    leases: BTreeMap<String, (OperatorLease, Option<Instant>)>,
    synced: bool,
    failed: Option<String>,
}

impl Watched {
    fn apply(&mut self, lease: &Lease) {
        let new = OperatorLease::read(lease);
        let seen = match self.leases.get(&new.namespace) {
            Some((old, seen)) if old.renewed == new.renewed => *seen,
            Some(_) => Some(Instant::now()),
            None => None,
        };
        self.leases.insert(new.namespace.clone(), (new, seen));
    }

    /// Why medik8s checks must not be decided now, if so.
    fn stop(&self, now: Timestamp) -> Option<Stop> {
        if let Some(why) = &self.failed {
            return Some(Stop::Unsure(format!(
                "cannot tell whether the NodeHealthCheck operator runs: the watch of its Lease {OPERATOR_LEASE} \
                 failed ({why})"
            )));
        }
        if !self.synced {
            return Some(Stop::Starting);
        }
        self.leases
            .values()
            .find(|(l, seen)| l.running(now, seen.map(|s| s.elapsed())))
            .map(|(l, _)| Stop::Operator(l.describe()))
    }
}

/// Watches the operator's Lease in every namespace and stops (or resumes) every medik8s check
/// as it says; looked at again every second, since a Lease that expires sends no event.
async fn watch_operator(ctx: Arc<Context>, told: Arc<tokio::sync::Notify>) {
    let api: Api<Lease> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={OPERATOR_LEASE}"));
    let mut stream = std::pin::pin!(sources::relisting(api, config, ctx.epoch()));
    ctx.sources.register(LEASE_SOURCE, true);
    let mut watched = Watched::default();
    let mut buffer: Vec<Lease> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            item = stream.next() => match item {
                None => break,
                Some(Ok(watcher::Event::Init)) => buffer.clear(),
                Some(Ok(watcher::Event::InitApply(l))) => buffer.push(l),
                Some(Ok(watcher::Event::InitDone)) => {
                    let old = std::mem::take(&mut watched.leases);
                    for l in buffer.drain(..) {
                        watched.apply(&l);
                        let ns = l.metadata.namespace.clone().unwrap_or_default();
                        if let (Some(entry), Some((before, seen))) = (watched.leases.get_mut(&ns), old.get(&ns)) {
                            entry.1 = if before.renewed == entry.0.renewed { *seen } else { Some(Instant::now()) };
                        }
                    }
                    watched.synced = true;
                    watched.failed = None;
                    ctx.sources.synced(LEASE_SOURCE);
                }
                Some(Ok(watcher::Event::Apply(l))) => watched.apply(&l),
                Some(Ok(watcher::Event::Delete(l))) => {
                    watched.leases.remove(&l.metadata.namespace.clone().unwrap_or_default());
                }
                Some(Err(e)) => {
                    ctx.sources.failed(LEASE_SOURCE, &e);
                    watched.failed = Some(e);
                }
            },
            _ = tick.tick() => {}
        }
        set_stop(&ctx, watched.stop(ctx.clock.now()), &told);
    }
    ctx.sources.remove(LEASE_SOURCE);
}

/// Records why medik8s checks are not decided (`None`: they are) when that changed in kind, and
/// puts them into or takes them out of the decisions.
fn set_stop(ctx: &Arc<Context>, stop: Option<Stop>, told: &tokio::sync::Notify) {
    let Some(dirty) = ctx.write_index().stop_medik8s(stop.clone()) else { return };
    match &stop {
        Some(Stop::Operator(what)) => {
            warn!(lease = %what, "the NodeHealthCheck operator runs: medik8s NodeHealthChecks are not decided")
        }
        Some(Stop::Unsure(why)) => warn!(%why, "medik8s NodeHealthChecks are not decided"),
        Some(Stop::Starting) => {}
        None => info!("the NodeHealthCheck operator does not run: medik8s NodeHealthChecks are decided"),
    }
    ctx.scheduler.mark(dirty);
    told.notify_one();
}

// ------------------------------------------------------------------------------------------
// The controller: watches, refusals, status writes and events
// ------------------------------------------------------------------------------------------

/// Starts serving medik8s' NodeHealthChecks: their watch, the watch of the operator's Lease,
/// and the task that tells refused checks why.
pub fn start(ctx: &Arc<Context>) {
    ctx.write_index().serve_medik8s();
    let told = Arc::new(tokio::sync::Notify::new());
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &api_resource());
    let stream = sources::relisting(api, watcher::Config::default(), ctx.epoch());
    let (on_update, on_state) = (told.clone(), told.clone());
    tokio::spawn(feed(
        ctx.clone(),
        SOURCE.into(),
        true,
        stream,
        |o: DynamicObject| read(&serde_json::to_value(o).unwrap_or(Value::Null)),
        move |idx, op| {
            on_update.notify_one();
            match op {
                Op::Upsert(entry) => idx.put_medik8s(entry),
                Op::Remove(o) => idx.remove_medik8s(o.metadata.name.as_deref().unwrap_or("")),
                Op::Replace(list) => idx.replace_medik8s(list),
            }
        },
        move |idx| {
            on_state.notify_one();
            idx.state_mut(&Source::Medik8s)
        },
        Index::all_nhcs,
    ));
    tokio::spawn(watch_operator(ctx.clone(), told.clone()));
    tokio::spawn(tell_refusals(ctx.clone(), told));
}

/// Where a decision's status and events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To Vigil's own check.
    Vigil,
    /// To the medik8s check, in medik8s' terms.
    Medik8s,
    /// Nowhere: the medik8s check was decided but is no longer served (a `vigil.dev` check took
    /// its name, or the operator started, meanwhile); its status is not Vigil's to write now.
    Drop,
}

impl Context {
    /// Where the status and events of check `key` decided as the object with `uid` go: a
    /// decision made for a medik8s check (its uid) never writes to Vigil's check of that name.
    pub fn route(&self, key: &CheckRef, uid: Option<&str>) -> Route {
        let CheckRef::Node { name } = key else { return Route::Vigil };
        let idx = self.read_index();
        let Some(up) = idx.medik8s() else { return Route::Vigil };
        let medik8s = up
            .checks()
            .get(name)
            .is_some_and(|e| e.check.metadata.uid.is_some() && e.check.metadata.uid.as_deref() == uid);
        match (medik8s, up.is_served(name)) {
            (true, true) => Route::Medik8s,
            (true, false) => Route::Drop,
            (false, _) => Route::Vigil,
        }
    }
}

/// A refused medik8s check, as the teller needs it.
struct Refused {
    name: String,
    check: NodeHealthCheck,
    stored: Value,
    reason: Reason,
    message: String,
}

/// Tells each medik8s check that is not decided why, once (in its status and an event), when
/// woken and every [`TELL_PERIOD`] (a failed write is tried again). Told once and not again
/// while the reason stands: the operator, when it runs, writes the status itself.
async fn tell_refusals(ctx: Arc<Context>, wake: Arc<tokio::sync::Notify>) {
    let mut told: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(TELL_PERIOD) => {}
        }
        let refused: Vec<Refused> = {
            let idx = ctx.read_index();
            let Some(up) = idx.medik8s() else { continue };
            told.retain(|name, _| up.checks().contains_key(name) && !up.is_served(name));
            up.checks()
                .iter()
                .filter(|(name, _)| !up.is_served(name.as_str()))
                .filter_map(|(name, e)| {
                    let (reason, message) = up.refusal(name)?;
                    let key = (e.check.metadata.uid.clone(), message.clone());
                    (told.get(name) != Some(&key)).then(|| Refused {
                        name: name.clone(),
                        check: e.check.clone(),
                        stored: e.status.clone(),
                        reason,
                        message,
                    })
                })
                .collect()
        };
        for r in refused {
            let key = CheckRef::Node { name: r.name.clone() };
            // Unable to tell is not a change of the check: its phase and `Disabled` stay.
            let plan = if r.reason == Reason::WaitingForCaches {
                vigil_engine::node::wait(&r.check, r.reason, &r.message, ctx.clock.now())
            } else {
                vigil_engine::node::refuse(&r.check, r.reason, &r.message, ctx.clock.now())
            };
            let version = r.check.metadata.resource_version.as_deref();
            let write = patch_status(&ctx, &r.name, &plan.status, &r.stored, false, version);
            match bounded(ctx.right(&key), String::new, write).await {
                Ok(_) => {
                    warn!(check = %key, reason = %plan.status.reason.clone().unwrap_or_default(), "medik8s NodeHealthCheck not decided");
                    told.insert(r.name.clone(), (r.check.metadata.uid.clone(), r.message.clone()));
                    for notice in &plan.notices {
                        publish(&ctx, &r.name, r.check.metadata.uid.as_deref(), (notice, None), false).await;
                    }
                }
                Err(WriteError::NotLeader(_) | WriteError::RightEnding(_)) => {}
                Err(WriteError::Timeout(_)) => {
                    warn!(check = %key, "the status of a refused medik8s NodeHealthCheck not written in time")
                }
                Err(e) => {
                    warn!(check = %key, error = %e, "the status of a refused medik8s NodeHealthCheck not written")
                }
            }
        }
    }
}

/// Whether the served check `name` has a `stormCooldownDuration` (medik8s then reports storms).
fn storm_configured(ctx: &Context, name: &str) -> bool {
    matches!(ctx.read_index().nhc_policy(name), Some(Ok(p)) if p.storm_cooldown.is_positive())
}

/// Writes a served medik8s check's status from its plan, in medik8s' schema (a merge patch of
/// what differs from the stored status), and the `Enabled` / `Disabled` events the operator
/// emits when its `Disabled` condition changes for a template.
pub(crate) async fn write_status(ctx: &Arc<Context>, job: &Job) -> Result<(), WriteError> {
    let (CheckStatus::Node(status), CheckRef::Node { name }) = (&job.plan.status, &job.key) else { return Ok(()) };
    let stored = {
        let idx = ctx.read_index();
        idx.medik8s().and_then(|u| u.checks().get(name)).map(|e| e.status.clone())
    };
    let Some(stored) = stored else { return Ok(()) };
    let storm = storm_configured(ctx, name);
    if patch_status(ctx, name, status, &stored, storm, job.resource_version.as_deref()).await?
        && let Some(event) = disabled_change(&stored, status)
    {
        let (ctx, name, uid) = (ctx.clone(), name.clone(), job.uid.clone());
        tokio::spawn(async move { send(&ctx, &name, uid.as_deref(), event, None, "Reconcile").await });
    }
    Ok(())
}

/// Sends `status` as a merge patch against `stored` (medik8s' schema) when they differ, only
/// while the check is still at `resource_version` (the version decided on: a status written
/// since refuses it, and the check is read again and decided again); the answer goes into the
/// index at once. `Ok(true)` when a patch was sent and taken.
async fn patch_status(
    ctx: &Context,
    name: &str,
    status: &NodeHealthCheckStatus,
    stored: &Value,
    storm: bool,
    resource_version: Option<&str>,
) -> Result<bool, WriteError> {
    let new = status_to_upstream(status, stored, storm);
    let Some(diff) = merge_diff(stored, &new) else { return Ok(false) };
    let ar = api_resource();
    let patch = at_version(json!({ "status": diff }), resource_version);
    let put_answer = |answer: &DynamicObject| {
        let entry = read(&serde_json::to_value(answer).unwrap_or(Value::Null));
        ctx.write_index().put_medik8s(entry);
    };
    let what = || format!("status of {KIND}.{GROUP}/{name}");
    match ctx.writer.patch_status(&ar, "", name, &patch, what).await {
        Ok(Some(written)) => {
            put_answer(&written);
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => {
            if e.is_conflict()
                && let Some(Some(fresh)) = ctx.writer.read_again(&ar, "", name).await
            {
                put_answer(&fresh);
            }
            Err(e)
        }
    }
}

/// The operator's `Enabled` / `Disabled` event for a change of the `Disabled` condition between
/// `stored` and `new`: `Enabled` when it turns `False`; `Disabled` when a template turns it
/// `True` (a check refused outright has the engine's own notice, told as `Disabled`).
fn disabled_change(stored: &Value, new: &NodeHealthCheckStatus) -> Option<(EventType, &'static str, String)> {
    let before = status_from_upstream(stored).unwrap_or_default();
    let was = get_condition(&before.conditions, DISABLED);
    let now = get_condition(&new.conditions, DISABLED)?;
    if now.status == "False" && was.is_some_and(|c| c.status == "True") {
        return Some((EventType::Normal, "Enabled", now.message.clone()));
    }
    let template = [Reason::RemediationTemplateNotFound.as_str(), Reason::RemediationTemplateInvalid.as_str()];
    let newly = was.is_none_or(|c| c.status != "True" || c.reason != now.reason);
    (now.status == "True" && template.contains(&now.reason.as_str()) && newly).then(|| {
        (EventType::Warning, "Disabled", format!("Disabling NHC. Reason: {}, Message: {}", now.reason, now.message))
    })
}

/// The Event type and reason the NodeHealthCheck operator gives what `notice` tells
/// (internal/controller/utils/events.go and nodehealthcheck_controller.go, v0.12.0); Vigil's own
/// where the operator has none. `storm`: the check has a `stormCooldownDuration`.
pub fn event(notice: &Notice, storm: bool) -> (EventType, &'static str) {
    use EventType::{Normal, Warning};
    let key = CheckRef::Node { name: String::new() };
    let own = || {
        let kind = if notice.kind.is_warning() { Warning } else { Normal };
        (kind, notice.kind.event_reason(&key))
    };
    match notice.kind {
        NoticeKind::Unhealthy => (Normal, "DetectedUnhealthy"),
        NoticeKind::RemediationCreated => (Normal, "RemediationCreated"),
        NoticeKind::RemediationDeleted => (Normal, "RemediationRemoved"),
        NoticeKind::Paused => (Normal, "RemediationSkipped"),
        NoticeKind::RemediationSkipped => (Warning, "RemediationSkipped"),
        NoticeKind::NoTemplateLeft => (Warning, "NoTemplateLeft"),
        NoticeKind::RemediationBlocked if storm && notice.reason == Reason::StormCooldown => {
            (Warning, "StormRecoveryCooldownStarted")
        }
        NoticeKind::RemediationBlocked if storm => (Warning, "StormRecoveryStarted"),
        NoticeKind::RemediationBlocked => (Warning, "RemediationSkipped"),
        NoticeKind::RemediationAllowed if storm => (Normal, "StormRecoveryEnded"),
        // A check refused outright is disabled, as the operator says; one whose sources cannot
        // be read now is not (Vigil's own `NoDecision`).
        NoticeKind::NoDecision if notice.target.is_none() && notice.reason != Reason::WaitingForCaches => {
            (Warning, "Disabled")
        }
        _ => own(),
    }
}

/// The medik8s NodeHealthCheck `name` as an event's object.
fn reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{GROUP}/{VERSION}")),
        kind: Some(KIND.into()),
        name: Some(name.into()),
        uid: uid.map(str::to_string),
        ..Default::default()
    }
}

/// Publishes `notice` as an event on the medik8s NodeHealthCheck `name`, with the operator's
/// type and reason ([`event`]).
pub(crate) async fn publish(
    ctx: &Context,
    name: &str,
    uid: Option<&str>,
    (notice, about): (&Notice, Option<&ObjectRef>),
    storm: bool,
) {
    let (type_, reason) = event(notice, storm);
    let target = notice.target_key();
    let note = match &target {
        Some(t) if !notice.message.contains(t.as_str()) => format!("{t}: {}", notice.message),
        _ => notice.message.clone(),
    };
    // The action says what happened: a check-wide notice's reason, or the remediation object
    // a notice is about (the related object stays the Node, as the operator's events have it).
    let action = match (&notice.target, about) {
        (_, Some(object)) => format!("{:?} {object}", notice.kind).chars().take(128).collect(),
        (Some(_), None) => format!("{:?}", notice.kind),
        (None, None) => notice.reason.as_str().chars().take(128).collect(),
    };
    send(ctx, name, uid, (type_, reason, note), target.as_deref(), &action).await;
}

/// Sends one event on the medik8s NodeHealthCheck `name` (about Node `target`, if any), fenced
/// by the check's right to write.
async fn send(
    ctx: &Context,
    name: &str,
    uid: Option<&str>,
    (type_, reason, note): (EventType, &str, String),
    target: Option<&str>,
    action: &str,
) {
    let key = CheckRef::Node { name: name.to_string() };
    if !ctx.right(&key).is_leader() {
        return;
    }
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: target.map(|t| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(t.into()),
            ..Default::default()
        }),
    };
    ctx.send_event(&event, &reference(name, uid), Some(&key)).await;
}

/// [`publish`] for a check decided as a medik8s one, with its storm setting read from the index.
pub(crate) async fn publish_served(
    ctx: &Context,
    name: &str,
    uid: Option<&str>,
    notice: &Notice,
    about: Option<&ObjectRef>,
) {
    let storm = storm_configured(ctx, name);
    publish(ctx, name, uid, (notice, about), storm).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use std::collections::BTreeSet;
    use vigil_api::well_known::REMEDIATION_ALLOWED;
    use vigil_engine::target::Target;
    use vigil_index::upstream::{SHARED_FIELDS, STORM_ACTIVE, STORM_COOLDOWN_ACTIVE};

    fn t(s: &str) -> Time {
        Time(s.parse().expect("timestamp"))
    }

    fn condition(type_: &str, status: &str, reason: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: t(at),
            observed_generation: Some(2),
        }
    }

    /// A status the engine wrote for a check in a storm cool-down, with one remediation.
    fn remediating() -> NodeHealthCheckStatus {
        serde_json::from_value(json!({
            "observedNodes": 3, "healthyNodes": 2, "phase": "Remediating", "reason": "1 node remediating",
            "unhealthyNodes": [{"name": "w1", "remediations": [{
                "resource": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                             "namespace": "medik8s", "name": "w1", "uid": "u1"},
                "started": "2030-01-01T00:00:00Z", "templateName": "reboot"}]}],
            "conditions": [
                {"type": "Disabled", "status": "False", "reason": "Enabled", "message": "ok",
                 "lastTransitionTime": "2030-01-01T00:00:00Z", "observedGeneration": 2},
                {"type": "RemediationAllowed", "status": "False", "reason": "StormCooldown", "message": "cooling",
                 "lastTransitionTime": "2030-01-01T00:01:00Z", "observedGeneration": 2}],
            "lastUpdateTime": "2030-01-01T00:02:00Z",
            "stormRecoveryStartTime": "2030-01-01T00:02:00Z",
            "observedGeneration": 2
        }))
        .expect("status")
    }

    /// What the engine writes is what it reads back: the storm's start, the generation and every
    /// shared field survive medik8s' schema, and a status that did not change is not written
    /// again (the status in medik8s' schema is a fixed point of reading and writing it).
    #[test]
    fn a_status_in_medik8s_schema_reads_back_to_what_the_engine_decides_on() {
        let status = remediating();
        let stored = status_to_upstream(&status, &Value::Null, true);
        let keys: BTreeSet<&str> = stored.as_object().expect("object").keys().map(String::as_str).collect();
        assert!(keys.iter().all(|k| SHARED_FIELDS.contains(k)), "only medik8s' fields: {keys:?}");
        let conditions = &stored["conditions"];
        let find = |type_: &str| conditions.as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).cloned();
        assert_eq!(find("Disabled").expect("Disabled")["reason"], "NodeHealthCheckEnabled");
        let cooldown = find("StormCooldownActive").expect("StormCooldownActive");
        assert_eq!(
            (cooldown["status"].as_str(), cooldown["lastTransitionTime"].as_str()),
            (Some("True"), Some("2030-01-01T00:02:00Z"))
        );
        let storm = find("StormActive").expect("StormActive");
        assert_eq!(
            (storm["status"].as_str(), storm["reason"].as_str()),
            (Some("True"), Some("HealthyNodeThresholdChange"))
        );

        let prev = status_from_upstream(&stored).expect("reads");
        assert_eq!(prev.storm_recovery_start_time, status.storm_recovery_start_time);
        assert_eq!(prev.observed_generation, Some(2));
        assert_eq!(
            (prev.unhealthy_nodes.clone(), prev.phase.clone()),
            (status.unhealthy_nodes.clone(), status.phase.clone())
        );
        assert_eq!(get_condition(&prev.conditions, DISABLED).map(|c| c.reason.as_str()), Some("Enabled"));
        assert_eq!(status_to_upstream(&prev, &stored, true), stored, "nothing changed, nothing to write");
        assert_eq!(merge_diff(&stored, &status_to_upstream(&prev, &stored, true)), None);
    }

    #[test]
    fn the_end_of_a_cooldown_and_of_a_storm_are_written_as_medik8s_does() {
        let stored = status_to_upstream(&remediating(), &Value::Null, true);
        let mut after = status_from_upstream(&stored).expect("reads");
        after.storm_recovery_start_time = None;
        after.last_update_time = Some(t("2030-01-01T00:07:00Z"));
        let allowed = condition(REMEDIATION_ALLOWED, "True", "RemediationAllowed", "2030-01-01T00:07:00Z");
        after.conditions.retain(|c| c.type_ != REMEDIATION_ALLOWED);
        after.conditions.push(allowed);
        let written = status_to_upstream(&after, &stored, true);
        let reread = status_from_upstream(&written).expect("reads");
        let get = |type_: &str| {
            get_condition(&reread.conditions, type_).map(|c| (c.status.clone(), c.last_transition_time.clone()))
        };
        assert_eq!(get(STORM_COOLDOWN_ACTIVE), Some(("False".into(), t("2030-01-01T00:07:00Z"))));
        assert_eq!(get(STORM_ACTIVE), Some(("False".into(), t("2030-01-01T00:07:00Z"))));
        assert_eq!(reread.storm_recovery_start_time, None);
        assert_eq!(written["conditions"].as_array().map(Vec::len), Some(4), "{written}");
    }

    /// A status the operator wrote before the swap: its deprecated field is cleared, a reference
    /// without a namespace is read, and a storm it was in continues in the engine's terms.
    #[test]
    fn a_status_the_operator_wrote_is_read() {
        let stored = json!({
            "observedNodes": 3, "healthyNodes": 1, "phase": "Enabled",
            "inFlightRemediations": {"w1": "2030-01-01T00:00:00Z"},
            "unhealthyNodes": [{"name": "w1", "remediations": [{
                "resource": {"apiVersion": "x.medik8s.io/v1alpha1", "kind": "ClusterRemediation", "name": "w1"},
                "started": "2030-01-01T00:00:00Z"}]}],
            "conditions": [
                {"type": "Disabled", "status": "False", "reason": "NodeHealthCheckEnabled", "message": "",
                 "lastTransitionTime": "2030-01-01T00:00:00Z"},
                {"type": "StormActive", "status": "True", "reason": "HealthyNodeThresholdChange", "message": "storm",
                 "lastTransitionTime": "2030-01-01T00:03:00Z"}]
        });
        let prev = status_from_upstream(&stored).expect("reads");
        assert_eq!(prev.unhealthy_nodes[0].remediations[0].resource.namespace, "");
        let allowed = get_condition(&prev.conditions, REMEDIATION_ALLOWED).expect("the storm, in the engine's terms");
        assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("False", "TooFewHealthy"));
        assert_eq!(allowed.last_transition_time, t("2030-01-01T00:03:00Z"));
        let written = status_to_upstream(&prev, &stored, true);
        let patch = merge_diff(&stored, &written).expect("changed");
        assert_eq!(patch["inFlightRemediations"], Value::Null, "cleared as the operator clears it: {patch}");
        assert_eq!(status_from_upstream(&json!("not a status")), None);
    }

    #[test]
    fn a_medik8s_check_is_read_with_the_convert_code_and_a_bad_spec_is_named() {
        let raw = json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": "workers", "uid": "u-1", "resourceVersion": "7"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": "51%",
                     "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                        "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": "medik8s"}},
            "status": {"observedNodes": 4, "phase": "Enabled"}});
        let entry = read(&raw);
        assert_eq!(entry.error, None);
        assert_eq!(entry.check.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(entry.check.status.as_ref().map(|s| s.observed_nodes), Some(4));
        let policy = vigil_api::validate::medik8s_node_health_check(&entry.check).expect("valid");
        assert_eq!(policy.api.api_version(), "remediation.medik8s.io/v1alpha1");

        let mut bad = raw.clone();
        bad["spec"]["selector"] = json!(5);
        let entry = read(&bad);
        let error = entry.error.expect("refused");
        assert!(error.starts_with("spec cannot be read: spec.selector: invalid type: integer `5`"), "{error}");
        assert_eq!(entry.check.metadata.name.as_deref(), Some("workers"), "still known by its name");
    }

    #[test]
    fn a_lease_says_the_operator_runs_while_held_and_renewed() {
        let now: Timestamp = "2030-01-01T00:01:00Z".parse().expect("now");
        let lease = |holder: &str, renewed: &str| OperatorLease {
            namespace: "medik8s".into(),
            holder: holder.into(),
            renewed: Some(renewed.parse().expect("time")),
            duration: Duration::from_secs(15),
        };
        assert!(lease("nhc-abc", "2030-01-01T00:00:55Z").running(now, None), "renewed 5s ago");
        assert!(lease("nhc-abc", "2030-01-01T00:00:36Z").running(now, None), "within duration + skew");
        assert!(!lease("nhc-abc", "2030-01-01T00:00:30Z").running(now, None), "expired");
        assert!(!lease("", "2030-01-01T00:00:59Z").running(now, None), "released");
        // The operator's clock far behind: seen renewed while watched counts.
        assert!(lease("nhc-abc", "2029-01-01T00:00:00Z").running(now, Some(Duration::from_secs(3))));
        assert!(!lease("nhc-abc", "2029-01-01T00:00:00Z").running(now, Some(Duration::from_secs(60))));
        let text = lease("nhc-abc", "2030-01-01T00:00:55Z").describe();
        assert!(text.contains("medik8s/e1f13584.medik8s.io") && text.contains("\"nhc-abc\""), "{text}");
    }

    #[test]
    fn events_carry_the_operators_reasons() {
        let notice = |kind: NoticeKind, target: Option<&str>, reason: Reason| Notice {
            kind,
            target: target.map(Target::local_node),
            reason,
            message: String::new(),
        };
        let cases = [
            (notice(NoticeKind::Unhealthy, Some("w1"), Reason::Rule("Ready=False".into())), false, "DetectedUnhealthy"),
            (
                notice(NoticeKind::RemediationCreated, Some("w1"), Reason::RemediationCreated),
                false,
                "RemediationCreated",
            ),
            (
                notice(NoticeKind::RemediationDeleted, Some("w1"), Reason::RemediationRemoved),
                false,
                "RemediationRemoved",
            ),
            (notice(NoticeKind::RemediationBlocked, None, Reason::TooFewHealthy), false, "RemediationSkipped"),
            (notice(NoticeKind::RemediationBlocked, None, Reason::TooFewHealthy), true, "StormRecoveryStarted"),
            (notice(NoticeKind::RemediationBlocked, None, Reason::StormCooldown), true, "StormRecoveryCooldownStarted"),
            (notice(NoticeKind::RemediationAllowed, None, Reason::RemediationAllowed), true, "StormRecoveryEnded"),
            (notice(NoticeKind::Paused, None, Reason::Paused), false, "RemediationSkipped"),
            (notice(NoticeKind::NoTemplateLeft, Some("w1"), Reason::NoTemplateLeft), false, "NoTemplateLeft"),
            (notice(NoticeKind::NoDecision, None, Reason::InvalidSpec), false, "Disabled"),
            (notice(NoticeKind::NoDecision, None, Reason::WaitingForCaches), false, "NoDecision"),
            (notice(NoticeKind::NoDecision, Some("w1"), Reason::MissingLastTransitionTime), false, "NoDecision"),
            (
                notice(NoticeKind::RemediationTimedOut, Some("w1"), Reason::RemediationTimedOut),
                false,
                "RemediationTimedOut",
            ),
        ];
        for (n, storm, reason) in cases {
            assert_eq!(event(&n, storm).1, reason, "{n:?} storm={storm}");
        }
        assert_eq!(
            event(&notice(NoticeKind::Unhealthy, Some("w1"), Reason::Rule("Ready=False".into())), false).0,
            EventType::Normal
        );
    }

    fn entry(name: &str, rv: &str) -> Entry {
        read(&json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": name, "uid": format!("medik8s-{name}"), "resourceVersion": rv},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                     "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                        "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": "medik8s"}}}))
    }

    fn vigil_check(name: &str, rv: &str) -> NodeHealthCheck {
        let mut c = entry(name, "1").check;
        c.metadata.uid = Some(format!("vigil-{name}"));
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn served(idx: &Index, name: &str) -> Option<(String, &'static str)> {
        let uid = idx.nhc(name)?.metadata.uid.clone()?;
        let api = match idx.nhc_policy(name) {
            Some(Ok(p)) => p.api.api_version(),
            _ => "invalid",
        };
        Some((uid, api))
    }

    /// One name, one check: a vigil.dev check takes a medik8s check's place and gives it back;
    /// nothing medik8s' is decided while the operator runs or before its Lease was listed.
    #[test]
    fn the_index_serves_a_medik8s_check_only_when_nothing_else_may_decide_it() {
        let mut idx = Index::default();
        idx.serve_medik8s();
        let key = CheckRef::Node { name: "workers".into() };
        assert!(idx.put_medik8s(entry("workers", "10")).is_empty(), "nothing before the operator's Lease is known");
        assert_eq!(served(&idx, "workers"), None);
        assert_eq!(idx.stop_medik8s(None), Some(BTreeSet::from([key.clone()])));
        let medik8s = Some(("medik8s-workers".to_string(), "remediation.medik8s.io/v1alpha1"));
        assert_eq!(served(&idx, "workers"), medik8s);

        // A vigil.dev check of the same name (an older resourceVersion) wins, and gives it back.
        assert!(idx.put_nhc(Some(vigil_check("workers", "5")), None).contains(&key));
        assert_eq!(served(&idx, "workers"), Some(("vigil-workers".to_string(), "vigil.dev/v1alpha1")));
        let up = idx.medik8s().expect("mode on");
        assert!(up.refusal("workers").is_some_and(|(r, _)| r == Reason::NameTakenByVigilCheck));
        assert!(idx.put_medik8s(entry("workers", "11")).is_empty(), "still the vigil.dev one");
        idx.put_nhc(None, Some("workers".into()));
        assert_eq!(served(&idx, "workers"), medik8s);

        // A relist of vigil.dev checks keeps it.
        idx.clear_nhcs();
        assert_eq!(served(&idx, "workers"), medik8s);

        // The operator runs: taken out of the decisions, told why.
        let stopped = idx.stop_medik8s(Some(Stop::Operator("Lease medik8s/e1f13584.medik8s.io held".into())));
        assert!(stopped.is_some_and(|d| d.contains(&key)));
        assert_eq!(served(&idx, "workers"), None);
        let up = idx.medik8s().expect("mode on");
        assert!(up.refusal("workers").is_some_and(|(r, m)| r == Reason::OperatorRunning && m.contains("held")));
        assert!(idx.remove_medik8s("workers").is_empty());
        assert_eq!(idx.medik8s().and_then(|u| u.refusal("workers")), None);
    }
}
