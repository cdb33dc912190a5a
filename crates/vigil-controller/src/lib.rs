//! `vigil run`: the controller. It gathers observed state from watches into in-memory indexes,
//! calls the engine for each check that a change concerns or whose wake-up is due, and applies
//! the plans. It decides nothing itself: every rule is in `vigil-engine`. Every write goes out
//! through the one [`Writer`] the [`Context`] holds ([`writer`]); [`apply`] and [`medik8s`] say
//! which writes a plan makes and put their answers into the index.

pub mod apply;
pub mod clock;
pub mod confirm;
pub mod context;
pub mod events;
pub mod fenced;
pub mod guards;
pub mod http;
pub mod leader;
pub mod medik8s;
pub mod metrics;
pub mod run_loop;
pub mod scheduler;
pub mod sources;
pub mod surroundings;
pub mod watch;
pub mod wire;
pub mod workload;
pub mod writer;
pub mod writes;

pub use context::{Context, EVENT_LANE};
pub use writer::Writer;

use kube::Client;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
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
    ctx.write_index().set_lease_namespace(options.lease_namespace.clone());
    if options.serve_medik8s {
        medik8s::start(&ctx);
    }
    watch::start_fixed(&ctx).await;
    surroundings::start(&ctx).await;
    if let Some(addr) = options.metrics_addr {
        tokio::spawn(http::serve(ctx.clone(), addr));
    }
    let mut workers: Vec<_> =
        (0..options.workers.max(1)).map(|_| tokio::spawn(run_loop::work(ctx.clone(), stop_rx.clone()))).collect();
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
    ctx.write_index().set_dry_run(options.dry_run);
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
