//! The Helm chart (deploy/helm/vigil) against helm itself and the real API server: lint,
//! rendering, server-side apply of every rendered object, restricted Pod Security, and the
//! controller running with a token of the chart's ServiceAccount, holding exactly the chart's
//! RBAC (happy paths, then a permission taken away).
//!
//! helm comes from `VIGIL_HELM` or scripts/helm.sh (built from its Go module, cached).

mod deploy;
mod support;

use anyhow::{Context, Result, ensure};
use deploy::{NAMESPACE, RELEASE, apply_all, chart_dir, helm_run, kind_of, may, may_named, one, render, repo_root};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use vigil_controller::Options;
use vigil_testenv::{TestEnv, wait_for};

/// The ServiceAccount (and ClusterRole) the chart makes for release `vigil`.
const SA: &str = "vigil";

fn chart_path() -> Result<String> {
    chart_dir().to_str().map(str::to_string).context("chart path is not UTF-8")
}

#[tokio::test]
async fn helm_lint_passes_with_defaults_and_with_every_option() -> Result<()> {
    let chart = chart_path()?;
    for sets in [
        vec![],
        vec![
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "dashboard.enabled=true",
        ],
        vec![
            "--set",
            "leaderElection.enabled=false",
            "--set",
            "replicas=1",
            "--set",
            "podDisruptionBudget.enabled=false",
        ],
        vec!["--set", "shards=6", "--set", "replicas=3"],
        vec!["--set", "serveMedik8s=true"],
    ] {
        let mut args = vec!["lint", "--strict", chart.as_str()];
        args.extend(sets.iter().copied());
        let (ok, out, err) = helm_run(&args).await?;
        assert!(ok, "helm lint {sets:?} failed:\n{out}\n{err}");
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    Ok(())
}

#[tokio::test]
async fn chart_refuses_several_replicas_without_leader_election() -> Result<()> {
    let chart = chart_path()?;
    let (ok, _, err) = helm_run(&["template", RELEASE, &chart, "--set", "leaderElection.enabled=false"]).await?;
    assert!(!ok, "2 replicas without leader election must be refused");
    assert!(err.contains("leaderElection.enabled=false with replicas > 1"), "{err}");
    let docs = render(&["leaderElection.enabled=false", "replicas=1"]).await?;
    let args = one(&docs, "Deployment")?.pointer("/spec/template/spec/containers/0/args").cloned().unwrap_or_default();
    assert!(args.as_array().is_some_and(|a| a.contains(&json!("--leader-elect=false"))), "{args}");
    let roles: Vec<&str> =
        docs.iter().filter(|d| kind_of(d) == "Role").filter_map(|d| d["metadata"]["name"].as_str()).collect();
    assert_eq!(roles, ["vigil-node-leases"], "no leader-election Lease permission without leader election");
    Ok(())
}

/// The chart's `crds/` are the generated ones (`vigil crd` writes deploy/crds; a test of the
/// vigil crate keeps those equal to the code): same files, same bytes.
#[test]
fn chart_crds_are_the_generated_ones() -> Result<()> {
    let names = |dir: std::path::PathBuf| -> Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        v.sort();
        Ok(v)
    };
    let generated = repo_root().join("deploy").join("crds");
    let chart = chart_dir().join("crds");
    let files = names(generated.clone())?;
    assert_eq!(files, names(chart.clone())?, "deploy/helm/vigil/crds must hold exactly deploy/crds' files");
    for f in &files {
        let a = std::fs::read(generated.join(f))?;
        let b = std::fs::read(chart.join(f))?;
        assert!(
            a == b,
            "deploy/helm/vigil/crds/{f} differs from deploy/crds/{f}: run `cp deploy/crds/*.yaml deploy/helm/vigil/crds/`"
        );
    }
    Ok(())
}

/// Every rendered object (defaults, then the optional ones that need no other CRDs) is accepted
/// by the API server, in a namespace that enforces the restricted Pod Security Standard; a Pod
/// made from the Deployment's template is admitted there, and the same Pod with one restriction
/// removed is refused (so the check is real).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_chart_is_accepted_and_its_pods_meet_restricted_pod_security() -> Result<()> {
    let docs = render(&[]).await?;
    let kinds: Vec<&str> = docs.iter().map(kind_of).collect();
    for kind in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(&kind), "the chart renders no {kind}: {kinds:?}");
    }
    let deployment = one(&docs, "Deployment")?;
    assert_eq!(deployment.pointer("/spec/replicas"), Some(&json!(2)));
    let container = deployment.pointer("/spec/template/spec/containers/0").context("no container")?;
    assert_eq!(container.pointer("/livenessProbe/httpGet/path"), Some(&json!("/livez")));
    assert_eq!(container.pointer("/readinessProbe/httpGet/path"), Some(&json!("/readyz")));
    assert!(
        container.pointer("/resources/requests/cpu").is_some()
            && container.pointer("/resources/requests/memory").is_some()
    );
    let args = container["args"].as_array().context("no args")?;
    for arg in [
        "run",
        "--metrics-addr=0.0.0.0:8080",
        "--leader-elect=true",
        "--lease-name=vigil",
        "--lease-namespace=$(POD_NAMESPACE)",
    ] {
        assert!(args.contains(&json!(arg)), "args lack {arg}: {args:?}");
    }

    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    let restricted = json!({"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"});
    apply_all(&env, &docs, restricted).await?;

    // A Pod of the Deployment's template passes the restricted admission check...
    let spec = deployment.pointer("/spec/template/spec").context("no pod spec")?.clone();
    let pod = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec});
    env.apply(pod("vigil-pss", spec.clone())).await.context("a Pod of the chart's template was refused")?;
    // ...and fails it without `capabilities.drop: [ALL]`.
    let mut weaker = spec.clone();
    if let Some(sc) = weaker.pointer_mut("/containers/0/securityContext").and_then(Value::as_object_mut) {
        sc.remove("capabilities");
    }
    let refused =
        env.apply(pod("vigil-pss-weaker", weaker)).await.expect_err("a Pod without capabilities.drop must be refused");
    assert!(format!("{refused:#}").contains("restricted"), "{refused:#}");

    // The optional objects render as their kinds; the PrometheusRule carries the recording
    // rules' groups, then the alerts'.
    let all = render(&["serviceMonitor.enabled=true", "prometheusRule.enabled=true"]).await?;
    let sm = one(&all, "ServiceMonitor")?;
    assert_eq!(sm.pointer("/spec/endpoints/0/port"), Some(&json!("metrics")));
    let rule = one(&all, "PrometheusRule")?;
    let groups = |dir: &str, file: &str| -> Result<Vec<Value>> {
        let file: Value = serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join(dir).join(file))?)?;
        Ok(file["groups"].as_array().cloned().unwrap_or_default())
    };
    let mut expected = groups("rules", "vigil.recording.yaml")?;
    expected.extend(groups("alerts", "vigil.rules.yaml")?);
    assert!(expected.len() >= 2, "both files have groups");
    assert_eq!(rule.pointer("/spec/groups"), Some(&Value::Array(expected)), "the PrometheusRule is the rule files");
    env.stop().await?;
    Ok(())
}

/// The book's RBAC table (docs/rbac.md) is what the chart grants (default values).
#[tokio::test]
async fn documented_rbac_table_matches_the_chart() -> Result<()> {
    let docs = render(&[]).await?;
    let expected = rbac_table(&docs)?;
    let page = std::fs::read_to_string(repo_root().join("docs/rbac.md"))?;
    let (_, rest) =
        page.split_once("<!-- rbac:begin -->\n").context("docs/rbac.md has no <!-- rbac:begin --> marker")?;
    let (table, _) = rest.split_once("<!-- rbac:end -->").context("docs/rbac.md has no <!-- rbac:end --> marker")?;
    assert!(
        table == expected,
        "docs/rbac.md's RBAC table differs from the chart; put this between the markers:\n{expected}"
    );
    Ok(())
}

/// The rules of the chart's ClusterRole and Role as a Markdown table.
fn rbac_table(docs: &[Value]) -> Result<String> {
    let mut out = String::from("| scope | API group | resources | verbs |\n| --- | --- | --- | --- |\n");
    let role_of = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| kind_of(d) == kind && d["metadata"]["name"] == name)
            .with_context(|| format!("no {kind} {name}"))
    };
    for (kind, name, scope) in [
        ("ClusterRole", "vigil", "cluster".to_string()),
        ("Role", "vigil-leader-election", "release namespace".to_string()),
        ("Role", "vigil-node-leases", "`medik8s-leases` namespace (node Leases)".to_string()),
    ] {
        let role = role_of(kind, name)?;
        for rule in role["rules"].as_array().context("rules")? {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default()
            };
            let groups: Vec<String> =
                list("apiGroups").iter().map(|g| if g.is_empty() { "core".into() } else { format!("`{g}`") }).collect();
            let mut resources = list("resources").iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ");
            let names = list("resourceNames");
            if !names.is_empty() {
                let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                resources.push_str(&format!(" (only {})", names.join(", ")));
            }
            out.push_str(&format!(
                "| {scope} | {} | {resources} | {} |\n",
                groups.join(", "),
                list("verbs").join(", ")
            ));
        }
    }
    Ok(out)
}

async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), io).await.context("GET timed out")??;
    let code = buf.split(' ').nth(1).and_then(|c| c.parse().ok()).context("no status line")?;
    Ok((code, buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The metric names (without labels) a /metrics text serves.
fn served_metrics(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
        .collect()
}

/// The `vigil_*` metric names the alert rules use.
fn alert_metrics() -> Result<Vec<String>> {
    let text = std::fs::read_to_string(chart_dir().join("alerts").join("vigil.rules.yaml"))?;
    let file: Value = serde_saphyr::from_str(&text)?;
    let mut names = Vec::new();
    for group in file["groups"].as_array().context("groups")? {
        for rule in group["rules"].as_array().context("rules")? {
            let expr = rule["expr"].as_str().context("an alert without expr")?;
            for (i, _) in expr.match_indices("vigil_") {
                let name: String = expr[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                names.push(name);
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

async fn snrs_for(env: &TestEnv, node: &str) -> Result<usize> {
    Ok(for_node(&list_snr(env, MEDIK8S).await?, node).len())
}

/// The controller holds only a token of the chart's ServiceAccount, bound to exactly the
/// chart's ClusterRole (and leader-election Role). Happy paths of both checks pass; the
/// ServiceAccount cannot do what Vigil never does; then `create` on SelfNodeRemediations is
/// taken from the ClusterRole: a Warning event `RemediationFailed` says why, no object is made and the
/// status lists none; given back, exactly one object is made. The alert rules' metrics are
/// all served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_with_the_charts_service_account_does_its_work_and_nothing_more() -> Result<()> {
    let docs = render(&[]).await?;
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    apply_all(&env, &docs, json!({})).await?;

    let token = deploy::service_account_token(&env, SA).await?;
    let client = env.client_with_token(&token, NAMESPACE).await?;
    // Least privilege, as the API server's authorizer sees it.
    for (verb, group, resource, ns, allowed) in [
        ("get", "", "secrets", "default", true),
        ("list", "", "secrets", "default", false),
        ("watch", "", "secrets", "default", false),
        ("patch", "", "nodes", "", false),
        ("delete", "", "nodes", "", false),
        ("list", "", "nodes", "", true),
        ("patch", "cluster.x-k8s.io", "machines", "default", false),
        ("delete", "cluster.x-k8s.io", "machines", "default", false),
        ("create", "events.k8s.io", "events", "default", true),
        ("update", "events.k8s.io", "events", "default", false),
        ("create", "", "events", "default", false),
        ("create", "self-node-remediation.medik8s.io", "selfnoderemediations", MEDIK8S, true),
        ("create", "self-node-remediation.medik8s.io", "selfnoderemediationtemplates", MEDIK8S, false),
        ("update", "vigil.dev", "machinehealthchecks", "default", false),
        ("create", "coordination.k8s.io", "leases", NAMESPACE, true),
        ("create", "coordination.k8s.io", "leases", "default", false),
        // medik8s node Leases: in their namespace only (never the kubelets' heartbeats).
        ("create", "coordination.k8s.io", "leases", "medik8s-leases", true),
        ("delete", "coordination.k8s.io", "leases", "medik8s-leases", true),
        ("delete", "coordination.k8s.io", "leases", "kube-node-lease", false),
        ("list", "nodemaintenance.medik8s.io", "nodemaintenances", "", true),
        ("create", "nodemaintenance.medik8s.io", "nodemaintenances", "", false),
        ("list", "config.openshift.io", "clusterversions", "", true),
        ("list", "machine.openshift.io", "machines", "openshift-machine-api", true),
        ("delete", "machine.openshift.io", "machines", "openshift-machine-api", false),
        ("create", "", "pods", NAMESPACE, false),
    ] {
        assert_eq!(
            may(&client, verb, group, resource, ns).await?,
            allowed,
            "ServiceAccount {NAMESPACE}/{SA}: {verb} {resource}.{group} in {ns:?}"
        );
    }

    // A MachineHealthCheck (self-hosted workload cluster) and a NodeHealthCheck with a
    // SelfNodeRemediation template.
    cluster(&env, false).await?;
    self_hosted(&env).await?;
    node(&env, "n1", json!({})).await?;
    machine(&env, "m1", Some("n1"), json!({})).await?;
    mhc(&env, "workers", json!({})).await?;
    workers(&env, 2).await?;
    env.apply(snr_template("reboot", MEDIK8S, true)).await?;
    nhc(&env, "workers", json!({"remediationTemplate": reboot_ref("reboot"), "maxUnhealthy": 2})).await?;

    let metrics = free_addr()?;
    let controller =
        Controller::start_with(client, Options { workers: 2, metrics_addr: Some(metrics), ..Default::default() });
    wait_machine_condition(&env, "m1", "HealthCheckSucceeded", "True", "HealthCheckSucceeded").await?;
    wait_for("/readyz 200 with the chart's RBAC", WAIT, || async {
        Ok(http_get(metrics, "/readyz").await.ok().filter(|(c, _)| *c == 200).map(|_| ()))
    })
    .await?;

    // Happy paths: a Machine marked for its owner, a Node remediated with one object.
    set_ready(&env, "n1", "False", &secs_ago(60)).await?;
    wait_machine_condition(&env, "m1", "OwnerRemediated", "False", "WaitingForRemediation").await?;
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    wait_for("a SelfNodeRemediation for w1", WAIT, || async { Ok((snrs_for(&env, "w1").await? == 1).then_some(())) })
        .await?;

    // Take `create` on SelfNodeRemediations away: w2 fails.
    let cluster_role = one(&docs, "ClusterRole")?;
    let mut weaker = cluster_role.clone();
    let rules = weaker["rules"].as_array_mut().context("rules")?;
    for rule in rules.iter_mut() {
        if rule["resources"] == json!(["selfnoderemediations"]) {
            rule["verbs"] = json!(["list", "watch", "patch", "delete"]);
        }
    }
    env.apply(weaker).await?;
    set_ready(&env, "w2", "False", &secs_ago(60)).await?;
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(env.client());
    // The failed create is a Warning event `RemediationFailed` on the check whose note names
    // the target and the API server's refusal.
    let found = wait_for("a Warning event naming the refused create", WAIT, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("RemediationFailed")
                && e.note.as_deref().is_some_and(|n| n.contains("Could not create SelfNodeRemediation for w2"))
        }))
    })
    .await;
    let event = match found {
        Ok(e) => e,
        Err(e) => {
            let seen: Vec<String> = events
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                .collect();
            let status = check_status(&env, "NodeHealthCheck", "workers").await?;
            anyhow::bail!("{e:#}\nevents: {seen:#?}\nstatus: {status}");
        }
    };
    let note = event.note.unwrap_or_default();
    ensure!(
        ["forbidden", "system:serviceaccount:vigil-system:vigil", "cannot create resource"]
            .iter()
            .all(|w| note.contains(w)),
        "the event does not say the create was refused, and for whom: {note}"
    );
    stays("an object for w2 or a status listing one while create is refused", Duration::from_secs(4), || async {
        let s = check_status(&env, "NodeHealthCheck", "workers").await?;
        let listed = s["unhealthyNodes"].as_array().is_some_and(|ns| {
            ns.iter().any(|n| n["name"] == "w2" && n["remediations"].as_array().is_some_and(|r| !r.is_empty()))
        });
        Ok(listed || snrs_for(&env, "w2").await? > 0)
    })
    .await?;

    // Given back (the chart's role as rendered): exactly one object for w2.
    env.apply(cluster_role.clone()).await?;
    wait_for("w2's object once the chart's role is back", Duration::from_secs(90), || async {
        Ok((snrs_for(&env, "w2").await? >= 1).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(snrs_for(&env, "w2").await?, 1, "exactly one object for w2");
    assert_eq!(snrs_for(&env, "w1").await?, 1, "exactly one object for w1");

    // Every metric the alert rules use is served (vigil_remediations_total has a failed
    // outcome by now).
    let text = http_get(metrics, "/metrics").await?.1;
    let served = served_metrics(&text);
    for name in alert_metrics()? {
        assert!(served.contains(&name), "the alert rules use {name}, which /metrics does not serve:\n{text}");
    }
    assert!(text.contains("vigil_remediations_total{") && text.contains("outcome=\"failed\""), "{text}");
    // Events went out through the event lane (counted as writes), and it empties once they are sent.
    assert!(text.contains("vigil_writes_total{kind=\"event\"}"), "{text}");
    wait_for("the event lane empty", WAIT, || async {
        let text = http_get(metrics, "/metrics").await?.1;
        Ok(text.lines().any(|l| l == "vigil_events_waiting 0").then_some(()))
    })
    .await?;
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// `serveMedik8s=true`: the controller runs with `--serve-medik8s` and a token of the chart's
/// ServiceAccount only, starts (it may read the operator's Lease by name, in any namespace), and
/// decides a medik8s NodeHealthCheck in place; it may read no other Lease, nor change a medik8s
/// check but its status. Without the value, nothing of medik8s' is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_serve_medik8s_the_charts_role_serves_medik8s_checks_and_nothing_more() -> Result<()> {
    let plain = render(&[]).await?;
    let rules = |docs: &[Value]| -> Result<String> { Ok(one(docs, "ClusterRole")?["rules"].to_string()) };
    let granted = |docs: &[Value]| -> Result<bool> {
        let rules = rules(docs)?;
        Ok(rules.contains("\"remediation.medik8s.io\"") || rules.contains("e1f13584"))
    };
    assert!(!granted(&plain)?, "{}", rules(&plain)?);
    let docs = render(&["serveMedik8s=true"]).await?;
    let args = one(&docs, "Deployment")?.pointer("/spec/template/spec/containers/0/args").cloned().unwrap_or_default();
    assert!(args.as_array().is_some_and(|a| a.contains(&json!("--serve-medik8s"))), "{args}");
    assert!(granted(&docs)?);

    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    env.install_crds(&[vigil_testenv::medik8s_nhc_crd()?]).await?;
    apply_all(&env, &docs, json!({})).await?;
    let token = deploy::service_account_token(&env, SA).await?;
    let client = env.client_with_token(&token, NAMESPACE).await?;
    let lease = vigil_controller::medik8s::OPERATOR_LEASE;
    for (verb, group, resource, ns, name, allowed) in [
        ("list", "coordination.k8s.io", "leases", "openshift-workload-availability", lease, true),
        ("watch", "coordination.k8s.io", "leases", "", lease, true),
        ("list", "coordination.k8s.io", "leases", "kube-node-lease", "", false),
        ("get", "coordination.k8s.io", "leases", "kube-node-lease", "n1", false),
        ("list", "remediation.medik8s.io", "nodehealthchecks", "", "", true),
        ("patch", "remediation.medik8s.io", "nodehealthchecks/status", "", "workers", true),
        ("patch", "remediation.medik8s.io", "nodehealthchecks", "", "workers", false),
        ("delete", "remediation.medik8s.io", "nodehealthchecks", "", "workers", false),
    ] {
        assert_eq!(
            may_named(&client, verb, group, resource, ns, name).await?,
            allowed,
            "ServiceAccount {NAMESPACE}/{SA}: {verb} {resource}.{group} {name:?} in {ns:?}"
        );
    }
    vigil_controller::medik8s::refuse_to_start(&client).await.map_err(anyhow::Error::msg)?;

    workers(&env, 2).await?;
    env.apply(snr_template("reboot", MEDIK8S, false)).await?;
    env.apply(json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "workers"},
        "spec": {"selector": {"matchLabels": {"role": "worker"}}, "minHealthy": 1, "remediationTemplate": reboot_ref("reboot"),
                 "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "2s"}]}}))
        .await?;
    let controller = Controller::start_with(client, Options { workers: 2, serve_medik8s: true, ..Default::default() });
    set_ready(&env, "w1", "False", &secs_ago(60)).await?;
    let objects = wait_for("a SelfNodeRemediation for w1 from the medik8s check", WAIT, || async {
        let all = list_snr(&env, MEDIK8S).await?;
        Ok((!for_node(&all, "w1").is_empty()).then_some(all))
    })
    .await?;
    assert_eq!(
        for_node(&objects, "w1")[0]["metadata"]["ownerReferences"][0]["apiVersion"],
        "remediation.medik8s.io/v1alpha1"
    );
    wait_for("the medik8s check's status", WAIT, || async {
        let s = env.get_json("remediation.medik8s.io/v1alpha1", "NodeHealthCheck", None, "workers").await?;
        Ok(s.filter(|s| s.pointer("/status/phase") == Some(&json!("Remediating"))).map(|_| ()))
    })
    .await?;
    controller.stop().await;
    env.stop().await?;
    Ok(())
}

/// The alert rules file is a Prometheus rule file with the alerts docs/metrics.md names, each with a
/// severity and a summary (that their `vigil_*` metrics are served is checked above, against
/// the running controller).
#[test]
fn alert_rules_cover_what_the_readme_promises() -> Result<()> {
    let text = std::fs::read_to_string(chart_dir().join("alerts").join("vigil.rules.yaml"))?;
    let file: Value = serde_saphyr::from_str(&text)?;
    let rules: Vec<&Value> = file["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    for rule in &rules {
        let name = rule["alert"].as_str().context("a rule without alert")?;
        assert!(rule["expr"].as_str().is_some_and(|e| !e.is_empty()), "{name}: no expr");
        assert!(
            matches!(rule["labels"]["severity"].as_str(), Some("warning" | "critical")),
            "{name}: severity must be warning or critical"
        );
        assert!(rule["annotations"]["summary"].is_string(), "{name}: no summary");
    }
    let exprs: Vec<&str> = rules.iter().filter_map(|r| r["expr"].as_str()).collect();
    for needle in [
        "vigil_api_reachable",
        "vigil_source_synced",
        "vigil_remediations_total{outcome=\"failed\"}",
        "vigil_remediations_unconfirmed_total",
        "kube_pod_container_status_ready{container=\"vigil\"}",
    ] {
        assert!(exprs.iter().any(|e| e.contains(needle)), "no alert on {needle}");
    }
    Ok(())
}

/// The install, upgrade and uninstall commands of docs/install.md work against the real API server:
/// helm installs the CRDs and every object, an upgrade changes the Deployment, an uninstall
/// removes the release's objects and leaves the CRDs (so no check is lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_on_the_api_server() -> Result<()> {
    let env = TestEnv::start().await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).await?;
    let kubeconfig = kubeconfig.to_str().context("temp path is not UTF-8")?.to_string();
    let chart = chart_path()?;
    let helm = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--kubeconfig".into(), kubeconfig.clone(), "--namespace".into(), NAMESPACE.into()]);
        async move {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            let (ok, out, err) = helm_run(&refs).await?;
            ensure!(ok, "helm {} failed:\n{out}\n{err}", refs.join(" "));
            anyhow::Ok(out)
        }
    };
    let args = || async {
        let d = env.get_json("apps/v1", "Deployment", Some(NAMESPACE), "vigil").await?;
        anyhow::Ok(d.and_then(|d| d.pointer("/spec/template/spec/containers/0/args").cloned()))
    };

    helm(&["install", RELEASE, &chart, "--create-namespace"]).await?;
    for name in ["machinehealthchecks.vigil.dev", "nodehealthchecks.vigil.dev"] {
        let crd = env.get_json("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, name).await?;
        assert!(crd.is_some(), "helm install did not install CRD {name}");
    }
    assert!(args().await?.is_some_and(|a| a.as_array().is_some_and(|a| a.contains(&json!("--workers=16")))));
    let sa = env.get_json("v1", "ServiceAccount", Some(NAMESPACE), SA).await?;
    assert!(sa.is_some(), "no ServiceAccount after helm install");

    helm(&["upgrade", RELEASE, &chart, "--reuse-values", "--set", "workers=8"]).await?;
    let upgraded = args().await?;
    assert!(
        upgraded.as_ref().is_some_and(|a| a.as_array().is_some_and(|a| a.contains(&json!("--workers=8")))),
        "{upgraded:?}"
    );

    helm(&["uninstall", RELEASE]).await?;
    assert!(args().await?.is_none(), "the Deployment survived helm uninstall");
    let role = env.get_json("rbac.authorization.k8s.io/v1", "ClusterRole", None, "vigil").await?;
    assert!(role.is_none(), "the ClusterRole survived helm uninstall");
    let crd = env
        .get_json("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, "machinehealthchecks.vigil.dev")
        .await?;
    assert!(crd.is_some(), "helm uninstall must leave the CRDs (and every check) in place");
    env.stop().await?;
    Ok(())
}
