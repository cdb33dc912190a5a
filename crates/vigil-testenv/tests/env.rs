//! The harness against real etcd + kube-apiserver processes.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use vigil_testenv::{Result, TestEnv, wait_for};

const T0: &str = "2030-01-01T00:00:00Z";

fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer).unwrap_or(&Value::Null)
}

/// Whether a process id is gone (exited and reaped).
fn is_gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn upstream_crds_and_v1beta2_objects_with_status() -> Result<()> {
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;

    env.apply(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": "fleet"},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": "prod"}},
    }))
    .await?;
    env.apply_status(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": "fleet"},
        "status": {
            "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
            "conditions": [{"type": "Available", "status": "True", "reason": "Available", "message": "", "lastTransitionTime": T0}],
        },
    }))
    .await?;

    env.apply(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m1", "namespace": "fleet", "labels": {"cluster.x-k8s.io/cluster-name": "prod"}},
        "spec": {
            "clusterName": "prod",
            "bootstrap": {"dataSecretName": "m1-bootstrap"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "m1"},
        },
    }))
    .await?;
    env.apply_status(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m1", "namespace": "fleet"},
        "status": {
            "phase": "Running",
            "nodeRef": {"name": "n1"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": T0}],
        },
    }))
    .await?;

    env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"role": "worker"}}}))
        .await?;
    env.apply_status(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "KubeletDown", "message": "kubelet stopped posting",
            "lastHeartbeatTime": T0, "lastTransitionTime": T0,
        }]},
    }))
    .await?;

    env.apply(json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "snr", "namespace": "fleet"},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}},
    }))
    .await?;

    let cluster = env.get_json("cluster.x-k8s.io/v1beta2", "Cluster", Some("fleet"), "prod").await?.expect("Cluster");
    assert_eq!(at(&cluster, "/status/initialization/infrastructureProvisioned"), true);
    assert_eq!(at(&cluster, "/status/conditions/0/type"), "Available");

    let machine = env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some("fleet"), "m1").await?.expect("Machine");
    assert_eq!(at(&machine, "/spec/clusterName"), "prod");
    assert_eq!(at(&machine, "/status/nodeRef/name"), "n1");
    assert_eq!(at(&machine, "/status/phase"), "Running");
    assert_eq!(at(&machine, "/status/conditions/0/status"), "True");
    let managers: Vec<&str> = at(&machine, "/metadata/managedFields")
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert!(managers.iter().all(|m| *m == "vigil-test"), "{managers:?}");

    // A typed client sees the Node conditions as the controller will.
    let node = Api::<Node>::all(env.client()).get("n1").await?;
    let ready = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert_eq!(ready.len(), 1);
    assert_eq!((ready[0].type_.as_str(), ready[0].status.as_str()), ("Ready", "False"));
    assert_eq!(ready[0].reason.as_deref(), Some("KubeletDown"));

    let template = env
        .get_json("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediationTemplate", Some("fleet"), "snr")
        .await?
        .expect("template");
    assert_eq!(at(&template, "/spec/template/spec/remediationStrategy"), "Automatic");

    // Deleting: true once, then false; the object is gone (no finalizers here).
    assert!(env.delete("cluster.x-k8s.io/v1beta2", "Machine", Some("fleet"), "m1").await?);
    wait_for("Machine m1 to be gone", Duration::from_secs(10), || async {
        Ok(env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some("fleet"), "m1").await?.is_none().then_some(()))
    })
    .await?;
    assert!(!env.delete("cluster.x-k8s.io/v1beta2", "Machine", Some("fleet"), "m1").await?);

    // Mistakes are named.
    let err = env.apply(json!({"apiVersion": "example.com/v1", "kind": "Bogus", "metadata": {"name": "x"}})).await;
    let err = format!("{:#}", err.expect_err("unknown kind"));
    assert!(err.contains("serves no Bogus in example.com/v1"), "{err}");
    let err = env.get_json("v1", "Node", Some("fleet"), "n1").await.expect_err("cluster-scoped");
    assert!(err.to_string().contains("Node is cluster-scoped"), "{err}");
    // The reduced CRD serves v1beta2 only.
    let err = env.get_json("cluster.x-k8s.io/v1beta1", "Machine", Some("fleet"), "m1").await;
    assert!(err.is_err(), "v1beta1 must not be served: {err:?}");

    env.stop().await
}

#[tokio::test]
async fn upstream_crds_reduced_to_v1beta1() -> Result<()> {
    let env = TestEnv::start().await?;
    env.install_upstream_crds_v1beta1().await?;
    env.apply(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": "old", "namespace": "default"},
        "spec": {
            "clusterName": "prod",
            "bootstrap": {"dataSecretName": "old-bootstrap"},
            "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": "old"},
        },
    }))
    .await?;
    env.apply_status(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": "old", "namespace": "default"},
        "status": {
            "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": "n-old"},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T0}],
        },
    }))
    .await?;
    let machine = env.get_json("cluster.x-k8s.io/v1beta1", "Machine", Some("default"), "old").await?.expect("Machine");
    assert_eq!(at(&machine, "/apiVersion"), "cluster.x-k8s.io/v1beta1");
    assert_eq!(at(&machine, "/spec/infrastructureRef/kind"), "DockerMachine");
    assert_eq!(at(&machine, "/status/nodeRef/name"), "n-old");
    assert!(env.get_json("cluster.x-k8s.io/v1beta2", "Machine", Some("default"), "old").await.is_err());
    Ok(())
}

/// Two envs at once, and a Cluster API kubeconfig Secret in env A that reaches env B.
#[tokio::test]
async fn two_envs_and_a_kubeconfig_secret() -> Result<()> {
    let (a, b) = tokio::join!(TestEnv::start(), TestEnv::start());
    let (a, b) = (a?, b?);
    assert_ne!(a.server_url(), b.server_url());

    b.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "only-in-b"}})).await?;
    a.apply(a.kubeconfig_secret("fleet", "prod")).await?; // A's own, overwritten below
    a.apply(b.kubeconfig_secret("fleet", "prod")).await?;

    // Read the Secret as the controller will, and build a client from its `value`.
    let secret = Api::<Secret>::namespaced(a.client(), "fleet").get("prod-kubeconfig").await?;
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    let value = secret.data.as_ref().and_then(|d| d.get("value")).expect("data.value");
    let yaml = String::from_utf8(value.0.clone())?;
    let workload = client_from_yaml(&yaml).await?;
    let nodes = node_names(&workload).await?;
    assert_eq!(nodes, ["only-in-b"]);
    assert!(node_names(&a.client()).await?.is_empty(), "env A must not see env B's Node");

    // The kubeconfig file works too.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.kubeconfig");
    a.write_kubeconfig(&path).await?;
    let from_file = client_from_yaml(&std::fs::read_to_string(&path)?).await?;
    assert!(node_names(&from_file).await?.is_empty());
    Ok(())
}

async fn client_from_yaml(yaml: &str) -> Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(yaml)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn node_names(client: &Client) -> Result<Vec<String>> {
    let list =
        tokio::time::timeout(Duration::from_secs(30), Api::<Node>::all(client.clone()).list(&ListParams::default()))
            .await??;
    Ok(list.items.into_iter().filter_map(|n| n.metadata.name).collect())
}

#[tokio::test]
async fn drop_and_stop_leave_nothing_behind() -> Result<()> {
    let env = TestEnv::start().await?;
    let pids = [env.apiserver_pid().expect("apiserver"), env.etcd_pid().expect("etcd")];
    let dir = env.dir().expect("dir").to_path_buf();
    assert!(pids.iter().all(|p| !is_gone(*p)) && dir.exists());
    drop(env);
    assert!(pids.iter().all(|p| is_gone(*p)), "processes left after drop");
    assert!(!dir.exists(), "temp dir left after drop");

    let env = TestEnv::start().await?;
    let pids = [env.apiserver_pid().expect("apiserver"), env.etcd_pid().expect("etcd")];
    let dir = env.dir().expect("dir").to_path_buf();
    let t = Instant::now();
    env.stop().await?;
    eprintln!("graceful stop took {:?}", t.elapsed());
    assert!(pids.iter().all(|p| is_gone(*p)), "processes left after stop");
    assert!(!dir.exists(), "temp dir left after stop");
    Ok(())
}

/// Start time and memory; run with `cargo test -p vigil-testenv --test env -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "measurement, run by hand"]
async fn measure_start_time_and_memory() -> Result<()> {
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let env = TestEnv::start().await?;
        times.push(t.elapsed());
        let rss = |pid: Option<u32>| rss_mib(pid.expect("pid"));
        eprintln!(
            "start {:?}; RSS apiserver {} MiB, etcd {} MiB",
            t.elapsed(),
            rss(env.apiserver_pid()),
            rss(env.etcd_pid())
        );
        let t = Instant::now();
        env.install_upstream_crds().await?;
        eprintln!(
            "install_upstream_crds {:?}; RSS apiserver {} MiB, etcd {} MiB",
            t.elapsed(),
            rss(env.apiserver_pid()),
            rss(env.etcd_pid())
        );
        let t = Instant::now();
        drop(env);
        eprintln!("drop {:?}", t.elapsed());
    }
    times.sort();
    eprintln!("median start {:?} of {times:?}", times[times.len() / 2]);
    Ok(())
}

/// Many envs at once, as a parallel e2e suite would start them; run by hand like the above.
#[tokio::test]
#[ignore = "measurement, run by hand"]
async fn measure_eight_envs_at_once() -> Result<()> {
    let t = Instant::now();
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..8 {
        starts.spawn(async move {
            let env = TestEnv::start().await?;
            let ready = t.elapsed();
            env.install_upstream_crds().await?;
            Ok::<_, vigil_testenv::Error>((env, ready, t.elapsed()))
        });
    }
    let mut envs = Vec::new();
    while let Some(started) = starts.join_next().await {
        let (env, ready, crds) = started??;
        eprintln!("ready after {ready:?}, CRDs after {crds:?}");
        envs.push(env);
    }
    eprintln!("all 8 ready with CRDs after {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut total = 0;
    for env in &envs {
        total += rss_mib(env.apiserver_pid().expect("pid")) + rss_mib(env.etcd_pid().expect("pid"));
    }
    eprintln!("total RSS of 8 envs: {total} MiB");
    Ok(())
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib / 1024)
}
