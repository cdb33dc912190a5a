//! End-to-end: `vigil check` and `vigil snapshot` as a user runs them, against a real
//! kube-apiserver and etcd, with credentials that may only get and list (RBAC enforced: the
//! test shows a write is refused with them).

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vigil_api::{MachineHealthCheck, NodeHealthCheck};
use vigil_testenv::TestEnv;

const NS: &str = "default";
const CLUSTER: &str = "prod";
const READER: &str = "vigil-reader";

fn vigil(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vigil")).args(args).env("NO_COLOR", "1").output().expect("vigil runs")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn secs_ago(s: i64) -> Timestamp {
    let t = Timestamp::now().checked_sub(SignedDuration::from_secs(s)).expect("time");
    Timestamp::from_second(t.as_second()).expect("time")
}

async fn env() -> Result<TestEnv> {
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    let ours = [serde_json::to_value(MachineHealthCheck::crd())?, serde_json::to_value(NodeHealthCheck::crd())?];
    env.install_crds(&ours).await?;
    Ok(env)
}

/// A service account that may get and list everything and do nothing else, and a kubeconfig
/// for it (the env's server and CA, the account's token).
async fn reader_kubeconfig(env: &TestEnv) -> Result<String> {
    env.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": READER, "namespace": NS}}))
        .await?;
    env.apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": READER},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list"]}]}),
    )
    .await?;
    env.apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": NS}]}),
    )
    .await?;
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(env.client(), NS)
        .create_token_request(READER, &PostParams::default(), &request)
        .await?
        .status
        .context("no token issued")?
        .token;
    let admin = env.kubeconfig_yaml();
    let lines: Vec<String> = admin
        .lines()
        .map(|l| match l.find("token:") {
            Some(i) if l.trim_start().starts_with("token:") => format!("{}token: {token}", &l[..i]),
            _ => l.to_string(),
        })
        .collect();
    if lines.iter().filter(|l| l.contains(&token)).count() != 1 {
        bail!("the env's kubeconfig has no single token line:\n{admin}");
    }
    Ok(lines.join("\n") + "\n")
}

/// A self-hosted Cluster whose kubeconfig Secret also holds the read-only credentials, three
/// Machines with Nodes: w-1 Ready, w-2 NotReady for 1 minute, w-3 NotReady for 10 minutes.
/// Returns when w-2 and w-3 went NotReady.
async fn fleet(env: &TestEnv, reader: &str) -> Result<(Timestamp, Timestamp)> {
    env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS}, "spec": {"paused": false}}))
        .await?;
    let hour_ago = secs_ago(3600).to_string();
    env.apply_status(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS},
        "status": {"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                   "conditions": [
                       {"type": "InfrastructureReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": hour_ago},
                       {"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized", "message": "", "lastTransitionTime": hour_ago}]}}))
    .await?;
    let mut secret = env.kubeconfig_secret(NS, CLUSTER);
    secret["data"]["value"] = json!(base64::engine::general_purpose::STANDARD.encode(reader));
    env.apply(secret).await?;
    let since = [secs_ago(3600), secs_ago(60), secs_ago(600)];
    for (name, ready, since) in [("w-1", "True", since[0]), ("w-2", "False", since[1]), ("w-3", "False", since[2])] {
        env.apply(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER, "pool": "workers"}},
            "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": name},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}}}))
        .await?;
        env.apply_status(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": NS}, "status": {"nodeRef": {"name": name}}}))
            .await?;
        env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "b"}}}))
            .await?;
        env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Test", "message": "",
                "lastHeartbeatTime": Timestamp::now().to_string(), "lastTransitionTime": since.to_string()}]}}))
            .await?;
    }
    Ok((since[1], since[2]))
}

fn mhc(name: &str, timeout: &str) -> Value {
    json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "MachineHealthCheck",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterName": CLUSTER, "selector": {"matchLabels": {"pool": "workers"}},
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": timeout}]}})
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

fn hms(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_what_vigil_would_do_with_get_list_only_and_exits_2() -> Result<()> {
    let env = env().await?;
    let dir = tempfile_dir()?;
    let reader = reader_kubeconfig(&env).await?;
    let (w2_since, w3_since) = fleet(&env, &reader).await?;
    env.apply(mhc("workers", "5m")).await?;
    let kubeconfig = write(&dir, "reader.yaml", &reader)?;
    let kubeconfig = kubeconfig.to_str().context("utf-8 path")?;

    // The credentials really are read-only: a write is refused.
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&reader)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?,
    )?;
    let refused = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, NS)
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}}))?)
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 403), "{refused:?}");

    let out = vigil(&["check", "--kubeconfig", kubeconfig]);
    let (stdout, stderr) = text(&out);
    eprintln!("$ vigil check\n{stdout}");
    assert_eq!(out.status.code(), Some(2), "w-3 is remediated now\n{stdout}\n{stderr}");
    assert!(stdout.contains("MachineHealthCheck/default/workers"), "{stdout}");
    assert!(stdout.contains("targets 3: 1 healthy, 2 unhealthy; budget: 1 more remediation"), "{stdout}");
    let since = format!("unhealthy default/w-3 since {}: UnhealthyNode", hms(w3_since));
    assert!(stdout.contains(&since), "expected {since:?} in\n{stdout}");
    assert!(stdout.contains("RemediationRequested default/w-3"), "{stdout}");
    // w-2 went NotReady 60 s ago: remediated just after 5 minutes from then (the rule is
    // strict: the first instant past the deadline), unless it recovers.
    let due = w2_since.checked_add(SignedDuration::from_secs(300)).expect("time");
    let said = format!("default/w-2 will be remediated at {} unless it recovers", hms(due));
    assert!(stdout.contains(&said), "expected {said:?} in\n{stdout}");

    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--output", "json", "workers"]);
    let report: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(out.status.code(), Some(2));
    let check = &report["checks"][0];
    assert_eq!(report["checks"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        (check["targets"].as_i64(), check["healthy"].as_i64(), check["unhealthy"].as_i64()),
        (Some(3), Some(1), Some(2))
    );
    assert_eq!(check["remediationsAllowed"], 1);
    assert_eq!(check["unhealthyTargets"][0]["since"], w3_since.to_string());
    assert_eq!(check["unhealthyTargets"][0]["target"], "default/w-3");
    assert_eq!(check["unhealthyTargets"][0]["reason"], "UnhealthyNode");
    assert_eq!(check["next"]["events"][0]["target"], "default/w-2");

    // Nothing was written: the check has no status, the Machines no conditions.
    let live = env.get_json("vigil.dev/v1alpha1", "MachineHealthCheck", Some(NS), "workers").await?.context("mhc")?;
    assert!(live.get("status").is_none_or(|s| s.as_object().is_none_or(|o| o.is_empty())), "{live}");
    let w3 = env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some(NS), "w-3").await?.context("machine")?;
    assert!(w3.pointer("/status/conditions").is_none(), "{w3}");

    // A candidate policy, not applied: with a 30m timeout nothing is due now (exit 0) and w-3
    // is due 30 minutes after it went NotReady.
    let candidate = write(&dir, "candidate.yaml", &serde_json::to_string(&mhc("slow", "30m"))?)?;
    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--policy", candidate.to_str().context("utf-8")?, "slow"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let due = w3_since.checked_add(SignedDuration::from_secs(1800)).expect("time");
    assert!(stdout.contains(&format!("default/w-3 will be remediated at {} unless it recovers", hms(due))), "{stdout}");
    assert!(env.get_json("vigil.dev/v1alpha1", "MachineHealthCheck", Some(NS), "slow").await?.is_none());

    // A NodeHealthCheck candidate reads the management cluster's Nodes (a check of
    // MachineHealthChecks alone does not need them): it sees the three, two of them NotReady.
    let nhc = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "zone-b"},
        "spec": {"selector": {"matchLabels": {"zone": "b"}}, "minHealthy": 1,
            "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS}}});
    let nhc = write(&dir, "nhc.yaml", &serde_json::to_string(&nhc)?)?;
    // Beside it, the same MachineHealthCheck as `workers`: the cluster hosts itself and its
    // credentials may list Nodes, so it reads the management cluster's Nodes, read once for both.
    let again = write(&dir, "again.yaml", &serde_json::to_string(&mhc("again", "5m"))?)?;
    let (nhc, again) = (nhc.to_str().context("utf-8")?, again.to_str().context("utf-8")?);
    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--output", "json", "--policy", nhc, "--policy", again]);
    let report: Value = serde_json::from_slice(&out.stdout)?;
    let check = report["checks"].as_array().into_iter().flatten().find(|c| c["check"] == "NodeHealthCheck/zone-b");
    let check = check.context("the NodeHealthCheck candidate is reported")?;
    assert_eq!(check["check"], "NodeHealthCheck/zone-b", "{report}");
    assert_eq!((check["targets"].as_i64(), check["unhealthy"].as_i64()), (Some(3), Some(2)), "{report}");
    let workers =
        report["checks"].as_array().into_iter().flatten().find(|c| c["check"] == "MachineHealthCheck/default/again");
    let workers = workers.context("the MachineHealthCheck candidate is reported")?;
    assert_eq!(
        (workers["targets"].as_i64(), workers["healthy"].as_i64(), workers["unhealthy"].as_i64()),
        (Some(3), Some(1), Some(2)),
        "{report}"
    );
    assert_eq!(workers["unhealthyTargets"][0]["since"], w3_since.to_string());

    // An invalid candidate is refused with its field and value, and nothing is evaluated.
    let mut bad = mhc("bad", "5m");
    bad["spec"]["maxUnhealthy"] = json!("140%");
    let bad = write(&dir, "bad.yaml", &serde_json::to_string(&bad)?)?;
    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--policy", bad.to_str().context("utf-8")?]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains(r#"spec.maxUnhealthy: invalid value "140%""#), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");

    // Karpenter takes w-1 down on purpose: a check counting voluntary disruptions sees three of
    // three out of a budget of 2 and requests nothing; the same check ignoring them remediates w-3.
    env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w-1", "labels": {"zone": "b"}},
        "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}))
        .await?;
    for (name, disruptions, code) in [("shared", "Count", 0), ("own", "Ignore", 2)] {
        let mut candidate = mhc(name, "5m");
        candidate["spec"]["maxUnhealthy"] = json!(2);
        candidate["spec"]["voluntaryDisruptions"] = json!(disruptions);
        let file = write(&dir, &format!("{name}.yaml"), &serde_json::to_string(&candidate)?)?;
        let out = vigil(&["check", "--kubeconfig", kubeconfig, "--policy", file.to_str().context("utf-8")?, name]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{disruptions}: {stdout}\n{stderr}");
        let said = stdout.contains("taken down on purpose: 1 (Karpenter 1), counted in the budget");
        assert_eq!(said, disruptions == "Count", "{stdout}");
        assert_eq!(stdout.contains("RemediationRequested default/w-3"), disruptions == "Ignore", "{stdout}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_writes_a_scenario_without_secrets_that_simulates_an_outage() -> Result<()> {
    let env = env().await?;
    let dir = tempfile_dir()?;
    let reader = reader_kubeconfig(&env).await?;
    fleet(&env, &reader).await?;
    env.apply(mhc("workers", "5m")).await?;
    let kubeconfig = write(&dir, "reader.yaml", &reader)?;

    let out = vigil(&["snapshot", "--kubeconfig", kubeconfig.to_str().context("utf-8")?, "--duration", "20m"]);
    let (yaml, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    eprintln!("$ vigil snapshot\n{yaml}");
    assert!(!yaml.contains("kind: Secret"), "Secrets are left out");
    let token = reader.lines().find_map(|l| l.trim().strip_prefix("token: ")).context("token")?;
    assert!(!yaml.contains(token), "no credentials in the snapshot");
    assert!(!yaml.contains("managedFields"), "server bookkeeping is dropped");
    let scenario = vigil_simulator::Scenario::parse(&yaml)?;
    assert!(scenario.timeline.is_empty());
    let kinds: Vec<&str> = scenario.objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in ["MachineHealthCheck", "Cluster", "Machine", "Node"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    assert_eq!(scenario.workload_clusters.get("default/prod").map(Vec::len), Some(3), "Nodes read via the Secret");

    // The operator adds an outage: at 2m every Node of zone b is NotReady (w-2 and w-3 already
    // are and keep their transition times; w-1 fails).
    let outage = yaml.replace(
        "timeline: []",
        "timeline:\n  - at: 2m\n    cluster: default/prod\n    setNodeCondition: {nodeSelector: {zone: b}, type: Ready, status: \"False\", reason: ZoneDown}",
    );
    let edited = write(&dir, "outage.yaml", &outage)?;
    let out = vigil(&["simulate", edited.to_str().context("utf-8")?, "--output", "json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let events: Vec<Value> = stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let requested: Vec<(f64, &str)> = events
        .iter()
        .filter(|e| e["event"] == "RemediationRequested")
        .map(|e| (e["t"].as_f64().unwrap_or(-1.0), e["target"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(requested.first(), Some(&(0.0, "default/w-3")), "{requested:?}");
    assert!(requested.iter().any(|(t, w)| *w == "default/w-1" && *t >= 420.0 && *t <= 421.0), "2m + 5m: {requested:?}");
    Ok(())
}

/// What a check does at one instant, as (event, target) pairs, sorted.
fn pairs<'a>(events: impl Iterator<Item = &'a Value>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = events
        .map(|e| (e["event"].as_str().unwrap_or("").to_string(), e["target"].as_str().unwrap_or("").to_string()))
        .collect();
    out.sort();
    out
}

/// `vigil check` and `vigil simulate` of a `vigil snapshot` of the same live state say the same,
/// check by check: what Vigil does now, and its next change, when and to which targets. The
/// snapshot is all the simulation knows, so anything `check` reads that the snapshot leaves out
/// (or writes differently) shows here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_a_simulation_of_its_snapshot_agree() -> Result<()> {
    let env = env().await?;
    let dir = tempfile_dir()?;
    let reader = reader_kubeconfig(&env).await?;
    fleet(&env, &reader).await?;
    env.apply(mhc("workers", "5m")).await?;
    let mut slow = mhc("slow", "8m");
    slow["spec"]["maxUnhealthy"] = json!(1);
    env.apply(slow).await?;
    let kubeconfig = write(&dir, "reader.yaml", &reader)?;
    let kubeconfig = kubeconfig.to_str().context("utf-8 path")?;

    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--output", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).context("check's report")?;
    let out = vigil(&["snapshot", "--kubeconfig", kubeconfig, "--output", "json", "--duration", "24h"]);
    let (snapshot, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let start: Timestamp = serde_json::from_str::<Value>(&snapshot)?["start"].as_str().context("start")?.parse()?;
    let file = write(&dir, "snapshot.json", &snapshot)?;
    let out = vigil(&["simulate", file.to_str().context("utf-8")?, "--output", "json"]);
    let (lines, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let events: Vec<Value> = lines.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;

    let checks = report["checks"].as_array().context("checks")?;
    assert_eq!(checks.len(), 2, "{report}");
    let mut with_next = 0;
    for check in checks {
        let label = check["check"].as_str().context("label")?;
        let mine: Vec<&Value> = events.iter().filter(|e| e["check"] == label && e["reason"] != "InvalidSpec").collect();
        let now_sim = pairs(mine.iter().copied().filter(|e| e["t"].as_f64() == Some(0.0)));
        let now_check = pairs(check["now"].as_array().context("now")?.iter());
        assert_eq!(now_check, now_sim, "{label}: now");
        assert!(!now_check.is_empty(), "{label} does something now (w-3 is past both timeouts)");
        let next = &check["next"];
        let first = mine.iter().filter_map(|e| e["t"].as_f64()).find(|t| *t > 0.0);
        // A check that writes nothing (the other one writes these Machines) has no next change.
        let (Some(at), Some(first)) = (next["at"].as_str(), first) else {
            assert!(next.is_null() && first.is_none(), "{label}: next {next} by check, at +{first:?} s simulated");
            continue;
        };
        let at: Timestamp = at.parse()?;
        let then = pairs(mine.iter().copied().filter(|e| e["t"].as_f64() == Some(first)));
        assert_eq!(pairs(next["events"].as_array().context("events")?.iter()), then, "{label}: next");
        let simulated_at = start.checked_add(SignedDuration::from_secs_f64(first))?;
        let apart = simulated_at.duration_since(at).abs();
        assert!(apart <= SignedDuration::from_secs(2), "{label}: next at {at} by check, {simulated_at} simulated");
        with_next += 1;
    }
    assert_eq!(with_next, 1, "the check writing the Machines has a next change (w-2's timeout): {report}");
    Ok(())
}

/// On a cluster without Cluster API (Vigil's CRDs and Nodes only, as a medik8s user has it),
/// `vigil check` and `vigil snapshot` read what is there: Cluster API is "not served", not an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_snapshot_work_on_a_cluster_without_cluster_api() -> Result<()> {
    let env = TestEnv::start().await?;
    let ours = [serde_json::to_value(MachineHealthCheck::crd())?, serde_json::to_value(NodeHealthCheck::crd())?];
    env.install_crds(&ours).await?;
    let dir = tempfile_dir()?;
    let reader = reader_kubeconfig(&env).await?;
    for (name, ready, since) in [("n-1", "True", secs_ago(3600)), ("n-2", "False", secs_ago(600))] {
        env.apply(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": "worker"}}}),
        )
        .await?;
        env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Test", "message": "",
                "lastHeartbeatTime": Timestamp::now().to_string(), "lastTransitionTime": since.to_string()}]}}))
            .await?;
    }
    env.apply(json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1,
            "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "300s"}],
            "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS}}}))
        .await?;
    let kubeconfig = write(&dir, "reader.yaml", &reader)?;
    let kubeconfig = kubeconfig.to_str().context("utf-8 path")?;

    let out = vigil(&["check", "--kubeconfig", kubeconfig, "--output", "json"]);
    let (stdout, stderr) = text(&out);
    assert!(matches!(out.status.code(), Some(0 | 2)), "exit {:?}\n{stdout}\n{stderr}", out.status.code());
    assert!(!stderr.contains("Missing Api Group"), "{stderr}");
    let report: Value = serde_json::from_str(&stdout).with_context(|| format!("{stdout}\n{stderr}"))?;
    let check = &report["checks"][0];
    assert_eq!(check["check"], "NodeHealthCheck/workers", "{report}");
    assert_eq!((check["targets"].as_i64(), check["unhealthy"].as_i64()), (Some(2), Some(1)), "{report}");

    let out = vigil(&["snapshot", "--kubeconfig", kubeconfig]);
    let (yaml, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let scenario = vigil_simulator::Scenario::parse(&yaml)?;
    let kinds: Vec<&str> = scenario.objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert!(kinds.contains(&"NodeHealthCheck") && kinds.contains(&"Node"), "{kinds:?}");
    assert!(!kinds.contains(&"Machine"), "{kinds:?}");
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("vigil-live-{}-{}", std::process::id(), Timestamp::now().as_nanosecond()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
