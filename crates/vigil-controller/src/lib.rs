//! `vigil run`: the controller. It gathers observed state from watches into in-memory indexes,
//! calls the engine for each check that a change concerns or whose wake-up is due, and applies
//! the plans. It decides nothing itself: every rule is in `vigil-engine`. Every write goes out
//! through the one [`Writer`] the [`Context`] holds ([`writer`]); [`apply`] and [`medik8s`] say
//! which writes a plan makes and put their answers into the index.

pub mod apply;
pub mod around;
pub mod claims;
pub mod clock;
pub mod confirm;
pub mod context;
pub mod events;
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
pub mod upstream_nhc;
pub mod watch;
pub mod wire;
pub mod workload;
pub mod writer;
pub mod writes;

pub use context::{Context, EVENT_LANE};
pub use writer::Writer;

use jiff::SignedDuration;
use kube::Client;
use std::sync::Arc;
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

/// How often the API server is probed by default.
pub const PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(4);
/// Failed probes in a row after which the API server counts as unreachable.
const PROBE_FAILURES: u32 = 2;

impl Context {
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
            self.ensure(need).await;
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
            Err(e) => self.retry_later(key, next_wake, &e),
        }
        debug!(
            check = %key,
            decide_us = decided_at.as_micros() as u64,
            confirm_us = confirmed_at.saturating_sub(decided_at).as_micros() as u64,
            elapsed_us = started.elapsed().as_micros() as u64,
            "decided"
        );
    }

    /// After a plan was not fully applied: the check is decided again after a delay that grows
    /// with the failures in a row (1 s to 5 min), never sooner; a due verdict still wakes it at
    /// its own time.
    fn retry_later(&self, key: &CheckRef, next_wake: Option<jiff::Timestamp>, e: &writes::WriteError) {
        let failures = {
            let mut f = self.lock_failures();
            let n = f.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let backoff =
            SignedDuration::from_secs(1i64 << failures.min(8).saturating_sub(1)).min(SignedDuration::from_secs(300));
        let retry = self.clock.now().checked_add(backoff).ok();
        let at = match (retry, next_wake) {
            (Some(r), Some(w)) => Some(r.min(w)),
            (r, w) => r.or(w),
        };
        warn!(check = %key, error = %e, retry_in = %backoff, "plan not fully applied");
        self.scheduler.wake_at(key, at);
    }

    /// Caches what `key` now remediates, for the others' decisions, and has the other
    /// NodeHealthChecks deciding on a Node it newly holds decide again: one that decided while
    /// this check was writing saw the Node's Lease (taken first) but not yet this claim, and
    /// said it waits for the Lease rather than for this check. When it let a target go, the
    /// checks waiting for another check decide again too.
    fn cache_claims(&self, key: &CheckRef) {
        let (newly_held, waiting): (Vec<String>, Vec<CheckRef>) = {
            let mut idx = self.write_index();
            let claims = claims::claims_of(&idx, key);
            let before: std::collections::BTreeSet<&vigil_engine::target::Target> =
                idx.claims.get(key).into_iter().flatten().map(|c| &c.target).collect();
            // A target let go: the checks waiting for another check decide again (one that
            // decided while this check was writing saw the claim it is letting go).
            let released = before.iter().any(|t| !claims.iter().any(|c| &c.target == *t));
            let waiting = match released {
                true => idx.waiting_checks().filter(|c| c != key).collect(),
                false => Vec::new(),
            };
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
            (new, waiting)
        };
        self.scheduler.mark(waiting);
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
                this.publish(&key, uid.as_deref(), &h.notice()).await;
            }
        });
    }

    /// Starts what a check needs watched, once: a kind's objects, or a workload cluster's
    /// connection and its Nodes.
    async fn ensure(self: &Arc<Self>, need: sources::Need) {
        if !self.started.lock().await.insert(need.clone()) {
            return;
        }
        let ctx = self.clone();
        match need {
            sources::Need::Kind { group, version, kind, template } => {
                tokio::spawn(async move { watch::watch_kind(ctx, group, version, kind, template).await });
            }
            sources::Need::WorkloadCluster(namespace, cluster) => {
                tokio::spawn(async move { workload::keep_connected(ctx, namespace, cluster).await });
            }
        }
    }
}

/// How long a shutdown waits for the decisions in flight to finish their writes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Runs the controller until `shutdown` completes: then no new decision starts, the ones in
/// flight finish their writes (up to 20 s), and the Lease, if held, is released.
pub async fn run(client: Client, options: Options, shutdown: impl std::future::Future<Output = ()>) {
    let ctx = context_for(client.clone(), &options);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let election = options.leader.clone().map(|lo| tokio::spawn(elect(ctx.clone(), client, lo, stop_rx.clone())));
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
    let mut workers: Vec<_> =
        (0..options.workers.max(1)).map(|_| tokio::spawn(work(ctx.clone(), stop_rx.clone()))).collect();
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

/// The context of a run: sharded when there are shards and an election, else fenced by the one
/// leader's right (or always allowed to write, without election).
fn context_for(client: Client, options: &Options) -> Arc<Context> {
    let ctx = if options.shards > 1 && options.leader.is_some() {
        Context::sharded(client, Arc::new(leader::ShardRights::new(options.shards)))
    } else {
        let leadership =
            if options.leader.is_some() { leader::Leadership::elected() } else { leader::Leadership::always() };
        Context::with_leadership(client, leadership)
    };
    ctx.ready_grace.store(options.ready_grace.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    ctx.write_index().dry_run = options.dry_run;
    ctx
}

/// Takes part in the election until `stop`: for the whole controller, or per shard.
async fn elect(ctx: Arc<Context>, client: Client, lo: leader::LeaderOptions, stop: tokio::sync::watch::Receiver<bool>) {
    let Some(rights) = ctx.writer.shards().cloned() else {
        let leadership = ctx.writer.leadership().clone();
        let on_elected = {
            let ctx = ctx.clone();
            move || {
                // A standby decided nothing and holds no wake-ups: everything is decided anew.
                let all = ctx.read_index().all_checks();
                ctx.scheduler.mark(all);
            }
        };
        return leader::run(client, lo, leadership, &ctx.metrics, stop, on_elected).await;
    };
    let on_gained = {
        let ctx = ctx.clone();
        move |shard: u32| {
            // The shard's Machines and Clusters are listed; its checks decide once they are
            // (decided by nobody here so far: all marked now).
            ctx.write_index().take_shard(shard);
            ctx.relist_capi();
            let all = ctx.read_index().all_checks();
            let mine: Vec<CheckRef> = all.into_iter().filter(|k| ctx.shard_of(k) == Some(shard)).collect();
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

/// One worker: decides the checks the scheduler hands out, one at a time, until `stop`.
async fn work(ctx: Arc<Context>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        let key = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            key = async {
                ctx.writer.leadership().wait_leading().await;
                ctx.scheduler.next().await
            } => key,
        };
        if !ctx.writer.leadership().is_leader() || !ctx.right(&key).is_leader() {
            // Lost the lease while waiting, or the check's shard is not held here: the check is
            // decided by whoever holds its Lease.
            ctx.scheduler.done(&key);
            ctx.metrics.leader(false);
            continue;
        }
        ctx.run_one(&key).await;
        ctx.scheduler.done(&key);
    }
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
