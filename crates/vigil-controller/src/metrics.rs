//! Prometheus metrics: how much Vigil decides and writes, and how long it takes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// Every metric, registered once.
pub struct Metrics {
    registry: Registry,
    decisions: Counter,
    decide_seconds: Histogram,
    apply_seconds: Histogram,
    writes: Family<KindLabel, Counter>,
    write_errors: Family<KindLabel, Counter>,
    watch_events: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("vigil");
        let decisions = Counter::default();
        let decide_seconds = Histogram::new(exponential_buckets(1e-5, 4.0, 10));
        let apply_seconds = Histogram::new(exponential_buckets(1e-3, 2.0, 14));
        let writes = Family::<KindLabel, Counter>::default();
        let write_errors = Family::<KindLabel, Counter>::default();
        let watch_events = Counter::default();
        registry.register("decisions", "Health-check decisions made", decisions.clone());
        registry.register("decide_seconds", "Time to gather state and decide one check", decide_seconds.clone());
        registry.register("apply_seconds", "Time to apply one plan's writes", apply_seconds.clone());
        registry.register("writes", "Writes to the API server, by kind", writes.clone());
        registry.register("write_errors", "Failed writes, by category", write_errors.clone());
        registry.register("watch_events", "Watch events received", watch_events.clone());
        Metrics { registry, decisions, decide_seconds, apply_seconds, writes, write_errors, watch_events }
    }
}

impl Metrics {
    /// Counts a decision and its duration.
    pub fn decided(&self, seconds: f64) {
        self.decisions.inc();
        self.decide_seconds.observe(seconds);
    }

    /// Records how long a plan's writes took.
    pub fn apply_seconds(&self, seconds: f64) {
        self.apply_seconds.observe(seconds);
    }

    /// Counts a write.
    pub fn writes(&self, kind: &str) {
        self.writes.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    /// Counts a failed write.
    pub fn write_error(&self, category: &str) {
        self.write_errors.get_or_create(&KindLabel { kind: category.into() }).inc();
    }

    /// Counts a watch event.
    pub fn watch_event(&self) {
        self.watch_events.inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
