//! Helpers of the installation tests (chart.rs, image.rs): helm (built by scripts/helm.sh),
//! the chart rendered to JSON documents, applied to the test API server, and ServiceAccount
//! tokens from the TokenRequest API.

#![allow(dead_code)]

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_testenv::TestEnv;

/// The release namespace of every rendering.
pub const NAMESPACE: &str = "vigil-system";
/// The release name: the chart's objects are named `vigil` (the name holds "vigil").
pub const RELEASE: &str = "vigil";
/// Time limit of one helm command (not the build).
const HELM_LIMIT: Duration = Duration::from_secs(60);
/// Time limit of scripts/helm.sh (a cold Go build of helm takes a few minutes on 2 busy cores).
const HELM_BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

pub fn chart_dir() -> PathBuf {
    repo_root().join("deploy").join("helm").join("vigil")
}

/// Runs a command with a time limit; returns (success, stdout, stderr).
pub async fn run_bounded(
    cmd: &mut tokio::process::Command,
    limit: Duration,
    what: &str,
) -> Result<(bool, String, String)> {
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .with_context(|| format!("{what}: no answer within {limit:?}"))?
        .with_context(|| format!("{what}: cannot start"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The helm binary: `VIGIL_HELM`, else the one scripts/helm.sh builds (once, cached).
pub async fn helm() -> Result<PathBuf> {
    static HELM: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    HELM.get_or_try_init(|| async {
        if let Some(path) = std::env::var_os("VIGIL_HELM") {
            return Ok(PathBuf::from(path));
        }
        let script = repo_root().join("scripts").join("helm.sh");
        let (ok, out, err) =
            run_bounded(&mut tokio::process::Command::new(&script), HELM_BUILD_LIMIT, "scripts/helm.sh").await?;
        ensure!(ok, "scripts/helm.sh failed:\n{err}");
        Ok(PathBuf::from(out.trim()))
    })
    .await
    .cloned()
}

/// Runs helm with `args`; returns (success, stdout, stderr).
pub async fn helm_run(args: &[&str]) -> Result<(bool, String, String)> {
    let helm = helm().await?;
    run_bounded(tokio::process::Command::new(&helm).args(args), HELM_LIMIT, &format!("helm {}", args.join(" "))).await
}

/// `helm template` of the chart (release `vigil` in `vigil-system`, CRDs included) with
/// `--set` values, as JSON documents (empty documents left out).
pub async fn render(sets: &[&str]) -> Result<Vec<Value>> {
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path is not UTF-8")?;
    let mut args = vec!["template", RELEASE, chart, "--namespace", NAMESPACE, "--include-crds"];
    for s in sets {
        args.push("--set");
        args.push(s);
    }
    let (ok, out, err) = helm_run(&args).await?;
    ensure!(ok, "helm template {sets:?} failed:\n{err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).context("helm template printed invalid YAML")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

pub fn kind_of(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

pub fn name_of(doc: &Value) -> &str {
    doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

/// The one rendered document of `kind`.
pub fn one<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    let found: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == kind).collect();
    match found.as_slice() {
        [one] => Ok(one),
        _ => bail!("expected exactly one {kind} in the rendered chart, found {}", found.len()),
    }
}

/// Server-side applies every rendered document (CRDs first, waiting until they are served),
/// after creating the release namespace with `labels`. Every object must be accepted.
pub async fn apply_all(env: &TestEnv, docs: &[Value], ns_labels: Value) -> Result<()> {
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": ns_labels}}))
        .await?;
    let crds: Vec<Value> = docs.iter().filter(|d| kind_of(d) == "CustomResourceDefinition").cloned().collect();
    env.install_crds(&crds).await.context("the chart's CRDs were not accepted")?;
    for doc in docs.iter().filter(|d| kind_of(d) != "CustomResourceDefinition") {
        env.apply(doc.clone())
            .await
            .with_context(|| format!("the chart's {} {} was not accepted", kind_of(doc), name_of(doc)))?;
    }
    Ok(())
}

/// A token of ServiceAccount `NAMESPACE/name` from the TokenRequest API (1 h).
pub async fn service_account_token(env: &TestEnv, name: &str) -> Result<String> {
    let client = env.client();
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}});
    let req = http::Request::post(format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request)?)?;
    let answer: Value = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .context("TokenRequest: no answer within 30s")?
        .with_context(|| format!("TokenRequest for ServiceAccount {NAMESPACE}/{name} failed"))?;
    answer
        .pointer("/status/token")
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("TokenRequest answer without status.token: {answer}"))
}

/// Whether the identity of `client` may do `verb` on `resource` (SelfSubjectAccessReview).
pub async fn may(client: &kube::Client, verb: &str, group: &str, resource: &str, namespace: &str) -> Result<bool> {
    may_named(client, verb, group, resource, namespace, "").await
}

/// [`may`] for the object `name` (`""`: any), so a rule limited to names can be shown to be.
pub async fn may_named(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> Result<bool> {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "subresource": subresource, "namespace": namespace, "name": name}}});
    let req = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review)?)?;
    let answer: Value = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .context("SelfSubjectAccessReview: no answer within 30s")?
        .context("SelfSubjectAccessReview failed")?;
    answer
        .pointer("/status/allowed")
        .and_then(Value::as_bool)
        .with_context(|| format!("review without status.allowed: {answer}"))
}
