//! The run loop: each worker takes the next check the scheduler hands out, decides it
//! ([`vigil_index::gather`], [`crate::confirm`]), applies its plan ([`crate::apply`]) and does what
//! follows a decision: the claims cached for the others, the holders told, a failed write tried
//! again later, the watches a check needs started.

use crate::context::Context;
use crate::{confirm, sources, watch, workload, writes};
use jiff::SignedDuration;
use std::sync::Arc;
use tracing::{debug, warn};
use vigil_engine::target::CheckRef;
use vigil_index::gather;

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
        vigil_index::decision::pace_verdicts(&mut job, vigil_index::decision::VERDICTS_PER_RUN);
        self.metrics.check(key, &crate::metrics::Gauges::of_job(&job));
        let next_wake = job.plan.next_wake;
        let again = job.again;
        let held_elsewhere = std::mem::take(&mut job.plan.held_elsewhere);
        let result = self.apply(job).await;
        // What this check now remediates, for the others' decisions; updated before the
        // confirmation locks are released, so a check waiting on one sees it when it decides again.
        self.cache_claims(key);
        self.confirming.unlock(key, &locked);
        self.tell_holders(held_elsewhere);
        if again {
            // Remediations left out while confirming (new targets, or held by another check).
            self.scheduler.mark([key.clone()]);
        }
        match result {
            Ok(()) => {
                self.failures.succeeded(key);
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
        let failures = self.failures.failed(key);
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
        let wake = vigil_index::decision::cache_claims(&mut self.write_index(), key);
        self.scheduler.mark(wake);
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
                let uid = this.read_index().uid_of(&key);
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
            sources::Need::WorkloadCluster(cluster) => {
                tokio::spawn(async move { workload::keep_connected(ctx, cluster).await });
            }
        }
    }
}

/// One worker: decides the checks the scheduler hands out, one at a time, until `stop`.
pub async fn work(ctx: Arc<Context>, mut stop: tokio::sync::watch::Receiver<bool>) {
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
