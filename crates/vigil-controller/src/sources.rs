//! Whether each watched source can be trusted, and watches that always recover.
//!
//! A watch that fails is never resumed from where it was: it is started again with a complete
//! list, so after any error (a reset connection, a compacted history, an API server restart) the
//! cache is rebuilt from a consistent read before a decision trusts it again. The API server is
//! also probed on a short period: when it cannot be reached, every watch is started again (a
//! partition does not break a connection, so a watch alone would not notice), and nothing is
//! decided until the new lists arrive.

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use vigil_index::sources::{Need, SourceState};

/// How long a source may be not live before `/readyz` says so.
pub const READY_GRACE: Duration = Duration::from_secs(30);
/// The first delay before a failed watch starts again; it doubles up to [`MAX_RESTART_DELAY`].
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(250);
/// The longest delay between two starts of a failing watch.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);

/// One item of a [`relisting`] stream: a watch event, or why the watch stopped (it starts again
/// by itself, with a new list).
pub type Item<K> = Result<Event<K>, String>;

/// The delay before the `n`th restart in a row (n ≥ 1), with jitter so that many watches failing
/// at once do not come back at once.
pub fn restart_delay(n: u32) -> Duration {
    let base = FIRST_RESTART_DELAY.saturating_mul(1u32 << n.saturating_sub(1).min(10)).min(MAX_RESTART_DELAY);
    let jitter_ms = u64::from(std::process::id().wrapping_add(n.wrapping_mul(7919))) % 100;
    base + Duration::from_millis(jitter_ms)
}

/// A watch of `api` that starts again with a complete list after any error, after the end of
/// its stream, and whenever `epoch` changes (the API server was found unreachable).
pub fn relisting<K>(
    api: Api<K>,
    config: watcher::Config,
    epoch: tokio::sync::watch::Receiver<u64>,
) -> impl Stream<Item = Item<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    relisting_also_on(api, config, epoch, None)
}

/// [`relisting`], which also starts again with a complete list, without an error (what the
/// watch held stays trusted until the list replaces it), whenever `quiet` changes.
pub fn relisting_also_on<K>(
    api: Api<K>,
    config: watcher::Config,
    epoch: tokio::sync::watch::Receiver<u64>,
    quiet: Option<tokio::sync::watch::Receiver<u64>>,
) -> impl Stream<Item = Item<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    struct WatchState<K: Resource + Clone + DeserializeOwned + Debug + Send + 'static> {
        api: Api<K>,
        config: watcher::Config,
        epoch: tokio::sync::watch::Receiver<u64>,
        quiet: Option<tokio::sync::watch::Receiver<u64>>,
        inner: Option<futures::stream::BoxStream<'static, Result<Event<K>, watcher::Error>>>,
        failures: u32,
    }
    let state = WatchState { api, config, epoch, quiet, inner: None, failures: 0 };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            let inner = match st.inner.as_mut() {
                Some(inner) => inner,
                None => {
                    if st.failures > 0 {
                        tokio::time::sleep(restart_delay(st.failures)).await;
                    }
                    st.epoch.borrow_and_update();
                    if let Some(q) = st.quiet.as_mut() {
                        q.borrow_and_update();
                    }
                    // The watcher's own retries would resume without a list: it is used for one
                    // run only, and every error ends that run.
                    st.inner.insert(watcher::watcher(st.api.clone(), st.config.clone()).boxed())
                }
            };
            let quiet = async {
                match st.quiet.as_mut() {
                    Some(q) => q.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                next = inner.next() => next,
                true = quiet => {
                    // Listed again on request: no error, the watch just starts over.
                    st.inner = None;
                    continue;
                }
                changed = st.epoch.changed() => {
                    st.inner = None;
                    st.failures = st.failures.saturating_add(1);
                    if changed.is_err() {
                        // The prober is gone (shutting down): nothing more to watch.
                        return None;
                    }
                    return Some((Err("the API server could not be reached; listing again".to_string()), st));
                }
            };
            match next {
                Some(Ok(event)) => {
                    if matches!(event, Event::InitDone) {
                        st.failures = 0;
                    }
                    return Some((Ok(event), st));
                }
                Some(Err(e)) => {
                    st.inner = None;
                    st.failures = st.failures.saturating_add(1);
                    return Some((Err(e.to_string()), st));
                }
                None => {
                    st.inner = None;
                    st.failures = st.failures.saturating_add(1);
                }
            }
        }
    })
}

/// The health of one source, as `/readyz` and the metrics report it.
#[derive(Debug, Clone)]
pub struct SourceHealth {
    /// Listed and watching.
    pub synced: bool,
    /// Since when `synced` has had its value.
    pub since: Instant,
    /// How often the watch started again after an error.
    pub restarts: u64,
    /// The last error, for the operator.
    pub last_error: Option<String>,
    /// Whether the controller's readiness depends on it (a tenant's unreachable workload cluster
    /// must not make the controller unready).
    pub counts_for_readiness: bool,
}

/// Every source's health, by name.
#[derive(Debug, Default)]
pub struct Registry {
    sources: Mutex<BTreeMap<String, SourceHealth>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SourceHealth>> {
        self.sources.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a source that has not listed yet.
    pub fn register(&self, name: &str, counts_for_readiness: bool) {
        self.lock().entry(name.to_string()).or_insert(SourceHealth {
            synced: false,
            since: Instant::now(),
            restarts: 0,
            last_error: None,
            counts_for_readiness,
        });
    }

    /// Records a complete list.
    pub fn synced(&self, name: &str) {
        let mut all = self.lock();
        if let Some(h) = all.get_mut(name)
            && !h.synced
        {
            h.synced = true;
            h.since = Instant::now();
        }
    }

    /// Records a watch failure (the watch starts again).
    pub fn failed(&self, name: &str, error: &str) {
        let mut all = self.lock();
        if let Some(h) = all.get_mut(name) {
            if h.synced {
                h.synced = false;
                h.since = Instant::now();
            }
            h.restarts = h.restarts.saturating_add(1);
            h.last_error = Some(error.to_string());
        }
    }

    /// Forgets a source that is no longer watched (a workload cluster's Nodes).
    pub fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// A copy of every source's health.
    pub fn snapshot(&self) -> BTreeMap<String, SourceHealth> {
        self.lock().clone()
    }

    /// The sources that keep the controller from being ready: not live for longer than `grace`.
    pub fn not_ready(&self, grace: Duration) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, h)| h.counts_for_readiness && !h.synced && h.since.elapsed() > grace)
            .map(|(name, h)| match &h.last_error {
                Some(e) => format!("{name}: not live for {}s ({e})", h.since.elapsed().as_secs()),
                None => format!("{name}: not listed for {}s", h.since.elapsed().as_secs()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delays_grow_and_stay_bounded() {
        let d: Vec<Duration> = (1..12).map(restart_delay).collect();
        assert!(d[0] >= FIRST_RESTART_DELAY && d[0] < FIRST_RESTART_DELAY + Duration::from_millis(100));
        assert!(d[2] >= Duration::from_secs(1));
        assert!(d.iter().all(|x| *x < MAX_RESTART_DELAY + Duration::from_millis(100)), "{d:?}");
    }

    #[test]
    fn readiness_waits_out_the_grace_period_and_ignores_tenant_sources() {
        let r = Registry::default();
        r.register("Nodes", true);
        r.register("Nodes of workload cluster t/x", false);
        assert!(r.not_ready(Duration::from_secs(60)).is_empty(), "a new source has its grace period");
        assert_eq!(r.not_ready(Duration::ZERO).len(), 1, "only the source that counts");
        r.synced("Nodes");
        assert!(r.not_ready(Duration::ZERO).is_empty());
        r.failed("Nodes", "connection reset");
        let why = r.not_ready(Duration::ZERO);
        assert!(why[0].contains("connection reset"), "{why:?}");
        assert_eq!(r.snapshot()["Nodes"].restarts, 1);
        r.synced("Nodes");
        assert!(r.not_ready(Duration::ZERO).is_empty(), "trusted again after a new list");
    }
}
