//! Events as series, keyed by what they say: a repeat of the same report on the same object
//! (same type, action, reason, note, regarding and related object) within [`SERIES_WINDOW`]
//! counts up the series of the Event already sent; a report whose note changed is a new Event.
//! kube's own recorder leaves the note out of its key, so every later report of a reason kept
//! the first note it sent (a postponement Event still naming an upgrade long over).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;

/// How long a report counts as a repeat of the Event sent before (client-go's series window).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// How many series are remembered at once; past that the oldest is forgotten (its next report
/// starts a new Event), so a long storm of distinct reports cannot grow the controller's memory.
const MAX_SERIES: usize = 4096;

/// What makes two reports the same Event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    warning: bool,
    action: String,
    reason: String,
    note: Option<String>,
    regarding: ObjectKey,
    related: Option<ObjectKey>,
}

/// The fields of an object reference that name the object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl ObjectKey {
    fn of(r: &ObjectReference) -> Self {
        ObjectKey {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

/// The Event a series was sent as.
#[derive(Debug, Clone)]
struct Sent {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// Who reports: written into every Event.
#[derive(Debug, Clone)]
pub struct Reporting {
    /// `reportingController`.
    pub controller: String,
    /// `reportingInstance` (the controller's name when none).
    pub instance: Option<String>,
}

/// Sends Events, counting repeats into series.
pub struct EventSeriesBook {
    client: Client,
    reporting: Reporting,
    sent: Mutex<HashMap<SeriesKey, Sent>>,
}

/// What to do with one report.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A new Event, named so.
    Create { namespace: String, name: String },
    /// The `count`th report of the Event already sent.
    Count { namespace: String, name: String, count: i32 },
}

impl EventSeriesBook {
    /// A book sending through `client` as `reporting`.
    pub fn new(client: Client, reporting: Reporting) -> Self {
        EventSeriesBook { client, reporting, sent: Mutex::new(HashMap::new()) }
    }

    /// Sends `event` about `regarding` at `now`: a new Event, or one more of the series of the
    /// same report sent within [`SERIES_WINDOW`].
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> Result<(), kube::Error> {
        let key = key_of(event, regarding);
        let step = self.step(&key, regarding, now);
        let step = match step {
            Step::Count { namespace, name, count } => {
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
                let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
                match events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => return Ok(()),
                    // Gone (the API server's Event TTL): the report starts a new Event.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        let name = event_name(regarding, &self.reporting, now);
                        self.remember(
                            key.clone(),
                            Sent { namespace: namespace.clone(), name: name.clone(), count: 1, last: now },
                        );
                        Step::Create { namespace, name }
                    }
                    Err(e) => return Err(e),
                }
            }
            create => create,
        };
        let Step::Create { namespace, name } = step else { return Ok(()) };
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let object = self.event_object(event, regarding, namespace, name, now);
        match events.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // Not sent: the next report tries a new Event rather than counting up a missing one.
                self.forget(&key);
                Err(e)
            }
        }
    }

    /// Whether the report is new or a repeat, remembering it either way.
    fn step(&self, key: &SeriesKey, regarding: &ObjectReference, now: Timestamp) -> Step {
        let mut sent = self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sent.retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
        if let Some(s) = sent.get_mut(key) {
            s.count += 1;
            s.last = now;
            return Step::Count { namespace: s.namespace.clone(), name: s.name.clone(), count: s.count };
        }
        if sent.len() >= MAX_SERIES
            && let Some(oldest) = sent.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone())
        {
            sent.remove(&oldest);
        }
        let namespace = regarding.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
        let name = event_name(regarding, &self.reporting, now);
        sent.insert(key.clone(), Sent { namespace: namespace.clone(), name: name.clone(), count: 1, last: now });
        Step::Create { namespace, name }
    }

    fn remember(&self, key: SeriesKey, s: Sent) {
        self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, s);
    }

    fn forget(&self, key: &SeriesKey) {
        self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(key);
    }

    fn event_object(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        namespace: String,
        name: String,
        now: Timestamp,
    ) -> K8sEvent {
        let controller = self.reporting.controller.clone();
        K8sEvent {
            metadata: ObjectMeta { namespace: Some(namespace), name: Some(name), ..Default::default() },
            event_time: Some(MicroTime(now)),
            type_: Some(if event.type_ == EventType::Warning { "Warning" } else { "Normal" }.into()),
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_instance: Some(self.reporting.instance.clone().unwrap_or_else(|| controller.clone())),
            reporting_controller: Some(controller),
            series: None::<EventSeries>,
            ..Default::default()
        }
    }
}

/// A new Event's name: the object's name and the time, as the API server's own events are named.
fn event_name(regarding: &ObjectReference, reporting: &Reporting, now: Timestamp) -> String {
    let base = regarding.name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&reporting.controller);
    format!("{base}.{:x}", now.as_nanosecond())
}

fn key_of(event: &Event, regarding: &ObjectReference) -> SeriesKey {
    SeriesKey {
        warning: event.type_ == EventType::Warning,
        action: event.action.clone(),
        reason: event.reason.clone(),
        note: event.note.clone(),
        regarding: ObjectKey::of(regarding),
        related: event.secondary.as_ref().map(ObjectKey::of),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> EventSeriesBook {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        EventSeriesBook::new(client, Reporting { controller: "vigil".into(), instance: None })
    }

    fn check() -> ObjectReference {
        ObjectReference {
            api_version: Some("vigil.dev/v1alpha1".into()),
            kind: Some("NodeHealthCheck".into()),
            name: Some("workers".into()),
            uid: Some("u1".into()),
            ..Default::default()
        }
    }

    fn postponed(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "RemediationSkipped".into(),
            note: Some(note.into()),
            action: "Postpone".into(),
            secondary: None,
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    #[tokio::test]
    async fn a_changed_note_is_a_new_event_and_a_repeat_counts_up_its_series() {
        let book = book();
        let (a, b) =
            (key_of(&postponed("upgrade to 4.19.1"), &check()), key_of(&postponed("upgrade to 4.19.2"), &check()));
        let first = book.step(&a, &check(), at(0));
        assert!(
            matches!(&first, Step::Create { namespace, name } if namespace == "default" && name.starts_with("workers."))
        );
        let Step::Create { name: first_name, .. } = first else { unreachable!() };
        assert_eq!(
            book.step(&a, &check(), at(10)),
            Step::Count { namespace: "default".into(), name: first_name.clone(), count: 2 }
        );
        let other = book.step(&b, &check(), at(20));
        assert!(matches!(&other, Step::Create { name, .. } if *name != first_name), "{other:?}");
        // The first cause again, within the window: still its own series.
        assert!(matches!(book.step(&a, &check(), at(30)), Step::Count { count: 3, .. }));
    }

    #[tokio::test]
    async fn a_report_after_the_window_starts_a_new_event() {
        let book = book();
        let a = key_of(&postponed("upgrade"), &check());
        book.step(&a, &check(), at(0));
        assert!(matches!(book.step(&a, &check(), at(359)), Step::Count { count: 2, .. }));
        assert!(matches!(book.step(&a, &check(), at(359 + 360)), Step::Create { .. }));
    }

    #[tokio::test]
    async fn the_book_stays_bounded() {
        let book = book();
        for i in 0..(MAX_SERIES + 10) {
            let k = key_of(&postponed(&format!("cause {i}")), &check());
            book.step(&k, &check(), at(i64::try_from(i).expect("small") / 100));
        }
        assert_eq!(book.sent.lock().expect("lock").len(), MAX_SERIES);
        // The newest survives.
        let newest = key_of(&postponed(&format!("cause {}", MAX_SERIES + 9)), &check());
        assert!(matches!(book.step(&newest, &check(), at(200)), Step::Count { .. }));
    }
}
