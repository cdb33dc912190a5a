//! The CustomResourceDefinitions committed in `deploy/crds/` must be exactly what the Rust types
//! generate: a field, doc comment or rule changed in `vigil-api` without regenerating them would
//! let the API server admit (or refuse) objects differently from what the controller reads.

use std::path::Path;
use vigil_api::crd;

/// Where two texts first differ, as `line N: committed <a> / generated <b>`.
fn first_difference(committed: &str, generated: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut generated_lines = generated.lines();
    for line in 1.. {
        match (committed_lines.next(), generated_lines.next()) {
            (Some(a), Some(b)) if a == b => continue,
            (None, None) => return "only in line endings".to_string(),
            (a, b) => {
                return format!(
                    "line {line}: committed {:?} / generated {:?}",
                    a.unwrap_or("<end of file>"),
                    b.unwrap_or("<end of file>")
                );
            }
        }
    }
    String::new()
}

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(crd::CRD_DIR);
    let files = crd::files().expect("the CRDs render as YAML");
    let mut problems = Vec::new();
    for file in &files {
        let path = dir.join(&file.name);
        match std::fs::read_to_string(&path) {
            Ok(text) if text == file.text => {}
            Ok(text) => problems.push(format!(
                "{}/{} differs from what the Rust types generate ({})",
                crd::CRD_DIR,
                file.name,
                first_difference(&text, &file.text)
            )),
            Err(e) => problems.push(format!("{}/{} cannot be read: {e}", crd::CRD_DIR, file.name)),
        }
    }
    // A CRD file left behind after a resource was renamed or removed would still be installed.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let generated_name = name.starts_with(&format!("{}_", vigil_api::GROUP)) && name.ends_with(".yaml");
            if generated_name && !files.iter().any(|f| f.name == name) {
                problems.push(format!("{}/{name} is not generated any more; delete it", crd::CRD_DIR));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the committed CRDs are out of date:\n  {}\nRegenerate them from the repository root with:\n    {}\n",
        problems.join("\n  "),
        crd::REGENERATE_COMMAND
    );
}

/// The status fields of Vigil's own features are one Rust struct flattened into both statuses:
/// in both generated CRDs they are plain properties of `status` (structural: no `allOf`, `$ref`
/// or nested object standing for the flattened struct), and the same schema on both kinds.
#[test]
fn the_feature_status_block_is_the_same_plain_fields_on_both_kinds() {
    let features = [
        "wouldRemediate",
        "remediationHistory",
        "backedOffPools",
        "failureDomains",
        "staleTargetCount",
        "staleTargets",
        "queued",
        "queuedCount",
    ];
    let status_of =
        |crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
            let schema =
                crd.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("a schema");
            let status = schema.properties.as_ref().and_then(|p| p.get("status")).expect("a status schema").clone();
            serde_json::to_value(status).expect("the schema is JSON")
        };
    let definitions = crd::definitions();
    assert_eq!(definitions.len(), 2, "both kinds");
    let statuses: Vec<serde_json::Value> = definitions.iter().map(status_of).collect();
    for (crd, status) in definitions.iter().zip(&statuses) {
        let text = status.to_string();
        for word in ["allOf", "$ref", "\"features\""] {
            assert!(!text.contains(word), "{}: status schema has {word}: {text}", crd.spec.names.kind);
        }
        for field in features {
            assert!(
                status["properties"].get(field).is_some(),
                "{}: status.{field} is a plain field",
                crd.spec.names.kind
            );
        }
    }
    for field in features {
        assert_eq!(
            statuses[0]["properties"][field], statuses[1]["properties"][field],
            "status.{field} has the same schema on both kinds"
        );
    }
}
