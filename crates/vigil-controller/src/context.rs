//! What every task of the controller shares: the client it reads with, the indexes, the
//! scheduler, the clock, the metrics, the small locks that keep two decisions of the same target
//! apart, and the [`Writer`]. It holds state and answers questions about it; it decides nothing
//! and writes only through its writer (the run loop is the crate root; which writes a plan makes
//! and what their answers change in the index are [`crate::apply`] and [`crate::medik8s`]; the
//! writes themselves are [`crate::writer`]).

use crate::writer::Writer;
use crate::{clock, guards, leader, metrics, scheduler, sources, wire};
use kube::Client;
use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use tracing::warn;
use vigil_engine::target::CheckRef;
use vigil_index::index::Index;
use vigil_index::sources::ClusterRef;

pub use crate::writer::EVENT_LANE;

/// What every task of the controller shares.
pub struct Context {
    /// Client of the cluster Vigil runs in, for reads (watches, confirming reads, probes).
    pub client: Client,
    /// Every write goes through it: fenced, bounded, counted, its answer handed back.
    pub writer: Writer,
    /// The indexes (short, non-async critical sections only).
    pub index: RwLock<Index>,
    /// Which check to decide next, and when.
    pub scheduler: scheduler::Scheduler,
    /// The time decisions are made at (see [`clock`]; the system clock but in tests).
    pub clock: Arc<dyn clock::Clock>,
    /// Watches already started for checks' needs.
    pub started: tokio::sync::Mutex<BTreeSet<sources::Need>>,
    /// Metrics (shared with the writer, which counts the writes).
    pub metrics: Arc<metrics::Metrics>,
    /// Whether each watched source can be trusted (for `/readyz`).
    pub sources: sources::Registry,
    /// How long a source may be not live before `/readyz` fails.
    pub ready_grace: std::sync::atomic::AtomicU64,
    /// Bumped when the API server was unreachable: every watch lists again.
    pub(crate) epoch: tokio::sync::watch::Sender<u64>,
    /// Bumped when the Machine and Cluster watches must list again without distrusting what
    /// they hold (sharded mode: a shard taken, a local Node added).
    pub(crate) capi_relist: tokio::sync::watch::Sender<u64>,
    /// Clients of connected workload clusters, for confirming reads.
    pub(crate) workload_clients: guards::WorkloadClients,
    /// Targets whose remediation is being confirmed and written, with the check doing it.
    pub(crate) confirming: guards::TargetLocks,
    /// Unreadable Node fields already reported, so each is told once.
    pub(crate) reported: guards::ToldOnce<guards::UnreadableField>,
    /// Failed applies in a row per check (the retry delay grows with them).
    pub(crate) failures: guards::Failures,
}

impl Context {
    /// A new context for `client`.
    pub fn new(client: Client) -> Arc<Self> {
        Self::with_leadership(client, leader::Leadership::always())
    }

    /// A new context whose writes are fenced by `leadership`.
    pub fn with_leadership(client: Client, leadership: leader::Leadership) -> Arc<Self> {
        Self::with_clock(client, leadership, Arc::new(clock::SystemClock))
    }

    /// A new context that reads the time from `clock` (a test steps it).
    pub fn with_clock(client: Client, leadership: leader::Leadership, clock: Arc<dyn clock::Clock>) -> Arc<Self> {
        Self::build(client, leadership, clock, None)
    }

    /// A new context of a sharded replica: each check's writes are fenced by its shard's right.
    pub fn sharded(client: Client, shards: Arc<leader::ShardRights>) -> Arc<Self> {
        Self::build(client, leader::Leadership::always(), Arc::new(clock::SystemClock), Some(shards))
    }

    fn build(
        client: Client,
        leadership: leader::Leadership,
        clock: Arc<dyn clock::Clock>,
        shards: Option<Arc<leader::ShardRights>>,
    ) -> Arc<Self> {
        let metrics = Arc::new(metrics::Metrics::default());
        Arc::new(Context {
            writer: Writer::new(client.clone(), leadership, shards.clone(), metrics.clone()),
            client,
            index: RwLock::new(Index::with_shards(shards.as_ref().map_or(1, |s| s.count()), shards.is_some())),
            scheduler: scheduler::Scheduler::with_clock(clock.clone()),
            clock,
            started: tokio::sync::Mutex::new(BTreeSet::new()),
            metrics,
            sources: sources::Registry::default(),
            ready_grace: std::sync::atomic::AtomicU64::new(sources::READY_GRACE.as_millis() as u64),
            epoch: tokio::sync::watch::Sender::new(0),
            capi_relist: tokio::sync::watch::Sender::new(0),
            workload_clients: guards::WorkloadClients::default(),
            confirming: guards::TargetLocks::default(),
            reported: guards::ToldOnce::default(),
            failures: guards::Failures::default(),
        })
    }

    /// The shard of a check (a MachineHealthCheck by its workload cluster, a NodeHealthCheck by
    /// its name); `None` in sharded mode when the check is not known (nothing is written for it).
    pub fn shard_of(&self, key: &CheckRef) -> Option<u32> {
        self.read_index().shard_of(key)
    }

    /// The right to write for `key`: its shard's right in sharded mode, the leader's otherwise.
    /// Checked before every write of the check (fencing per shard).
    pub fn right(&self, key: &CheckRef) -> &leader::Leadership {
        match self.writer.shards() {
            Some(_) => self.writer.right(self.shard_of(key)),
            None => self.writer.right(None),
        }
    }

    /// A receiver of the relist epoch, for a new watch.
    pub fn epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// A receiver of the quiet relists of the Machine and Cluster watches.
    pub fn capi_relists(&self) -> tokio::sync::watch::Receiver<u64> {
        self.capi_relist.subscribe()
    }

    /// Makes the Machine and Cluster watches list again (what they hold stays trusted meanwhile).
    pub fn relist_capi(&self) {
        self.capi_relist.send_modify(|e| *e = e.wrapping_add(1));
    }

    /// Makes every watch list again (the API server could not be reached: what the watches
    /// hold may be stale, and a connection held open through a partition would not tell).
    pub fn relist_all(&self) {
        self.epoch.send_modify(|e| *e = e.wrapping_add(1));
    }

    /// The client that reads `cluster`'s Nodes: Vigil's own, or a workload cluster's when
    /// connected.
    pub fn client_of(&self, cluster: &ClusterRef) -> Option<Client> {
        match cluster {
            ClusterRef::Local => Some(self.client.clone()),
            ClusterRef::Workload(w) => self.workload_clients.get(w),
        }
    }

    /// Reports a Node field no rule can read: once in the log and once as an event on the Node.
    pub fn report_unreadable(self: &Arc<Self>, cluster: &ClusterRef, problem: wire::Unreadable) {
        if !self.reported.first((cluster.clone(), problem.node.clone(), problem.field.clone())) {
            return;
        }
        warn!(cluster = %cluster, "{problem}");
        self.metrics.unreadable_object();
        if !cluster.is_local() {
            // An event in the management cluster about a workload cluster's Node would name an
            // object that is not there; the log and the check's status say it.
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: vigil_api::reason::Reason::UnreadableCondition.as_str().into(),
                note: Some(problem.to_string().chars().take(1000).collect()),
                action: "Read".into(),
                secondary: None,
            };
            let node = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(problem.node.clone()),
                ..Default::default()
            };
            this.send_event(&event, &node, None).await;
        });
    }

    /// Sends one event through the writer's event lane ([`Writer::send_event`]). With
    /// `fenced_by`, the event is sent only if that check's right to write still holds when its
    /// turn comes (its shard looked up then).
    pub async fn send_event(
        &self,
        event: &kube::runtime::events::Event,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        fenced_by: Option<&CheckRef>,
    ) {
        let may_send = || fenced_by.is_none_or(|key| self.right(key).is_leader());
        self.writer.send_event(event, reference, may_send).await;
    }

    /// The indexes, for reading.
    pub fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// A Machine's index entry: the one held when the index holds this very version (a write's
    /// answer and the watch's echo of it are one object), else read from `raw`.
    pub fn machine_entry(&self, raw: &serde_json::Value) -> Option<vigil_index::index::MachineEntry> {
        let held = self.read_index().machine_at(raw);
        held.or_else(|| vigil_index::index::machine_entry(raw))
    }

    /// The indexes, for writing.
    pub fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }
}
