//! Three `vigil run --shards 6` replicas against a real kube-apiserver and etcd: the shard Leases
//! are spread (each shard one holder, no replica above ceil(6/3) = 2), a `kill -9`ed replica's
//! shards are taken by the others within a lease duration, and a failure wave after that is
//! remediated with none missed, none duplicated, none wrongful.

use jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};
use vigil_testenv::{Identity, TestEnv, wait_for};

type Result<T> = std::result::Result<T, vigil_testenv::Error>;

const LEASE_NS: &str = "vigil-system";
const MEDIK8S: &str = "medik8s";
/// Short durations for the test (the defaults are 15 s / 10 s / 2 s).
const LEASE: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(40);

struct Replica {
    child: tokio::process::Child,
}

impl Replica {
    async fn start(
        env: &TestEnv,
        name: &'static str,
        who: Identity,
        server: &str,
        dir: &std::path::Path,
    ) -> Result<Replica> {
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, env.kubeconfig_yaml_at(server, who)?)?;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--workers", "2", "--lease-namespace", LEASE_NS])
            .args(["--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "1s", "--shards", "6"])
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()?;
        Ok(Replica { child })
    }
}

fn anyhow_msg(m: String) -> vigil_testenv::Error {
    vigil_testenv::Error::msg(m)
}

fn secs_ago(s: i64) -> String {
    let t = Timestamp::now() - jiff::SignedDuration::from_secs(s);
    Timestamp::from_second(t.as_second()).map(|t| t.to_string()).unwrap_or_default()
}

async fn set_ready(env: &TestEnv, node: &str, status: &str) -> Result<()> {
    set_ready_since(env, node, status, 60).await
}

async fn set_ready_since(env: &TestEnv, node: &str, status: &str, secs: i64) -> Result<()> {
    env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test", "message": "",
                   "lastHeartbeatTime": Timestamp::now().to_string(), "lastTransitionTime": secs_ago(secs)}]}}))
        .await?;
    Ok(())
}

/// Remediation objects per Node (generateName: a duplicate would be a second object).
async fn objects_per_node(env: &TestEnv) -> Result<std::collections::BTreeMap<String, usize>> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "self-node-remediation.medik8s.io",
        "v1alpha1",
        "SelfNodeRemediation",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(env.client(), MEDIK8S, &ar);
    let mut out = std::collections::BTreeMap::new();
    for o in api.list(&Default::default()).await?.items {
        let node = o
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("remediation.medik8s.io/node-name"))
            .cloned()
            .unwrap_or_default();
        *out.entry(node).or_insert(0) += 1;
    }
    Ok(out)
}

async fn remediated(env: &TestEnv, nodes: &[&str]) -> Result<()> {
    wait_for(&format!("{nodes:?} remediated"), WAIT, || async {
        let per = objects_per_node(env).await?;
        Ok(nodes.iter().all(|n| per.get(*n).copied().unwrap_or(0) > 0).then_some(()))
    })
    .await
}

/// Holder of each shard Lease `vigil-shard-<i>` (none: no Lease or no holder).
async fn shard_holders(env: &TestEnv) -> Result<Vec<Option<String>>> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(env.client(), LEASE_NS);
    let mut out = Vec::new();
    for i in 0..SHARDS {
        let lease = api.get_opt(&format!("vigil-shard-{i}")).await?;
        out.push(lease.and_then(|l| l.spec).and_then(|s| s.holder_identity).filter(|h| !h.is_empty()));
    }
    Ok(out)
}

const SHARDS: u32 = 6;

/// Waits until every shard has a holder among `replicas` and none holds more than `limit`.
async fn spread(env: &TestEnv, replicas: &[&str], limit: usize, within: Duration) -> Result<Vec<Option<String>>> {
    wait_for(&format!("shards spread over {replicas:?}, at most {limit} each"), within, || async {
        let holders = shard_holders(env).await?;
        let all_held = holders.iter().all(|h| h.as_deref().is_some_and(|h| replicas.contains(&h)));
        let fair = replicas.iter().all(|r| holders.iter().filter(|h| h.as_deref() == Some(*r)).count() <= limit);
        Ok((all_held && fair).then_some(holders))
    })
    .await
}

async fn setup(env: &TestEnv) -> Result<()> {
    env.install_upstream_crds().await?;
    let ours = vigil_api::crd::files().map_err(|e| anyhow_msg(e.to_string()))?;
    let docs: Vec<Value> = ours
        .iter()
        .map(|f| serde_saphyr::from_str::<Value>(&f.text))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow_msg(e.to_string()))?;
    env.install_crds(&docs).await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})).await?;
    env.apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "reboot", "namespace": MEDIK8S,
                     "annotations": {"remediation.medik8s.io/multiple-templates-support": "true"}},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
        .await?;
    // One NodeHealthCheck per pair of Nodes, so the checks fall into several shards.
    for i in 1..=8 {
        let group = format!("g{}", (i + 1) / 2);
        env.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("w{i}"), "labels": {"group": group}}}))
            .await?;
        set_ready(env, &format!("w{i}"), "True").await?;
    }
    for g in 1..=4 {
        env.apply(
            json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": format!("g{g}")},
            "spec": {"selector": {"matchLabels": {"group": format!("g{g}")}}, "minHealthy": 0,
                     "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                         "kind": "SelfNodeRemediationTemplate", "name": "reboot", "namespace": MEDIK8S},
                     "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]}}),
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sharded_replicas_spread_the_shards_and_take_over_a_killed_ones_mid_wave() -> Result<()> {
    let env = TestEnv::start().await?;
    setup(&env).await?;
    let dir = tempfile_dir()?;
    let mut a = Replica::start(&env, "a", Identity::Audited, env.server_url(), &dir).await?;
    let b = Replica::start(&env, "b", Identity::Audited, env.server_url(), &dir).await?;
    let c = Replica::start(&env, "c", Identity::Audited, env.server_url(), &dir).await?;
    // Whoever started first may hold everything for a moment; the excess is given back.
    let holders = spread(&env, &["a", "b", "c"], 2, WAIT).await?;
    eprintln!("SHARDS spread: {holders:?}");
    let shards_of_a: Vec<usize> = (0..holders.len()).filter(|i| holders[*i].as_deref() == Some("a")).collect();
    assert!(!shards_of_a.is_empty(), "with 6 shards and 3 replicas each holds 2: {holders:?}");

    // A wave; replica a is killed in the middle of it.
    set_ready(&env, "w1", "False").await?;
    set_ready(&env, "w3", "False").await?;
    remediated(&env, &["w1", "w3"]).await?;
    set_ready(&env, "w5", "False").await?;
    set_ready(&env, "w7", "False").await?;
    let killed = Instant::now();
    a.child.start_kill()?;
    let _ = a.child.wait().await;
    let after = spread(&env, &["b", "c"], 3, LEASE + RETRY * 4).await?;
    eprintln!(
        "SHARDS kill -9: shards {shards_of_a:?} of a taken after {} ms (lease duration {} ms): {after:?}",
        killed.elapsed().as_millis(),
        LEASE.as_millis()
    );
    remediated(&env, &["w5", "w7"]).await?;
    set_ready(&env, "w2", "False").await?;
    set_ready(&env, "w6", "False").await?;
    remediated(&env, &["w2", "w6"]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let per = objects_per_node(&env).await?;
    let expected = ["w1", "w2", "w3", "w5", "w6", "w7"];
    let missed = expected.iter().filter(|n| !per.contains_key(**n)).count();
    let duplicated: usize = per.values().map(|n| n.saturating_sub(1)).sum();
    let wrongful = ["w4", "w8"].iter().filter_map(|n| per.get(*n)).sum::<usize>();
    eprintln!("SHARDS counts: missed {missed} duplicated {duplicated} wrongful {wrongful} ({per:?})");
    assert_eq!((missed, duplicated, wrongful), (0, 0, 0), "{per:?}");
    drop((b, c));
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("vigil-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
