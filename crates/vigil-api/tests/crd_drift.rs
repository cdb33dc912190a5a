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
