//! The real upstream CRDs, reduced to the one Cluster API version a test wants (upstream serves
//! two and converts between them with a webhook a bare API server lacks). Cluster API's come from
//! its published Go module at a pinned version (`scripts/capi-crds.sh`, cached); medik8s' are
//! committed under `crates/vigil-testenv/upstream-crds/medik8s` (version and licence noted there);
//! OpenShift's ClusterVersion and Machine come from the `github.com/openshift/api` module
//! (`scripts/openshift-crds.sh`, cached); the stand-in remediators' CRDs, written for the tests,
//! are under `crates/vigil-testenv/standin-crds`.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use crate::Result;

/// The Cluster API version the reduced upstream CRDs serve: a test picks the one it exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapiVersion {
    /// `cluster.x-k8s.io/v1beta1`, the older API that many clusters still run.
    V1Beta1,
    /// `cluster.x-k8s.io/v1beta2`, the storage version upstream.
    V1Beta2,
}

impl CapiVersion {
    /// The version name as it appears in `spec.versions[].name`, to find the entry to keep.
    pub fn as_str(self) -> &'static str {
        match self {
            CapiVersion::V1Beta1 => "v1beta1",
            CapiVersion::V1Beta2 => "v1beta2",
        }
    }
}

/// Cluster API CRD files (in [`capi_crds_dir`]) installed by [`crate::TestEnv::install_upstream_crds`].
const CAPI_FILES: [&str; 3] =
    ["cluster.x-k8s.io_clusters.yaml", "cluster.x-k8s.io_machines.yaml", "cluster.x-k8s.io_machinesets.yaml"];

/// medik8s CRD files (in [`medik8s_crds_dir`]) installed as they are (they serve a single version).
const MEDIK8S_FILES: [&str; 2] = [
    "self-node-remediation.medik8s.io_selfnoderemediations.yaml",
    "self-node-remediation.medik8s.io_selfnoderemediationtemplates.yaml",
];

/// OpenShift CRD files (in [`openshift_crds_dir`]): ClusterVersion and Machine API Machine.
const OPENSHIFT_FILES: [&str; 2] = ["config.openshift.io_clusterversions.yaml", "machine.openshift.io_machines.yaml"];

/// Stand-in CRD files (in [`standin_crds_dir`]): the remediation kinds of the fence-like and
/// deletion-like stand-ins with their templates, and NodeMaintenance.
const STANDIN_FILES: [&str; 5] = [
    "fence-agents-remediation.medik8s.io_fenceagentsremediations.yaml",
    "fence-agents-remediation.medik8s.io_fenceagentsremediationtemplates.yaml",
    "machine-deletion-remediation.medik8s.io_machinedeletionremediations.yaml",
    "machine-deletion-remediation.medik8s.io_machinedeletionremediationtemplates.yaml",
    "nodemaintenance.medik8s.io_nodemaintenances.yaml",
];

/// Time limit for `scripts/capi-crds.sh` (one module download; cached afterwards).
const FETCH_LIMIT: Duration = Duration::from_secs(10 * 60);

/// The committed medik8s CRDs, inside the project so a fresh clone has them.
pub fn medik8s_crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream-crds").join("medik8s")
}

/// The Cluster API CRDs of the pinned `sigs.k8s.io/cluster-api` module: `VIGIL_CAPI_CRD_DIR`
/// when set (`scripts/test.sh` sets it), else the directory `scripts/capi-crds.sh` prints (it
/// downloads the module once and caches the CRDs).
pub fn capi_crds_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("VIGIL_CAPI_CRD_DIR") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => run_crds_script("capi-crds.sh").map_err(|e| format!("{e:#}")),
    })
    .clone()
    .map_err(|e| anyhow!("{e}"))
}

/// The OpenShift CRDs of the pinned `github.com/openshift/api` module: `VIGIL_OPENSHIFT_CRD_DIR`
/// when set (`scripts/test.sh` sets it), else the directory `scripts/openshift-crds.sh` prints (it
/// downloads the module once and caches the CRDs).
pub fn openshift_crds_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("VIGIL_OPENSHIFT_CRD_DIR") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => run_crds_script("openshift-crds.sh").map_err(|e| format!("{e:#}")),
    })
    .clone()
    .map_err(|e| anyhow!("{e}"))
}

/// OpenShift's `config.openshift.io/v1` ClusterVersion and `machine.openshift.io/v1beta1` Machine
/// CRDs as the module publishes them (their Default feature set), parsed, for
/// [`crate::TestEnv::install_crds`]: the upgrade pause reads the first, remediation objects are
/// owned by the second.
pub fn openshift_crds() -> Result<Vec<Value>> {
    let dir = openshift_crds_dir()?;
    OPENSHIFT_FILES.iter().map(|f| read_crd_file(&dir.join(f))).collect()
}

/// The stand-in CRDs, inside the project (`crates/vigil-testenv/standin-crds`).
pub fn standin_crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("standin-crds")
}

/// The stand-in remediators' CRDs (fence agents and machine deletion remediation with their
/// templates, NodeMaintenance), parsed, for [`crate::TestEnv::install_crds`].
pub fn standin_crds() -> Result<Vec<Value>> {
    let dir = standin_crds_dir();
    STANDIN_FILES.iter().map(|f| read_crd_file(&dir.join(f))).collect()
}

/// Runs `scripts/<name>` and returns the directory it prints on its last line.
fn run_crds_script(name: &str) -> Result<PathBuf> {
    let script = crate::workspace_root().join("scripts").join(name);
    let mut child = std::process::Command::new("bash")
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().with_context(|| format!("waiting for {}", script.display()))? {
            break status;
        }
        if started.elapsed() > FETCH_LIMIT {
            // Best effort: the error below is what matters.
            let _ = child.kill();
            bail!("{} did not finish within {FETCH_LIMIT:?}", script.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout).with_context(|| format!("reading the output of {}", script.display()))?;
    }
    if !status.success() {
        bail!("{} failed ({status}); its progress is on stderr above", script.display());
    }
    let dir = stdout.lines().rev().find(|l| !l.trim().is_empty()).map(str::trim);
    dir.map(PathBuf::from).ok_or_else(|| anyhow!("{} printed no directory", script.display()))
}

/// The upstream CRDs e2e tests need (Cluster, Machine, MachineSet reduced to `capi`, plus
/// SelfNodeRemediation and its template), parsed as JSON, ready for [`crate::TestEnv::install_crds`].
pub fn upstream_crds(capi: CapiVersion) -> Result<Vec<Value>> {
    let mut crds = Vec::new();
    for (file, doc) in parsed_upstream()? {
        let mut doc = doc.clone();
        if CAPI_FILES.contains(&file.as_str()) {
            reduce_to_version(&mut doc, capi.as_str()).with_context(|| file.clone())?;
        }
        crds.push(doc);
    }
    Ok(crds)
}

/// Parses the upstream files once per test process: they are large and every env needs them.
fn parsed_upstream() -> Result<&'static [(String, Value)]> {
    static PARSED: OnceLock<std::result::Result<Vec<(String, Value)>, String>> = OnceLock::new();
    PARSED
        .get_or_init(|| {
            let capi = capi_crds_dir().map_err(|e| format!("{e:#}"))?;
            let medik8s = medik8s_crds_dir();
            let files = CAPI_FILES.iter().map(|f| capi.join(f)).chain(MEDIK8S_FILES.iter().map(|f| medik8s.join(f)));
            let mut out = Vec::new();
            for path in files {
                let doc = read_crd_file(&path).map_err(|e| format!("{e:#}"))?;
                let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                out.push((file, doc));
            }
            Ok(out)
        })
        .as_deref()
        .map_err(|e| anyhow!("{e}"))
}

/// medik8s' NodeHealthCheck CRD (`remediation.medik8s.io/v1alpha1`, node-healthcheck-operator
/// v0.12.0, committed under [`medik8s_crds_dir`]), for the tests of `vigil run --serve-medik8s`;
/// installed only by them, so the other suites' API servers serve no medik8s check.
pub fn medik8s_nhc_crd() -> Result<Value> {
    read_crd_file(&medik8s_crds_dir().join("remediation.medik8s.io_nodehealthchecks.yaml"))
}

/// Reads a YAML file holding exactly one CustomResourceDefinition document.
fn read_crd_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the upstream CRD {} (Cluster API's come from scripts/capi-crds.sh or \
             VIGIL_CAPI_CRD_DIR)",
            path.display()
        )
    })?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{}: invalid YAML", path.display()))?;
    let mut crds =
        docs.into_iter().filter(|d| d.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition"));
    match (crds.next(), crds.next()) {
        (Some(crd), None) => Ok(crd),
        (None, _) => bail!("{}: no CustomResourceDefinition document", path.display()),
        (Some(_), Some(_)) => bail!("{}: more than one CustomResourceDefinition document", path.display()),
    }
}

/// Keeps only `version` in `spec.versions`, makes it the served storage version and drops
/// `spec.conversion`, so a CRD that upstream converts with a webhook works on a bare API server.
pub fn reduce_to_version(crd: &mut Value, version: &str) -> Result<()> {
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<unnamed>").to_string();
    let spec = crd.get_mut("spec").and_then(Value::as_object_mut).ok_or_else(|| anyhow!("CRD {name}: no spec"))?;
    spec.remove("conversion");
    let versions = spec
        .get_mut("versions")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| anyhow!("CRD {name}: no spec.versions"))?;
    let available: Vec<String> =
        versions.iter().filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string)).collect();
    versions.retain(|v| v.get("name").and_then(Value::as_str) == Some(version));
    let kept = versions
        .first_mut()
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("CRD {name}: no version {version} (it has {})", available.join(", ")))?;
    kept.insert("served".into(), Value::Bool(true));
    kept.insert("storage".into(), Value::Bool(true));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reduce_keeps_only_the_asked_version_as_storage_and_drops_conversion() {
        let mut crd = json!({
            "metadata": {"name": "machines.cluster.x-k8s.io"},
            "spec": {
                "conversion": {"strategy": "Webhook"},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1beta2", "served": true, "storage": true},
                ]
            }
        });
        reduce_to_version(&mut crd, "v1beta1").expect("reduce");
        assert_eq!(crd["spec"], json!({"versions": [{"name": "v1beta1", "served": true, "storage": true}]}));
    }

    #[test]
    fn reduce_names_the_missing_version() {
        let mut crd = json!({"metadata": {"name": "x.y"}, "spec": {"versions": [{"name": "v1"}]}});
        let err = reduce_to_version(&mut crd, "v1beta2").expect_err("must fail");
        assert_eq!(err.to_string(), "CRD x.y: no version v1beta2 (it has v1)");
    }

    #[test]
    fn upstream_crds_are_reduced_to_one_version() {
        for capi in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
            let crds = upstream_crds(capi).expect("upstream CRDs");
            let names: Vec<&str> =
                crds.iter().filter_map(|c| c.pointer("/metadata/name").and_then(Value::as_str)).collect();
            assert_eq!(
                names,
                [
                    "clusters.cluster.x-k8s.io",
                    "machines.cluster.x-k8s.io",
                    "machinesets.cluster.x-k8s.io",
                    "selfnoderemediations.self-node-remediation.medik8s.io",
                    "selfnoderemediationtemplates.self-node-remediation.medik8s.io",
                ]
            );
            for crd in &crds[..3] {
                let versions = crd["spec"]["versions"].as_array().expect("versions");
                assert_eq!(versions.len(), 1);
                assert_eq!(versions[0]["name"], capi.as_str());
                assert_eq!(versions[0]["storage"], true);
                assert!(crd["spec"].get("conversion").is_none());
            }
        }
    }
}
