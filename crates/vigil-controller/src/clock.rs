//! The controller's clock, injected so a test can step time: the wall-clock instant a decision
//! is made at (`now` for the engine, wake-ups, the detection-latency metric) and a monotonic
//! instant for measuring how long something took.
//!
//! Not everything reads it. Leader election ([`crate::leader`]) and `/readyz` grace
//! ([`crate::sources`]) measure real elapsed time against a Lease and a probe: a stepped wall
//! clock there would claim or drop a Lease the API server never agreed to. Timeouts and sleeps
//! are tokio's timers (a test pauses those with tokio's own test clock), and the scheduler
//! sleeps on tokio time for the gap its clock reports; [`crate::scheduler::Scheduler::recheck`]
//! makes it read the clock again after a step.

use jiff::{SignedDuration, Timestamp};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the controller reads the time from.
pub trait Clock: Send + Sync {
    /// The wall-clock instant now.
    fn now(&self) -> Timestamp;
    /// A monotonic instant now, for durations.
    fn instant(&self) -> Instant;
}

/// The system's clocks (`vigil run`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until a test steps it (both readings move together).
#[derive(Debug)]
pub struct TestClock {
    wall: Timestamp,
    mono: Instant,
    elapsed: Mutex<Duration>,
}

impl TestClock {
    /// A clock standing at `wall`.
    pub fn at(wall: Timestamp) -> Self {
        TestClock { wall, mono: Instant::now(), elapsed: Mutex::new(Duration::ZERO) }
    }

    /// Moves the clock forward by `by`.
    pub fn step(&self, by: Duration) {
        let mut elapsed = self.elapsed.lock().unwrap_or_else(|p| p.into_inner());
        *elapsed = elapsed.saturating_add(by);
    }

    fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        let by = SignedDuration::try_from(self.elapsed()).unwrap_or(SignedDuration::MAX);
        self.wall.checked_add(by).unwrap_or(Timestamp::MAX)
    }

    fn instant(&self) -> Instant {
        self.mono.checked_add(self.elapsed()).unwrap_or(self.mono)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_clock_moves_only_when_stepped() {
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let clock = TestClock::at(t0);
        let i0 = clock.instant();
        assert_eq!(clock.now(), t0);
        clock.step(Duration::from_secs(90));
        assert_eq!(clock.now(), "2030-01-01T00:01:30Z".parse::<Timestamp>().expect("time"));
        assert_eq!(clock.instant().duration_since(i0), Duration::from_secs(90));
    }
}
