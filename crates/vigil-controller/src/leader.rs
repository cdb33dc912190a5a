//! Leader election on a `coordination.k8s.io/v1` Lease, with fencing.
//!
//! Every replica watches and keeps its indexes warm; only the leader decides and writes. The
//! algorithm is client-go's: the holder renews the Lease every `retry_period`; another replica
//! takes it over only after it has seen the Lease unchanged for a whole `lease_duration` on its
//! own clock (or empty: released). **Fencing**: the leader's right to write ends `renew_deadline`
//! after the start of its last successful renewal, and `renew_deadline < lease_duration`, so a
//! leader that cannot renew (partitioned, frozen, slow) stops writing before any other replica can
//! take over. The right is checked before every write, and each write is given no more time than
//! the right has left. Why not a crate: `kube-lease-manager` 0.13 fits kube 5 but exposes only a
//! leading / not-leading flag, not the instant until which writing is safe, which fencing needs.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// Settings of leader election.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (the Pod name).
    pub identity: String,
    /// How long another replica waits, after the Lease last changed, before taking it over.
    pub lease_duration: Duration,
    /// How long after the start of its last successful renewal the leader may still write.
    pub renew_deadline: Duration,
    /// How often the Lease is renewed or looked at.
    pub retry_period: Duration,
}

impl LeaderOptions {
    /// Checks the durations ([`check_durations`]) and names.
    pub fn validate(&self) -> Result<(), String> {
        check_durations(self.lease_duration, self.renew_deadline, self.retry_period)?;
        if self.lease_name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err("--lease-name, --lease-namespace and the identity must not be empty".into());
        }
        Ok(())
    }
}

/// How far two replicas' clocks may differ in rate, as a fraction (numerator, denominator) of the
/// time they measure: chrony slews a clock by up to 83 333 ppm (1/12, its default
/// `maxslewrate`), and `Instant` (`CLOCK_MONOTONIC`) follows the slew. Every duration check
/// below assumes each replica's clock within this of real time.
pub const CLOCK_RATE_MARGIN: (u32, u32) = (1, 12);

/// Checks that no two replicas can write for the same Lease at once, and that a leader gets to
/// renew before its right to write ends.
///
/// The holder may start writes until `renew_deadline` after the start of its last successful
/// renewal, on its own clock; a standby may take the Lease `lease_duration` after the answer
/// that first showed it that renewal, on its own clock — never before the renewal was made. With
/// clocks within [`CLOCK_RATE_MARGIN`] (ρ) of real time, the standby's earliest takeover comes
/// after the holder's last write when `renew_deadline · (1 + ρ) < lease_duration · (1 − ρ)`:
/// `renew_deadline` under 11/13 of `lease_duration`. Also `retry_period < renew_deadline` (a
/// renewal fits in the right it extends) and a lease of at least 1 s.
pub fn check_durations(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), String> {
    let (n, d) = (u128::from(CLOCK_RATE_MARGIN.0), u128::from(CLOCK_RATE_MARGIN.1));
    if renew_deadline.as_nanos() * (d + n) >= lease_duration.as_nanos() * (d - n) {
        let longest = Duration::from_millis(
            u64::try_from(lease_duration.as_millis() * (d - n) / (d + n)).unwrap_or(u64::MAX).saturating_sub(1),
        );
        return Err(format!(
            "--lease-duration {lease_duration:?}, --renew-deadline {renew_deadline:?}, --retry-period {retry_period:?}: \
             two replicas could write at once. A standby may take the Lease --lease-duration after it saw the \
             holder's last renewal, and the holder may write until --renew-deadline after that renewal began; \
             with clocks that run up to {n}/{d} fast or slow, --renew-deadline must stay under {}/{} of \
             --lease-duration (at most {longest:?} here), or --lease-duration above {}/{} of --renew-deadline",
            d - n,
            d + n,
            d + n,
            d - n,
        ));
    }
    if retry_period >= renew_deadline {
        return Err(format!(
            "--retry-period ({retry_period:?}) must be shorter than --renew-deadline ({renew_deadline:?}): a leader must get to renew before its right to write ends"
        ));
    }
    if lease_duration.as_secs() < 1 {
        return Err(format!("--lease-duration ({lease_duration:?}) must be at least 1s"));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Right {
    /// No election: this replica always writes.
    Always,
    /// Elected: may write until this instant (none: not the leader).
    Until(Option<Instant>),
}

/// Whether this replica may write now, and for how long.
#[derive(Debug)]
pub struct Leadership {
    right: Mutex<Right>,
    leading: watch::Sender<bool>,
}

impl Leadership {
    /// A replica that does not take part in an election (it always writes).
    pub fn always() -> Self {
        Leadership { right: Mutex::new(Right::Always), leading: watch::Sender::new(true) }
    }

    /// A replica that writes only once elected.
    pub fn elected() -> Self {
        Leadership { right: Mutex::new(Right::Until(None)), leading: watch::Sender::new(false) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Right> {
        self.right.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long this replica may still write (`None`: it must not write now).
    pub fn remaining(&self) -> Option<Duration> {
        match *self.lock() {
            Right::Always => Some(Duration::MAX),
            Right::Until(Some(until)) => until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()),
            Right::Until(None) => None,
        }
    }

    /// Whether this replica leads (may write) right now.
    pub fn is_leader(&self) -> bool {
        self.remaining().is_some()
    }

    /// Waits until this replica leads.
    pub async fn wait_leading(&self) {
        let mut rx = self.leading.subscribe();
        loop {
            if self.is_leader() {
                return;
            }
            // The right can also end by time alone: look again at least every 100 ms.
            let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
        }
    }

    /// A receiver that changes whenever the right is gained or lost (a right that ends by time
    /// alone is published at the next election round), for what lives only while it is held.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Publishes the end of a right to write that ran out by time; true when it just did.
    fn expire_if_due(&self) -> bool {
        let mut right = self.lock();
        if let Right::Until(Some(u)) = *right
            && u <= Instant::now()
        {
            *right = Right::Until(None);
            self.leading.send_replace(false);
            return true;
        }
        false
    }

    /// The instant this replica's right to write ends (none: it has none).
    fn until(&self) -> Option<Instant> {
        match *self.lock() {
            Right::Until(u) => u,
            Right::Always => None,
        }
    }

    fn set(&self, until: Option<Instant>) -> bool {
        let mut right = self.lock();
        if matches!(*right, Right::Always) {
            return false;
        }
        let was = matches!(*right, Right::Until(Some(u)) if u > Instant::now());
        *right = Right::Until(until);
        let now = until.is_some();
        self.leading.send_replace(now);
        was != now
    }
}

/// What one round of the election saw.
enum Round {
    /// This replica holds the Lease; it renewed it with a request started at this instant.
    Holding(Instant),
    /// Another replica holds it.
    Held(String),
}

/// Runs the election until `stop` turns true, then releases the Lease if this replica holds it.
/// `on_elected` runs each time this replica becomes the leader. The metrics hear every round:
/// whether this replica leads (set each round, so a right that ran out by time shows at once),
/// each election won, each Lease request that failed.
pub async fn run(
    client: Client,
    options: LeaderOptions,
    leadership: std::sync::Arc<Leadership>,
    metrics: &crate::metrics::Metrics,
    mut stop: watch::Receiver<bool>,
    on_elected: impl Fn() + Send,
) {
    let api: Api<Lease> = Api::namespaced(client, &options.namespace);
    let mut observed: Option<Sighting> = None;
    let mut holder_seen = String::new();
    loop {
        if *stop.borrow() {
            break;
        }
        let started = Instant::now();
        let round =
            tokio::time::timeout(options.retry_period, round(&api, &options, &mut observed, started, true)).await;
        // Another replica holds it: look again as soon as its Lease expires (if before the next
        // retry period), so a standby takes over one lease duration after it first saw the last
        // renewal, not up to a retry period later.
        let expiry = match &round {
            Ok(Ok(Round::Held(holder))) if !holder.is_empty() => {
                observed.as_ref().map(|(_, at)| at.0 + options.lease_duration)
            }
            _ => None,
        };
        match round {
            Ok(Ok(Round::Holding(at))) => {
                if leadership.set(Some(at + options.renew_deadline)) {
                    info!(lease = %options.lease_name, identity = %options.identity, "elected leader");
                    metrics.elected();
                    on_elected();
                }
            }
            Ok(Ok(Round::Held(holder))) => {
                if leadership.set(None) {
                    warn!(holder = %holder, "lost the lease; writing stops");
                }
                if holder != holder_seen {
                    info!(holder = %holder, "another replica leads; standing by with warm caches");
                    holder_seen = holder;
                }
            }
            Ok(Err(e)) => {
                metrics.lease_error();
                warn!(error = %e, "lease not renewed; writing stops at the renew deadline unless a renewal succeeds")
            }
            Err(_) => {
                metrics.lease_error();
                warn!("lease request timed out; writing stops at the renew deadline unless a renewal succeeds")
            }
        }
        if leadership.expire_if_due() {
            warn!("renew deadline passed without a renewal; writing stopped");
        }
        metrics.leader(leadership.is_leader());
        let observation =
            Observation { members: Vec::new(), shards: expiry.map(|e| (String::new(), e)).into_iter().collect() };
        let wake = next_wake(Some(&observation), started, started + options.retry_period);
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.changed() => {}
        }
    }
    if leadership.is_leader() {
        leadership.set(None);
        metrics.leader(false);
        release(&api, &options).await;
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One round of the leader algorithm on one Lease: renew it (held), take it (free or expired, if
/// `may_take`) or leave it. `started` is taken before any request of the round: the right to
/// write a renewal or a takeover grants counts from it, never from later.
async fn round(
    api: &Api<Lease>,
    options: &LeaderOptions,
    observed: &mut Option<Sighting>,
    started: Instant,
    may_take: bool,
) -> Result<Round, kube::Error> {
    let duration_secs = written_seconds(options.lease_duration);
    let (lease, answered) = read_lease(api, &options.lease_name).await?;
    let Some(mut lease) = lease else {
        if !may_take {
            return Ok(Round::Held(String::new()));
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(options.lease_name.clone()),
                namespace: Some(options.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(options.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Round::Holding(started)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Round::Held(String::from("(someone)"))),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    if holder == options.identity {
        spec.renew_time = Some(now_micro());
        spec.lease_duration_seconds = Some(duration_secs);
        return match api.replace(&options.lease_name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(Round::Holding(started)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Round::Held(holder)),
            Err(e) => Err(e),
        };
    }
    // Another holder: the Lease is taken over only after it stayed unchanged for a whole lease
    // duration on this replica's clock (clocks of different machines are never compared),
    // counted from the answer that first showed this version.
    let changed_at = changed_at(observed, &version, answered);
    let their_duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(options.lease_duration, Duration::from_secs);
    let free = holder.is_empty() || expired(changed_at, Instant::now(), their_duration);
    if !free || !may_take {
        return Ok(Round::Held(holder));
    }
    spec.holder_identity = Some(options.identity.clone());
    spec.lease_duration_seconds = Some(duration_secs);
    spec.acquire_time = Some(now_micro());
    spec.renew_time = Some(now_micro());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    match api.replace(&options.lease_name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Round::Holding(started)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Round::Held(holder)),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up (holder empty), so a standby takes over at its next round instead of
/// waiting out the lease duration.
async fn release(api: &Api<Lease>, options: &LeaderOptions) {
    let released = async {
        let mut lease = api.get(&options.lease_name).await?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(options.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now_micro());
        api.replace(&options.lease_name, &PostParams::default(), &lease).await.map(|_| ())
    };
    match tokio::time::timeout(Duration::from_secs(5), released).await {
        Ok(Ok(())) => info!(lease = %options.lease_name, "lease released"),
        Ok(Err(e)) => warn!(error = %e, "lease not released; a standby takes over when it expires"),
        Err(_) => warn!("lease release timed out; a standby takes over when it expires"),
    }
}

/// How long after another replica's Lease expires an early round looks at it (the Lease is
/// free only once strictly older than its duration).
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// One right to write per shard (sharded mode: `vigil run --shards N`, N > 1).
#[derive(Debug)]
pub struct ShardRights {
    rights: Vec<Leadership>,
    never: Leadership,
}

impl ShardRights {
    /// `count` shards, none held yet.
    pub fn new(count: u32) -> Self {
        ShardRights { rights: (0..count.max(1)).map(|_| Leadership::elected()).collect(), never: Leadership::elected() }
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        u32::try_from(self.rights.len()).unwrap_or(u32::MAX)
    }

    /// The right to write for `shard` (none or out of range: a right that is never held).
    pub fn right(&self, shard: Option<u32>) -> &Leadership {
        shard.and_then(|s| self.rights.get(s as usize)).unwrap_or(&self.never)
    }

    /// The shards this replica may write for now.
    pub fn held(&self) -> BTreeSet<u32> {
        (0..self.count()).filter(|s| self.right(Some(*s)).is_leader()).collect()
    }
}

/// The name of shard `shard`'s Lease.
pub fn shard_lease_name(lease_name: &str, shard: u32) -> String {
    format!("{lease_name}-shard-{shard}")
}

/// The name of a replica's membership Lease.
pub fn member_lease_name(lease_name: &str, identity: &str) -> String {
    format!("{lease_name}-member-{identity}")
}

/// Runs sharded election until `stop` turns true: each round renews this replica's membership
/// Lease, counts the live replicas ([`Observation::live`]: membership Leases that changed within
/// a lease duration on this replica's clock, released ones and replicas whose every shard Lease
/// expired excluded), gives back held shards beyond the fair share
/// (after their right to write has run out, so no write of this replica overlaps the next
/// holder's), then runs the leader algorithm on every shard Lease: held ones are renewed, free
/// ones taken while under the fair share. `on_gained` runs when a shard is won, `on_lost` when
/// its right to write ends (given back, taken by another, or run out). A round starts a retry
/// period after the previous one, or as soon as another replica's Lease expires if sooner, so a
/// `kill -9`ed replica's shards are taken within one lease duration plus one retry period of its
/// last renewal (seen up to a retry period late, taken once a lease duration older). On stop
/// every held Lease and the membership Lease are released.
pub async fn run_shards(
    client: Client,
    options: LeaderOptions,
    rights: std::sync::Arc<ShardRights>,
    metrics: &crate::metrics::Metrics,
    mut stop: watch::Receiver<bool>,
    on_gained: impl Fn(u32) + Send,
    on_lost: impl Fn(u32) + Send,
) {
    let count = rights.count();
    let member =
        LeaderOptions { lease_name: member_lease_name(&options.lease_name, &options.identity), ..options.clone() };
    let mut shards = ShardRounds {
        api: Api::namespaced(client, &options.namespace),
        member,
        observed: vec![None; count as usize],
        member_observed: None,
        members: HashMap::new(),
        releasing: BTreeMap::new(),
        joined: None,
        options,
        rights,
        metrics,
        on_gained,
        on_lost,
    };
    loop {
        if *stop.borrow() {
            break;
        }
        let started = Instant::now();
        let observation = shards.join(started).await;
        let live = observation.as_ref().map(|o| o.live(Instant::now()));
        let balance = vigil_engine::shard::balance(count, live.unwrap_or(1), &shards.rights.held());
        if live.is_some() {
            shards.give_back(&balance.give_back, live);
        }
        // Free shards are taken up to the fair share (none before a retry period after this
        // replica's membership Lease was first written, none while membership is unknown).
        let may_take = match live {
            None => 0,
            Some(_) => {
                vigil_engine::shard::may_take(&balance, shards.joined.map(|j| j.elapsed()), shards.options.retry_period)
            }
        };
        shards.renew_and_take(may_take).await;
        shards.metrics.leader(!shards.rights.held().is_empty());
        let wake = next_wake(observation.as_ref(), started, shards.next_round(started));
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.changed() => {}
        }
    }
    shards.release_all().await;
}

/// One replica's part in sharding: its Leases, what it last saw of everyone's, and what it does
/// when a shard is won or lost. Each round is [`ShardRounds::join`], [`ShardRounds::give_back`], then
/// [`ShardRounds::renew_and_take`].
struct ShardRounds<'m, G, L> {
    api: Api<Lease>,
    options: LeaderOptions,
    /// This replica's membership Lease.
    member: LeaderOptions,
    rights: std::sync::Arc<ShardRights>,
    metrics: &'m crate::metrics::Metrics,
    /// Each shard Lease's last version seen, and when it changed.
    observed: Vec<Option<Sighting>>,
    member_observed: Option<Sighting>,
    members: HashMap<String, Option<Sighting>>,
    /// Shards given back, by when their right to write ends (released after that, not before).
    releasing: BTreeMap<u32, Instant>,
    /// When this replica's membership Lease was first written (renewed or created).
    joined: Option<Instant>,
    on_gained: G,
    on_lost: L,
}

impl<G: Fn(u32) + Send, L: Fn(u32) + Send> ShardRounds<'_, G, L> {
    fn shard_options(&self, s: u32) -> LeaderOptions {
        LeaderOptions { lease_name: shard_lease_name(&self.options.lease_name, s), ..self.options.clone() }
    }

    /// Renews the membership Lease and lists everyone's: how many replicas are alive.
    async fn join(&mut self, started: Instant) -> Option<Observation> {
        let renewal = round(&self.api, &self.member, &mut self.member_observed, started, true);
        match tokio::time::timeout(self.options.retry_period, renewal).await {
            Ok(Ok(Round::Holding(_))) => {
                self.joined.get_or_insert_with(Instant::now);
            }
            Ok(Ok(Round::Held(_))) => {}
            Ok(Err(_)) | Err(_) => self.metrics.lease_error(),
        }
        let member = self.member.lease_name.clone();
        observe_leases(&self.api, &self.options, &member, &mut self.members, &mut self.observed).await
    }

    /// Gives back the shards beyond the fair share, fenced: each stops writing now and its Lease
    /// is released once its right to write has run out.
    fn give_back(&mut self, shards: &[u32], live: Option<usize>) {
        for s in shards {
            let right = self.rights.right(Some(*s));
            let until = right.until().unwrap_or_else(Instant::now);
            right.set(None);
            (self.on_lost)(*s);
            self.releasing.insert(*s, until);
            info!(shard = s, live = ?live, "giving back a shard beyond the fair share");
        }
    }

    /// Renews the held shards and takes up to `may_take` free ones; releases the given-back
    /// shards whose right has run out.
    async fn renew_and_take(&mut self, mut may_take: usize) {
        for s in 0..self.rights.count() {
            if let Some(until) = self.releasing.get(&s).copied() {
                if Instant::now() >= until {
                    release(&self.api, &self.shard_options(s)).await;
                    self.releasing.remove(&s);
                }
                continue;
            }
            let holding = self.rights.right(Some(s)).is_leader();
            let took = self.round_on(s, holding || may_take > 0).await;
            if took && !holding {
                may_take = may_take.saturating_sub(1);
            }
        }
    }

    /// One round of the leader algorithm on shard `s`; whether this replica holds it after.
    async fn round_on(&mut self, s: u32, may_hold: bool) -> bool {
        let options = self.shard_options(s);
        let at = Instant::now();
        let seen = &mut self.observed[s as usize];
        let result =
            tokio::time::timeout(self.options.retry_period, round(&self.api, &options, seen, at, may_hold)).await;
        let right = self.rights.right(Some(s));
        let mut held = false;
        match result {
            Ok(Ok(Round::Holding(at))) => {
                held = true;
                if right.set(Some(at + self.options.renew_deadline)) {
                    info!(shard = s, identity = %self.options.identity, "took a shard");
                    self.metrics.elected();
                    (self.on_gained)(s);
                }
            }
            Ok(Ok(Round::Held(holder))) => {
                if right.set(None) {
                    warn!(shard = s, holder = %holder, "lost a shard; its writes stop");
                    (self.on_lost)(s);
                }
            }
            Ok(Err(_)) | Err(_) => self.metrics.lease_error(),
        }
        if right.expire_if_due() {
            warn!(shard = s, "renew deadline passed without a renewal; writing for the shard stopped");
            (self.on_lost)(s);
        }
        held
    }

    /// The next round comes a retry period after this one started, or (see [`next_wake`]) just
    /// after another replica's Lease expires if that is sooner. Until it may take shards, the
    /// round that may is a retry period after joining (a single replica's cold start waits the
    /// membership write's latency more than before, no more).
    fn next_round(&self, started: Instant) -> Instant {
        match self.joined.filter(|j| j.elapsed() < self.options.retry_period) {
            Some(j) => j + self.options.retry_period,
            None => started + self.options.retry_period,
        }
    }

    /// On stop: every held shard stops writing and its Lease is released, then the membership.
    async fn release_all(&mut self) {
        for s in self.rights.held() {
            self.rights.right(Some(s)).set(None);
            (self.on_lost)(s);
            release(&self.api, &self.shard_options(s)).await;
        }
        self.metrics.leader(false);
        release(&self.api, &self.member).await;
    }
}

/// When the next round starts: at `next_round`, or just after the first Lease of another replica
/// that expires after this round `started` if sooner — including one that expired while this
/// round ran (after its shard was looked at): that round starts at once instead of a retry
/// period later, which put takeovers up to a retry period past one lease duration plus one
/// retry period after the dead holder's last renewal.
fn next_wake(observation: Option<&Observation>, started: Instant, next_round: Instant) -> Instant {
    observation.and_then(|o| o.next_expiry(started)).map_or(next_round, |e| next_round.min(e + EXPIRY_MARGIN))
}

/// What one list of the Leases told this replica, judged on its own clock.
#[derive(Debug, Default)]
struct Observation {
    /// Other replicas' membership Leases with a holder: identity and when the Lease expires
    /// (the last change seen + its duration).
    members: Vec<(String, Instant)>,
    /// Shard Leases held by another replica: holder and when the Lease expires.
    shards: Vec<(String, Instant)>,
}

impl Observation {
    /// How many replicas are alive: this one, plus every other one whose membership Lease has
    /// not expired, except a replica every shard Lease of which has expired: a `kill -9`ed
    /// replica's last membership renewal may come after its last shard renewals (or be seen a
    /// round later), and counting it alive until the membership Lease expires too would keep
    /// the others at their old fair share for up to a retry period after its shards are free.
    fn live(&self, now: Instant) -> usize {
        let dead_by_shards = |who: &str| {
            let mut held = self.shards.iter().filter(|(h, _)| h == who).peekable();
            held.peek().is_some() && held.all(|(_, expires)| *expires < now)
        };
        1 + self.members.iter().filter(|(who, expires)| now <= *expires && !dead_by_shards(who)).count()
    }

    /// The next instant after `now` at which another replica's Lease expires: a round then
    /// counts the replicas and takes the shards without waiting for the next retry period, so a
    /// dead replica's shards are taken one lease duration after this replica first saw their
    /// last renewal.
    fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.members.iter().chain(&self.shards).map(|(_, e)| *e).filter(|e| *e >= now).min()
    }
}

/// The instant a read's answer arrived. A Lease version's age counts from the answer that first
/// showed it, never from when the read was sent: an answer can come up to the round's timeout
/// after its request, and the version it shows may have been written just before the API server
/// read it (a request queued in the network or in the API server), so a sighting stamped at the
/// request would make the version look that much older and a standby take over early. Made only
/// by [`read_lease`] and [`list_leases`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Answered(Instant);

/// A Lease version, and the answer that first showed it to this replica.
pub type Sighting = (String, Answered);

/// Reads one Lease; the answer's arrival stamps the versions it shows.
async fn read_lease(api: &Api<Lease>, name: &str) -> Result<(Option<Lease>, Answered), kube::Error> {
    let lease = api.get_opt(name).await?;
    Ok((lease, Answered(Instant::now())))
}

/// Lists the Leases within `limit`; the answer's arrival stamps the versions it shows.
async fn list_leases(api: &Api<Lease>, limit: Duration) -> Option<(Vec<Lease>, Answered)> {
    let list = tokio::time::timeout(limit, api.list(&kube::api::ListParams::default())).await.ok()?.ok()?;
    Some((list.items, Answered(Instant::now())))
}

/// The `leaseDurationSeconds` a holder writes: its lease duration rounded up, so a standby that
/// reads it never waits less than the duration the holder's right to write was checked against.
fn written_seconds(lease_duration: Duration) -> i32 {
    let secs = lease_duration.as_secs().saturating_add(u64::from(lease_duration.subsec_nanos() > 0));
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Whether a Lease last changed at `changed_at` (on this replica's clock) has expired by `now`:
/// only once strictly older than its duration.
fn expired(changed_at: Instant, now: Instant, duration: Duration) -> bool {
    now.saturating_duration_since(changed_at) > duration
}

/// When a Lease last changed on this replica's clock: `seen` keeps the version and the answer
/// that first showed it; a version not seen before restarts the clock at `answered`. The one
/// place every election and shard loop stamps a version's first sighting.
fn changed_at(seen: &mut Option<Sighting>, version: &str, answered: Answered) -> Instant {
    match seen {
        Some((v, at)) if v == version => at.0,
        _ => {
            *seen = Some((version.to_string(), answered));
            answered.0
        }
    }
}

/// Lists the Leases: membership Leases of the other replicas (their versions' first sightings
/// in `members`) and shard Leases (in `shards`, the same record [`round`] keeps, so a shard's
/// expiry is judged from the first sighting of its version by either); `None`: the list failed.
async fn observe_leases(
    api: &Api<Lease>,
    options: &LeaderOptions,
    own: &str,
    members: &mut HashMap<String, Option<Sighting>>,
    shards: &mut [Option<Sighting>],
) -> Option<Observation> {
    let member_prefix = member_lease_name(&options.lease_name, "");
    // `shard_lease_name` without the index.
    let shard_prefix = format!("{}-shard-", options.lease_name);
    let (items, answered) = list_leases(api, options.retry_period).await?;
    let mut out = Observation::default();
    let mut names = HashSet::new();
    for lease in items {
        let Some(name) = lease.metadata.name.clone() else { continue };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let spec = lease.spec.unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(options.lease_duration, Duration::from_secs);
        if name.starts_with(&member_prefix) && name != own {
            names.insert(name.clone());
            let at = changed_at(members.entry(name).or_default(), &version, answered);
            if !holder.is_empty() {
                out.members.push((holder, at + duration));
            }
        } else if let Some(seen) =
            name.strip_prefix(&shard_prefix).and_then(|i| i.parse::<usize>().ok()).and_then(|i| shards.get_mut(i))
        {
            let at = changed_at(seen, &version, answered);
            if !holder.is_empty() && holder != options.identity {
                out.shards.push((holder, at + duration));
            }
        }
    }
    members.retain(|n, _| names.contains(n));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(lease: u64, deadline: u64, retry: u64) -> LeaderOptions {
        LeaderOptions {
            lease_name: "vigil".into(),
            namespace: "ns".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(deadline),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn durations_must_leave_room_for_fencing() {
        assert!(opts(15, 10, 2).validate().is_ok());
        assert!(opts(10, 10, 2).validate().expect_err("deadline = duration").contains("--renew-deadline"));
        assert!(opts(15, 10, 10).validate().expect_err("retry = deadline").contains("--retry-period"));
    }

    #[test]
    fn durations_that_let_a_standby_take_over_before_the_holders_last_write_are_refused() {
        let ms = Duration::from_millis;
        let table = [
            // (lease, deadline, retry, accepted)
            (ms(15_000), ms(10_000), ms(2_000), true),  // the defaults
            (ms(4_000), ms(3_000), ms(1_000), true),    // the sharding tests
            (ms(10_000), ms(8_000), ms(1_000), true),   // the late-writes tests
            (ms(13_000), ms(10_999), ms(2_000), true),  // 11/13 of the lease, just under
            (ms(13_000), ms(11_000), ms(2_000), false), // 11/13 of the lease exactly
            (ms(15_000), ms(14_000), ms(2_000), false), // a second's overlap before stamping at the answer
            (ms(4_000), ms(3_500), ms(1_000), false),
        ];
        for (lease, deadline, retry, accepted) in table {
            let got = check_durations(lease, deadline, retry);
            assert_eq!(got.is_ok(), accepted, "{lease:?} / {deadline:?} / {retry:?}: {got:?}");
        }
        let e = check_durations(ms(15_000), ms(14_000), ms(2_000)).expect_err("refused");
        for named in ["--lease-duration 15s", "--renew-deadline 14s", "--retry-period 2s", "11/13", "at most 12.69"] {
            assert!(e.contains(named), "{named} not in: {e}");
        }
        // What the error proposes is accepted.
        assert!(check_durations(ms(15_000), ms(12_690), ms(2_000)).is_ok());
    }

    #[test]
    fn a_holder_writes_its_lease_duration_rounded_up() {
        assert_eq!(written_seconds(Duration::from_secs(15)), 15);
        assert_eq!(written_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(written_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }

    #[test]
    fn a_replica_whose_every_shard_lease_expired_counts_dead_before_its_membership_lease_does() {
        let now = Instant::now();
        let (past, soon, later) =
            (now - Duration::from_millis(1), now + Duration::from_secs(1), now + Duration::from_secs(9));
        let seen = |members: &[(&str, Instant)], shards: &[(&str, Instant)]| Observation {
            members: members.iter().map(|(w, e)| (w.to_string(), *e)).collect(),
            shards: shards.iter().map(|(w, e)| (w.to_string(), *e)).collect(),
        };
        let table = [
            // (members, shards held by others, live replicas counting this one)
            (seen(&[("b", later), ("c", later)], &[("b", later), ("c", later)]), 3),
            // b's shard Leases all expired while its membership Lease was renewed after them.
            (seen(&[("b", later), ("c", later)], &[("b", past), ("b", past), ("c", later)]), 2),
            // One of b's shards still renewed: b is alive.
            (seen(&[("b", later)], &[("b", past), ("b", soon)]), 2),
            // b holds no shard (joining, or gave all back): its membership Lease alone counts.
            (seen(&[("b", later)], &[("c", past)]), 2),
            // b's membership Lease expired.
            (seen(&[("b", past)], &[("b", later)]), 1),
            // Exactly at expiry a Lease still counts (free only once strictly older).
            (seen(&[("b", now)], &[("b", now)]), 2),
        ];
        for (i, (o, want)) in table.iter().enumerate() {
            assert_eq!(o.live(now), *want, "row {i}: {o:?}");
        }
    }

    #[test]
    fn the_next_round_comes_when_the_first_lease_of_another_replica_expires() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        let o = Observation {
            members: vec![("b".into(), at(9000)), ("c".into(), now - Duration::from_secs(1))],
            shards: vec![("b".into(), at(700)), ("c".into(), at(300))],
        };
        assert_eq!(o.next_expiry(now), Some(at(300)), "the earliest expiry still ahead");
        assert_eq!(o.next_expiry(at(301)), Some(at(700)), "an expired Lease does not wake again");
        assert_eq!(Observation::default().next_expiry(now), None);
    }

    #[test]
    fn a_lease_that_expires_while_a_round_runs_starts_the_next_round_at_once() {
        let started = Instant::now();
        let at = |ms: u64| started + Duration::from_millis(ms);
        let next_round = at(1000);
        // b's shard expires 150 ms into the round, after the round looked at it (the round took
        // 300 ms): the next round comes just after the expiry, not a retry period later.
        let o = Observation { members: vec![("b".into(), at(9000))], shards: vec![("b".into(), at(150))] };
        assert_eq!(next_wake(Some(&o), started, next_round), at(150) + EXPIRY_MARGIN);
        // Expired before the round started: this round saw it expired; no extra round.
        let o = Observation { members: Vec::new(), shards: vec![("b".into(), started - Duration::from_millis(1))] };
        assert_eq!(next_wake(Some(&o), started, next_round), next_round);
        // Later than a retry period: the retry period comes first; no list: the retry period.
        let o = Observation { members: Vec::new(), shards: vec![("b".into(), at(5000))] };
        assert_eq!(next_wake(Some(&o), started, next_round), next_round);
        assert_eq!(next_wake(None, started, next_round), next_round);
    }

    #[test]
    fn a_lease_changed_clock_restarts_only_on_a_new_version() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut seen = None;
        assert_eq!(changed_at(&mut seen, "1", Answered(t0)), t0);
        assert_eq!(changed_at(&mut seen, "1", Answered(t1)), t0, "same version: first sighting kept");
        assert_eq!(changed_at(&mut seen, "2", Answered(t1)), t1, "new version: clock restarts");
    }

    /// The timing model of a takeover, in real time from the start of the holder's last
    /// successful renewal (0): what the holder's right covers, what the standby sees and when.
    #[derive(Debug, Clone)]
    struct Takeover {
        /// Lease duration, renew deadline, retry period (ms).
        durations: (u64, u64, u64),
        /// How fast the holder's and the standby's clocks run, as parts per million of real time
        /// off (within the clock-rate margin).
        rates_ppm: (i64, i64),
        /// When the holder's renewal took effect at the API server, after its round began (ms).
        written: u64,
        /// The standby's reads: when each started after the previous answer (ms), how long its
        /// request took to be read by the API server, and its answer to come back (ms). A read
        /// whose request and answer take a retry period or more is given up (the round's timeout).
        reads: Vec<(u64, u64, u64)>,
        /// When the standby's reads began, relative to the start of the holder's renewal round
        /// (ms, may be negative).
        first_read: i64,
    }

    /// Real time (ms) to a replica's `Instant`, for a clock `ppm` off real time.
    fn local(base: Instant, real_ms: f64, ppm: i64) -> Instant {
        let local_ms = real_ms * (1.0 + ppm as f64 / 1e6);
        if local_ms >= 0.0 {
            base + Duration::from_secs_f64(local_ms / 1000.0)
        } else {
            base - Duration::from_secs_f64(-local_ms / 1000.0)
        }
    }

    /// When (real ms) the standby takes the Lease over, judging each answer as [`round`] does:
    /// first sighting stamped by [`changed_at`] at the answer, taken once [`expired`] by the
    /// duration the holder wrote; `None`: not within the reads.
    fn standby_takes_at(t: &Takeover) -> Option<f64> {
        let base = Instant::now() + Duration::from_secs(3600);
        let (lease, _, retry) = t.durations;
        let their = Duration::from_secs(u64::try_from(written_seconds(Duration::from_millis(lease))).ok()?);
        let mut seen = Some(("before".to_string(), Answered(local(base, -1e6, t.rates_ppm.1))));
        let mut at = t.first_read as f64;
        for (gap, request, answer) in &t.reads {
            at += *gap as f64;
            if request + answer >= retry {
                at += retry as f64;
                continue;
            }
            let read = at + *request as f64;
            let answered = read + *answer as f64;
            // The holder renewed at `written` and wrote nothing after: what the API server read.
            let version = if read >= t.written as f64 { "renewed" } else { "before" };
            let now = local(base, answered, t.rates_ppm.1);
            let changed = changed_at(&mut seen, version, Answered(now));
            if version == "renewed" && expired(changed, now, their) {
                return Some(answered);
            }
            at = answered;
        }
        None
    }

    fn takeovers() -> impl proptest::strategy::Strategy<Value = Takeover> {
        use proptest::prelude::*;
        let margin = i64::from(1_000_000 / CLOCK_RATE_MARGIN.1 * CLOCK_RATE_MARGIN.0);
        // Leases mostly in whole seconds, as flags are given; deadlines and retry periods often
        // close to their limits, where an early takeover would show first.
        let lease = prop_oneof![(1u64..30).prop_map(|s| s * 1_000), 1_000u64..30_000];
        let deadline = prop_oneof![1u64..1_000, 700u64..850];
        let retry = prop_oneof![1u64..1_000, 500u64..1_000];
        (lease, deadline, retry)
            .prop_map(|(lease, d, r)| {
                let deadline = lease * d / 1_000;
                (lease, deadline.max(2), (deadline * r / 1_000).max(1))
            })
            .prop_filter("accepted durations", |(l, d, r)| {
                check_durations(Duration::from_millis(*l), Duration::from_millis(*d), Duration::from_millis(*r)).is_ok()
            })
            .prop_flat_map(move |(lease, deadline, retry)| {
                // Delays mostly short, else anything up to the round's timeout, often close to it.
                let delay = move || prop_oneof![2 => 0..=retry / 20, 1 => 0..=retry, 1 => retry * 3 / 4..=retry];
                let read = (delay(), delay(), delay());
                (
                    Just((lease, deadline, retry)),
                    (-margin..=margin, -margin..=margin),
                    0..retry,
                    proptest::collection::vec(read, 1..80),
                    // The standby's reads begin up to a retry period before or after the renewal.
                    -(retry as i64)..(retry as i64),
                )
            })
            .prop_map(|(durations, rates_ppm, written, reads, from_renewal)| Takeover {
                durations,
                rates_ppm,
                written,
                reads,
                first_read: written as i64 + from_renewal,
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5_000))]

        /// Under every accepted setting, whatever the delays of the standby's reads and however
        /// the two clocks run within the margin, the standby takes the Lease only after the
        /// holder's right to write has ended.
        #[test]
        fn a_standby_never_takes_over_before_the_holders_right_ends(t in takeovers()) {
            let (_, deadline, _) = t.durations;
            // The holder's right: the renew deadline on its clock from its round's start.
            let right_ends = deadline as f64 / (1.0 + t.rates_ppm.0 as f64 / 1e6);
            if let Some(taken) = standby_takes_at(&t) {
                proptest::prop_assert!(taken > right_ends, "taken at {taken} ms, the holder may write until {right_ends} ms: {t:?}");
            }
        }
    }

    #[test]
    fn the_right_to_write_ends_at_its_deadline() {
        let l = Leadership::elected();
        assert!(!l.is_leader());
        assert!(l.set(Some(Instant::now() + Duration::from_millis(50))), "became leader");
        assert!(l.remaining().is_some_and(|r| r <= Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!l.is_leader(), "no renewal: no right to write");
        assert!(Leadership::always().is_leader());
        assert_eq!(Leadership::always().remaining(), Some(Duration::MAX));
    }
}
