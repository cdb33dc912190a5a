//! `vigil validate FILE...`: checks every health check in the given manifests against the same
//! admission rules the controller applies, so a bad spec is caught before it is applied.
//!
//! One line per finding, each starting with the file and document so editors and CI logs can
//! point at it. A file that cannot be read or parsed is reported and counted as invalid, and
//! the other files are still checked.

use std::io::Write;
use std::path::{Path, PathBuf};
use vigil_api::manifest::{self, HealthCheck};
use vigil_api::validate::{self, ValidationErrors};

/// Validates every document of every file, writing one line per finding to `out`; returns
/// whether everything was valid (main exits 1 otherwise). Only a failure to write is an `Err`.
pub fn run(paths: &[PathBuf], out: &mut impl Write) -> anyhow::Result<bool> {
    let mut all_valid = true;
    for path in paths {
        all_valid &= validate_file(path, out)?;
    }
    Ok(all_valid)
}

fn validate_file(path: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    let file = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            writeln!(out, "{file}: cannot read: {e}")?;
            return Ok(false);
        }
    };
    let documents = match manifest::parse_documents(&text) {
        Ok(documents) => documents,
        Err(e) => {
            writeln!(out, "{file}: {e}")?;
            return Ok(false);
        }
    };
    let mut all_valid = true;
    let mut checks = 0usize;
    for (i, document) in documents.iter().enumerate() {
        let n = i + 1;
        let check = match manifest::health_check_from_value(document) {
            Ok(check) => check,
            Err(e) if e.is_other_kind() => {
                let object = manifest::object_id_of(document).unwrap_or_default();
                writeln!(out, "{file}: document {n}: {object}: skipped (not a health check)")?;
                continue;
            }
            Err(e) => {
                writeln!(out, "{file}: {}", e.in_document(n))?;
                all_valid = false;
                continue;
            }
        };
        checks += 1;
        match validate_check(&check).map_err(|e| manifest::as_written(document, e)) {
            Ok(()) => writeln!(out, "{file}: document {n}: {}: valid", check.object_id())?,
            Err(invalid) => {
                all_valid = false;
                for error in &invalid.errors {
                    writeln!(out, "{file}: document {n}: {}: {error}", invalid.object)?;
                }
            }
        }
    }
    if checks == 0 && all_valid {
        // Nothing checked is not a pass: a CI job pointed at the wrong file must fail.
        writeln!(out, "{file}: no health checks found (no MachineHealthCheck or NodeHealthCheck document)")?;
        return Ok(false);
    }
    Ok(all_valid)
}

fn validate_check(check: &HealthCheck) -> Result<(), ValidationErrors> {
    match check {
        HealthCheck::Machine(mhc) => validate::machine_health_check(mhc).map(drop),
        HealthCheck::Node(nhc) => validate::node_health_check(nhc).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A manifest file in the temp dir, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(text: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("vigil-validate-{}-{n}.yaml", std::process::id()));
            std::fs::write(&path, text).expect("write temp file");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn run_on(paths: &[PathBuf]) -> (bool, Vec<String>) {
        let mut out = Vec::new();
        let ok = run(paths, &mut out).expect("writing to a Vec never fails");
        let text = String::from_utf8(out).expect("UTF-8 output");
        (ok, text.lines().map(|l| l.to_string()).collect())
    }

    const GOOD_MHC: &str = "\
apiVersion: cluster.x-k8s.io/v1beta1
kind: MachineHealthCheck
metadata:
  name: good
spec:
  clusterName: prod
  maxUnhealthy: 40%
  selector:
    matchLabels:
      pool: a
  unhealthyConditions:
  - type: Ready
    status: \"False\"
    timeout: 300s
";

    const BAD_MHC: &str = "\
apiVersion: vigil.dev/v1alpha1
kind: MachineHealthCheck
metadata:
  name: bad
  namespace: default
spec:
  clusterName: prod
  maxUnhealthy: 120%
  nodeStartupTimeout: 15s
  selector:
    matchLabels:
      pool: a
";

    const MACHINE: &str = "\
apiVersion: cluster.x-k8s.io/v1beta1
kind: Machine
metadata:
  name: m-1
  namespace: default
spec:
  clusterName: prod
";

    const GOOD_NHC: &str = "\
apiVersion: remediation.medik8s.io/v1alpha1
kind: NodeHealthCheck
metadata:
  name: workers
spec:
  minHealthy: 51%
  selector:
    matchExpressions:
    - key: node-role.kubernetes.io/worker
      operator: Exists
  remediationTemplate:
    apiVersion: self-node-remediation.medik8s.io/v1alpha1
    kind: SelfNodeRemediationTemplate
    name: snr
    namespace: medik8s
";

    #[test]
    fn reports_every_document_of_a_mixed_file() {
        let file = TempFile::new(&[GOOD_MHC, BAD_MHC, MACHINE, GOOD_NHC].join("---\n"));
        let f = file.0.display().to_string();
        let (ok, lines) = run_on(std::slice::from_ref(&file.0));
        assert!(!ok);
        assert_eq!(
            lines,
            [
                format!("{f}: document 1: MachineHealthCheck/default/good: valid"),
                format!(
                    "{f}: document 2: MachineHealthCheck/default/bad: spec.nodeStartupTimeout: invalid value \"15s\": must be 0 (disabled) or at least 30s: a shorter timeout remediates Machines that are still booting"
                ),
                format!(
                    "{f}: document 2: MachineHealthCheck/default/bad: spec.maxUnhealthy: invalid value \"120%\": must be a percentage between 0% and 100%"
                ),
                format!("{f}: document 3: Machine/default/m-1: skipped (not a health check)"),
                format!("{f}: document 4: NodeHealthCheck/workers: valid"),
            ]
        );
    }

    #[test]
    fn all_valid_files_pass() {
        let a = TempFile::new(GOOD_MHC);
        let b = TempFile::new(&format!("{MACHINE}---\n{GOOD_NHC}"));
        let (ok, lines) = run_on(&[a.0.clone(), b.0.clone()]);
        assert!(ok, "{lines:?}");
        assert_eq!(lines.len(), 3);
        assert!(lines[2].ends_with("document 2: NodeHealthCheck/workers: valid"), "{lines:?}");
    }

    #[test]
    fn unreadable_and_unparsable_files_do_not_stop_the_others() {
        let missing = std::env::temp_dir().join(format!("vigil-validate-{}-missing.yaml", std::process::id()));
        let broken = TempFile::new("a: 1\n---\nb: [1, 2\nc: 3\n");
        let good = TempFile::new(GOOD_NHC);
        let (ok, lines) = run_on(&[missing.clone(), broken.0.clone(), good.0.clone()]);
        assert!(!ok);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with(&format!("{}: cannot read: ", missing.display())), "{lines:?}");
        assert!(
            lines[1].starts_with(&format!("{}: document 2: YAML syntax error at line 4, column ", broken.0.display())),
            "{lines:?}"
        );
        assert_eq!(lines[2], format!("{}: document 1: NodeHealthCheck/workers: valid", good.0.display()));
    }

    #[test]
    fn unreadable_health_checks_are_invalid_not_skipped() {
        let shape = BAD_MHC.replace("  selector:\n    matchLabels:\n      pool: a\n", "  selector: 5\n");
        let version = GOOD_NHC.replace("remediation.medik8s.io/v1alpha1", "remediation.medik8s.io/v1beta9");
        let file = TempFile::new(&format!("{shape}---\n{version}"));
        let f = file.0.display().to_string();
        let (ok, lines) = run_on(std::slice::from_ref(&file.0));
        assert!(!ok);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "{f}: document 1: MachineHealthCheck/default/bad: spec.selector: invalid type: integer `5`"
            )),
            "{lines:?}"
        );
        assert!(lines[1].starts_with(&format!("{f}: document 2: NodeHealthCheck/workers: apiVersion \"remediation.medik8s.io/v1beta9\" kind \"NodeHealthCheck\" is not a health check Vigil reads; accepted: ")), "{lines:?}");
    }

    #[test]
    fn a_file_without_health_checks_fails() {
        let empty = TempFile::new("# nothing yet\n");
        let machines = TempFile::new(MACHINE);
        let good = TempFile::new(GOOD_NHC);
        let (ok, lines) = run_on(&[empty.0.clone(), machines.0.clone(), good.0.clone()]);
        assert!(!ok, "nothing checked is not a pass");
        let none = "no health checks found (no MachineHealthCheck or NodeHealthCheck document)";
        assert_eq!(
            lines,
            [
                format!("{}: {none}", empty.0.display()),
                format!("{}: document 1: Machine/default/m-1: skipped (not a health check)", machines.0.display()),
                format!("{}: {none}", machines.0.display()),
                format!("{}: document 1: NodeHealthCheck/workers: valid", good.0.display()),
            ]
        );
    }

    #[test]
    fn cluster_api_v1beta2_is_read_and_its_errors_name_its_fields() {
        let v1beta2 = "\
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata:
  name: workers
spec:
  clusterName: prod
  selector:
    matchLabels:
      pool: a
  checks:
    nodeStartupTimeoutSeconds: 15
    unhealthyNodeConditions:
    - type: Ready
      status: Unknown
      timeoutSeconds: 300
  remediation:
    triggerIf:
      unhealthyLessThanOrEqualTo: 120%
";
        let file = TempFile::new(&format!("{v1beta2}---\n{}", v1beta2.replace("15", "600").replace("120%", "40%")));
        let f = file.0.display().to_string();
        let (ok, lines) = run_on(std::slice::from_ref(&file.0));
        assert!(!ok);
        assert_eq!(
            lines,
            [
                format!(
                    "{f}: document 1: MachineHealthCheck/default/workers: spec.checks.nodeStartupTimeoutSeconds: invalid value \"15\": must be 0 (disabled) or at least 30s: a shorter timeout remediates Machines that are still booting"
                ),
                format!(
                    "{f}: document 1: MachineHealthCheck/default/workers: spec.remediation.triggerIf.unhealthyLessThanOrEqualTo: invalid value \"120%\": must be a percentage between 0% and 100%"
                ),
                format!("{f}: document 2: MachineHealthCheck/default/workers: valid"),
            ]
        );
    }
}
