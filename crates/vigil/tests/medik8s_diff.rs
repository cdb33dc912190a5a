//! The differential test against medik8s' NodeHealthCheck operator: the same fleet and the same
//! failures, once under the operator v0.12.0 as published (vigil_testenv::medik8s) and once under
//! `vigil run`, each on a real API server of its own. At each checkpoint the remediation objects
//! (name, namespace, labels, annotations, owner references, spec), the node Leases and every
//! check's status are compared field by field, and the differences must be exactly the ones
//! recorded in docs/DECISIONS.md ("Differences from NodeHealthCheck v0.12.0"), each deliberate or
//! to fix: a new difference fails, and so does a fixed one still listed. On a mismatch the test
//! prints the table to put there (reasons carried over by object and field).
//!
//! Vigil serves the very same `remediation.medik8s.io/v1alpha1` manifests in place (`vigil run
//! --serve-medik8s`, [`VIGIL_SERVES`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::{Value, json};
use vigil_testenv::TestEnv;
use vigil_testenv::medik8s::{LEASE_NAMESPACE, NhcOperator, nhc_crd};

type Result<T> = std::result::Result<T, vigil_testenv::Error>;

/// What Vigil serves in its run.
const VIGIL_SERVES: Served = Served::Medik8s;

/// The NodeHealthCheck resource a run's checks are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    /// medik8s' `remediation.medik8s.io/v1alpha1` itself (`vigil run --serve-medik8s`).
    Medik8s,
}

impl Served {
    fn api_version(self) -> &'static str {
        match self {
            Served::Medik8s => "remediation.medik8s.io/v1alpha1",
        }
    }

    /// The `vigil run` arguments that make it serve this resource.
    fn args(self) -> &'static [&'static str] {
        match self {
            Served::Medik8s => &["--serve-medik8s"],
        }
    }
}

/// Who runs the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Medik8s,
    Vigil,
}

impl Side {
    fn check_api_version(self) -> &'static str {
        match self {
            Side::Medik8s => Served::Medik8s.api_version(),
            Side::Vigil => VIGIL_SERVES.api_version(),
        }
    }
}

/// Where the templates and the remediation objects are.
const NS: &str = "medik8s";
/// The recorded differences in docs/DECISIONS.md are between these markers.
const BEGIN: &str = "<!-- medik8s-differences:begin -->\n";
const END: &str = "<!-- medik8s-differences:end -->";
/// How long a checkpoint may take to be reached, and how long it must then hold still.
const WAIT: Duration = Duration::from_secs(90);
const STILL: Duration = Duration::from_secs(4);

const WORKER: &str = "node-role.kubernetes.io/worker";
const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
const EXCLUDE: &str = "remediation.medik8s.io/exclude-from-remediation";

/// The fleet's Nodes and their labels.
fn nodes() -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    for w in ["w1", "w2", "w3", "w4", "w5", "w6"] {
        let labels = if w == "w2" { json!({WORKER: "", EXCLUDE: "true"}) } else { json!({WORKER: ""}) };
        out.push((w, labels));
    }
    for cp in ["cp1", "cp2", "cp3"] {
        out.push((cp, json!({CONTROL_PLANE: ""})));
    }
    for t in ["t1", "t2"] {
        out.push((t, json!({"pool": "tight"})));
    }
    out
}

/// The checks, as upstream manifests (`apiVersion` set per run): workers (one may fail, an
/// excluded one too), the control plane, a pool whose `minHealthy: 100%` blocks every
/// remediation, and one whose template does not exist.
fn checks(api_version: &str) -> Vec<Value> {
    let conditions = json!([{"type": "Ready", "status": "False", "duration": "2s"},
                            {"type": "Ready", "status": "Unknown", "duration": "2s"}]);
    let template = |name: &str| {
        json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
               "name": name, "namespace": NS})
    };
    let check = |name: &str, selector: Value, budget: (&str, Value), template: Value| {
        let mut spec =
            json!({"selector": selector, "unhealthyConditions": conditions, "remediationTemplate": template});
        spec[budget.0] = budget.1;
        json!({"apiVersion": api_version, "kind": "NodeHealthCheck", "metadata": {"name": name}, "spec": spec})
    };
    let exists = |key: &str| json!({"matchExpressions": [{"key": key, "operator": "Exists"}]});
    vec![
        check("workers", exists(WORKER), ("minHealthy", json!("50%")), template("reboot")),
        check("control-plane", exists(CONTROL_PLANE), ("maxUnhealthy", json!(1)), template("reboot")),
        check("tight", json!({"matchLabels": {"pool": "tight"}}), ("minHealthy", json!("100%")), template("reboot")),
        check("broken", json!({"matchLabels": {"pool": "none"}}), ("minHealthy", json!("51%")), template("missing")),
    ]
}

fn seconds(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

async fn set_ready(env: &TestEnv, node: &str, status: &str, since: Timestamp) -> Result<()> {
    let since = seconds(since);
    env.apply_status(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test", "message": "",
                   "lastHeartbeatTime": seconds(Timestamp::now()), "lastTransitionTime": since}]}}))
        .await?;
    Ok(())
}

/// One checkpoint: what is changed, then what must be seen before the state is compared.
struct Checkpoint {
    name: &'static str,
    /// Nodes set Ready=False a minute ago (past every duration).
    fail: &'static [&'static str],
    /// Nodes set Ready=True now.
    recover: &'static [&'static str],
    /// Nodes deleted (a replaced machine's Node goes away).
    delete: &'static [&'static str],
    /// The remediation objects (by node) that must exist, exactly.
    objects: &'static [&'static str],
}

const CHECKPOINTS: [Checkpoint; 4] = [
    Checkpoint { name: "healthy", fail: &[], recover: &[], delete: &[], objects: &[] },
    Checkpoint {
        name: "failures",
        fail: &["w1", "w2", "cp1", "t1"],
        recover: &[],
        delete: &[],
        objects: &["cp1", "w1"],
    },
    Checkpoint { name: "w1 recovered", fail: &[], recover: &["w1"], delete: &[], objects: &["cp1"] },
    Checkpoint { name: "cp1 deleted", fail: &[], recover: &[], delete: &["cp1"], objects: &[] },
];

/// A run's state at a checkpoint, normalized (uids named, times elided): the remediation
/// objects and the Leases by name, every check's status by check name.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    objects: BTreeMap<String, Value>,
}

/// The part of an object the comparison reads.
fn pick(o: &Value, meta: &[&str], rest: &[&str]) -> Value {
    let mut out = json!({"metadata": {}});
    for k in meta {
        if let Some(v) = o["metadata"].get(*k) {
            out["metadata"][*k] = v.clone();
        }
    }
    for k in rest {
        if let Some(v) = o.get(*k) {
            out[*k] = v.clone();
        }
    }
    out
}

async fn snapshot(env: &TestEnv, side: Side) -> Result<Snapshot> {
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    let mut name_uids = |list: &[Value], kind: &str| {
        for o in list {
            if let (Some(uid), Some(name)) = (o["metadata"]["uid"].as_str(), o["metadata"]["name"].as_str()) {
                uids.insert(uid.to_string(), format!("<uid of {kind} {name}>"));
            }
        }
    };
    let nodes = env.list_json("v1", "Node", None, "").await?;
    name_uids(&nodes, "Node");
    let checks = env.list_json(side.check_api_version(), "NodeHealthCheck", None, "").await?;
    name_uids(&checks, "NodeHealthCheck");
    let remediations =
        env.list_json("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediation", Some(NS), "").await?;
    name_uids(&remediations, "SelfNodeRemediation");
    let leases = env.list_json("coordination.k8s.io/v1", "Lease", Some(LEASE_NAMESPACE), "").await?;

    let mut objects = BTreeMap::new();
    let object_meta = ["name", "generateName", "namespace", "labels", "annotations", "ownerReferences", "finalizers"];
    for o in &remediations {
        let key = format!("SelfNodeRemediation {NS}/{}", o["metadata"]["name"].as_str().unwrap_or("?"));
        objects.insert(key, pick(o, &object_meta, &["spec"]));
    }
    for o in &leases {
        let key = format!("Lease {LEASE_NAMESPACE}/{}", o["metadata"]["name"].as_str().unwrap_or("?"));
        objects.insert(key, pick(o, &object_meta, &["spec"]));
    }
    for o in &checks {
        let key = format!("NodeHealthCheck {}", o["metadata"]["name"].as_str().unwrap_or("?"));
        objects.insert(key, json!({"status": o.get("status").cloned().unwrap_or(Value::Null)}));
    }
    for v in objects.values_mut() {
        normalize(v, &uids);
    }
    Ok(Snapshot { objects })
}

/// Uids become the object they name, times become `<time>`: they differ between any two runs.
fn normalize(v: &mut Value, uids: &BTreeMap<String, String>) {
    match v {
        Value::String(s) => {
            if let Some(named) = uids.get(s.as_str()) {
                *s = named.clone();
            } else if s.parse::<Timestamp>().is_ok() {
                *s = "<time>".to_string();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| normalize(i, uids)),
        Value::Object(map) => map.values_mut().for_each(|i| normalize(i, uids)),
        _ => {}
    }
}

/// Starts the side's controller against `env`; kept running until dropped.
enum Running {
    Medik8s(NhcOperator),
    /// The `vigil run` child (killed when dropped) and the directory of its kubeconfig and log.
    Vigil {
        _child: tokio::process::Child,
        dir: tempfile::TempDir,
    },
}

impl Running {
    async fn start(env: &TestEnv, side: Side) -> Result<Running> {
        Ok(match side {
            Side::Medik8s => Running::Medik8s(NhcOperator::start(env).await?),
            Side::Vigil => {
                let dir = tempfile::tempdir()?;
                let kubeconfig = dir.path().join("kubeconfig");
                env.write_kubeconfig(&kubeconfig).await?;
                let log = std::fs::File::create(dir.path().join("vigil.log"))?;
                let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
                    .args(["run", "--kubeconfig"])
                    .arg(&kubeconfig)
                    .args(["--workers", "2", "--leader-elect=false"])
                    .args(VIGIL_SERVES.args())
                    .env("RUST_LOG", "info")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::from(log))
                    .kill_on_drop(true)
                    .spawn()?;
                Running::Vigil { _child: child, dir }
            }
        })
    }

    /// The end of the controller's log, for a failure message.
    fn log_tail(&self) -> String {
        match self {
            Running::Medik8s(op) => op.log_tail(30),
            Running::Vigil { dir, .. } => {
                let log = std::fs::read_to_string(dir.path().join("vigil.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            }
        }
    }
}

/// Runs the scenario under one side; the snapshots at each checkpoint.
async fn run(side: Side) -> Result<Vec<Snapshot>> {
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    let mut crds = vec![nhc_crd()?];
    for f in vigil_api::crd::files().map_err(|e| vigil_testenv::Error::msg(e.to_string()))? {
        crds.push(serde_saphyr::from_str(&f.text)?);
    }
    env.install_crds(&crds).await?;
    env.apply(json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": "reboot", "namespace": NS},
        "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}))
        .await?;
    let long_ago = Timestamp::now() - jiff::SignedDuration::from_hours(1);
    for (name, labels) in nodes() {
        env.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})).await?;
        set_ready(&env, name, "True", long_ago).await?;
    }
    for check in checks(side.check_api_version()) {
        env.apply(check).await?;
    }
    let running = Running::start(&env, side).await?;
    let mut out = Vec::new();
    for cp in &CHECKPOINTS {
        let failed_at = Timestamp::now() - jiff::SignedDuration::from_secs(60);
        for n in cp.fail {
            set_ready(&env, n, "False", failed_at).await?;
        }
        for n in cp.recover {
            set_ready(&env, n, "True", Timestamp::now()).await?;
        }
        for n in cp.delete {
            env.delete("v1", "Node", None, n).await?;
        }
        let reached = settle(&env, side, cp).await;
        let snap =
            reached.map_err(|e| e.context(format!("{side:?}, checkpoint {:?}:\n{}", cp.name, running.log_tail())))?;
        out.push(snap);
    }
    drop(running);
    env.stop().await?;
    Ok(out)
}

/// Waits until the checkpoint's remediation objects are there (and no others), every check has
/// a status, and then nothing changes for [`STILL`]; returns that state.
async fn settle(env: &TestEnv, side: Side, cp: &Checkpoint) -> Result<Snapshot> {
    let want: BTreeSet<String> = cp.objects.iter().map(|n| format!("SelfNodeRemediation {NS}/{n}")).collect();
    let ready = |s: &Snapshot| {
        let have: BTreeSet<String> =
            s.objects.keys().filter(|k| k.starts_with("SelfNodeRemediation ")).cloned().collect();
        let statuses = s.objects.iter().filter(|(k, v)| k.starts_with("NodeHealthCheck ") && !v["status"].is_null());
        have == want && statuses.count() == checks(side.check_api_version()).len()
    };
    let deadline = Instant::now() + WAIT;
    let mut last: Option<(Snapshot, Instant)> = None;
    loop {
        let now = snapshot(env, side).await?;
        if !ready(&now) {
            last = None;
        } else {
            match &last {
                Some((prev, since)) if *prev == now => {
                    if since.elapsed() >= STILL {
                        return Ok(now);
                    }
                }
                _ => last = Some((now.clone(), Instant::now())),
            }
        }
        if Instant::now() > deadline {
            let state = serde_json::to_string_pretty(&now.objects)?;
            return Err(vigil_testenv::Error::msg(format!(
                "checkpoint {:?} not reached (or not still) within {WAIT:?}; last state:\n{state}",
                cp.name
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One difference: of which kind of object, which field, and what each side has (compact JSON,
/// `absent`; `{…}` or `[…]` for a structure only one side has).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Difference {
    kind: String,
    field: String,
    medik8s: String,
    vigil: String,
}

fn show(v: Option<&Value>, other: Option<&Value>) -> String {
    match (v, other) {
        (None, _) => "absent".to_string(),
        (Some(Value::Object(_)), None) => "{…}".to_string(),
        (Some(Value::Array(_)), None) => "[…]".to_string(),
        (Some(v), _) => serde_json::to_string(v).unwrap_or_default(),
    }
}

/// How an array's elements are matched: by `type`, else `name`, else position.
fn element_key(v: &Value, i: usize) -> String {
    for k in ["type", "name"] {
        if let Some(s) = v.get(k).and_then(Value::as_str) {
            return format!("[{k}={s}]");
        }
    }
    format!("[{i}]")
}

/// `path.key`, or `path["key"]` for a key with dots or slashes (a label or annotation).
fn field(path: &str, key: &str) -> String {
    if key.contains(['.', '/']) {
        format!("{path}[{key:?}]")
    } else if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Labels and annotations are compared key by key even when one side has none.
fn is_string_map(path: &str) -> bool {
    path.ends_with("metadata.labels") || path.ends_with("metadata.annotations")
}

fn diff(kind: &str, path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<Difference>) {
    let empty = Value::Object(serde_json::Map::new());
    let (a, b) = match (a, b) {
        (Some(x @ Value::Object(_)), None) if is_string_map(path) => (Some(x), Some(&empty)),
        (None, Some(y @ Value::Object(_))) if is_string_map(path) => (Some(&empty), Some(y)),
        other => other,
    };
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff(kind, &field(path, k), x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            let keyed = |items: &Vec<Value>| -> BTreeMap<String, Value> {
                items.iter().enumerate().map(|(i, v)| (element_key(v, i), v.clone())).collect()
            };
            let (kx, ky) = (keyed(x), keyed(y));
            let keys: BTreeSet<&String> = kx.keys().chain(ky.keys()).collect();
            for k in keys {
                diff(kind, &format!("{path}{k}"), kx.get(k), ky.get(k), out);
            }
        }
        (a, b) if a != b => out.push(Difference {
            kind: kind.to_string(),
            field: if path.is_empty() { "(the object)".to_string() } else { path.to_string() },
            medik8s: show(a, b),
            vigil: show(b, a),
        }),
        _ => {}
    }
}

/// Every difference, with where it was seen: `object (checkpoint, …); …`.
fn differences(medik8s: &[Snapshot], vigil: &[Snapshot]) -> BTreeMap<Difference, String> {
    let mut seen: BTreeMap<Difference, BTreeMap<String, Vec<&'static str>>> = BTreeMap::new();
    for ((cp, m), v) in CHECKPOINTS.iter().zip(medik8s).zip(vigil) {
        let keys: BTreeSet<&String> = m.objects.keys().chain(v.objects.keys()).collect();
        for key in keys {
            let (kind, name) = key.split_once(' ').unwrap_or((key.as_str(), ""));
            let mut found = Vec::new();
            match (m.objects.get(key), v.objects.get(key)) {
                (Some(a), Some(b)) => diff(kind, "", Some(a), Some(b), &mut found),
                (a, b) => found.push(Difference {
                    kind: kind.to_string(),
                    field: "(the object)".into(),
                    medik8s: if a.is_some() { "exists".into() } else { "absent".into() },
                    vigil: if b.is_some() { "exists".into() } else { "absent".into() },
                }),
            }
            for d in found {
                seen.entry(d).or_default().entry(name.to_string()).or_default().push(cp.name);
            }
        }
    }
    seen.into_iter()
        .map(|(d, at)| {
            let at: Vec<String> = at.into_iter().map(|(o, cps)| format!("{o} ({})", cps.join(", "))).collect();
            (d, at.join("; "))
        })
        .collect()
}

/// One row of the recorded table.
#[derive(Debug, Clone)]
struct Row {
    diff: Difference,
    at: String,
    why: String,
}

fn cell(s: &str) -> String {
    format!("`{}`", s.replace('|', "\\|"))
}

fn uncell(s: &str) -> String {
    s.trim().trim_matches('`').replace("\\|", "|")
}

fn render(rows: &[Row]) -> String {
    let mut out = String::from(
        "| object | field | NodeHealthCheck v0.12.0 | Vigil | where (checkpoints) | why |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.diff.kind,
            cell(&r.diff.field),
            cell(&r.diff.medik8s),
            cell(&r.diff.vigil),
            r.at,
            r.why
        ));
    }
    out
}

/// Splits a table row into cells at unescaped `|`.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push_str("\\|");
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The rows recorded in docs/DECISIONS.md.
fn recorded() -> Result<Vec<Row>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/DECISIONS.md");
    let text = std::fs::read_to_string(path)?;
    let (_, rest) =
        text.split_once(BEGIN).ok_or_else(|| vigil_testenv::Error::msg(format!("no {BEGIN:?} in {path}")))?;
    let (table, _) = rest.split_once(END).ok_or_else(|| vigil_testenv::Error::msg(format!("no {END:?} in {path}")))?;
    let mut rows = Vec::new();
    for line in table.lines().skip(2).filter(|l| l.starts_with('|')) {
        let c = cells(line);
        if c.len() != 6 {
            return Err(vigil_testenv::Error::msg(format!("a row without 6 cells in {path}: {line}")));
        }
        rows.push(Row {
            diff: Difference {
                kind: c[0].trim().to_string(),
                field: uncell(&c[1]),
                medik8s: uncell(&c[2]),
                vigil: uncell(&c[3]),
            },
            at: c[4].trim().to_string(),
            why: c[5].trim().to_string(),
        });
    }
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vigil_differs_from_node_health_check_only_where_recorded() -> Result<()> {
    let medik8s = run(Side::Medik8s).await?;
    let vigil = run(Side::Vigil).await?;
    let found = differences(&medik8s, &vigil);
    let recorded = recorded()?;

    // Every recorded difference says why it is there.
    for r in &recorded {
        assert!(
            r.why.starts_with("deliberate") || r.why.starts_with("to fix"),
            "docs/DECISIONS.md: the difference {} {:?} says neither \"deliberate…\" nor \"to fix…\": {}",
            r.diff.kind,
            r.diff.field,
            r.why
        );
    }
    let as_recorded: BTreeSet<(Difference, String)> = recorded.iter().map(|r| (r.diff.clone(), r.at.clone())).collect();
    let as_found: BTreeSet<(Difference, String)> = found.into_iter().collect();
    if as_recorded != as_found {
        let reasons: BTreeMap<(String, String), String> =
            recorded.iter().map(|r| ((r.diff.kind.clone(), r.diff.field.clone()), r.why.clone())).collect();
        let rows: Vec<Row> = as_found
            .iter()
            .map(|(d, at)| Row {
                diff: d.clone(),
                at: at.clone(),
                why: reasons.get(&(d.kind.clone(), d.field.clone())).cloned().unwrap_or_else(|| "?".into()),
            })
            .collect();
        let new: Vec<String> = as_found.difference(&as_recorded).map(|(d, at)| format!("{d:?} at {at}")).collect();
        let gone: Vec<String> = as_recorded.difference(&as_found).map(|(d, at)| format!("{d:?} at {at}")).collect();
        panic!(
            "the differences from NodeHealthCheck v0.12.0 are not the recorded ones.\nnew: {new:#?}\nno longer \
             found: {gone:#?}\nPut this between the markers in docs/DECISIONS.md (say why for each `?`):\n{}",
            render(&rows)
        );
    }
    Ok(())
}
