//! A Lease version's age counts from the answer that first showed it. Holder `a` renews its
//! Lease; standby `b` reads it through a hold ([`WriteHold::hold_reads_of`]) that keeps one of
//! its reads for seconds, until just after `a`'s last renewal: the read then reaches the API
//! server, shows that renewal, and is answered at once, to a `b` that sent it long before — as a
//! request queued in the network or in a busy API server is. Then `a` dies. `b` must take the
//! Lease only after `a`'s right to write has ended: `a`'s last renewal + the renew deadline,
//! from the audit log (the API server's clock), and from the two replicas' own rights. Stamping
//! the version's first sighting when `b`'s read was sent made `b` take over seconds early.
//! For the single leader Lease and for a shard's.

use anyhow::{Context as _, Result, bail, ensure};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use vigil_controller::leader::{self, LeaderOptions, Leadership, ShardRights};
use vigil_controller::metrics::Metrics;
use vigil_testenv::{AUDITED_USER, Identity, LIMITED_USER, TestEnv, WriteHold, wait_for};

const NS: &str = "vigil-system";
const LEASE: &str = "vigil";
const LEASE_DURATION: Duration = Duration::from_secs(10);
const RENEW_DEADLINE: Duration = Duration::from_secs(8);
/// The holder renews often, so one of its renewals falls where the test wants it.
const HOLDER_RETRY: Duration = Duration::from_millis(500);
/// The standby's round may wait this long for an answer: its held read fits in it.
const STANDBY_RETRY: Duration = Duration::from_secs(6);
/// The holder's last renewal comes this long after the standby's held read was sent, at least:
/// more than lease duration − renew deadline, so a sighting stamped at the request would let the
/// standby take over before the holder's right ends.
const HELD_BEFORE_RENEWAL: Duration = Duration::from_secs(3);
/// The held read is let go by then, well within the standby's round.
const HELD_AT_MOST: Duration = Duration::from_millis(4_800);

fn options(identity: &str, retry_period: Duration) -> LeaderOptions {
    LeaderOptions {
        lease_name: LEASE.into(),
        namespace: NS.into(),
        identity: identity.into(),
        lease_duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period,
    }
}

/// The API server, the namespace, and the limited user allowed everything (it is audited under
/// its own name, so the log tells the standby's requests from the holder's).
async fn setup() -> Result<TestEnv> {
    let env = TestEnv::start().await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).await?;
    env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "limited-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": LIMITED_USER}]}))
        .await?;
    Ok(env)
}

/// One replica's election, run in this process until its task is aborted (a `kill -9`: no
/// release) or dropped.
struct Replica {
    task: tokio::task::JoinHandle<()>,
    _stop: watch::Sender<bool>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn leader(client: kube::Client, options: LeaderOptions, right: Arc<Leadership>) -> Replica {
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let metrics = Metrics::default();
        leader::run(client, options, right, &metrics, stopped, || {}).await;
    });
    Replica { task, _stop: stop }
}

fn sharded(client: kube::Client, options: LeaderOptions, rights: Arc<ShardRights>) -> Replica {
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let metrics = Metrics::default();
        leader::run_shards(client, options, rights, &metrics, stopped, |_| {}, |_| {}).await;
    });
    Replica { task, _stop: stop }
}

/// What the hold and the kill came to.
struct Staged {
    /// When the holder's right to write ended, by its own reckoning at its death.
    holder_right_ends: Instant,
    /// How long the standby's read was held before the holder's last renewal was seen.
    held_before_renewal: Duration,
}

/// Holds the standby's reads of `lease`; once one has been held for [`HELD_BEFORE_RENEWAL`],
/// waits for the holder's next renewal of `lease`, kills the holder at once and lets the read go.
/// A held read that sees no renewal in time is let go and the next one tried.
async fn stage(
    env: &TestEnv,
    hold: &WriteHold,
    lease: &str,
    holder: &mut Option<Replica>,
    holder_right: &Leadership,
) -> Result<Staged> {
    let api: Api<Lease> = Api::namespaced(env.client(), NS);
    for _attempt in 0..10 {
        hold.hold_reads_of(&format!("/leases/{lease}"));
        let kept_at =
            wait_for("a standby read of the Lease held", Duration::from_secs(20), || async { Ok(hold.oldest_kept()) })
                .await?;
        let mut version = String::new();
        while kept_at.elapsed() < HELD_AT_MOST {
            let seen = api.get(lease).await?;
            let now = seen.metadata.resource_version.unwrap_or_default();
            let renewed = !version.is_empty() && now != version;
            version = now;
            if renewed && kept_at.elapsed() >= HELD_BEFORE_RENEWAL {
                let held_before_renewal = kept_at.elapsed();
                if let Some(replica) = holder.take() {
                    replica.task.abort();
                }
                let left = holder_right.remaining().context("the holder had no right to write when it died")?;
                let holder_right_ends = Instant::now() + left;
                let delivered = hold.release().await;
                ensure!(
                    delivered.iter().any(|d| d.caller_waiting && d.code == 200),
                    "the held read was not answered to a waiting standby: {delivered:?}"
                );
                return Ok(Staged { holder_right_ends, held_before_renewal });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        hold.release().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no renewal of {lease} came while a standby read was held long enough")
}

/// One successful Lease write of the audit log: who and when the API server received it.
#[derive(Debug)]
struct LeaseWrite {
    user: String,
    received: Timestamp,
}

/// The successful updates of Lease `name` by the holder and the standby, in order.
fn lease_writes(env: &TestEnv, name: &str) -> Result<Vec<LeaseWrite>> {
    let path = env.audit_log_path().context("no audit log")?;
    let text = std::fs::read_to_string(path)?;
    let mut out: Vec<LeaseWrite> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && matches!(e["verb"].as_str(), Some("update" | "create")))
        .filter(|e| e["objectRef"]["resource"] == "leases" && e["objectRef"]["name"] == name)
        .filter(|e| e["responseStatus"]["code"].as_i64().is_some_and(|c| (200..300).contains(&c)))
        .filter_map(|e| {
            Some(LeaseWrite {
                user: e["user"]["username"].as_str()?.to_string(),
                received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
            })
        })
        .collect();
    out.sort_by_key(|w| w.received);
    Ok(out)
}

/// The takeover as the API server saw it: the standby's first successful write of `lease` after
/// the holder's last one must come at least a renew deadline after that last one was received
/// (the holder's right began before it sent it, so ended before then).
async fn check_audit(env: &TestEnv, lease: &str) -> Result<Duration> {
    // The audit log is written as requests complete: give the last lines a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = lease_writes(env, lease)?;
    let last_renewal = writes.iter().rev().find(|w| w.user == AUDITED_USER).context("no renewal by the holder")?;
    let taken = writes
        .iter()
        .find(|w| w.user == LIMITED_USER && w.received > last_renewal.received)
        .context("no takeover by the standby in the audit log")?;
    let after = Duration::try_from(taken.received.duration_since(last_renewal.received))?;
    eprintln!("LEASE AGE {lease}: taken {after:?} after the holder's last renewal (renew deadline {RENEW_DEADLINE:?})");
    ensure!(
        after >= RENEW_DEADLINE,
        "{lease} was taken {after:?} after the holder's last renewal, before its right to write ({RENEW_DEADLINE:?}) ended"
    );
    Ok(after)
}

/// Waits for `right` to be held; returns when it was first seen held (looked at every 5 ms).
async fn gained(right: &Leadership) -> Result<Instant> {
    let limit = Instant::now() + LEASE_DURATION + STANDBY_RETRY * 3;
    while Instant::now() < limit {
        if right.is_leader() {
            return Ok(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bail!("the standby did not take over within {:?}", LEASE_DURATION + STANDBY_RETRY * 3)
}

#[tokio::test]
async fn a_standby_whose_read_was_answered_late_takes_the_leader_lease_only_after_the_holders_right_ended() -> Result<()>
{
    let env = setup().await?;
    let a_right = Arc::new(Leadership::elected());
    let b_right = Arc::new(Leadership::elected());
    let a_client = env.client_at(env.server_url(), Identity::Audited).await?;
    let mut a = Some(leader(a_client, options("a", HOLDER_RETRY), a_right.clone()));
    wait_for("a leads", Duration::from_secs(20), || async { Ok(a_right.is_leader().then_some(())) }).await?;
    let (b_client, hold) = WriteHold::client(env.client_at(env.server_url(), Identity::Limited).await?);
    let _b = leader(b_client, options("b", STANDBY_RETRY), b_right.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(!b_right.is_leader(), "b took the Lease a holds");

    let staged = stage(&env, &hold, LEASE, &mut a, &a_right).await?;
    let b_gained = gained(&b_right).await?;
    ensure!(
        b_gained >= staged.holder_right_ends,
        "b leads {:?} before a's right to write ended (its read was held {:?} before a's last renewal)",
        staged.holder_right_ends - b_gained,
        staged.held_before_renewal
    );
    check_audit(&env, LEASE).await?;
    Ok(())
}

#[tokio::test]
async fn a_standby_whose_read_was_answered_late_takes_a_shard_only_after_the_holders_right_ended() -> Result<()> {
    let env = setup().await?;
    let a_rights = Arc::new(ShardRights::new(2));
    let b_rights = Arc::new(ShardRights::new(2));
    let a_client = env.client_at(env.server_url(), Identity::Audited).await?;
    let mut a = Some(sharded(a_client, options("a", HOLDER_RETRY), a_rights.clone()));
    wait_for("a holds both shards", Duration::from_secs(20), || async {
        Ok((a_rights.held().len() == 2).then_some(()))
    })
    .await?;
    let (b_client, hold) = WriteHold::client(env.client_at(env.server_url(), Identity::Limited).await?);
    let _b = sharded(b_client, options("b", STANDBY_RETRY), b_rights.clone());
    // a gives one shard back once b has joined (after its right to it ran out), and b takes it.
    let limit = RENEW_DEADLINE + STANDBY_RETRY * 3;
    wait_for("a and b hold one shard each", limit, || async {
        Ok((a_rights.held().len() == 1 && b_rights.held().len() == 1).then_some(()))
    })
    .await?;
    let shard = *a_rights.held().first().context("a holds no shard")?;
    let lease = leader::shard_lease_name(LEASE, shard);

    let staged = stage(&env, &hold, &lease, &mut a, a_rights.right(Some(shard))).await?;
    let b_gained = gained(b_rights.right(Some(shard))).await?;
    ensure!(
        b_gained >= staged.holder_right_ends,
        "b holds shard {shard} {:?} before a's right to write it ended (its read was held {:?} before a's last renewal)",
        staged.holder_right_ends - b_gained,
        staged.held_before_renewal
    );
    check_audit(&env, &lease).await?;
    Ok(())
}
