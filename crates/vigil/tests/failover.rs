//! Two `vigil run` replicas against a real kube-apiserver and etcd: leader election, failover
//! after `kill -9` in the middle of a failure wave, fencing of a partitioned leader, and the Lease
//! released on SIGTERM. Counts what a user would count: remediations missed and duplicated, the
//! time until the standby leads, and (from the audit log) writes of a deposed replica.

mod support;

use jiff::Timestamp;
use kube::api::Api;
use serde_json::json;
use std::time::{Duration, Instant};
use support::{
    LEASE, LEASE_NS, MEDIK8S, RENEW_DEADLINE, RETRY, Replica, Result, WAIT, anyhow_msg, audited_writes, install_basics,
    limited_user_is_admin, objects_per_node, remediated, set_ready, set_ready_since, tempfile_dir,
};
use vigil_testenv::{AUDITED_USER, Identity, LIMITED_USER, TestEnv, wait_for};

async fn holder(env: &TestEnv) -> Result<Option<String>> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(env.client(), LEASE_NS);
    Ok(api.get_opt("vigil").await?.and_then(|l| l.spec).and_then(|s| s.holder_identity).filter(|h| !h.is_empty()))
}

async fn wait_holder(env: &TestEnv, name: &str, limit: Duration) -> Result<Duration> {
    let since = Instant::now();
    wait_for(&format!("{name} to hold the Lease"), limit, || async {
        Ok((holder(env).await?.as_deref() == Some(name)).then(|| since.elapsed()))
    })
    .await
}

/// Writes (not Lease renewals) by `user` the API server received after `after`.
fn writes_after(env: &TestEnv, user: &str, after: Timestamp) -> Result<Vec<String>> {
    Ok(audited_writes(env, user)?
        .into_iter()
        .filter(|w| w.resource != "leases" && w.received > after)
        .map(|w| w.to_string())
        .collect())
}

async fn setup(env: &TestEnv) -> Result<()> {
    install_basics(env).await?;
    // The second replica runs as the limited user, so the audit log tells the two apart.
    limited_user_is_admin(env).await?;
    for i in 1..=8 {
        env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("w{i}"), "labels": {"role": "worker"}}}))
            .await?;
        set_ready(env, &format!("w{i}"), "True").await?;
    }
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                 "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                     "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": MEDIK8S},
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]}}))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_a_killed_leader_mid_wave_and_a_partitioned_leader_writes_nothing() -> Result<()> {
    let env = TestEnv::start().await?;
    setup(&env).await?;
    let dir = tempfile_dir("vigil-failover")?;
    // Replica b reaches the API server through a proxy the test can partition.
    let proxy = env.proxy().await?;
    let mut a = Replica::start(&env, "a", Identity::Audited, env.server_url(), &dir, &[]).await?;
    wait_holder(&env, "a", WAIT).await?;
    let b = Replica::start(&env, "b", Identity::Limited, &proxy.url(), &dir, &[]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holder(&env).await?.as_deref(), Some("a"), "the standby does not take a held Lease");

    // A failure wave; the leader is killed in the middle of it.
    set_ready(&env, "w1", "False").await?;
    set_ready(&env, "w2", "False").await?;
    remediated(&env, &["w1", "w2"]).await?;
    set_ready(&env, "w3", "False").await?;
    set_ready(&env, "w4", "False").await?;
    a.child.start_kill()?;
    let _ = a.child.wait().await;
    let takeover = wait_holder(&env, "b", LEASE + RETRY * 3).await?;
    eprintln!(
        "FAILOVER kill -9: standby leads after {} ms (lease duration {} ms)",
        takeover.as_millis(),
        LEASE.as_millis()
    );
    remediated(&env, &["w3", "w4"]).await?;

    // The leader is cut off by a partition while a Node's timeout runs out: it cannot renew, it
    // still decides from its cache, and whatever it sends arrives when the partition heals. A new
    // replica takes over; the old one must have stopped writing at its renew deadline.
    let mut a2 = Replica::start(&env, "a2", Identity::Audited, env.server_url(), &dir, &[]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    set_ready_since(&env, "w5", "False", 0).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.partition();
    let cut_at = Timestamp::now();
    wait_holder(&env, "a2", LEASE + RETRY * 4).await?;
    remediated(&env, &["w5"]).await?;
    proxy.heal();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let deadline = cut_at + jiff::SignedDuration::try_from(RENEW_DEADLINE).map_err(|e| anyhow_msg(e.to_string()))?;
    let late = writes_after(&env, LIMITED_USER, deadline)?;
    eprintln!("FAILOVER partitioned leader: {} writes received after its renew deadline", late.len());
    assert!(late.is_empty(), "the deposed replica wrote after its renew deadline: {late:?}");
    set_ready(&env, "w6", "False").await?;
    remediated(&env, &["w6"]).await?;

    // SIGTERM: the leader finishes and releases the Lease; the standby leads at its next round,
    // long before the lease duration would have run out.
    let since = Instant::now();
    a2.signal(rustix::process::Signal::TERM)?;
    let status = tokio::time::timeout(Duration::from_secs(30), a2.child.wait()).await??;
    assert!(status.success(), "vigil run exits 0 on SIGTERM: {status}");
    let handover = wait_holder(&env, "b", LEASE).await?;
    eprintln!("FAILOVER SIGTERM: standby leads {} ms after the signal", since.elapsed().as_millis());
    assert!(handover < LEASE, "released, not expired: {handover:?}");
    set_ready(&env, "w7", "False").await?;
    remediated(&env, &["w7"]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let per = objects_per_node(&env).await?;
    let missed = (1..=7).filter(|i| !per.contains_key(&format!("w{i}"))).count();
    let duplicated: usize = per.values().map(|n| n.saturating_sub(1)).sum();
    let wrongful = per.get("w8").copied().unwrap_or(0);
    eprintln!("FAILOVER counts: missed {missed} duplicated {duplicated} wrongful {wrongful} ({per:?})");
    assert_eq!((missed, duplicated, wrongful), (0, 0, 0), "{per:?}");
    assert!(!writes_after(&env, AUDITED_USER, Timestamp::now() - jiff::SignedDuration::from_secs(3600))?.is_empty());
    drop(b);
    Ok(())
}
