//! Reading health checks from YAML manifests: `vigil validate`, the simulator and tests read
//! files that may hold several documents, other kinds of objects, and the upstream
//! (`cluster.x-k8s.io`, `remediation.medik8s.io`) forms of the two resources.
//!
//! Reading is two steps so that one bad document never hides the others: [`parse_documents`]
//! turns the text into JSON values (a YAML syntax error fails the whole text, because the parser
//! cannot resynchronise), then [`health_check_from_value`] reads each value on its own.
//! Admission rules are not checked here; that is [`crate::validate`]'s job.

use crate::machine_health_check::MachineHealthCheck;
use crate::node_health_check::NodeHealthCheck;
use crate::validate::object_id;
use crate::well_known::{CAPI_MHC_API_VERSION, CAPI_MHC_V1BETA2_API_VERSION, MEDIK8S_NHC_API_VERSION};
use serde_json::Value;
use std::fmt;

/// Every (`apiVersion`, `kind`) pair [`health_check_from_value`] reads, so errors can list them.
pub const ACCEPTED: [(&str, &str); 5] = [
    (crate::API_VERSION, "MachineHealthCheck"),
    (crate::API_VERSION, "NodeHealthCheck"),
    (CAPI_MHC_API_VERSION, "MachineHealthCheck"),
    (CAPI_MHC_V1BETA2_API_VERSION, "MachineHealthCheck"),
    (MEDIK8S_NHC_API_VERSION, "NodeHealthCheck"),
];

/// A health check read from a manifest, of either kind, so callers can handle a mixed file.
// One value per manifest read, validated and dropped or unwrapped at once (never held in bulk),
// so the two kinds' difference in size costs nothing that boxing one would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum HealthCheck {
    /// A MachineHealthCheck (Vigil's own or Cluster API's).
    Machine(MachineHealthCheck),
    /// A NodeHealthCheck (Vigil's own or medik8s').
    Node(NodeHealthCheck),
}

impl HealthCheck {
    /// Every admission rule of its kind, so that each command checks a manifest the same way.
    pub fn validate(&self) -> Result<(), crate::validate::ValidationErrors> {
        match self {
            HealthCheck::Machine(m) => crate::validate::machine_health_check(m).map(drop),
            HealthCheck::Node(n) => crate::validate::node_health_check(n).map(drop),
        }
    }

    /// The kind, for messages that must say what was read.
    pub fn kind(&self) -> &'static str {
        match self {
            HealthCheck::Machine(_) => "MachineHealthCheck",
            HealthCheck::Node(_) => "NodeHealthCheck",
        }
    }

    /// `Kind/namespace/name` (`Kind/name` for the cluster-scoped NodeHealthCheck), the same form
    /// [`crate::validate::ValidationErrors::object`] uses, so valid and invalid lines match.
    pub fn object_id(&self) -> String {
        match self {
            HealthCheck::Machine(m) => object_id(
                self.kind(),
                Some(m.metadata.namespace.as_deref().unwrap_or("default")),
                m.metadata.name.as_deref(),
            ),
            HealthCheck::Node(n) => object_id(self.kind(), None, n.metadata.name.as_deref()),
        }
    }
}

/// Where in a manifest an error was found, as far as known; shown before every error message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// 1-based position of the document among the file's non-empty documents.
    pub document: Option<usize>,
    /// `Kind/namespace/name` of the object, when the document says.
    pub object: Option<String>,
}

impl fmt::Display for Origin {
    /// Writes `document N: Kind/ns/name: ` (each part only when known) as a message prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.document {
            write!(f, "document {n}: ")?;
        }
        if let Some(object) = &self.object {
            write!(f, "{object}: ")?;
        }
        Ok(())
    }
}

/// Why a manifest, or one document of it, could not be read as a health check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The text is not valid YAML; nothing after this point could be read.
    #[error("document {document}: YAML syntax error{}: {message}", at_line(*.line, *.column))]
    Yaml {
        /// 1-based position of the document being parsed among the non-empty documents.
        document: usize,
        /// 1-based line in the whole text (0 when the parser did not say).
        line: u64,
        /// 1-based column (0 when the parser did not say).
        column: u64,
        /// The parser's message, without its location.
        message: String,
    },
    /// The document is not a Kubernetes object (not a mapping, or no `apiVersion` / `kind`).
    #[error("{origin}not a Kubernetes object: {problem}")]
    NotAnObject {
        /// Where.
        origin: Origin,
        /// What is missing.
        problem: String,
    },
    /// An object of an `apiVersion` / `kind` Vigil does not read as a health check.
    #[error(
        "{origin}apiVersion {api_version:?} kind {kind:?} is not a health check Vigil reads; accepted: {}",
        accepted_list()
    )]
    Unsupported {
        /// Where.
        origin: Origin,
        /// `apiVersion` as written.
        api_version: String,
        /// `kind` as written.
        kind: String,
    },
    /// A health check whose fields do not have the expected types or shape.
    #[error("{origin}{}{message}", path_prefix(.path))]
    Shape {
        /// Where.
        origin: Origin,
        /// JSON path of the offending field, e.g. `spec.selector` (empty for the whole object).
        path: String,
        /// What is wrong, as serde says it, e.g. that an integer came where a mapping was expected.
        message: String,
    },
}

impl ManifestError {
    /// The same error placed in document `n`, for callers that read documents one by one.
    #[must_use]
    pub fn in_document(mut self, n: usize) -> Self {
        match &mut self {
            ManifestError::Yaml { document, .. } => *document = n,
            ManifestError::NotAnObject { origin, .. }
            | ManifestError::Unsupported { origin, .. }
            | ManifestError::Shape { origin, .. } => origin.document = Some(n),
        }
        self
    }

    /// Whether the document is simply some other kind of object (e.g. a Machine next to its
    /// health check), which a reader of mixed files skips rather than reports as invalid.
    pub fn is_other_kind(&self) -> bool {
        matches!(self, ManifestError::Unsupported { kind, .. }
            if !ACCEPTED.iter().any(|(_, accepted)| accepted == kind))
    }
}

fn at_line(line: u64, column: u64) -> String {
    if line == 0 { String::new() } else { format!(" at line {line}, column {column}") }
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() { String::new() } else { format!("{path}: ") }
}

fn accepted_list() -> String {
    ACCEPTED.iter().map(|(v, k)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
}

/// `Kind/namespace/name` of any object value, in the form the validators use for health checks.
pub fn object_id_of(v: &Value) -> Option<String> {
    let kind = v.get("kind")?.as_str()?;
    let text = |field: &str| v.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str);
    let namespace = match kind {
        "MachineHealthCheck" => Some(text("namespace").unwrap_or("default")),
        "NodeHealthCheck" => None,
        _ => text("namespace"),
    };
    Some(object_id(kind, namespace, text("name")))
}

/// Parses multi-document YAML into JSON values, skipping empty (and null) documents.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, ManifestError> {
    let mut reader = std::io::Cursor::new(text.as_bytes());
    let mut documents = Vec::new();
    for (i, document) in serde_saphyr::read::<_, Value>(&mut reader).enumerate() {
        match document {
            Ok(v) => documents.push(v),
            Err(e) => return Err(yaml_error(i + 1, &e)),
        }
    }
    Ok(documents)
}

fn yaml_error(document: usize, e: &serde_saphyr::Error) -> ManifestError {
    let e = e.without_snippet();
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    let text = e.to_string();
    let suffix = format!(" at line {line}, column {column}");
    let message = text
        .strip_suffix(&suffix)
        .unwrap_or(&text)
        // the parser's advice is for Rust callers, not for whoever wrote the manifest
        .replace(", set DuplicateKeyPolicy in Options if acceptable", "");
    ManifestError::Yaml { document, line, column, message }
}

/// Reads one document as a health check, accepting Vigil's `apiVersion` and the upstream ones
/// listed in [`ACCEPTED`].
pub fn health_check_from_value(v: &Value) -> Result<HealthCheck, ManifestError> {
    let origin = Origin { document: None, object: object_id_of(v) };
    let Some(map) = v.as_object() else {
        return Err(ManifestError::NotAnObject {
            origin,
            problem: format!("expected a mapping, found {}", type_name(v)),
        });
    };
    let field = |name: &str| match map.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.as_str()),
        Some(Value::String(_)) | None => {
            Err(ManifestError::NotAnObject { origin: origin.clone(), problem: format!("{name} is missing") })
        }
        Some(other) => Err(ManifestError::NotAnObject {
            origin: origin.clone(),
            problem: format!("{name} must be a string, found {}", type_name(other)),
        }),
    };
    let api_version = field("apiVersion")?;
    let kind = field("kind")?;
    match (api_version, kind) {
        (crate::API_VERSION, "MachineHealthCheck") => read_as(v, &origin).map(HealthCheck::Machine),
        (crate::API_VERSION, "NodeHealthCheck") => read_as(v, &origin).map(HealthCheck::Node),
        (CAPI_MHC_API_VERSION, "MachineHealthCheck") => read_as(&as_vigil(map), &origin).map(HealthCheck::Machine),
        (CAPI_MHC_V1BETA2_API_VERSION, "MachineHealthCheck") => {
            read_as(&v1beta2_as_vigil(map, &origin)?, &origin).map(HealthCheck::Machine).map_err(|e| match e {
                ManifestError::Shape { origin, path, message } => {
                    ManifestError::Shape { origin, path: v1beta2_path(&path), message }
                }
                other => other,
            })
        }
        (MEDIK8S_NHC_API_VERSION, "NodeHealthCheck") => read_as(&medik8s_as_vigil(map), &origin).map(HealthCheck::Node),
        _ => Err(ManifestError::Unsupported { origin, api_version: api_version.to_string(), kind: kind.to_string() }),
    }
}

/// The upstream object rewritten to Vigil's `apiVersion`; its `status` is dropped because
/// upstream statuses have other shapes and a status is the controller's to write anyway.
fn as_vigil(map: &serde_json::Map<String, Value>) -> Value {
    Value::Object(vigil_object(map))
}

/// A medik8s NodeHealthCheck as Vigil's: upstream has no planned-maintenance rule beyond the
/// node Lease, so the check reads with `plannedMaintenance.enabled: false` unless it says.
fn medik8s_as_vigil(map: &serde_json::Map<String, Value>) -> Value {
    let mut map = vigil_object(map);
    if let Some(Value::Object(spec)) = map.get_mut("spec") {
        spec.entry("plannedMaintenance").or_insert_with(|| serde_json::json!({"enabled": false}));
    }
    Value::Object(map)
}

/// [`as_vigil`] as a mapping, for the conversions that go on to rewrite the spec.
fn vigil_object(map: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let mut map = map.clone();
    map.insert("apiVersion".into(), Value::String(crate::API_VERSION.into()));
    map.remove("status");
    map
}

/// Where each Vigil spec field comes from in a Cluster API `v1beta2` MachineHealthCheck, so
/// errors about a v1beta2 manifest name the field the user wrote (longest prefix first).
const V1BETA2_PATHS: [(&str, &str); 6] = [
    ("spec.unhealthyConditions", "spec.checks.unhealthyNodeConditions"),
    ("spec.unhealthyMachineConditions", "spec.checks.unhealthyMachineConditions"),
    ("spec.nodeStartupTimeout", "spec.checks.nodeStartupTimeoutSeconds"),
    ("spec.maxUnhealthy", "spec.remediation.triggerIf.unhealthyLessThanOrEqualTo"),
    ("spec.unhealthyRange", "spec.remediation.triggerIf.unhealthyInRange"),
    ("spec.remediationTemplate", "spec.remediation.templateRef"),
];

/// A Cluster API `v1beta2` MachineHealthCheck rewritten to Vigil's `apiVersion` and field names
/// (the `v1beta1` ones): `checks.*` and `remediation.*` move up, `…Seconds` integers become
/// durations (`300` → `"300s"`). The meaning is unchanged: Cluster API converts between its two
/// versions the same way. A field Vigil does not know is refused with its v1beta2 path.
pub fn v1beta2_as_vigil(map: &serde_json::Map<String, Value>, origin: &Origin) -> Result<Value, ManifestError> {
    let v1beta2 = V1beta2 { origin };
    let mut out = vigil_object(map);
    let Some(spec) = map.get("spec") else { return Ok(Value::Object(out)) };
    let spec = v1beta2.mapping("spec", spec)?;
    let mut vigil = serde_json::Map::new();
    for (key, value) in spec {
        match key.as_str() {
            "clusterName" | "selector" => {
                vigil.insert(key, value);
            }
            "checks" => v1beta2.checks(&value, &mut vigil)?,
            "remediation" => v1beta2.remediation(&value, &mut vigil)?,
            _ => return Err(v1beta2.shape(&format!("spec.{key}"), UNKNOWN_FIELD)),
        }
    }
    out.insert("spec".into(), Value::Object(vigil));
    Ok(Value::Object(out))
}

/// The pieces of [`v1beta2_as_vigil`]: each refuses what it cannot read with a shape error
/// naming the v1beta2 path, in the manifest the object came from.
struct V1beta2<'a> {
    origin: &'a Origin,
}

impl V1beta2<'_> {
    /// A shape error at `path` of this manifest.
    fn shape(&self, path: &str, message: &str) -> ManifestError {
        ManifestError::Shape { origin: self.origin.clone(), path: path.to_string(), message: message.to_string() }
    }

    /// A `…Seconds` integer as the Go duration Vigil's field holds (`300` → `"300s"`).
    fn seconds(&self, path: &str, v: &Value) -> Result<Value, ManifestError> {
        match v.as_i64() {
            Some(n) => Ok(Value::String(format!("{n}s"))),
            None => {
                Err(self.shape(path, &format!("invalid type: {}, expected a whole number of seconds", type_name(v))))
            }
        }
    }

    /// A value that must be a mapping.
    fn mapping(&self, path: &str, v: &Value) -> Result<serde_json::Map<String, Value>, ManifestError> {
        v.as_object()
            .cloned()
            .ok_or_else(|| self.shape(path, &format!("invalid type: {}, expected a mapping", type_name(v))))
    }

    /// A condition list with each `timeoutSeconds` turned into a `timeout` duration.
    fn conditions(&self, path: &str, v: &Value) -> Result<Value, ManifestError> {
        let Some(list) = v.as_array() else {
            return Err(self.shape(path, &format!("invalid type: {}, expected a list", type_name(v))));
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, c) in list.iter().enumerate() {
            let mut c = self.mapping(&format!("{path}[{i}]"), c)?;
            if let Some(t) = c.remove("timeoutSeconds") {
                c.insert("timeout".into(), self.seconds(&format!("{path}[{i}].timeoutSeconds"), &t)?);
            } else if c.contains_key("timeout") {
                return Err(
                    self.shape(&format!("{path}[{i}].timeout"), "unknown field: v1beta2 calls it timeoutSeconds")
                );
            }
            out.push(Value::Object(c));
        }
        Ok(Value::Array(out))
    }

    /// `spec.checks`: the node startup timeout and both condition lists move up into the spec.
    fn checks(&self, value: &Value, vigil: &mut serde_json::Map<String, Value>) -> Result<(), ManifestError> {
        for (k, v) in self.mapping("spec.checks", value)? {
            let path = format!("spec.checks.{k}");
            match k.as_str() {
                "nodeStartupTimeoutSeconds" => vigil.insert("nodeStartupTimeout".into(), self.seconds(&path, &v)?),
                "unhealthyNodeConditions" => vigil.insert("unhealthyConditions".into(), self.conditions(&path, &v)?),
                "unhealthyMachineConditions" => {
                    vigil.insert("unhealthyMachineConditions".into(), self.conditions(&path, &v)?)
                }
                _ => return Err(self.shape(&path, UNKNOWN_FIELD)),
            };
        }
        Ok(())
    }

    /// `spec.remediation`: the template reference and the `triggerIf` limits move up into the spec.
    fn remediation(&self, value: &Value, vigil: &mut serde_json::Map<String, Value>) -> Result<(), ManifestError> {
        for (k, v) in self.mapping("spec.remediation", value)? {
            let path = format!("spec.remediation.{k}");
            match k.as_str() {
                "templateRef" => {
                    vigil.insert("remediationTemplate".into(), v);
                }
                "triggerIf" => {
                    for (k, v) in self.mapping(&path, &v)? {
                        match k.as_str() {
                            "unhealthyLessThanOrEqualTo" => vigil.insert("maxUnhealthy".into(), v),
                            "unhealthyInRange" => vigil.insert("unhealthyRange".into(), v),
                            _ => return Err(self.shape(&format!("{path}.{k}"), UNKNOWN_FIELD)),
                        };
                    }
                }
                _ => return Err(self.shape(&path, UNKNOWN_FIELD)),
            }
        }
        Ok(())
    }
}

/// The message for a spec field that is not part of the resource.
const UNKNOWN_FIELD: &str = "unknown field: not part of the spec (a typo?); it would be ignored and its default used";

/// Rewrites the field paths (and `…Seconds` values) of errors found in a document that was a
/// Cluster API `v1beta2` MachineHealthCheck to the fields as written there; other documents'
/// errors are returned as they are.
pub fn as_written(
    document: &Value,
    mut errors: crate::validate::ValidationErrors,
) -> crate::validate::ValidationErrors {
    let is_v1beta2 = document.get("apiVersion").and_then(Value::as_str) == Some(CAPI_MHC_V1BETA2_API_VERSION);
    if !is_v1beta2 {
        return errors;
    }
    for e in &mut errors.errors {
        e.path = v1beta2_path(&e.path);
        if e.path.ends_with("Seconds")
            && let Some(n) = e.value.strip_suffix('s').filter(|n| n.parse::<i64>().is_ok())
        {
            e.value = n.to_string();
        }
    }
    errors
}

/// The v1beta2 path of a Vigil spec path (`spec.unhealthyConditions[0].timeout` →
/// `spec.checks.unhealthyNodeConditions[0].timeoutSeconds`).
pub fn v1beta2_path(path: &str) -> String {
    for (vigil, upstream) in V1BETA2_PATHS {
        if let Some(rest) = path.strip_prefix(vigil)
            && (rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
        {
            let rest = if (vigil == "spec.unhealthyConditions" || vigil == "spec.unhealthyMachineConditions")
                && rest.ends_with(".timeout")
            {
                format!("{rest}Seconds")
            } else {
                rest.to_string()
            };
            return format!("{upstream}{rest}");
        }
    }
    path.to_string()
}

/// Fields of upstream `ObjectReference`s that a template reference may carry and that mean
/// nothing for a template (Vigil resolves templates by apiVersion, kind, namespace and name).
const TOLERATED_REFERENCE_FIELDS: [&str; 3] = ["uid", "resourceVersion", "fieldPath"];

fn read_as<T: serde::de::DeserializeOwned>(v: &Value, origin: &Origin) -> Result<T, ManifestError> {
    let mut unknown: Vec<String> = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string().replace(".?", ""));
    let deserializer = serde_ignored::Deserializer::new(v, &mut note);
    let value: T = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let mut message = e.inner().to_string();
        if message.starts_with("invalid type:") && message.ends_with("expected a string") {
            message.push_str(" (quote the value in YAML, e.g. \"0\" or \"False\")");
        }
        ManifestError::Shape { origin: origin.clone(), path: if path == "." { String::new() } else { path }, message }
    })?;
    // An unknown spec field is most likely a typo (`maxUnhealty`) that would silently leave a
    // default in force; refuse it, as `kubectl apply` with strict validation does.
    let typo = unknown.into_iter().find(|path| {
        path.starts_with("spec.")
            && !(path.contains("emediationTemplate.")
                && TOLERATED_REFERENCE_FIELDS.iter().any(|f| path.ends_with(&format!(".{f}"))))
    });
    match typo {
        Some(path) => Err(ManifestError::Shape { origin: origin.clone(), path, message: UNKNOWN_FIELD.into() }),
        None => Ok(value),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_several_documents_and_skips_empty_ones() {
        let text = "---\n---\na: 1\n---\n# only a comment\n---\nb: [x, \"False\", 0]\n...\n";
        let docs = parse_documents(text).expect("valid YAML");
        assert_eq!(docs, [json!({"a": 1}), json!({"b": ["x", "False", 0]})]);
        assert_eq!(parse_documents("").expect("empty text"), Vec::<Value>::new());
    }

    #[test]
    fn syntax_errors_name_document_line_and_column() {
        let err = parse_documents("a: 1\n---\nb: 2\n---\nc: [1, 2\nd: 3\n").expect_err("unclosed");
        let ManifestError::Yaml { document, line, column, message } = &err else { panic!("{err:?}") };
        assert_eq!((*document, *line), (3, 6), "{err}");
        assert!(*column > 0);
        assert!(!message.contains("at line"), "{message}");
        assert!(err.to_string().starts_with("document 3: YAML syntax error at line 6, column "), "{err}");

        let dup = parse_documents("a: 1\na: 2\n").expect_err("duplicate key");
        assert_eq!(dup.to_string(), "document 1: YAML syntax error at line 2, column 1: duplicate mapping key: a");
    }

    fn mhc(api_version: &str) -> Value {
        json!({
            "apiVersion": api_version, "kind": "MachineHealthCheck",
            "metadata": {"name": "workers", "namespace": "team-a"},
            "spec": {"clusterName": "prod", "selector": {"matchLabels": {"pool": "a"}}},
            "status": {"conditions": [{"type": "RemediationAllowed", "status": "True", "severity": ""}]}
        })
    }

    #[test]
    fn reads_vigil_and_upstream_forms() {
        let HealthCheck::Machine(upstream) = health_check_from_value(&mhc(CAPI_MHC_API_VERSION)).expect("upstream MHC")
        else {
            panic!("not an MHC")
        };
        assert_eq!(upstream.spec.cluster_name, "prod");
        assert_eq!(upstream.status, None, "upstream status is dropped");

        let mut own = mhc(crate::API_VERSION);
        own.as_object_mut().expect("object").remove("status");
        let read = health_check_from_value(&own).expect("own MHC");
        assert_eq!(read.object_id(), "MachineHealthCheck/team-a/workers");
        let HealthCheck::Machine(own) = read else { panic!("not an MHC") };
        assert_eq!((own.metadata, own.spec), (upstream.metadata, upstream.spec));

        let nhc = json!({
            "apiVersion": MEDIK8S_NHC_API_VERSION, "kind": "NodeHealthCheck", "metadata": {"name": "n"},
            "spec": {"selector": {"matchLabels": {"role": "worker"}}}
        });
        let read = health_check_from_value(&nhc).expect("upstream NHC");
        assert_eq!((read.kind(), read.object_id().as_str()), ("NodeHealthCheck", "NodeHealthCheck/n"));
    }

    #[test]
    fn refuses_other_kinds_and_versions_naming_them() {
        let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m", "namespace": "ns"}});
        let err = health_check_from_value(&machine).expect_err("a Machine");
        assert!(err.is_other_kind());
        let text = err.in_document(2).to_string();
        assert!(
            text.starts_with(
                "document 2: Machine/ns/m: apiVersion \"cluster.x-k8s.io/v1beta1\" kind \"Machine\" is not"
            ),
            "{text}"
        );
        assert!(text.ends_with(&accepted_list()), "{text}");
        assert!(text.contains("remediation.medik8s.io/v1alpha1 NodeHealthCheck"), "{text}");

        let err = health_check_from_value(&mhc("cluster.x-k8s.io/v1alpha4")).expect_err("unsupported version");
        assert!(!err.is_other_kind(), "an MHC of another version is an error, not something to skip");
        assert!(err.to_string().contains("\"cluster.x-k8s.io/v1alpha4\""), "{err}");

        let err = health_check_from_value(&json!({"kind": "NodeHealthCheck"})).expect_err("no apiVersion");
        assert_eq!(err.to_string(), "NodeHealthCheck/<unnamed>: not a Kubernetes object: apiVersion is missing");
        let err = health_check_from_value(&json!(["a"])).expect_err("a list");
        assert_eq!(err.to_string(), "not a Kubernetes object: expected a mapping, found a list");
    }

    fn v1beta2_mhc() -> Value {
        json!({
            "apiVersion": CAPI_MHC_V1BETA2_API_VERSION, "kind": "MachineHealthCheck",
            "metadata": {"name": "workers", "namespace": "team-a"},
            "spec": {
                "clusterName": "prod",
                "selector": {"matchLabels": {"pool": "a"}},
                "checks": {
                    "nodeStartupTimeoutSeconds": 600,
                    "unhealthyNodeConditions": [{"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}],
                    "unhealthyMachineConditions": [{"type": "NodeHealthy", "status": "False", "timeoutSeconds": 120}]
                },
                "remediation": {
                    "triggerIf": {"unhealthyLessThanOrEqualTo": "40%"},
                    "templateRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3RemediationTemplate", "name": "m3"}
                }
            },
            "status": {"conditions": [{"type": "RemediationAllowed", "status": "True"}]}
        })
    }

    #[test]
    fn reads_cluster_api_v1beta2_as_the_v1beta1_fields_it_converts_to() {
        let HealthCheck::Machine(read) = health_check_from_value(&v1beta2_mhc()).expect("v1beta2 MHC") else {
            panic!("not an MHC")
        };
        let same_in_v1beta1 = json!({
            "apiVersion": CAPI_MHC_API_VERSION, "kind": "MachineHealthCheck",
            "metadata": {"name": "workers", "namespace": "team-a"},
            "spec": {
                "clusterName": "prod",
                "selector": {"matchLabels": {"pool": "a"}},
                "nodeStartupTimeout": "600s",
                "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "300s"}],
                "unhealthyMachineConditions": [{"type": "NodeHealthy", "status": "False", "timeout": "120s"}],
                "maxUnhealthy": "40%",
                "remediationTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3RemediationTemplate", "name": "m3"}
            }
        });
        let HealthCheck::Machine(want) = health_check_from_value(&same_in_v1beta1).expect("v1beta1 MHC") else {
            panic!("not an MHC")
        };
        assert_eq!((read.metadata, read.spec, read.status), (want.metadata, want.spec, None));

        let mut range = v1beta2_mhc();
        range["spec"]["remediation"]["triggerIf"] = json!({"unhealthyInRange": "[1-3]"});
        let HealthCheck::Machine(read) = health_check_from_value(&range).expect("range") else { panic!("not an MHC") };
        assert_eq!((read.spec.unhealthy_range.as_deref(), read.spec.max_unhealthy), (Some("[1-3]"), None));
    }

    #[test]
    fn v1beta2_errors_name_the_v1beta2_field() {
        let cases = [
            ("/spec/checks/nodeStartupTimeout", json!("10m"), "spec.checks.nodeStartupTimeout", "unknown field"),
            (
                "/spec/remediation/triggerIf/maxUnhealthy",
                json!(1),
                "spec.remediation.triggerIf.maxUnhealthy",
                "unknown field",
            ),
            ("/spec/maxUnhealthy", json!(1), "spec.maxUnhealthy", "unknown field"),
            (
                "/spec/checks/nodeStartupTimeoutSeconds",
                json!("10m"),
                "spec.checks.nodeStartupTimeoutSeconds",
                "expected a whole number of seconds",
            ),
            (
                "/spec/checks/unhealthyNodeConditions/0/timeoutSeconds",
                json!(1.5),
                "spec.checks.unhealthyNodeConditions[0].timeoutSeconds",
                "expected a whole number of seconds",
            ),
            (
                "/spec/checks/unhealthyNodeConditions/0/status",
                json!(false),
                "spec.checks.unhealthyNodeConditions[0].status",
                "invalid type",
            ),
        ];
        for (pointer, value, path, words) in cases {
            let mut v = v1beta2_mhc();
            let (parent, field) = pointer.rsplit_once('/').expect("pointer");
            v.pointer_mut(parent).and_then(Value::as_object_mut).expect("parent").insert(field.into(), value);
            let err = health_check_from_value(&v).expect_err(pointer);
            let ManifestError::Shape { path: got, message, .. } = &err else { panic!("{err:?}") };
            assert_eq!(got, path, "{pointer}");
            assert!(message.contains(words), "{pointer}: {message}");
        }

        // Admission errors found on the converted spec are reported on the v1beta2 fields.
        let mut v = v1beta2_mhc();
        v["spec"]["checks"]["nodeStartupTimeoutSeconds"] = json!(15);
        v["spec"]["checks"]["unhealthyNodeConditions"][0]["status"] = json!("Maybe");
        let HealthCheck::Machine(m) = health_check_from_value(&v).expect("reads") else { panic!("not an MHC") };
        let errors = as_written(&v, crate::validate::machine_health_check(&m).expect_err("invalid"));
        let got: Vec<(String, String)> = errors.errors.iter().map(|e| (e.path.clone(), e.value.clone())).collect();
        assert_eq!(
            got,
            [
                ("spec.checks.unhealthyNodeConditions[0].status".to_string(), "Maybe".to_string()),
                ("spec.checks.nodeStartupTimeoutSeconds".to_string(), "15".to_string()),
            ]
        );
    }

    #[test]
    fn shape_errors_name_the_field_path() {
        let mut v = mhc(crate::API_VERSION);
        v["spec"]["selector"] = json!(5);
        let err = health_check_from_value(&v).expect_err("selector: 5").in_document(1);
        let ManifestError::Shape { path, message, .. } = &err else { panic!("{err:?}") };
        assert_eq!(path, "spec.selector");
        assert!(message.starts_with("invalid type: integer `5`, expected"), "{message}");
        assert!(
            err.to_string().starts_with("document 1: MachineHealthCheck/team-a/workers: spec.selector: invalid type"),
            "{err}"
        );

        let mut v = mhc(crate::API_VERSION);
        v["spec"]["unhealthyConditions"] = json!([{"type": "Ready", "status": false, "timeout": "5m"}]);
        let err = health_check_from_value(&v).expect_err("status: false");
        let ManifestError::Shape { path, message, .. } = &err else { panic!("{err:?}") };
        assert_eq!(path, "spec.unhealthyConditions[0].status");
        assert!(message.contains("quote the value"), "{message}");

        let mut v = mhc(crate::API_VERSION);
        v["spec"].as_object_mut().expect("spec").remove("clusterName");
        let err = health_check_from_value(&v).expect_err("no clusterName");
        assert!(err.to_string().ends_with("spec: missing field `clusterName`"), "{err}");
    }
}
