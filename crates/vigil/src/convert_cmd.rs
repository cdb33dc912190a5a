//! `vigil convert FILE...`: prints the `vigil.dev/v1alpha1` manifests equivalent to the upstream
//! MachineHealthChecks (Cluster API `v1beta1`, `v1beta2`) and NodeHealthChecks (medik8s) in the
//! files, so a fleet's checks move over with one command. Each document is preceded by comments
//! saying where it came from and what a user must know because meaning or ownership changes.
//!
//! Output goes to `out` (stdout): only YAML and comments, ready for `kubectl apply -f -`. Problems
//! (a document that cannot be read, a check the admission rules refuse) go to `problems` (stderr)
//! with the file and document, and make the command exit 1; nothing is printed for such a
//! document, so an invalid check is never half-converted.

use crate::documents::each_health_check;
use std::io::Write;
use std::path::{Path, PathBuf};
use vigil_api::manifest::{self, HealthCheck};
use vigil_api::well_known::{CAPI_MHC_API_VERSION, CAPI_MHC_V1BETA2_API_VERSION, MEDIK8S_NHC_API_VERSION};

/// Converts every health check of every file; returns whether all of them converted.
pub fn run(paths: &[PathBuf], out: &mut impl Write, problems: &mut impl Write) -> anyhow::Result<bool> {
    let mut all_ok = true;
    let mut converted = 0usize;
    for path in paths {
        let (ok, n) = convert_file(path, out, problems)?;
        all_ok &= ok;
        converted += n;
    }
    if converted == 0 && all_ok {
        writeln!(problems, "no health checks found (no MachineHealthCheck or NodeHealthCheck document)")?;
        return Ok(false);
    }
    Ok(all_ok)
}

fn convert_file(path: &Path, out: &mut impl Write, problems: &mut impl Write) -> anyhow::Result<(bool, usize)> {
    let file = path.display();
    each_health_check(path, problems, |n, document, mut check, problems| {
        let notes = notes(document, &mut check);
        if let Err(invalid) = check.validate().map_err(|e| manifest::as_written(document, e)) {
            for error in &invalid.errors {
                writeln!(problems, "{file}: document {n}: {}: {error}", invalid.object)?;
            }
            return Ok(false);
        }
        let yaml = match &check {
            HealthCheck::Machine(m) => serde_saphyr::to_string(m),
            HealthCheck::Node(nhc) => serde_saphyr::to_string(nhc),
        }?;
        let source = document.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
        writeln!(out, "---")?;
        writeln!(out, "# {} from {source} ({file}, document {n})", check.object_id())?;
        for note in notes {
            writeln!(out, "# {note}")?;
        }
        out.write_all(yaml.as_bytes())?;
        Ok(true)
    })
}

/// What a user must know about one converted check; also puts a namespaced check without a
/// namespace where kubectl would have put it. Server-set metadata (uid, resourceVersion, …) is
/// dropped: the API server sets it anew.
fn notes(document: &serde_json::Value, check: &mut HealthCheck) -> Vec<String> {
    let source = document.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
    let upstream = source != vigil_api::API_VERSION;
    let mut notes = Vec::new();
    let meta = match check {
        HealthCheck::Machine(m) => &mut m.metadata,
        HealthCheck::Node(n) => &mut n.metadata,
    };
    *meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        labels: meta.labels.take(),
        annotations: meta.annotations.take(),
        ..Default::default()
    };
    if let HealthCheck::Machine(m) = check {
        if m.metadata.namespace.is_none() {
            m.metadata.namespace = Some("default".into());
            notes.push("metadata.namespace was not set: written as \"default\", where kubectl would create it".into());
        }
        if source == CAPI_MHC_V1BETA2_API_VERSION {
            notes.push(
                "v1beta2 fields moved to Vigil's (v1beta1) names: checks.* -> unhealthyConditions, \
                 unhealthyMachineConditions, nodeStartupTimeout (seconds -> duration); \
                 remediation.triggerIf.unhealthyLessThanOrEqualTo -> maxUnhealthy, unhealthyInRange -> \
                 unhealthyRange; remediation.templateRef -> remediationTemplate. Same meaning."
                    .into(),
            );
        }
        if (source == CAPI_MHC_API_VERSION || source == CAPI_MHC_V1BETA2_API_VERSION)
            && m.spec.remediation_template.is_some()
        {
            notes.push(
                "while the remediation template is missing, Vigil still marks unhealthy Machines \
                 (HealthCheckSucceeded=False, ExternallyRemediated=False/RemediationTemplateNotFound): \
                 docs/DECISIONS.md, \"Fixed upstream flaws\""
                    .into(),
            );
        }
    }
    if source == MEDIK8S_NHC_API_VERSION && document.pointer("/spec/plannedMaintenance").is_none() {
        notes.push(
            "plannedMaintenance.enabled: false keeps medik8s' behaviour (only the node Lease holds a Node \
             under maintenance back); remove it to also leave Nodes in a NodeMaintenance or cordoned by a \
             maintenance drain alone: docs/beside-medik8s.md"
                .into(),
        );
    }
    if document.get("status").is_some() {
        notes.push("status is not carried over: Vigil writes its own".into());
    }
    if upstream {
        notes.push(format!(
            "after applying this, delete the {source} object: while both exist, both controllers remediate the same {}",
            if matches!(check, HealthCheck::Machine(_)) { "Machines" } else { "Nodes" }
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_api::validate;

    fn convert(text: &str) -> (bool, String, String) {
        let path = std::env::temp_dir().join(format!(
            "vigil-convert-{}-{:?}.yaml",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, text).expect("write temp file");
        let (mut out, mut problems) = (Vec::new(), Vec::new());
        let ok = run(std::slice::from_ref(&path), &mut out, &mut problems).expect("writing to a Vec never fails");
        let _ = std::fs::remove_file(&path);
        let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8").replace(&path.display().to_string(), "FILE");
        (ok, text(out), text(problems))
    }

    const V1BETA2: &str = "\
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata:
  name: workers
  uid: 0b8f
  resourceVersion: \"42\"
spec:
  clusterName: prod
  selector:
    matchLabels:
      pool: a
  checks:
    nodeStartupTimeoutSeconds: 600
    unhealthyNodeConditions:
    - type: Ready
      status: Unknown
      timeoutSeconds: 300
  remediation:
    triggerIf:
      unhealthyLessThanOrEqualTo: 40%
    templateRef:
      apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
      kind: Metal3RemediationTemplate
      name: m3
status:
  expectedMachines: 3
";

    #[test]
    fn converts_v1beta2_to_the_same_check_in_vigil_form_with_notes() {
        let (ok, out, problems) = convert(V1BETA2);
        assert!(ok, "{problems}");
        assert_eq!(problems, "");
        let comments: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(
            comments[0],
            "# MachineHealthCheck/default/workers from cluster.x-k8s.io/v1beta2 (FILE, document 1)"
        );
        assert!(comments.iter().any(|c| c.contains("metadata.namespace was not set")), "{out}");
        assert!(comments.iter().any(|c| c.contains("status is not carried over")), "{out}");
        assert!(comments.iter().any(|c| c.contains("delete the cluster.x-k8s.io/v1beta2 object")), "{out}");

        // The output is a Vigil manifest that reads back to the same policy as the input.
        let docs = manifest::parse_documents(&out).expect("YAML");
        let [converted] = docs.as_slice() else { panic!("one document: {out}") };
        assert_eq!(converted["apiVersion"], "vigil.dev/v1alpha1");
        assert!(converted["metadata"].get("uid").is_none() && converted["metadata"].get("resourceVersion").is_none());
        assert!(converted.get("status").is_none());
        let policy = |v: &serde_json::Value| match manifest::health_check_from_value(v).expect("reads") {
            HealthCheck::Machine(m) => validate::machine_health_check(&m).expect("valid"),
            HealthCheck::Node(_) => panic!("an MHC"),
        };
        let original =
            manifest::parse_documents(&V1BETA2.replace("  name: workers\n", "  name: workers\n  namespace: default\n"))
                .expect("YAML");
        assert_eq!(policy(converted), policy(&original[0]));
        assert_eq!(converted["spec"]["unhealthyConditions"][0]["timeout"], "300s");
        assert_eq!(converted["spec"]["maxUnhealthy"], "40%");
    }

    #[test]
    fn refuses_what_the_admission_rules_refuse_and_prints_nothing_for_it() {
        let bad = V1BETA2.replace("600", "10");
        let nhc = "apiVersion: remediation.medik8s.io/v1alpha1\nkind: NodeHealthCheck\nmetadata: {name: workers}\nspec:\n  selector: {matchLabels: {role: worker}}\n  minHealthy: 51%\n  remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: snr, namespace: medik8s}\n";
        let machine = "apiVersion: cluster.x-k8s.io/v1beta1\nkind: Machine\nmetadata: {name: m, namespace: default}\n";
        let (ok, out, problems) = convert(&format!("{bad}---\n{machine}---\n{nhc}"));
        assert!(!ok);
        assert_eq!(
            problems,
            "FILE: document 1: MachineHealthCheck/default/workers: spec.checks.nodeStartupTimeoutSeconds: invalid value \"10\": must be 0 (disabled) or at least 30s: a shorter timeout remediates Machines that are still booting\n\
             FILE: document 2: Machine/default/m: skipped (not a health check)\n"
        );
        let docs = manifest::parse_documents(&out).expect("YAML");
        assert_eq!(docs.len(), 1, "only the NodeHealthCheck: {out}");
        assert_eq!(
            (docs[0]["apiVersion"].as_str(), docs[0]["kind"].as_str()),
            (Some("vigil.dev/v1alpha1"), Some("NodeHealthCheck"))
        );
        assert!(out.contains("# after applying this, delete the remediation.medik8s.io/v1alpha1 object: while both exist, both controllers remediate the same Nodes"), "{out}");
    }

    #[test]
    fn a_file_without_health_checks_fails() {
        let (ok, out, problems) = convert("# nothing\n");
        assert!(!ok);
        assert_eq!(out, "");
        assert_eq!(problems, "no health checks found (no MachineHealthCheck or NodeHealthCheck document)\n");
    }
}
