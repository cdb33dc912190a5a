//! The OLM bundle (deploy/olm) against operator-framework's own validators, the Helm chart and
//! the real API server.
//!
//! The bundle is the chart's: the ClusterServiceVersion's install section (RBAC, the
//! Deployment with its image and flags), its name, version and `containerImage`, and every
//! other object (metrics Service, PodDisruptionBudget, the ClusterRole aggregating remediators'
//! rights and its binding) are derived from `helm template` of deploy/helm/vigil with
//! `remediatorAggregation.enabled=true`; `bundle_is_the_charts` fails on any difference and
//! `VIGIL_OLM_WRITE=1` makes it write them instead. The rest of the CSV (description, icon,
//! examples, owned CRDs' descriptions) is edited in the file.
//!
//! The validators come from `VIGIL_OLM_VALIDATE` or scripts/olm-validate.sh (operator-framework/api
//! v0.45.0, built from its Go module, cached); helm as for the chart tests.

mod deploy;

use anyhow::{Context, Result, bail, ensure};
use deploy::{NAMESPACE, helm_run, kind_of, name_of, render, repo_root, run_bounded};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_testenv::TestEnv;

/// The chart values the bundle is rendered with (everything else at its default).
const BUNDLE_VALUES: [&str; 1] = ["remediatorAggregation.enabled=true"];
/// The CSV's file name.
const CSV_FILE: &str = "vigil.clusterserviceversion.yaml";
/// Labels helm puts on what it renders, which mean nothing under OLM.
const HELM_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/managed-by"];
/// Set to write the derived parts of the bundle instead of comparing them.
const WRITE_VAR: &str = "VIGIL_OLM_WRITE";
/// Time limit of one validator run (not the build).
const VALIDATE_LIMIT: Duration = Duration::from_secs(60);
/// Time limit of scripts/olm-validate.sh (a cold Go build).
const BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);

fn bundle_dir() -> PathBuf {
    repo_root().join("deploy").join("olm")
}

fn manifests_dir(bundle: &Path) -> PathBuf {
    bundle.join("manifests")
}

/// The validator binary: `VIGIL_OLM_VALIDATE`, else the one scripts/olm-validate.sh builds.
async fn olm_validate() -> Result<PathBuf> {
    static BIN: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    BIN.get_or_try_init(|| async {
        if let Some(path) = std::env::var_os("VIGIL_OLM_VALIDATE") {
            return Ok(PathBuf::from(path));
        }
        let script = repo_root().join("scripts").join("olm-validate.sh");
        let (ok, out, err) =
            run_bounded(&mut tokio::process::Command::new(&script), BUILD_LIMIT, "scripts/olm-validate.sh").await?;
        ensure!(ok, "scripts/olm-validate.sh failed:\n{err}");
        Ok(PathBuf::from(out.trim()))
    })
    .await
    .cloned()
}

/// What the validators said about a bundle directory.
#[derive(Debug)]
struct Verdict {
    /// The validator's exit status was 0.
    passed: bool,
    /// Its findings (`errors`, `warnings`), or Null when it could not load the bundle.
    findings: Value,
    /// Its stderr (why a bundle could not be loaded).
    stderr: String,
}

impl Verdict {
    fn errors(&self) -> Vec<String> {
        self.list("errors")
    }

    fn warnings(&self) -> Vec<String> {
        self.list("warnings")
    }

    fn list(&self, key: &str) -> Vec<String> {
        let items = self.findings[key].as_array().cloned().unwrap_or_default();
        items.iter().map(|f| format!("{} {} {}: {}", f["manifest"], f["field"], f["value"], f["detail"])).collect()
    }
}

async fn validate(dir: &Path) -> Result<Verdict> {
    let bin = olm_validate().await?;
    let (passed, out, stderr) =
        run_bounded(tokio::process::Command::new(&bin).arg(dir), VALIDATE_LIMIT, "olm-validate").await?;
    let findings = if out.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&out).with_context(|| format!("olm-validate printed no JSON:\n{out}\n{stderr}"))?
    };
    Ok(Verdict { passed, findings, stderr })
}

fn read_yaml(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("{}: invalid YAML", path.display()))
}

fn write_yaml(path: &Path, header: &str, value: &Value) -> Result<()> {
    let text = serde_saphyr::to_string(value).with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(path, format!("{header}{text}")).with_context(|| format!("cannot write {}", path.display()))
}

/// A temp dir for a bundle copy: not hidden (`.tmp…`), which the bundle loader would skip.
fn bundle_temp_dir() -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new().prefix("vigil-olm-").tempdir()?)
}

/// Copies a bundle (manifests/ and metadata/) into `to`, for a test to break.
fn copy_bundle(to: &Path) -> Result<()> {
    for sub in ["manifests", "metadata"] {
        let (src, dst) = (bundle_dir().join(sub), to.join(sub));
        std::fs::create_dir_all(&dst)?;
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            std::fs::copy(entry.path(), dst.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// What the chart says the bundle carries (see the module doc).
#[derive(Debug, PartialEq)]
struct FromChart {
    /// `vigil.v<appVersion>`.
    csv_name: String,
    /// The chart's appVersion, the CSV's `spec.version`.
    version: String,
    /// The Deployment's image, the CSV's `containerImage`.
    image: String,
    /// `spec.install.spec` of the CSV: clusterPermissions, permissions, deployments.
    install: Value,
    /// Every other object, by its bundle file name.
    objects: BTreeMap<String, Value>,
}

/// Removes what helm adds and OLM decides (the namespace) from a rendered object.
fn for_olm(mut doc: Value) -> Value {
    if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("namespace");
    }
    strip_helm_labels(&mut doc, "/metadata/labels");
    doc
}

fn strip_helm_labels(doc: &mut Value, pointer: &str) {
    if let Some(labels) = doc.pointer_mut(pointer).and_then(Value::as_object_mut) {
        for l in HELM_LABELS {
            labels.remove(l);
        }
    }
}

/// operator-sdk's file naming: `<name>_<group>_<version>_<kind>.yaml` (core: `<name>_v1_<kind>`).
fn file_name(doc: &Value) -> String {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default().replace('/', "_");
    format!("{}_{api_version}_{}.yaml", name_of(doc), kind_of(doc).to_lowercase())
}

/// The subject of a binding is the Deployment's ServiceAccount (in the release namespace).
fn binds(binding: &Value, sa: &str) -> bool {
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NAMESPACE)
    })
}

fn from_chart(docs: &[Value], app_version: &str) -> Result<FromChart> {
    let deployments: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == "Deployment").collect();
    let [deployment] = deployments.as_slice() else {
        bail!("the chart renders {} Deployments; the bundle carries one", deployments.len());
    };
    let mut spec = deployment["spec"].clone();
    strip_helm_labels(&mut spec, "/template/metadata/labels");
    let sa = spec
        .pointer("/template/spec/serviceAccountName")
        .and_then(Value::as_str)
        .context("the Deployment names no ServiceAccount")?
        .to_string();
    let image = spec
        .pointer("/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .context("the Deployment has no image")?
        .to_string();
    let by_name = |kind: &str, name: &str| docs.iter().find(|d| kind_of(d) == kind && name_of(d) == name);

    let (mut cluster_rules, mut rules) = (Vec::new(), Vec::new());
    let mut objects = BTreeMap::new();
    // Roles and ClusterRoles reached through a binding of the ServiceAccount: plain ones become
    // the CSV's permissions; an aggregating one (no rules of its own) stays an object.
    let mut consumed: Vec<(String, String)> = Vec::new();
    for binding in docs.iter().filter(|d| binds(d, &sa)) {
        let (binding_kind, role_kind) = (kind_of(binding), binding.pointer("/roleRef/kind").and_then(Value::as_str));
        let role_name = binding.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or_default();
        let Some(role) = role_kind.and_then(|k| by_name(k, role_name)) else {
            bail!(
                "{binding_kind} {} binds {role_kind:?} {role_name}, which the chart does not render",
                name_of(binding)
            );
        };
        if role.get("aggregationRule").is_some() {
            continue;
        }
        // A Role of another namespace (the medik8s node Leases') has no place of its own in a
        // CSV, whose permissions hold in the operator's namespace only: its rules become cluster
        // permissions, as the NodeHealthCheck operator's own bundle grants Leases.
        let elsewhere = binding.pointer("/metadata/namespace").and_then(Value::as_str).is_some_and(|n| n != NAMESPACE);
        let into = match (binding_kind, kind_of(role)) {
            ("ClusterRoleBinding", "ClusterRole") => &mut cluster_rules,
            ("RoleBinding", "Role") if elsewhere => &mut cluster_rules,
            ("RoleBinding", "Role") => &mut rules,
            (b, r) => bail!("{b} {} binds a {r}: the bundle has no place for it", name_of(binding)),
        };
        into.extend(role["rules"].as_array().cloned().unwrap_or_default());
        consumed.push((kind_of(binding).into(), name_of(binding).into()));
        consumed.push((kind_of(role).into(), name_of(role).into()));
    }
    for doc in docs {
        let key = (kind_of(doc).to_string(), name_of(doc).to_string());
        // The lease namespace the chart makes when missing: OLM installs no Namespace (Vigil
        // creates it at start, as medik8s' operators do).
        let skip = matches!(kind_of(doc), "CustomResourceDefinition" | "ServiceAccount" | "Deployment" | "Namespace");
        if !skip && !consumed.contains(&key) {
            let doc = for_olm(doc.clone());
            objects.insert(file_name(&doc), doc);
        }
    }
    let mut install = Map::new();
    install.insert("clusterPermissions".into(), json!([{"serviceAccountName": sa, "rules": cluster_rules}]));
    if !rules.is_empty() {
        install.insert("permissions".into(), json!([{"serviceAccountName": sa, "rules": rules}]));
    }
    install.insert("deployments".into(), json!([{"name": name_of(deployment), "spec": spec}]));
    Ok(FromChart {
        csv_name: format!("vigil.v{app_version}"),
        version: app_version.to_string(),
        image,
        install: Value::Object(install),
        objects,
    })
}

/// The chart's appVersion (Chart.yaml).
fn app_version() -> Result<String> {
    let chart = read_yaml(&deploy::chart_dir().join("Chart.yaml"))?;
    chart["appVersion"].as_str().map(str::to_string).context("Chart.yaml has no appVersion")
}

/// The CSV with the chart's parts put in.
fn with_chart(mut csv: Value, chart: &FromChart) -> Value {
    csv["metadata"]["name"] = json!(chart.csv_name);
    csv["metadata"]["annotations"]["containerImage"] = json!(chart.image);
    csv["spec"]["version"] = json!(chart.version);
    csv["spec"]["install"]["spec"] = chart.install.clone();
    csv
}

/// The files of a bundle's manifests/ directory, by name.
fn manifest_files(bundle: &Path) -> Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(manifests_dir(bundle))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    files.sort();
    Ok(files)
}

/// The generated CRDs (deploy/crds), by file name.
fn generated_crds() -> Result<Vec<String>> {
    let dir = repo_root().join("deploy").join("crds");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    files.sort();
    Ok(files)
}

/// operator-framework's validators find no error and no warning in deploy/olm.
#[tokio::test]
async fn bundle_passes_operator_frameworks_validators() -> Result<()> {
    let verdict = validate(&bundle_dir()).await?;
    assert!(verdict.passed, "deploy/olm fails validation: {:#?}\n{}", verdict.errors(), verdict.stderr);
    assert_eq!(verdict.errors(), Vec::<String>::new());
    assert_eq!(verdict.warnings(), Vec::<String>::new(), "deploy/olm draws warnings");
    Ok(())
}

/// A broken bundle fails, and the validators say what is wrong: so the test above can fail.
#[tokio::test]
async fn broken_bundles_fail_validation_naming_the_fault() -> Result<()> {
    type Breaker = fn(&Path) -> Result<()>;
    let edit_csv = |dir: &Path, edit: &dyn Fn(&mut Value)| -> Result<()> {
        let path = manifests_dir(dir).join(CSV_FILE);
        let mut csv = read_yaml(&path)?;
        edit(&mut csv);
        write_yaml(&path, "", &csv)
    };
    let no_version: Breaker = |dir| {
        let path = manifests_dir(dir).join(CSV_FILE);
        let mut csv = read_yaml(&path)?;
        csv["spec"].as_object_mut().context("spec")?.remove("version");
        write_yaml(&path, "", &csv)
    };
    let cases: [(&str, Breaker, &str); 4] = [
        ("a CSV without spec.version", no_version, "Version must be set"),
        (
            "a category OperatorHub does not know",
            |dir| {
                let path = manifests_dir(dir).join(CSV_FILE);
                let mut csv = read_yaml(&path)?;
                csv["metadata"]["annotations"]["categories"] = json!("Health Checking");
                write_yaml(&path, "", &csv)
            },
            "Health Checking",
        ),
        (
            "an owned CRD missing from the bundle",
            |dir| Ok(std::fs::remove_file(manifests_dir(dir).join("vigil.dev_nodehealthchecks.yaml"))?),
            "owned CRD",
        ),
        (
            "the chart's ServiceAccount shipped next to the CSV's",
            |dir| {
                let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "vigil"}});
                write_yaml(&manifests_dir(dir).join("vigil_v1_serviceaccount.yaml"), "", &sa)
            },
            "invalid service account",
        ),
    ];
    for (what, break_it, says) in cases {
        let dir = bundle_temp_dir()?;
        copy_bundle(dir.path())?;
        break_it(dir.path())?;
        let verdict = validate(dir.path()).await?;
        assert!(!verdict.passed, "{what}: the validators passed it");
        let errors = verdict.errors();
        assert!(
            errors.iter().any(|e| e.contains(says)),
            "{what}: no error says {says:?}: {errors:#?}\n{}",
            verdict.stderr
        );
    }
    // The same edit with a valid value passes: the breakers above are what fails.
    let dir = bundle_temp_dir()?;
    copy_bundle(dir.path())?;
    edit_csv(dir.path(), &|csv| csv["metadata"]["annotations"]["categories"] = json!("Monitoring"))?;
    let verdict = validate(dir.path()).await?;
    assert!(verdict.passed, "a rewritten but valid CSV fails: {:#?}", verdict.errors());
    Ok(())
}

/// The bundle's RBAC, Deployment (image, flags, probes, security), version and other objects
/// are the chart's (see the module doc); `VIGIL_OLM_WRITE=1` writes them from the chart.
#[tokio::test]
async fn bundle_is_the_charts() -> Result<()> {
    let docs = render(&BUNDLE_VALUES).await?;
    let chart = from_chart(&docs, &app_version()?)?;
    let bundle = bundle_dir();
    let csv_path = manifests_dir(&bundle).join(CSV_FILE);
    let csv = read_yaml(&csv_path)?;
    let expected_csv = with_chart(csv.clone(), &chart);
    let crds = generated_crds()?;
    let mut expected_files: Vec<String> = chart.objects.keys().cloned().chain(crds.iter().cloned()).collect();
    expected_files.push(CSV_FILE.to_string());
    expected_files.sort();

    if std::env::var_os(WRITE_VAR).is_some() {
        let header = "# Written by `VIGIL_OLM_WRITE=1 cargo test -p vigil-controller --test olm bundle_is_the_charts`:\n\
             # install, version, name and containerImage come from deploy/helm/vigil; edit the rest here.\n";
        write_yaml(&csv_path, header, &expected_csv)?;
        for file in manifest_files(&bundle)? {
            if !expected_files.contains(&file) {
                std::fs::remove_file(manifests_dir(&bundle).join(&file))?;
            }
        }
        let header = "# Written from deploy/helm/vigil by `VIGIL_OLM_WRITE=1 cargo test -p vigil-controller --test olm \
             bundle_is_the_charts`; do not edit.\n";
        for (file, doc) in &chart.objects {
            write_yaml(&manifests_dir(&bundle).join(file), header, doc)?;
        }
        for file in &crds {
            std::fs::copy(repo_root().join("deploy").join("crds").join(file), manifests_dir(&bundle).join(file))?;
        }
        return Ok(());
    }

    let fix = format!(
        "the chart changed: run `{WRITE_VAR}=1 cargo test -p vigil-controller --test olm bundle_is_the_charts`"
    );
    assert_eq!(
        manifest_files(&bundle)?,
        expected_files,
        "deploy/olm/manifests holds other files than the chart's; {fix}"
    );
    for (what, pointer) in [
        ("RBAC and Deployment (spec.install.spec)", "/spec/install/spec"),
        ("name", "/metadata/name"),
        ("version", "/spec/version"),
        ("image (containerImage)", "/metadata/annotations/containerImage"),
    ] {
        assert_eq!(csv.pointer(pointer), expected_csv.pointer(pointer), "the CSV's {what} is not the chart's; {fix}");
    }
    for (file, doc) in &chart.objects {
        assert_eq!(&read_yaml(&manifests_dir(&bundle).join(file))?, doc, "deploy/olm/manifests/{file}; {fix}");
    }
    for file in &crds {
        let same = std::fs::read(repo_root().join("deploy/crds").join(file))?
            == std::fs::read(manifests_dir(&bundle).join(file))?;
        assert!(same, "deploy/olm/manifests/{file} is not deploy/crds/{file}; {fix}");
    }
    // The owned CRDs are the bundle's CRDs (their descriptions are edited in the CSV).
    let mut owned: Vec<(String, String, String)> = csv
        .pointer("/spec/customresourcedefinitions/owned")
        .and_then(Value::as_array)
        .context("no owned CRDs")?
        .iter()
        .map(|o| (o["name"].as_str(), o["kind"].as_str(), o["version"].as_str()))
        .map(|(n, k, v)| (n.unwrap_or("").into(), k.unwrap_or("").into(), v.unwrap_or("").into()))
        .collect();
    owned.sort();
    let mut crd_keys = Vec::new();
    for file in &crds {
        let crd = read_yaml(&manifests_dir(&bundle).join(file))?;
        let storage = crd["spec"]["versions"].as_array().and_then(|vs| vs.iter().find(|v| v["storage"] == true));
        crd_keys.push((
            name_of(&crd).to_string(),
            crd.pointer("/spec/names/kind").and_then(Value::as_str).unwrap_or("").to_string(),
            storage.and_then(|v| v["name"].as_str()).unwrap_or("").to_string(),
        ));
    }
    crd_keys.sort();
    assert_eq!(owned, crd_keys, "spec.customresourcedefinitions.owned must name the bundle's CRDs");
    Ok(())
}

/// The derivation follows the chart wherever its RBAC grows: a second plain ClusterRole bound
/// to the ServiceAccount joins clusterPermissions, an unbound object is carried as it is, and
/// the aggregating role stays an object.
#[test]
fn derivation_follows_a_growing_chart() -> Result<()> {
    let labels = json!({"app.kubernetes.io/name": "vigil", "helm.sh/chart": "vigil-0.1.0", "app.kubernetes.io/managed-by": "Helm"});
    let subject = json!([{"kind": "ServiceAccount", "name": "vigil", "namespace": NAMESPACE}]);
    let rule = |r: &str| json!({"apiGroups": ["g"], "resources": [r], "verbs": ["get"]});
    let docs = vec![
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vigil", "namespace": NAMESPACE},
               "spec": {"template": {"metadata": {"labels": labels}, "spec": {"serviceAccountName": "vigil",
                        "containers": [{"name": "vigil", "image": "vigil:9.9.9", "args": ["run", "--serve-medik8s"]}]}}}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "vigil", "namespace": NAMESPACE}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vigil"}, "rules": [rule("a")]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "vigil"},
               "roleRef": {"kind": "ClusterRole", "name": "vigil"}, "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vigil-medik8s"}, "rules": [rule("b")]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "vigil-medik8s"},
               "roleRef": {"kind": "ClusterRole", "name": "vigil-medik8s"}, "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vigil-agg", "labels": labels},
               "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "true"}}]}, "rules": []}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "vigil-agg"},
               "roleRef": {"kind": "ClusterRole", "name": "vigil-agg"}, "subjects": subject}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vigil-metrics", "namespace": NAMESPACE, "labels": labels}}),
    ];
    let chart = from_chart(&docs, "9.9.9")?;
    assert_eq!(chart.install["clusterPermissions"][0]["rules"], json!([rule("a"), rule("b")]));
    assert!(chart.install.get("permissions").is_none(), "no Role, no permissions");
    assert_eq!(
        chart.install.pointer("/deployments/0/spec/template/spec/containers/0/args/1"),
        Some(&json!("--serve-medik8s"))
    );
    assert_eq!(
        chart.install.pointer("/deployments/0/spec/template/metadata/labels"),
        Some(&json!({"app.kubernetes.io/name": "vigil"})),
        "helm's labels are not OLM's"
    );
    assert_eq!((chart.csv_name.as_str(), chart.image.as_str()), ("vigil.v9.9.9", "vigil:9.9.9"));
    let files: Vec<&str> = chart.objects.keys().map(String::as_str).collect();
    assert_eq!(
        files,
        [
            "vigil-agg_rbac.authorization.k8s.io_v1_clusterrole.yaml",
            "vigil-agg_rbac.authorization.k8s.io_v1_clusterrolebinding.yaml",
            "vigil-metrics_v1_service.yaml"
        ]
    );
    let service = &chart.objects["vigil-metrics_v1_service.yaml"];
    assert_eq!(service["metadata"], json!({"name": "vigil-metrics", "labels": {"app.kubernetes.io/name": "vigil"}}));
    // A binding of a role the chart does not render is refused, not skipped.
    let mut broken = docs.clone();
    broken.retain(|d| name_of(d) != "vigil-medik8s" || kind_of(d) != "ClusterRole");
    let err = from_chart(&broken, "9.9.9").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("binds Some(\"ClusterRole\") vigil-medik8s"), "{err}");
    Ok(())
}

/// The package, channel `stable` and default channel, as OLM reads them.
#[test]
fn bundle_metadata_names_the_package_and_the_stable_channel() -> Result<()> {
    let meta = read_yaml(&bundle_dir().join("metadata").join("annotations.yaml"))?;
    let a = &meta["annotations"];
    for (key, value) in [
        ("operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"),
        ("operators.operatorframework.io.bundle.manifests.v1", "manifests/"),
        ("operators.operatorframework.io.bundle.metadata.v1", "metadata/"),
        ("operators.operatorframework.io.bundle.package.v1", "vigil"),
        ("operators.operatorframework.io.bundle.channels.v1", "stable"),
        ("operators.operatorframework.io.bundle.channel.default.v1", "stable"),
    ] {
        assert_eq!(a[key], json!(value), "{key}");
    }
    Ok(())
}

/// What OLM applies besides the CSV (CRDs, the aggregating ClusterRole and its binding, the
/// Service, the PodDisruptionBudget) is accepted by the API server in the suggested namespace,
/// the CSV's examples are valid checks there, and helm lints the chart with the option the
/// bundle is rendered with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundle_objects_and_examples_are_accepted_by_the_api_server() -> Result<()> {
    let chart = deploy::chart_dir();
    let chart = chart.to_str().context("chart path is not UTF-8")?;
    let mut lint = vec!["lint", "--strict", chart];
    for v in BUNDLE_VALUES {
        lint.extend(["--set", v]);
    }
    let (ok, out, err) = helm_run(&lint).await?;
    ensure!(ok && out.contains("0 chart(s) failed"), "helm lint {BUNDLE_VALUES:?} failed:\n{out}\n{err}");

    let bundle = bundle_dir();
    let csv = read_yaml(&manifests_dir(&bundle).join(CSV_FILE))?;
    let suggested = csv.pointer("/metadata/annotations/operatorframework.io~1suggested-namespace");
    assert_eq!(suggested, Some(&json!(NAMESPACE)), "the aggregating binding names {NAMESPACE}");

    let env = TestEnv::start().await?;
    env.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})).await?;
    let mut crds = Vec::new();
    let mut others = Vec::new();
    for file in manifest_files(&bundle)?.into_iter().filter(|f| f != CSV_FILE) {
        let mut doc = read_yaml(&manifests_dir(&bundle).join(&file))?;
        if kind_of(&doc) == "CustomResourceDefinition" {
            crds.push(doc);
        } else {
            // OLM puts namespaced objects into the install namespace.
            if matches!(kind_of(&doc), "Service" | "PodDisruptionBudget") {
                doc["metadata"]["namespace"] = json!(NAMESPACE);
            }
            others.push((file, doc));
        }
    }
    env.install_crds(&crds).await?;
    for (file, doc) in others {
        env.apply(doc).await.with_context(|| format!("deploy/olm/manifests/{file} was refused"))?;
    }
    let examples: Vec<Value> = serde_json::from_str(
        csv.pointer("/metadata/annotations/alm-examples").and_then(Value::as_str).context("no alm-examples")?,
    )?;
    assert_eq!(examples.len(), 2, "one example per owned kind");
    for example in examples {
        let what = format!("the alm-examples {}", kind_of(&example));
        env.apply(example).await.with_context(|| format!("{what} was refused"))?;
    }
    let role = env
        .get_json("rbac.authorization.k8s.io/v1", "ClusterRole", None, "vigil-ext-remediation")
        .await?
        .context("no role")?;
    assert_eq!(
        role.pointer("/aggregationRule/clusterRoleSelectors/0/matchLabels"),
        Some(&json!({"rbac.ext-remediation/aggregate-to-ext-remediation": "true"})),
        "the label medik8s' remediators put on their roles (NodeHealthCheck's aggregation)"
    );
    env.stop().await?;
    Ok(())
}
