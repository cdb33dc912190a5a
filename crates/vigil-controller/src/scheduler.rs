//! When each check is decided: at once when an object it concerns changed (dirty), or exactly at
//! its plan's `next_wake`. No fixed rate limit and no polling; a check is never decided twice at
//! the same time, and a change during a decision makes it run again afterwards.

use crate::index::CheckKey;
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    dirty: BTreeSet<CheckKey>,
    running: BTreeSet<CheckKey>,
    wakes: BTreeMap<CheckKey, Timestamp>,
}

/// The queue of checks to decide.
#[derive(Default)]
pub struct Scheduler {
    state: Mutex<State>,
    notify: Notify,
}

impl Scheduler {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks checks to be decided as soon as possible.
    pub fn mark(&self, keys: impl IntoIterator<Item = CheckKey>) {
        let mut any = false;
        {
            let mut s = self.lock();
            for k in keys {
                any |= s.dirty.insert(k);
            }
        }
        if any {
            self.notify.notify_waiters();
            self.notify.notify_one();
        }
    }

    /// Sets (or clears) the instant a check must be decided again.
    pub fn wake_at(&self, key: &CheckKey, at: Option<Timestamp>) {
        {
            let mut s = self.lock();
            match at {
                Some(t) => s.wakes.insert(key.clone(), t),
                None => s.wakes.remove(key),
            };
        }
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Forgets a check (it was deleted).
    pub fn forget(&self, key: &CheckKey) {
        let mut s = self.lock();
        s.wakes.remove(key);
        s.dirty.remove(key);
    }

    /// The earliest pending wake-up, for tests and metrics.
    pub fn next_wake(&self, key: &CheckKey) -> Option<Timestamp> {
        self.lock().wakes.get(key).copied()
    }

    /// Waits for the next check to decide and marks it running.
    pub async fn next(&self) -> CheckKey {
        loop {
            let notified = self.notify.notified();
            let sleep_for = {
                let mut s = self.lock();
                let now = Timestamp::now();
                let due: Vec<CheckKey> = s.wakes.iter().filter(|(_, t)| **t <= now).map(|(k, _)| k.clone()).collect();
                for k in due {
                    s.wakes.remove(&k);
                    s.dirty.insert(k);
                }
                let ready = s.dirty.iter().find(|k| !s.running.contains(*k)).cloned();
                if let Some(k) = ready {
                    s.dirty.remove(&k);
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
    pub fn done(&self, key: &CheckKey) {
        let again = {
            let mut s = self.lock();
            s.running.remove(key);
            s.dirty.contains(key)
        };
        if again {
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_up_fires_at_its_instant_not_before() {
        let s = Scheduler::default();
        let key = CheckKey::Node("a".into());
        let at = Timestamp::now().checked_add(jiff::SignedDuration::from_millis(150)).expect("time");
        s.wake_at(&key, Some(at));
        let got = tokio::time::timeout(Duration::from_secs(2), s.next()).await.expect("woken");
        assert_eq!(got, key);
        let late = Timestamp::now().duration_since(at);
        assert!(!late.is_negative(), "woken {late:?} early");
    }

    #[tokio::test]
    async fn a_running_check_is_not_handed_out_twice_but_runs_again_after() {
        let s = Scheduler::default();
        let key = CheckKey::Node("a".into());
        s.mark([key.clone()]);
        let first = s.next().await;
        s.mark([key.clone()]);
        assert!(tokio::time::timeout(Duration::from_millis(100), s.next()).await.is_err(), "not while running");
        s.done(&first);
        let again = tokio::time::timeout(Duration::from_secs(1), s.next()).await.expect("runs again");
        assert_eq!(again, key);
    }
}
