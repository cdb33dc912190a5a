//! `vigil run`: the controller. It gathers observed state from watches into in-memory indexes,
//! calls the engine for each check that a change concerns or whose wake-up is due, and applies
//! the plans. It decides nothing itself: every rule is in `vigil-engine`.

pub mod apply;
pub mod claims;
pub mod clock;
pub mod confirm;
pub mod fenced;
pub mod gather;
pub mod http;
pub mod index;
pub mod leader;
pub mod medik8s;
pub mod metrics;
pub mod scheduler;
pub mod sources;
pub mod surroundings;
pub mod watch;
pub mod wire;
pub mod workload;

use index::Index;
use jiff::SignedDuration;
use kube::Client;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::events::{Recorder, Reporter};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::{debug, info, warn};
use vigil_engine::target::CheckRef;

/// Settings of a controller run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many checks are decided and applied at once.
    pub workers: usize,
    /// Where `/metrics`, `/livez` and `/readyz` are served, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often the API server is probed (a partition breaks no connection, so only a probe
    /// notices it).
    pub probe_period: Duration,
    /// How long a source may be not live before `/readyz` fails.
    pub ready_grace: Duration,
    /// Leader election (`None`: this replica always leads).
    pub leader: Option<leader::LeaderOptions>,
    /// Decide every check in dry-run (shadow mode), whatever its spec says: report, never remediate.
    pub dry_run: bool,
    /// How many shards the checks are split into (1: one leader decides everything; more: each
    /// replica decides and writes only the checks of the shards whose Leases it holds).
    pub shards: u32,
    /// Where the medik8s node Leases live (`LEASE_NAMESPACE`, else `medik8s-leases`).
    pub lease_namespace: String,
    /// Also decide medik8s' own NodeHealthChecks (`remediation.medik8s.io/v1alpha1`) in place,
    /// while the NodeHealthCheck operator does not run ([`medik8s`]).
    pub serve_medik8s: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: 16,
            metrics_addr: None,
            probe_period: PROBE_PERIOD,
            ready_grace: sources::READY_GRACE,
            leader: None,
            dry_run: false,
            shards: 1,
            lease_namespace: surroundings::default_lease_namespace(),
            serve_medik8s: false,
        }
    }
}

/// How many events are sent at once. Events are the largest share of a failure wave's requests
/// (two per remediation: the target found unhealthy, its remediation requested); sent one after
/// another on a narrow lane they reach the API server after the remediations, not among them
/// (docs/DECISIONS.md, "Events on their own lane").
pub const EVENT_LANE: usize = 2;

/// How often the API server is probed by default.
pub const PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(4);
/// Failed probes in a row after which the API server counts as unreachable.
const PROBE_FAILURES: u32 = 2;

/// What every task of the controller shares.
pub struct Context {
    /// Client of the cluster Vigil runs in.
    pub client: Client,
    /// The indexes (short, non-async critical sections only).
    pub index: RwLock<Index>,
    /// Which check to decide next, and when.
    pub scheduler: scheduler::Scheduler,
    /// The time decisions are made at (see [`clock`]; the system clock but in tests).
    pub clock: Arc<dyn clock::Clock>,
    /// Event publisher.
    pub recorder: Recorder,
    /// The event lane: at most [`EVENT_LANE`] events are sent at once, so a wave's events queue
    /// behind each other instead of competing with its remediations at the API server.
    events: tokio::sync::Semaphore,
    /// Discovered API resources.
    pub resources: tokio::sync::Mutex<HashMap<GroupVersionKind, ApiResource>>,
    /// Watches already started for checks' needs.
    pub started: tokio::sync::Mutex<BTreeSet<gather::Need>>,
    /// Metrics.
    pub metrics: metrics::Metrics,
    /// Whether each watched source can be trusted (for `/readyz`).
    pub sources: sources::Registry,
    /// How long a source may be not live before `/readyz` fails.
    pub ready_grace: std::sync::atomic::AtomicU64,
    /// Whether this replica may write now (fencing: checked before every write).
    pub leadership: Arc<leader::Leadership>,
    /// Sharded mode: the right to write per shard (none: one shard, fenced by `leadership`).
    pub shards: Option<Arc<leader::ShardRights>>,
    /// Bumped when the API server was unreachable: every watch lists again.
    epoch: tokio::sync::watch::Sender<u64>,
    /// Bumped when the Machine and Cluster watches must list again without distrusting what
    /// they hold (sharded mode: a shard taken, a local Node added).
    capi_relist: tokio::sync::watch::Sender<u64>,
    /// Clients of connected workload clusters by `namespace/clusterName`, for confirming reads.
    workload_clients: std::sync::Mutex<HashMap<String, Client>>,
    /// Targets whose remediation is being confirmed and written, with the check doing it: a
    /// second check deciding on the same target at the same moment waits for the first.
    confirming: std::sync::Mutex<HashMap<String, CheckRef>>,
    /// Unreadable Node fields already reported (cluster, Node, field), so each is told once.
    reported: std::sync::Mutex<HashSet<(String, String, String)>>,
    failures: std::sync::Mutex<HashMap<CheckRef, u32>>,
    /// Permits for verdict-only Machine writes ([`apply::VERDICT_WRITES_IN_FLIGHT`]).
    verdict_writes: tokio::sync::Semaphore,
}

impl Context {
    /// A new context for `client`.
    pub fn new(client: Client) -> Arc<Self> {
        Self::with_leadership(client, leader::Leadership::always())
    }

    /// A new context whose writes are fenced by `leadership`.
    pub fn with_leadership(client: Client, leadership: leader::Leadership) -> Arc<Self> {
        Self::with_clock(client, leadership, Arc::new(clock::SystemClock))
    }

    /// A new context that reads the time from `clock` (a test steps it).
    pub fn with_clock(client: Client, leadership: leader::Leadership, clock: Arc<dyn clock::Clock>) -> Arc<Self> {
        Self::build(client, leadership, clock, None)
    }

    /// A new context of a sharded replica: each check's writes are fenced by its shard's right.
    pub fn sharded(client: Client, shards: Arc<leader::ShardRights>) -> Arc<Self> {
        Self::build(client, leader::Leadership::always(), Arc::new(clock::SystemClock), Some(shards))
    }

    fn build(
        client: Client,
        leadership: leader::Leadership,
        clock: Arc<dyn clock::Clock>,
        shards: Option<Arc<leader::ShardRights>>,
    ) -> Arc<Self> {
        let reporter = Reporter { controller: "vigil".into(), instance: std::env::var("POD_NAME").ok() };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            events: tokio::sync::Semaphore::new(EVENT_LANE),
            client,
            index: RwLock::new(Index::with_shards(shards.as_ref().map_or(1, |s| s.count()), shards.is_some())),
            scheduler: scheduler::Scheduler::with_clock(clock.clone()),
            clock,
            resources: tokio::sync::Mutex::new(HashMap::new()),
            started: tokio::sync::Mutex::new(BTreeSet::new()),
            metrics: metrics::Metrics::default(),
            sources: sources::Registry::default(),
            ready_grace: std::sync::atomic::AtomicU64::new(sources::READY_GRACE.as_millis() as u64),
            leadership: Arc::new(leadership),
            shards,
            epoch: tokio::sync::watch::Sender::new(0),
            capi_relist: tokio::sync::watch::Sender::new(0),
            workload_clients: std::sync::Mutex::new(HashMap::new()),
            confirming: std::sync::Mutex::new(HashMap::new()),
            reported: std::sync::Mutex::new(HashSet::new()),
            failures: std::sync::Mutex::new(HashMap::new()),
            verdict_writes: tokio::sync::Semaphore::new(apply::VERDICT_WRITES_IN_FLIGHT),
        })
    }

    /// The shard of a check (a MachineHealthCheck by its workload cluster, a NodeHealthCheck by
    /// its name); `None` in sharded mode when the check is not known (nothing is written for it).
    pub fn shard_of(&self, key: &CheckRef) -> Option<u32> {
        self.read_index().shard_of(key)
    }

    /// The right to write for `key`: its shard's right in sharded mode, the leader's otherwise.
    /// Checked before every write of the check (fencing per shard).
    pub fn right(&self, key: &CheckRef) -> &leader::Leadership {
        match &self.shards {
            Some(shards) => shards.right(self.shard_of(key)),
            None => &self.leadership,
        }
    }

    /// A receiver of the relist epoch, for a new watch.
    pub fn epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// A receiver of the quiet relists of the Machine and Cluster watches.
    pub fn capi_relists(&self) -> tokio::sync::watch::Receiver<u64> {
        self.capi_relist.subscribe()
    }

    /// Makes the Machine and Cluster watches list again (what they hold stays trusted meanwhile).
    pub fn relist_capi(&self) {
        self.capi_relist.send_modify(|e| *e = e.wrapping_add(1));
    }

    /// Makes every watch list again (the API server could not be reached: what the watches
    /// hold may be stale, and a connection held open through a partition would not tell).
    pub fn relist_all(&self) {
        self.epoch.send_modify(|e| *e = e.wrapping_add(1));
    }

    /// Connected workload clusters' clients.
    pub fn lock_workload_clients(&self) -> std::sync::MutexGuard<'_, HashMap<String, Client>> {
        self.workload_clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_confirming(&self) -> std::sync::MutexGuard<'_, HashMap<String, CheckRef>> {
        self.confirming.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Locks `targets` for `key`'s confirmation (a confirmation lock, not a holder's claim: it
    /// lasts from the confirming read to the write); returns the ones another check's
    /// confirmation has locked right now (left out).
    pub fn lock_targets(&self, key: &CheckRef, targets: &BTreeSet<String>) -> BTreeSet<String> {
        let mut locks = self.lock_confirming();
        let mut refused = BTreeSet::new();
        for t in targets {
            match locks.get(t) {
                Some(holder) if holder != key => {
                    refused.insert(t.clone());
                }
                _ => {
                    locks.insert(t.clone(), key.clone());
                }
            }
        }
        refused
    }

    /// Unlocks what `key`'s confirmation locked.
    pub fn unlock_targets(&self, key: &CheckRef, targets: &BTreeSet<String>) {
        let mut locks = self.lock_confirming();
        for t in targets {
            if locks.get(t) == Some(key) {
                locks.remove(t);
            }
        }
    }

    /// Reports a Node field no rule can read: once in the log and once as an event on the Node.
    pub fn report_unreadable(self: &Arc<Self>, cluster: &str, problem: wire::Unreadable) {
        let first = self.reported.lock().unwrap_or_else(|p| p.into_inner()).insert((
            cluster.to_string(),
            problem.node.clone(),
            problem.field.clone(),
        ));
        if !first {
            return;
        }
        warn!(cluster = %cluster, "{problem}");
        self.metrics.unreadable_object();
        if !cluster.is_empty() {
            // An event in the management cluster about a workload cluster's Node would name an
            // object that is not there; the log and the check's status say it.
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: vigil_api::reason::Reason::UnreadableCondition.as_str().into(),
                note: Some(problem.to_string().chars().take(1000).collect()),
                action: "Read".into(),
                secondary: None,
            };
            let node = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(problem.node.clone()),
                ..Default::default()
            };
            this.send_event(&event, &node, None).await;
        });
    }

    /// Sends one event through the event lane (waiting for a place on it); a failure is logged
    /// only: an event is a report, never a condition for a decision.
    /// With `fenced_by`, the event is sent only if that check's right to write still holds when
    /// its turn comes.
    pub async fn send_event(
        &self,
        event: &kube::runtime::events::Event,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        fenced_by: Option<&CheckRef>,
    ) {
        // The semaphore is never closed; were it, the event goes unqueued rather than lost.
        self.metrics.events_waiting(1);
        let _place = self.events.acquire().await.ok();
        self.metrics.events_waiting(-1);
        if fenced_by.is_some_and(|key| !self.right(key).is_leader()) {
            return;
        }
        match self.recorder.publish(event, reference).await {
            Ok(()) => self.metrics.writes("event"),
            Err(e) => debug!(error = %e, "event not published"),
        }
    }

    /// The indexes, for reading.
    pub fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The indexes, for writing.
    pub fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides one check and applies its plan.
    pub async fn run_one(self: &Arc<Self>, key: &CheckRef) {
        let started = self.clock.instant();
        let now = self.clock.now();
        let job = {
            let idx = self.read_index();
            gather::job(&idx, key, now)
        };
        let Some(job) = job else {
            self.scheduler.forget(key);
            self.metrics.forget_check(key);
            return;
        };
        let decided_at = started.elapsed();
        self.metrics.decided(decided_at.as_secs_f64());
        for need in job.needs.clone() {
            watch::ensure(self, need).await;
        }
        // A plan that remediates is confirmed first: its targets are read again from the API
        // server and the check decided again on what was read (see `confirm`).
        let (mut job, locked) = match confirm::confirm(self, job).await {
            confirm::Confirmed::Go(job, locked) => (*job, locked),
            confirm::Confirmed::Gone => {
                self.scheduler.forget(key);
                self.metrics.forget_check(key);
                return;
            }
        };
        let confirmed_at = started.elapsed();
        // Remediations first; a cold start's thousands of verdicts go a hundred per decision.
        confirm::pace_verdicts(&mut job, confirm::VERDICTS_PER_RUN);
        self.metrics.check(key, &job.gauges());
        let next_wake = job.plan.next_wake;
        let again = job.again;
        let held_elsewhere = std::mem::take(&mut job.plan.held_elsewhere);
        let result = self.apply(job).await;
        // What this check now remediates, for the others' decisions; updated before the
        // confirmation locks are released, so a check waiting on one sees it when it decides again.
        self.cache_claims(key);
        self.unlock_targets(key, &locked);
        self.tell_holders(held_elsewhere);
        if again {
            // Remediations left out while confirming (new targets, or held by another check).
            self.scheduler.mark([key.clone()]);
        }
        match result {
            Ok(()) => {
                self.lock_failures().remove(key);
                self.scheduler.wake_at(key, next_wake);
            }
            Err(e) => {
                // A failed write is retried with a growing delay (1 s to 5 min), never faster;
                // a due verdict still wakes the check at its own time.
                let failures = {
                    let mut f = self.lock_failures();
                    let n = f.entry(key.clone()).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                let backoff = SignedDuration::from_secs(1i64 << failures.min(8).saturating_sub(1))
                    .min(SignedDuration::from_secs(300));
                let retry = self.clock.now().checked_add(backoff).ok();
                let at = match (retry, next_wake) {
                    (Some(r), Some(w)) => Some(r.min(w)),
                    (r, w) => r.or(w),
                };
                warn!(check = %key, error = %e, retry_in = %backoff, "plan not fully applied");
                self.scheduler.wake_at(key, at);
            }
        }
        debug!(
            check = %key,
            decide_us = decided_at.as_micros() as u64,
            confirm_us = confirmed_at.saturating_sub(decided_at).as_micros() as u64,
            elapsed_us = started.elapsed().as_micros() as u64,
            "decided"
        );
    }

    /// Caches what `key` now remediates, for the others' decisions, and has the other
    /// NodeHealthChecks deciding on a Node it newly holds decide again: one that decided while
    /// this check was writing saw the Node's Lease (taken first) but not yet this claim, and
    /// said it waits for the Lease rather than for this check.
    fn cache_claims(&self, key: &CheckRef) {
        let newly_held: Vec<String> = {
            let mut idx = self.write_index();
            let claims = claims::claims_of(&idx, key);
            let before: std::collections::BTreeSet<&vigil_engine::target::Target> =
                idx.claims.get(key).into_iter().flatten().map(|c| &c.target).collect();
            let new = claims
                .iter()
                .filter(|c| !before.contains(&c.target))
                .filter_map(|c| match &c.target {
                    vigil_engine::target::Target::Node { cluster, name }
                        if cluster == vigil_engine::target::LOCAL_CLUSTER =>
                    {
                        Some(name.clone())
                    }
                    _ => None,
                })
                .collect();
            if claims.is_empty() {
                idx.claims.remove(key);
            } else {
                idx.claims.insert(key.clone(), claims);
            }
            new
        };
        if !newly_held.is_empty() {
            let deciding = self.read_index().nhcs_deciding_on(&newly_held, key);
            self.scheduler.mark(deciding);
        }
    }

    /// Tells each holding check, with an event, that another check waits for its target.
    fn tell_holders(self: &Arc<Self>, held: Vec<vigil_engine::plan::HeldElsewhere>) {
        if held.is_empty() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            for h in held {
                let key = h.holder.clone();
                let uid = {
                    let idx = this.read_index();
                    match &key {
                        CheckRef::Machine { namespace: ns, name: n } => {
                            idx.mhcs.get(&(ns.clone(), n.clone())).and_then(|c| c.metadata.uid.clone())
                        }
                        CheckRef::Node { name: n } => idx.nhcs.get(n).and_then(|c| c.metadata.uid.clone()),
                    }
                };
                let notice = vigil_engine::Notice {
                    kind: vigil_engine::NoticeKind::OtherCheckWaiting,
                    target: Some(h.target.clone()),
                    reason: vigil_api::reason::Reason::OtherCheckWaiting,
                    message: format!("{} ({})", h.message, h.waiter),
                };
                this.publish(&key, uid.as_deref(), &notice).await;
            }
        });
    }

    fn lock_failures(&self) -> std::sync::MutexGuard<'_, HashMap<CheckRef, u32>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a shutdown waits for the decisions in flight to finish their writes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Runs the controller until `shutdown` completes: then no new decision starts, the ones in
/// flight finish their writes (up to 20 s), and the Lease, if held, is released.
pub async fn run(client: Client, options: Options, shutdown: impl std::future::Future<Output = ()>) {
    let sharded = options.shards > 1 && options.leader.is_some();
    let ctx = if sharded {
        Context::sharded(client.clone(), Arc::new(leader::ShardRights::new(options.shards)))
    } else {
        let leadership =
            if options.leader.is_some() { leader::Leadership::elected() } else { leader::Leadership::always() };
        Context::with_leadership(client.clone(), leadership)
    };
    ctx.ready_grace.store(options.ready_grace.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    ctx.write_index().dry_run = options.dry_run;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let election = options.leader.clone().map(|lo| {
        let ctx = ctx.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let leadership = ctx.leadership.clone();
            let on_elected = {
                let ctx = ctx.clone();
                move || {
                    // A standby decided nothing and holds no wake-ups: everything is decided anew.
                    let all = ctx.read_index().all_checks();
                    ctx.scheduler.mark(all);
                }
            };
            match ctx.shards.clone() {
                Some(rights) => {
                    let on_gained = {
                        let ctx = ctx.clone();
                        move |shard: u32| {
                            // The shard's Machines and Clusters are listed; its checks decide
                            // once they are (decided by nobody here so far: all marked now).
                            ctx.write_index().take_shard(shard);
                            ctx.relist_capi();
                            let all = ctx.read_index().all_checks();
                            let mine: Vec<CheckRef> =
                                all.into_iter().filter(|k| ctx.shard_of(k) == Some(shard)).collect();
                            ctx.scheduler.mark(mine);
                        }
                    };
                    let on_lost = {
                        let ctx = ctx.clone();
                        move |shard: u32| {
                            let mut idx = ctx.write_index();
                            idx.let_go_shard(shard);
                            ctx.metrics.cached_machines(idx.machine_count());
                        }
                    };
                    leader::run_shards(client, lo, rights, &ctx.metrics, stop, on_gained, on_lost).await;
                }
                None => leader::run(client, lo, leadership, &ctx.metrics, stop, on_elected).await,
            }
        })
    });
    ctx.metrics.leader(options.leader.is_none());
    let prober = tokio::spawn(probe(ctx.clone(), options.probe_period));
    ctx.write_index().around.lease_namespace = options.lease_namespace.clone();
    if options.serve_medik8s {
        medik8s::start(&ctx);
    }
    watch::start_fixed(&ctx).await;
    surroundings::start(&ctx).await;
    if let Some(addr) = options.metrics_addr {
        tokio::spawn(http::serve(ctx.clone(), addr));
    }
    let mut workers = Vec::new();
    for _ in 0..options.workers.max(1) {
        let ctx = ctx.clone();
        let mut stop = stop_rx.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let key = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    key = async {
                        ctx.leadership.wait_leading().await;
                        ctx.scheduler.next().await
                    } => key,
                };
                if !ctx.leadership.is_leader() || !ctx.right(&key).is_leader() {
                    // Lost the lease while waiting, or the check's shard is not held here: the
                    // check is decided by whoever holds its Lease.
                    ctx.scheduler.done(&key);
                    ctx.metrics.leader(false);
                    continue;
                }
                ctx.run_one(&key).await;
                ctx.scheduler.done(&key);
            }
        }));
    }
    shutdown.await;
    info!("shutting down: no new decisions; finishing the writes in flight");
    let _ = stop_tx.send(true);
    let finished = tokio::time::timeout(SHUTDOWN_GRACE, futures::future::join_all(workers.iter_mut())).await;
    if finished.is_err() {
        warn!("writes still in flight after {SHUTDOWN_GRACE:?}; stopping anyway");
        for w in &workers {
            w.abort();
        }
    }
    if let Some(election) = election {
        // Releases the Lease (bounded), so a standby takes over at once.
        let _ = tokio::time::timeout(Duration::from_secs(10), election).await;
    }
    prober.abort();
}

/// The name of the API server's own entry in the source registry.
pub const API_SERVER_SOURCE: &str = "API server";

/// Probes the API server every `period`. After [`PROBE_FAILURES`] failures in a row it counts as
/// unreachable: `/readyz` says so and every watch lists again, so that nothing is decided from
/// what was cached before until fresh lists arrive.
async fn probe(ctx: Arc<Context>, period: Duration) {
    ctx.sources.register(API_SERVER_SOURCE, true);
    let mut failures = 0u32;
    loop {
        let ok = match tokio::time::timeout(PROBE_TIMEOUT, ctx.client.apiserver_version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs())),
        };
        match ok {
            Ok(()) => {
                if failures >= PROBE_FAILURES {
                    info!("API server reachable again");
                }
                failures = 0;
                ctx.sources.synced(API_SERVER_SOURCE);
                ctx.metrics.api_reachable(true);
            }
            Err(why) => {
                failures = failures.saturating_add(1);
                if failures == PROBE_FAILURES {
                    warn!(error = %why, "API server unreachable; every watch lists again once it answers");
                    ctx.sources.failed(API_SERVER_SOURCE, &why);
                    ctx.metrics.api_reachable(false);
                    ctx.relist_all();
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}
