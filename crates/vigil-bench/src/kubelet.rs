//! The benchmark plays the kubelet: a steady stream of heartbeats (a `lastHeartbeatTime`
//! update on every Node once per period, spread evenly), then a failure wave in which chosen
//! Nodes go `Ready=Unknown` and stop heartbeating.

use crate::fleet::{node_conditions, node_name, time};
use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the heartbeat loop sends what is due.
const TICK: Duration = Duration::from_millis(100);
/// Heartbeats in flight at once.
const CONCURRENCY: usize = 16;

const IDLE: u8 = 0;
const BEATING: u8 = 1;
const FAILED: u8 = 2;

/// The simulated kubelets of the whole fleet.
pub struct Kubelets {
    api: Api<Node>,
    /// Per Node: idle, a heartbeat in flight, or failed (so a heartbeat never lands after the
    /// failure it would hide).
    state: Vec<AtomicU8>,
    /// When every Node became Ready (its conditions' lastTransitionTime).
    since: String,
    /// Heartbeats sent successfully.
    pub sent: AtomicU64,
    /// Heartbeats the API server refused or that failed in transit.
    pub errors: AtomicU64,
}

/// One Node of the failure wave: when its Ready condition changed, as written.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Target index.
    pub index: usize,
    /// The `lastTransitionTime` written (second precision).
    pub since: Timestamp,
}

impl Kubelets {
    /// Kubelets for `n` Nodes that have been Ready since `since`.
    pub fn new(api: Api<Node>, n: usize, since: String) -> Arc<Kubelets> {
        Arc::new(Kubelets {
            api,
            state: (0..n).map(|_| AtomicU8::new(IDLE)).collect(),
            since,
            sent: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    /// Heartbeats every Node once per `period`, evenly spread, until the task is aborted.
    pub fn spawn_heartbeats(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let n = me.state.len() as u64;
            let start = Instant::now();
            let mut cursor = 0u64;
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() / period.as_secs_f64() * n as f64) as u64;
                let batch = (cursor..due).map(|k| (k % n) as usize);
                cursor = due.max(cursor);
                futures::stream::iter(batch).for_each_concurrent(CONCURRENCY, |i| me.heartbeat(i)).await;
            }
        })
    }

    async fn heartbeat(&self, i: usize) {
        if self.state[i].compare_exchange(IDLE, BEATING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        let now = time(Timestamp::now());
        let patch = json!({"status": {"conditions": node_conditions(true, &now, &self.since)}});
        match self.api.patch_status(&node_name(i), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => self.sent.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.errors.fetch_add(1, Ordering::Relaxed),
        };
        self.state[i].store(IDLE, Ordering::Release);
    }

    /// Fails each `(index, offset)` Node at `start + offset`: it stops heartbeating and its
    /// conditions go Unknown. Returns what was written, or the first error.
    pub async fn fail(self: &Arc<Self>, plan: Vec<(usize, Duration)>, start: Instant) -> anyhow::Result<Vec<Failure>> {
        let tasks = plan.into_iter().map(|(i, offset)| {
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until((start + offset).into()).await;
                while me.state[i].compare_exchange(IDLE, FAILED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let now = Timestamp::now();
                let since = Timestamp::from_second(now.as_second())?;
                let patch = json!({"status": {"conditions": node_conditions(false, &time(now), &since.to_string())}});
                me.api
                    .patch_status(&node_name(i), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot fail {}: {e}", node_name(i)))?;
                anyhow::Ok(Failure { index: i, since })
            })
        });
        let mut out = Vec::new();
        for task in futures::future::join_all(tasks).await {
            out.push(task??);
        }
        Ok(out)
    }
}

/// Which targets fail: `percent`% of `n`, spread evenly over the index range (so over every
/// check), each with its moment within `wave`, in a shuffled (but fixed) order.
pub fn wave_plan(n: usize, percent: f64, wave: Duration) -> Vec<(usize, Duration)> {
    let count = ((n as f64) * percent / 100.0).round() as usize;
    if count == 0 {
        return Vec::new();
    }
    let stride = n as f64 / count as f64;
    let mut chosen: Vec<usize> = (0..count).map(|k| ((k as f64 + 0.5) * stride) as usize).collect();
    // Fisher–Yates with a fixed xorshift seed: the same plan every run.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for k in (1..chosen.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chosen.swap(k, (x % (k as u64 + 1)) as usize);
    }
    chosen.into_iter().enumerate().map(|(k, i)| (i, wave.mul_f64(k as f64 / count as f64))).collect()
}

/// Which targets fail during the cold start (`--cold-wave`): `count` of `n`, spread evenly,
/// none of the main `wave`'s, all at `at` after the controller starts.
pub fn cold_wave_plan(n: usize, count: usize, wave: &[(usize, Duration)], at: Duration) -> Vec<(usize, Duration)> {
    let taken: std::collections::BTreeSet<usize> = wave.iter().map(|(i, _)| *i).collect();
    let count = count.min(n.saturating_sub(taken.len()));
    let mut chosen = std::collections::BTreeSet::new();
    for k in 0..count {
        let mut i = ((k as f64 + 0.25) * n as f64 / count as f64) as usize % n;
        while taken.contains(&i) || chosen.contains(&i) {
            i = (i + 1) % n;
        }
        chosen.insert(i);
    }
    chosen.into_iter().map(|i| (i, at)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cold_wave_fails_its_count_and_none_of_the_wave() {
        let wave = wave_plan(10_000, 5.0, Duration::from_secs(10));
        let cold = cold_wave_plan(10_000, 50, &wave, Duration::from_secs(1));
        assert_eq!(cold.len(), 50);
        let waved: std::collections::BTreeSet<usize> = wave.iter().map(|(i, _)| *i).collect();
        assert!(cold.iter().all(|(i, at)| !waved.contains(i) && *i < 10_000 && *at == Duration::from_secs(1)));
        let spread: std::collections::BTreeSet<usize> = cold.iter().map(|(i, _)| i / 1000).collect();
        assert_eq!(spread.len(), 10, "spread over the fleet (so over the checks)");
    }

    #[test]
    fn the_wave_fails_the_asked_share_once_each_within_the_window() {
        let plan = wave_plan(10_000, 5.0, Duration::from_secs(10));
        assert_eq!(plan.len(), 500);
        let mut seen: Vec<usize> = plan.iter().map(|(i, _)| *i).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 500, "no Node fails twice");
        assert!(seen.iter().all(|&i| i < 10_000));
        assert!(plan.iter().all(|(_, at)| *at < Duration::from_secs(10)));
        // Spread over the whole range: every 20th target, so every check of 50 has some.
        assert!(seen.windows(2).all(|w| w[1] - w[0] == 20));
        assert_eq!(plan, wave_plan(10_000, 5.0, Duration::from_secs(10)), "the same plan every run");
        assert!(wave_plan(10, 0.0, Duration::from_secs(1)).is_empty());
    }
}
