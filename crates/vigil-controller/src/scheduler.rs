//! When each check is decided: at once when an object it concerns changed (dirty), or exactly at
//! its plan's `next_wake`. No fixed rate limit and no polling; a check is never decided twice at
//! the same time, and a change during a decision makes it run again afterwards. Checks are
//! handed out first come, first served (a due wake-up queues at its due time), so a busy check
//! cannot starve the others.

use crate::clock::{Clock, SystemClock};
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use vigil_engine::target::CheckRef;

#[derive(Default)]
struct Queues {
    /// Checks to decide, oldest first; each at most once (see `queued`).
    queue: VecDeque<CheckRef>,
    queued: HashSet<CheckRef>,
    running: BTreeSet<CheckRef>,
    wakes: BTreeMap<CheckRef, Timestamp>,
}

impl Queues {
    /// Queues a check unless it is already queued; whether it was added.
    fn push(&mut self, key: CheckRef) -> bool {
        if self.queued.insert(key.clone()) {
            self.queue.push_back(key);
            true
        } else {
            false
        }
    }

    /// Puts a check whose wake-up came ahead of the checks queued by changes: a wake-up is a
    /// timeout running out, and a cold start's thousands of first verdicts must not hold it back.
    /// Each check has one wake-up at a time, so no check waits behind wake-ups forever.
    fn push_front(&mut self, key: CheckRef) {
        if !self.queued.insert(key.clone()) {
            self.queue.retain(|k| *k != key);
        }
        self.queue.push_front(key);
    }
}

/// The queue of checks to decide.
pub struct Scheduler {
    state: Mutex<Queues>,
    notify: Notify,
    /// What "due" is measured against.
    clock: Arc<dyn Clock>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }
}

impl Scheduler {
    /// A scheduler whose wake-ups fall due by `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Scheduler { state: Mutex::default(), notify: Notify::new(), clock }
    }

    /// Makes a waiting [`Scheduler::next`] read the clock again (after a test stepped it; the
    /// system clock needs no telling).
    pub fn recheck(&self) {
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks checks to be decided as soon as possible.
    pub fn mark(&self, keys: impl IntoIterator<Item = CheckRef>) {
        let mut any = false;
        {
            let mut s = self.lock();
            for k in keys {
                any |= s.push(k);
            }
        }
        if any {
            self.recheck();
        }
    }

    /// Sets (or clears) the instant a check must be decided again.
    pub fn wake_at(&self, key: &CheckRef, at: Option<Timestamp>) {
        {
            let mut s = self.lock();
            match at {
                Some(t) => s.wakes.insert(key.clone(), t),
                None => s.wakes.remove(key),
            };
        }
        self.recheck();
    }

    /// Forgets a check (it was deleted).
    pub fn forget(&self, key: &CheckRef) {
        let mut s = self.lock();
        s.wakes.remove(key);
        if s.queued.remove(key) {
            s.queue.retain(|k| k != key);
        }
    }

    /// The earliest pending wake-up, for tests and metrics.
    pub fn next_wake(&self, key: &CheckRef) -> Option<Timestamp> {
        self.lock().wakes.get(key).copied()
    }

    /// Waits for the next check to decide and marks it running.
    pub async fn next(&self) -> CheckRef {
        loop {
            let notified = self.notify.notified();
            let sleep_for = {
                let mut s = self.lock();
                let now = self.clock.now();
                let mut due: Vec<(Timestamp, CheckRef)> =
                    s.wakes.iter().filter(|(_, t)| **t <= now).map(|(k, t)| (*t, k.clone())).collect();
                due.sort();
                // The earliest due goes first: pushed to the front last.
                for (_, k) in due.into_iter().rev() {
                    s.wakes.remove(&k);
                    s.push_front(k);
                }
                let ready = s.queue.iter().position(|k| !s.running.contains(k));
                if let Some(k) = ready.and_then(|i| s.queue.remove(i)) {
                    s.queued.remove(&k);
                    s.running.insert(k.clone());
                    return k;
                }
                s.wakes.values().min().map(|t| t.duration_since(now))
            };
            match sleep_for {
                Some(d) => {
                    let d = std::time::Duration::try_from(d).unwrap_or_default();
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(d) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks a check's decision finished.
    pub fn done(&self, key: &CheckRef) {
        let again = {
            let mut s = self.lock();
            s.running.remove(key);
            s.queued.contains(key)
        };
        if again {
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TestClock;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_up_fires_exactly_when_the_clock_reaches_it() {
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let clock = Arc::new(TestClock::at(t0));
        let s = Scheduler::with_clock(clock.clone());
        let key = CheckRef::Node { name: "a".into() };
        let at = t0.checked_add(jiff::SignedDuration::from_secs(30)).expect("time");
        s.wake_at(&key, Some(at));
        let soon = Duration::from_millis(50);
        assert!(tokio::time::timeout(soon, s.next()).await.is_err(), "not due at the start");
        clock.step(Duration::from_secs(30) - Duration::from_nanos(1));
        s.recheck();
        assert!(tokio::time::timeout(soon, s.next()).await.is_err(), "not due a nanosecond before");
        clock.step(Duration::from_nanos(1));
        s.recheck();
        let got = tokio::time::timeout(soon, s.next()).await.expect("due at its instant");
        assert_eq!(got, key);
        assert_eq!(clock.now(), at);
        assert_eq!(s.next_wake(&key), None, "a fired wake-up is gone");
    }

    #[tokio::test]
    async fn a_wake_up_fires_at_its_instant_not_before() {
        let s = Scheduler::default();
        let key = CheckRef::Node { name: "a".into() };
        let at = Timestamp::now().checked_add(jiff::SignedDuration::from_millis(150)).expect("time");
        s.wake_at(&key, Some(at));
        let got = tokio::time::timeout(Duration::from_secs(2), s.next()).await.expect("woken");
        assert_eq!(got, key);
        let late = Timestamp::now().duration_since(at);
        assert!(!late.is_negative(), "woken {late:?} early");
    }

    #[tokio::test]
    async fn checks_are_served_in_the_order_they_became_due() {
        let s = Scheduler::default();
        // Machine keys sort before Node keys: the order must be arrival, not key order.
        let node = CheckRef::Node { name: "a".into() };
        let machines: Vec<CheckRef> =
            (0..3).map(|i| CheckRef::Machine { namespace: "ns".into(), name: format!("m{i}") }).collect();
        s.mark([node.clone()]);
        s.mark(machines.clone());
        let first = tokio::time::timeout(Duration::from_secs(1), s.next()).await.expect("one is ready");
        assert_eq!(first, node, "the check marked first is decided first");
        // A check marked again while busy keeps running first come, first served.
        s.mark([machines[0].clone()]);
        for m in &machines {
            assert_eq!(&tokio::time::timeout(Duration::from_secs(1), s.next()).await.expect("ready"), m);
        }
    }

    /// A cold start queues every check for its first verdicts; a check whose timeout runs out
    /// meanwhile is decided next, not after them, and due wake-ups keep their own order.
    #[tokio::test]
    async fn a_due_wake_up_goes_before_checks_queued_by_changes() {
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let clock = Arc::new(TestClock::at(t0));
        let s = Scheduler::with_clock(clock.clone());
        let busy: Vec<CheckRef> =
            (0..5).map(|i| CheckRef::Machine { namespace: "ns".into(), name: format!("m{i}") }).collect();
        s.mark(busy.clone());
        let (early, late) = (CheckRef::Node { name: "early".into() }, CheckRef::Node { name: "late".into() });
        let at = |secs| t0.checked_add(jiff::SignedDuration::from_secs(secs)).expect("time");
        s.wake_at(&late, Some(at(2)));
        s.wake_at(&early, Some(at(1)));
        // Also queued by a change, behind the others: its wake-up still moves it ahead.
        s.mark([late.clone()]);
        clock.step(Duration::from_secs(2));
        let soon = Duration::from_millis(100);
        let mut order = Vec::new();
        for _ in 0..7 {
            order.push(tokio::time::timeout(soon, s.next()).await.expect("ready"));
        }
        let mut want = vec![early, late];
        want.extend(busy);
        assert_eq!(order, want);
    }

    #[tokio::test]
    async fn a_running_check_is_not_handed_out_twice_but_runs_again_after() {
        let s = Scheduler::default();
        let key = CheckRef::Node { name: "a".into() };
        s.mark([key.clone()]);
        let first = s.next().await;
        s.mark([key.clone()]);
        assert!(tokio::time::timeout(Duration::from_millis(100), s.next()).await.is_err(), "not while running");
        s.done(&first);
        let again = tokio::time::timeout(Duration::from_secs(1), s.next()).await.expect("runs again");
        assert_eq!(again, key);
    }
}
