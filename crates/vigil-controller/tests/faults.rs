//! The fault suite: `vigil_controller::run` against a real kube-apiserver and etcd while the
//! network and the servers fail, and against what a hostile tenant can write. Each test counts
//! what a user would count — remediations missed, wrongful and duplicated, and the time to
//! recover — and prints one `FAULT {json}` line per fault for the report. Every fault and every
//! wait is bounded.

mod support;
use support::*;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vigil_controller::Options;
use vigil_testenv::{FaultProxy, Identity, TestEnv, wait_for};

/// How long the controller may take to be normal again after a fault ends.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// Options for a controller under faults: a fast probe and a short readiness grace.
fn options(metrics: SocketAddr) -> Options {
    Options {
        workers: 2,
        metrics_addr: Some(metrics),
        probe_period: Duration::from_millis(500),
        ready_grace: Duration::from_secs(2),
        ..Default::default()
    }
}

/// One plain HTTP GET to the controller's endpoint: (status code, body).
async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

/// Sum of a metric's samples whose line contains `filter`.
fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Waits until the controller is normal again — the API server probe answers, every source is
/// listed and live (`vigil_source_synced` all 1) and `/readyz` answers 200 — and returns how long
/// that took from `since`.
async fn recovered(metrics: SocketAddr, since: Instant) -> Result<Duration> {
    // A fault the controller has not noticed yet would read as "recovered": give the probe
    // (every 500 ms) and the watches a moment to see it first.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    wait_for("the controller to be normal again", RECOVERY_LIMIT, || async {
        let text = http_get(metrics, "/metrics").await.map(|r| r.1).unwrap_or_default();
        let synced: Vec<&str> = text.lines().filter(|l| l.starts_with("vigil_source_synced{")).collect();
        let all_live = !synced.is_empty() && synced.iter().all(|l| l.ends_with(" 1"));
        let reachable = metric(&text, "vigil_api_reachable", "") == 1.0;
        let ready = matches!(http_get(metrics, "/readyz").await, Ok((200, _)));
        Ok((all_live && reachable && ready).then(|| since.elapsed()))
    })
    .await
}

/// What the test sees happen to the targets, through its own watches (every version of every
/// object, so a remediation object deleted 30 ms after it was made is still counted).
#[derive(Default)]
struct Seen {
    /// SelfNodeRemediation uids by Node.
    snr: BTreeMap<String, BTreeSet<String>>,
    /// Machines ever seen marked unhealthy or for their owner's remediation.
    marked: BTreeSet<String>,
    /// Machines ever seen with `OwnerRemediated=False` (what the owner acts on).
    owner_asked: BTreeSet<String>,
}

struct Ledger {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn is_false(obj: &Value, type_: &str) -> bool {
    ["/status/conditions", "/status/v1beta2/conditions", "/status/deprecated/v1beta1/conditions"].iter().any(|p| {
        obj.pointer(p)
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "False"))
    })
}

impl Ledger {
    async fn start(env: &TestEnv) -> Result<Ledger> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut tasks = Vec::new();
        let snr = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "self-node-remediation.medik8s.io",
            "v1alpha1",
            "SelfNodeRemediation",
        ));
        let machines = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
        for (ar, is_snr) in [(snr, true), (machines, false)] {
            let api: Api<DynamicObject> = Api::all_with(env.client(), &ar);
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
                while let Some(e) = stream.next().await {
                    let objs = match e {
                        Ok(Event::Apply(o) | Event::InitApply(o)) => vec![o],
                        _ => continue,
                    };
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    for o in objs {
                        let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                        if is_snr {
                            let node = v["metadata"]["annotations"]["remediation.medik8s.io/node-name"]
                                .as_str()
                                .unwrap_or("")
                                .to_string();
                            let uid = v["metadata"]["uid"].as_str().unwrap_or("").to_string();
                            seen.snr.entry(node).or_default().insert(uid);
                        } else {
                            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
                            if is_false(&v, "OwnerRemediated") {
                                seen.owner_asked.insert(name.clone());
                            }
                            if is_false(&v, "OwnerRemediated") || is_false(&v, "HealthCheckSucceeded") {
                                seen.marked.insert(name);
                            }
                        }
                    }
                }
            }));
        }
        Ok(Ledger { seen, tasks })
    }

    fn snr_count(&self, node: &str) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).snr.get(node).map_or(0, BTreeSet::len)
    }

    fn marked(&self, machine: &str) -> bool {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).marked.contains(machine)
    }

    fn owner_asked(&self, machine: &str) -> bool {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).owner_asked.contains(machine)
    }
}

/// The counts of one fault, as a user would count them.
#[derive(Debug, Default)]
struct Tally {
    missed: usize,
    wrongful: usize,
    duplicated: usize,
}

impl Tally {
    /// Machines that had to be marked, and Nodes that had to get exactly one object.
    fn expect_remediated(&mut self, ledger: &Ledger, machines: &[&str], nodes: &[&str]) {
        for m in machines {
            if !ledger.marked(m) {
                self.missed += 1;
            }
        }
        for n in nodes {
            match ledger.snr_count(n) {
                0 => self.missed += 1,
                1 => {}
                k => self.duplicated += k - 1,
            }
        }
    }

    /// Machines and Nodes that must never have been touched.
    fn expect_untouched(&mut self, ledger: &Ledger, machines: &[&str], nodes: &[&str]) {
        self.wrongful += machines.iter().filter(|m| ledger.marked(m)).count();
        self.wrongful += nodes.iter().map(|n| ledger.snr_count(n)).sum::<usize>();
    }
}

fn report(fault: &str, tally: &Tally, recovery: Option<Duration>) {
    let line = json!({"fault": fault, "missed": tally.missed, "wrongful": tally.wrongful,
                      "duplicated": tally.duplicated,
                      "recovery_ms": recovery.map(|d| d.as_millis() as u64)});
    eprintln!("FAULT {line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("vigil-faults.jsonl");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// A fleet for both kinds: Machines m1..m`n` on Nodes n1..n`n` under MHC `workers` (3 s), and
/// Nodes w1..w`n` under NHC `workers` (SelfNodeRemediation `reboot`, 3 s). The workload
/// cluster's Secret reaches the API server at `server` (the proxy, so its Nodes break too).
async fn fleet(env: &TestEnv, n: usize, server: &str, timeout: &str) -> Result<()> {
    cluster(env, false).await?;
    let kubeconfig = env.kubeconfig_yaml_at(server, Identity::Audited)?;
    env.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{CLUSTER}-kubeconfig"), "namespace": NS,
                     "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "stringData": {"value": kubeconfig}}))
        .await?;
    for i in 1..=n {
        node(env, &format!("n{i}"), json!({})).await?;
        machine(env, &format!("m{i}"), Some(&format!("n{i}")), json!({})).await?;
        node(env, &format!("w{i}"), json!({"role": "worker"})).await?;
    }
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": NS},
        "spec": {"clusterName": CLUSTER, "selector": {"matchLabels": {"pool": "workers"}},
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": timeout},
                                         {"type": "Ready", "status": "Unknown", "timeout": timeout}]}}))
        .await?;
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                 "remediationTemplate": reboot_ref("reboot"),
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": timeout},
                                         {"type": "Ready", "status": "Unknown", "duration": timeout}]}}))
        .await?;
    Ok(())
}

async fn both_normal(env: &TestEnv) -> Result<()> {
    wait_check_condition(env, "MachineHealthCheck", "workers", "RemediationAllowed", "True", "RemediationAllowed")
        .await?;
    wait_check_condition(env, "NodeHealthCheck", "workers", "RemediationAllowed", "True", "RemediationAllowed").await?;
    Ok(())
}

/// Node `n<i>` and `w<i>` fail (Ready=False for a minute): both must be remediated.
async fn wave(env: &TestEnv, ledger: &Ledger, i: usize) -> Result<Tally> {
    let (n, w, m) = (format!("n{i}"), format!("w{i}"), format!("m{i}"));
    set_ready(env, &n, "False", &secs_ago(60)).await?;
    set_ready(env, &w, "False", &secs_ago(60)).await?;
    let _ = wait_for(&format!("{m} marked and {w} remediated"), WAIT, || async {
        Ok((ledger.marked(&m) && ledger.snr_count(&w) > 0).then_some(()))
    })
    .await;
    // Time for a duplicate to show up, if one were coming.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut t = Tally::default();
    t.expect_remediated(ledger, &[&m], &[&w]);
    Ok(t)
}

async fn start_through(env: &TestEnv, proxy: &FaultProxy) -> Result<(Controller, SocketAddr)> {
    let metrics = free_addr()?;
    let client = env.client_at(&proxy.url(), Identity::Audited).await?;
    Ok((Controller::start_with(client, options(metrics)), metrics))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_resets_recover_in_seconds_and_the_next_wave_is_fully_remediated() -> Result<()> {
    let env = env().await?;
    let proxy = env.proxy().await?;
    fleet(&env, 3, &proxy.url(), "3s").await?;
    let ledger = Ledger::start(&env).await?;
    let (controller, metrics) = start_through(&env, &proxy).await?;
    both_normal(&env).await?;
    assert_eq!(http_get(metrics, "/readyz").await?.0, 200);
    assert_eq!(http_get(metrics, "/livez").await?.0, 200);
    assert_eq!(http_get(metrics, "/nope").await?.0, 404, "unknown paths are 404");

    // The proxy (a load balancer) restarts: down for 5 s.
    proxy.down();
    let readyz = wait_for("/readyz to fail while the API server cannot be reached", WAIT, || async {
        let (code, body) = http_get(metrics, "/readyz").await?;
        Ok((code == 503).then_some(body))
    })
    .await?;
    assert!(readyz.contains("not live"), "{readyz}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.heal();
    let recovery = recovered(metrics, Instant::now()).await?;
    both_normal(&env).await?;
    let mut tally = wave(&env, &ledger, 1).await?;
    tally.expect_untouched(&ledger, &["m2", "m3"], &["w2", "w3"]);
    report("proxy down 5 s", &tally, Some(recovery));
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");
    assert!(recovery < Duration::from_secs(15), "recovered in {recovery:?}");

    // A blip: every connection reset, down for 0.2 s.
    proxy.down();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.heal();
    let since = Instant::now();
    let recovery = recovered(metrics, since).await?;
    let mut tally = wave(&env, &ledger, 2).await?;
    tally.expect_untouched(&ledger, &["m3"], &["w3"]);
    report("connections reset (0.2 s)", &tally, Some(recovery));
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");

    let text = http_get(metrics, "/metrics").await?.1;
    assert!(metric(&text, "vigil_watch_restarts_total", "Nodes") >= 1.0, "restarts counted:\n{text}");
    assert!(metric(&text, "vigil_detection_seconds_count", "") >= 4.0, "detection latencies recorded:\n{text}");
    assert_eq!(metric(&text, "vigil_check_targets", "NodeHealthCheck/workers"), 3.0, "{text}");
    assert_eq!(metric(&text, "vigil_check_targets", "MachineHealthCheck/default/workers"), 3.0, "{text}");
    assert_eq!(metric(&text, "vigil_leader", ""), 1.0, "a single replica leads");
    assert_eq!(metric(&text, "vigil_api_reachable", ""), 1.0);
    assert_eq!(metric(&text, "vigil_source_synced", "source=\"Nodes\""), 1.0, "the management Nodes are trusted again");
    controller.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_never_lets_a_stale_decision_through() -> Result<()> {
    let env = env().await?;
    let proxy = env.proxy().await?;
    fleet(&env, 3, &proxy.url(), "6s").await?;
    let ledger = Ledger::start(&env).await?;
    let (controller, metrics) = start_through(&env, &proxy).await?;
    both_normal(&env).await?;

    // Everything goes Unknown; the controller sees it; then the network partitions.
    for i in 1..=3 {
        set_ready(&env, &format!("n{i}"), "Unknown", &secs_ago(0)).await?;
        set_ready(&env, &format!("w{i}"), "Unknown", &secs_ago(0)).await?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.partition();
    // During the partition n1, n2, w1, w2 recover; n3 and w3 stay down. The 6 s timeouts pass
    // while the controller's caches still say Unknown.
    for i in 1..=2 {
        set_ready(&env, &format!("n{i}"), "True", &secs_ago(0)).await?;
        set_ready(&env, &format!("w{i}"), "True", &secs_ago(0)).await?;
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(http_get(metrics, "/readyz").await?.0, 503, "not ready while partitioned");
    proxy.heal();
    let recovery = recovered(metrics, Instant::now()).await?;
    let _ = wait_for("m3 marked and w3 remediated after the partition", WAIT, || async {
        Ok((ledger.marked("m3") && ledger.snr_count("w3") > 0).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut tally = Tally::default();
    tally.expect_untouched(&ledger, &["m1", "m2"], &["w1", "w2"]);
    tally.expect_remediated(&ledger, &["m3"], &["w3"]);
    report("partition (12 s) with recoveries inside it", &tally, Some(recovery));
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");
    let text = http_get(metrics, "/metrics").await?.1;
    eprintln!(
        "remediations decided {} unconfirmed {}",
        metric(&text, "vigil_remediations_decided_total", ""),
        metric(&text, "vigil_remediations_unconfirmed_total", "")
    );
    controller.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_while_the_api_server_is_unreachable_retries_until_it_answers() -> Result<()> {
    let env = env().await?;
    let proxy = env.proxy().await?;
    fleet(&env, 2, &proxy.url(), "3s").await?;
    let ledger = Ledger::start(&env).await?;
    proxy.down();
    let (controller, metrics) = start_through(&env, &proxy).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (code, body) = http_get(metrics, "/readyz").await?;
    assert_eq!(code, 503, "{body}");
    let since = Instant::now();
    proxy.heal();
    let recovery = recovered(metrics, since).await?;
    both_normal(&env).await?;
    let mut tally = wave(&env, &ledger, 1).await?;
    tally.expect_untouched(&ledger, &["m2"], &["w2"]);
    report("API server unreachable at start (5 s)", &tally, Some(recovery));
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");
    controller.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_and_etcd_restarts_freezes_and_compaction_are_survived() -> Result<()> {
    let mut env = env().await?;
    let proxy = env.proxy().await?;
    fleet(&env, 6, &proxy.url(), "3s").await?;
    let ledger = Ledger::start(&env).await?;
    let (controller, metrics) = start_through(&env, &proxy).await?;
    both_normal(&env).await?;
    let mut all = Tally::default();
    for (i, fault) in [
        (1, "kube-apiserver killed and restarted"),
        (2, "etcd frozen 5 s"),
        (3, "kube-apiserver frozen 5 s"),
        (4, "etcd compacted, connections reset (410 Gone on resume)"),
        (5, "etcd killed and restarted"),
    ] {
        match i {
            1 => env.restart_apiserver().await?,
            2 => {
                env.freeze_etcd(true)?;
                tokio::time::sleep(Duration::from_secs(5)).await;
                env.freeze_etcd(false)?;
            }
            3 => {
                env.freeze_apiserver(true)?;
                tokio::time::sleep(Duration::from_secs(5)).await;
                env.freeze_apiserver(false)?;
            }
            4 => {
                env.compact_etcd().await?;
                proxy.reset_all();
            }
            _ => env.restart_etcd().await?,
        }
        // Measured from the end of the fault (a restart returns once the server is ready).
        let recovery = recovered(metrics, Instant::now()).await?;
        let tally = wave(&env, &ledger, i).await?;
        report(fault, &tally, Some(recovery));
        all.missed += tally.missed;
        all.duplicated += tally.duplicated;
    }
    all.expect_untouched(&ledger, &["m6"], &["w6"]);
    assert_eq!((all.missed, all.wrongful, all.duplicated), (0, 0, 0), "{all:?}");
    controller.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extreme_timestamp_spoils_only_its_own_node() -> Result<()> {
    let env = env().await?;
    fleet(&env, 3, env.server_url(), "3s").await?;
    let ledger = Ledger::start(&env).await?;
    let metrics = free_addr()?;
    let controller = Controller::start_with(env.client(), options(metrics));
    both_normal(&env).await?;
    // The API server takes it; a Rust time type cannot hold it.
    set_ready(&env, "n3", "False", "9999-12-31T23:59:59Z").await?;
    set_ready(&env, "w3", "False", "9999-12-31T23:59:59Z").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut tally = wave(&env, &ledger, 1).await?;
    tally.expect_untouched(&ledger, &["m2", "m3"], &["w2", "w3"]);
    report("Node with lastTransitionTime 9999-12-31T23:59:59Z", &tally, None);
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");
    let s = check_status(&env, "NodeHealthCheck", "workers").await?;
    assert_eq!(s["observedNodes"].as_i64(), Some(3), "the rest of the list is used: {s}");
    let events = wait_for("an UnreadableCondition event on w3", WAIT, || async {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client());
        let list = api.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("UnreadableCondition")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w3")
        }))
    })
    .await?;
    let note = events.note.unwrap_or_default();
    assert!(note.contains("9999-12-31T23:59:59Z") && note.contains("lastTransitionTime"), "{note}");
    let text = http_get(metrics, "/metrics").await?.1;
    assert!(metric(&text, "vigil_unreadable_fields_total", "") >= 2.0, "{text}");
    controller.stop().await;
    Ok(())
}

/// A ClusterRole for the limited user: everything Vigil touches, and on SelfNodeRemediations
/// everything but `create` unless `can_create`.
fn role(can_create: bool) -> Value {
    let mut snr_verbs = vec!["get", "list", "watch", "delete", "patch", "update"];
    if can_create {
        snr_verbs.push("create");
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vigil-test"},
        "rules": [
            {"apiGroups": ["", "vigil.dev", "cluster.x-k8s.io", "events.k8s.io"], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": ["self-node-remediation.medik8s.io"], "resources": ["selfnoderemediationtemplates"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["self-node-remediation.medik8s.io"], "resources": ["selfnoderemediations"], "verbs": snr_verbs},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["get"]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_is_retried_and_status_never_reports_it() -> Result<()> {
    let env = env().await?;
    fleet(&env, 2, env.server_url(), "2s").await?;
    // Several objects per Node (upstream: generateName; here a computed name): a retry must not
    // make a second one.
    env.apply(snr_template("reboot", MEDIK8S, true)).await?;
    env.apply(role(false)).await?;
    env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "vigil-test"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vigil-test"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": vigil_testenv::LIMITED_USER}]}))
        .await?;
    let ledger = Ledger::start(&env).await?;
    let metrics = free_addr()?;
    let client = env.client_at(env.server_url(), Identity::Limited).await?;
    let controller = Controller::start_with(client, options(metrics));
    both_normal(&env).await?;
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    wait_for("the failed create counted", WAIT, || async {
        let text = http_get(metrics, "/metrics").await?.1;
        Ok((metric(&text, "vigil_remediations_total", "outcome=\"failed\"") >= 1.0).then_some(()))
    })
    .await?;
    stays("the status reports a remediation object that does not exist", Duration::from_secs(4), || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        let listed = s["unhealthyNodes"]
            .as_array()
            .is_some_and(|ns| ns.iter().any(|n| n["remediations"].as_array().is_some_and(|r| !r.is_empty())));
        Ok(listed || s["phase"] == "Remediating")
    })
    .await?;
    // The permission comes back: the retry creates exactly one object.
    env.apply(role(true)).await?;
    let since = Instant::now();
    wait_for("w1's object after the permission is restored", Duration::from_secs(60), || async {
        Ok((ledger.snr_count("w1") > 0).then_some(()))
    })
    .await?;
    let recovery = since.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut tally = Tally::default();
    tally.expect_remediated(&ledger, &[], &["w1"]);
    tally.expect_untouched(&ledger, &[], &["w2"]);
    report("create refused (403) until the permission is restored", &tally, Some(recovery));
    assert_eq!((tally.missed, tally.wrongful, tally.duplicated), (0, 0, 0), "{tally:?}");
    let s = check_status(&env, "NodeHealthCheck", "workers").await?;
    let uid = &s["unhealthyNodes"][0]["remediations"][0]["resource"]["uid"];
    assert!(uid.is_string(), "the status names the object that exists: {s}");
    controller.stop().await;
    Ok(())
}

/// A loopback listener that records whether anything connected to it.
async fn tripwire() -> Result<(String, Arc<Mutex<usize>>)> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("https://{}", l.local_addr()?);
    let hits = Arc::new(Mutex::new(0usize));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            *h.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }
    });
    Ok((url, hits))
}

async fn hostile_secret(env: &TestEnv, cluster_name: &str, user: Value, server: &str) -> Result<()> {
    let kubeconfig = json!({"apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": true}}],
        "users": [{"name": "u", "user": user}]});
    env.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{cluster_name}-kubeconfig"), "namespace": NS},
        "stringData": {"value": serde_json::to_string(&kubeconfig)?}}))
        .await?;
    Ok(())
}

async fn cluster_named(env: &TestEnv, name: &str) -> Result<()> {
    env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": NS}, "spec": {"paused": false}}))
        .await?;
    Ok(())
}

async fn mhc_for(env: &TestEnv, name: &str, cluster_name: &str) -> Result<()> {
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterName": cluster_name, "selector": {"matchLabels": {"pool": name}},
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "3s"}]}}))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_kubeconfig_cannot_run_code_read_files_or_be_read_without_its_cluster() -> Result<()> {
    let env = env().await?;
    let dir = tempfile::tempdir()?;
    let marker = dir.path().join("ran");
    let stolen = dir.path().join("token");
    std::fs::write(&stolen, "controller-token-not-for-tenants")?;
    let (trap_url, hits) = tripwire().await?;

    cluster_named(&env, "execs").await?;
    hostile_secret(
        &env,
        "execs",
        json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
                        "args": ["-c", format!("touch {}", marker.display())], "interactiveMode": "Never"}}),
        &trap_url,
    )
    .await?;
    mhc_for(&env, "execs", "execs").await?;
    cluster_named(&env, "steals").await?;
    hostile_secret(&env, "steals", json!({"tokenFile": stolen.display().to_string()}), &trap_url).await?;
    mhc_for(&env, "steals", "steals").await?;
    // No Cluster "ghost": its Secret must not even be read.
    hostile_secret(&env, "ghost", json!({"token": "t"}), &trap_url).await?;
    mhc_for(&env, "ghost", "ghost").await?;

    let kubeconfig = env.audited_kubeconfig_yaml();
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let controller = Controller::start_with(kube::Client::try_from(config)?, options(free_addr()?));
    for (check, field) in [("execs", "users[0].user.exec"), ("steals", "users[0].user.tokenFile")] {
        // The condition first says the cluster is not connected yet, then why it never will be.
        wait_for(&format!("{check}: RemediationAllowed=False naming {field}"), WAIT, || async {
            let s = check_status(&env, "MachineHealthCheck", check).await?;
            let hit = s["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "RemediationAllowed"
                        && c["status"] == "False"
                        && c["reason"] == "WorkloadClusterUnreachable"
                        && c["message"].as_str().is_some_and(|m| m.contains(field))
                })
            });
            Ok(hit.then_some(()))
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!marker.exists(), "the exec plugin ran");
    assert_eq!(*hits.lock().unwrap_or_else(|p| p.into_inner()), 0, "Vigil connected to the tenant's server");
    let audit = std::fs::read_to_string(env.audit_log_path().context("audit log")?)?;
    let read_ghost = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| e["objectRef"]["resource"] == "secrets" && e["objectRef"]["name"] == "ghost-kubeconfig");
    assert!(!read_ghost, "the Secret of a Cluster that does not exist was read");
    let read_execs = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| e["objectRef"]["resource"] == "secrets" && e["objectRef"]["name"] == "execs-kubeconfig");
    assert!(read_execs, "the audit log works (the existing Cluster's Secret was read)");
    controller.stop().await;
    Ok(())
}

async fn events_with_reason(env: &TestEnv, reason: &str) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client());
    Ok(api.list(&Default::default()).await?.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_checks_remediate_a_target_once_and_say_who_holds_it() -> Result<()> {
    let env = env().await?;
    // n1..n2 carry Machines m1..m2 (MHC `workers`, owner remediation) and the label of the NHCs,
    // in a self-hosted cluster: both kinds see n1 as one target.
    fleet(&env, 2, env.server_url(), "2s").await?;
    for i in 1..=2 {
        env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("n{i}"), "labels": {"role": "worker"}}}))
            .await?;
    }
    env.apply(snr_template("reboot-b", MEDIK8S, true)).await?;
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "second"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
                 "remediationTemplate": reboot_ref("reboot-b"),
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]}}))
        .await?;
    let ledger = Ledger::start(&env).await?;
    let controller = Controller::start_with(env.client(), options(free_addr()?));
    both_normal(&env).await?;

    // Two NodeHealthChecks with different templates select w1.
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    wait_for("w1 remediated", WAIT, || async { Ok((ledger.snr_count("w1") > 0).then_some(())) }).await?;
    let waiting = wait_for("the second check to say it waits", WAIT, || async {
        for name in ["workers", "second"] {
            let s = check_status(&env, "NodeHealthCheck", name).await?;
            let c = s["conditions"].as_array().and_then(|cs| {
                cs.iter().find(|c| c["type"] == "WaitingForOtherCheck" && c["status"] == "True").cloned()
            });
            if let Some(c) = c {
                return Ok(Some((name, c)));
            }
        }
        Ok(None)
    })
    .await?;
    let message = waiting.1["message"].as_str().unwrap_or("").to_string();
    let holder = if waiting.0 == "workers" { "second" } else { "workers" };
    assert!(message.contains(&format!("NodeHealthCheck/{holder}")), "the waiting check names the holder: {message}");
    wait_for("an event on the holder", WAIT, || async {
        Ok(events_with_reason(&env, "OtherCheckWaiting")
            .await?
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(holder)))
    })
    .await?;

    // A MachineHealthCheck and a NodeHealthCheck on the same self-hosted Node n1.
    set_ready(&env, "n1", "False", &secs_ago(60)).await?;
    wait_for("n1 remediated by one of them", WAIT, || async {
        Ok((ledger.owner_asked("m1") || ledger.snr_count("n1") > 0).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The owner acts on OwnerRemediated=False; HealthCheckSucceeded=False alone only reports.
    let by_mhc = usize::from(ledger.owner_asked("m1"));
    let by_nhc = ledger.snr_count("n1");
    let tally = Tally { missed: 0, wrongful: 0, duplicated: (ledger.snr_count("w1") - 1) + (by_mhc + by_nhc - 1) };
    report("overlapping checks (two NHCs; an MHC and an NHC on one Node)", &tally, None);
    assert_eq!(ledger.snr_count("w1"), 1, "two NodeHealthChecks: one remediation object");
    assert_eq!(by_mhc + by_nhc, 1, "an MHC and an NHC on one Node: one remediation (mhc {by_mhc}, nhc {by_nhc})");
    controller.stop().await;
    Ok(())
}
