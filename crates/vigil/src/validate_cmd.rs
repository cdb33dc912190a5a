//! `vigil validate FILE...`: checks every health check in the given manifests against the same
//! admission rules the controller applies, so a bad spec is caught before it is applied.
//!
//! One line per finding, each starting with the file and document so editors and CI logs can
//! point at it. A file that cannot be read or parsed is reported and counted as invalid, and
//! the other files are still checked.

use crate::documents::each_health_check;
use std::io::Write;
use std::path::{Path, PathBuf};
use vigil_api::manifest;

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
    let (all_valid, checks) = each_health_check(path, out, |n, document, check, out| {
        Ok(match check.validate().map_err(|e| manifest::as_written(document, e)) {
            Ok(()) => {
                writeln!(out, "{file}: document {n}: {}: valid", check.object_id())?;
                true
            }
            Err(invalid) => {
                for error in &invalid.errors {
                    writeln!(out, "{file}: document {n}: {}: {error}", invalid.object)?;
                }
                false
            }
        })
    })?;
    if checks == 0 && all_valid {
        // Nothing checked is not a pass: a CI job pointed at the wrong file must fail.
        writeln!(out, "{file}: no health checks found (no MachineHealthCheck or NodeHealthCheck document)")?;
        return Ok(false);
    }
    Ok(all_valid)
}
