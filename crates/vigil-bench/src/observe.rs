//! What the benchmark sees of the controller's work, through its own watches: when each
//! remediation write became visible, and which Machines carry a health verdict.

use crate::fleet::{NS, machine_resource, remediation_resource};
use futures::StreamExt as _;
use jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

/// Everything seen so far.
#[derive(Default)]
pub struct Seen {
    /// Machines whose `HealthCheckSucceeded` is True (the controller has evaluated them).
    pub verdicts: HashSet<String>,
    /// First moment a remediation write was visible, per Machine name (MHC: `OwnerRemediated`
    /// set) or Node name (NHC: a remediation object created for it).
    pub remediated: HashMap<String, Timestamp>,
    /// Watch errors (each one is a re-list; a late first sight would overstate a latency).
    pub watch_errors: u64,
}

/// Shared handle to [`Seen`].
#[derive(Clone, Default)]
pub struct Observer(Arc<Mutex<Seen>>);

impl Observer {
    /// Locks the observations.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the two watches (Machines and remediation objects in the bench namespace).
    pub fn spawn(&self, client: kube::Client) -> Vec<tokio::task::JoinHandle<()>> {
        let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &machine_resource());
        let remediations: Api<DynamicObject> = Api::namespaced_with(client, NS, &remediation_resource());
        vec![
            tokio::spawn(self.clone().run(machines, on_machine)),
            tokio::spawn(self.clone().run(remediations, on_remediation)),
        ]
    }

    async fn run(self, api: Api<DynamicObject>, on: fn(&mut Seen, &DynamicObject, Timestamp)) {
        let stream = watcher::watcher(api, watcher::Config::default().page_size(500)).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let now = Timestamp::now();
            let mut seen = self.lock();
            match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) => on(&mut seen, &o, now),
                Ok(_) => {}
                Err(_) => seen.watch_errors += 1,
            }
        }
    }
}

fn condition<'a>(o: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    o.data.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

fn on_machine(seen: &mut Seen, o: &DynamicObject, now: Timestamp) {
    let Some(name) = o.metadata.name.clone() else { return };
    // A verdict either way: with `--cold-wave`, some Machines' first verdict is False.
    if condition(o, "HealthCheckSucceeded").is_some_and(|c| c["status"] == "True" || c["status"] == "False") {
        seen.verdicts.insert(name.clone());
    }
    if condition(o, "OwnerRemediated").is_some() {
        seen.remediated.entry(name).or_insert(now);
    }
}

fn on_remediation(seen: &mut Seen, o: &DynamicObject, now: Timestamp) {
    let node = o
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("remediation.medik8s.io/node-name").cloned())
        .or_else(|| o.metadata.name.clone());
    if let Some(node) = node {
        seen.remediated.entry(node).or_insert(now);
    }
}
