//! The health checks of manifest files, read the way every command that takes files reads them:
//! a file that cannot be read or parsed, or a document that is not a readable health check, is
//! reported with the file and document number, and the other documents are still read.

use serde_json::Value;
use std::io::Write;
use std::path::Path;
use vigil_api::manifest::{self, HealthCheck};

/// Calls `each(n, document, check, problems)` for every health check of `path` (documents
/// numbered from 1); other kinds are reported as skipped. Returns whether nothing went wrong
/// (`each` returns false for a check it refuses) and how many health checks were read.
pub fn each_health_check<W: Write>(
    path: &Path,
    problems: &mut W,
    mut each: impl FnMut(usize, &Value, HealthCheck, &mut W) -> anyhow::Result<bool>,
) -> anyhow::Result<(bool, usize)> {
    let file = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            writeln!(problems, "{file}: cannot read: {e}")?;
            return Ok((false, 0));
        }
    };
    let documents = match manifest::parse_documents(&text) {
        Ok(documents) => documents,
        Err(e) => {
            writeln!(problems, "{file}: {e}")?;
            return Ok((false, 0));
        }
    };
    let mut ok = true;
    let mut checks = 0usize;
    for (i, document) in documents.iter().enumerate() {
        let n = i + 1;
        let check = match manifest::health_check_from_value(document) {
            Ok(check) => check,
            Err(e) if e.is_other_kind() => {
                let object = manifest::object_id_of(document).unwrap_or_default();
                writeln!(problems, "{file}: document {n}: {object}: skipped (not a health check)")?;
                continue;
            }
            Err(e) => {
                writeln!(problems, "{file}: {}", e.in_document(n))?;
                ok = false;
                continue;
            }
        };
        checks += 1;
        ok &= each(n, document, check, problems)?;
    }
    Ok((ok, checks))
}
