//! `vigil run`: the controller. It gathers observed state from watches into in-memory indexes,
//! calls the engine for each check that a change concerns or whose wake-up is due, and applies
//! the plans. It decides nothing itself: every rule is in `vigil-engine`.

pub mod apply;
pub mod index;
pub mod metrics;
pub mod reconcile;
pub mod scheduler;
pub mod watch;

use index::{CheckKey, Index};
use jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::events::{Recorder, Reporter};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use tracing::{debug, warn};

/// Settings of a controller run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many checks are decided and applied at once.
    pub workers: usize,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl Default for Options {
    fn default() -> Self {
        Options { workers: 16, metrics_addr: None }
    }
}

/// What every task of the controller shares.
pub struct Context {
    /// Client of the cluster Vigil runs in.
    pub client: Client,
    /// The indexes (short, non-async critical sections only).
    pub index: RwLock<Index>,
    /// Which check to decide next, and when.
    pub scheduler: scheduler::Scheduler,
    /// Event publisher.
    pub recorder: Recorder,
    /// Discovered API resources.
    pub resources: tokio::sync::Mutex<HashMap<GroupVersionKind, ApiResource>>,
    /// Watches already started for checks' needs.
    pub started: tokio::sync::Mutex<BTreeSet<reconcile::Need>>,
    /// Metrics.
    pub metrics: metrics::Metrics,
    failures: std::sync::Mutex<HashMap<CheckKey, u32>>,
}

impl Context {
    /// A new context for `client`.
    pub fn new(client: Client) -> Arc<Self> {
        let reporter = Reporter { controller: "vigil".into(), instance: std::env::var("POD_NAME").ok() };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            index: RwLock::new(Index::default()),
            scheduler: scheduler::Scheduler::default(),
            resources: tokio::sync::Mutex::new(HashMap::new()),
            started: tokio::sync::Mutex::new(BTreeSet::new()),
            metrics: metrics::Metrics::default(),
            failures: std::sync::Mutex::new(HashMap::new()),
        })
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
    pub async fn run_one(self: &Arc<Self>, key: &CheckKey) {
        let started = std::time::Instant::now();
        let now = Timestamp::now();
        let job = {
            let idx = self.read_index();
            reconcile::job(&idx, key, now)
        };
        let Some(job) = job else {
            self.scheduler.forget(key);
            return;
        };
        self.metrics.decided(started.elapsed().as_secs_f64());
        for need in job.needs.clone() {
            watch::ensure(self, need).await;
        }
        let next_wake = job.next_wake;
        match self.apply(job).await {
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
                let retry = Timestamp::now().checked_add(backoff).ok();
                let at = match (retry, next_wake) {
                    (Some(r), Some(w)) => Some(r.min(w)),
                    (r, w) => r.or(w),
                };
                warn!(check = %key, error = %e, retry_in = %backoff, "plan not fully applied");
                self.scheduler.wake_at(key, at);
            }
        }
        debug!(check = %key, elapsed_ms = started.elapsed().as_millis() as u64, "decided");
    }

    fn lock_failures(&self) -> std::sync::MutexGuard<'_, HashMap<CheckKey, u32>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs the controller until `shutdown` completes.
pub async fn run(client: Client, options: Options, shutdown: impl std::future::Future<Output = ()>) {
    let ctx = Context::new(client);
    watch::start_fixed(&ctx).await;
    if let Some(addr) = options.metrics_addr {
        tokio::spawn(serve_metrics(ctx.clone(), addr));
    }
    let mut workers = Vec::new();
    for _ in 0..options.workers.max(1) {
        let ctx = ctx.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let key = ctx.scheduler.next().await;
                ctx.run_one(&key).await;
                ctx.scheduler.done(&key);
            }
        }));
    }
    shutdown.await;
    for w in workers {
        w.abort();
    }
}

/// Serves `/metrics` (and answers every other path with it too: it is the only page).
async fn serve_metrics(ctx: Arc<Context>, addr: std::net::SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(%addr, error = %e, "metrics endpoint not served");
            return;
        }
    };
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { continue };
        let body = ctx.metrics.render();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}
