//! `vigil-bench --short` end to end: a real API server, 500 Nodes and Machines, the debug
//! `vigil` binary. Checks the summary's shape and the behaviour it measures (no write in the
//! steady state, one write per remediation, never before the timeout), with loose time bounds:
//! the figures themselves are the benchmark's business, not the test's.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

#[test]
fn short_run_prints_a_sane_summary() {
    let bench = Path::new(env!("CARGO_BIN_EXE_vigil-bench"));
    // `cargo test --workspace` builds the vigil binary next to this one (its own tests need it).
    let vigil = bench.with_file_name("vigil");
    assert!(vigil.is_file(), "{} is missing: run through `cargo test --workspace`", vigil.display());
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("summary.json");
    let run = Command::new(bench)
        .args(["--short", "--vigil"])
        .arg(&vigil)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run vigil-bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "vigil-bench failed: {}\n{stderr}", run.status);
    let printed: Value = serde_json::from_slice(&run.stdout).expect("stdout is one JSON document");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("--out file")).expect("JSON");
    assert_eq!(printed, written, "--out holds what was printed");
    let s = printed;
    eprintln!("{s:#}");

    // Shape: the fields docs/benchmarks.md documents.
    for (section, fields) in [
        ("detect_ms", &["min", "p50", "p99", "max"][..]),
        ("cpu_s", &["cold_start", "steady", "wave"][..]),
        ("rss_mib", &["peak", "steady", "wave"][..]),
        ("requests", &["get", "list", "watch", "patch", "create", "update", "delete"][..]),
        ("writes", &["cold_start", "steady", "wave", "per_remediation"][..]),
    ] {
        for f in fields {
            assert!(!s[section][f].is_null(), "{section}.{f} missing in {s}");
        }
    }
    let num = |p: &str| s.pointer(p).and_then(Value::as_f64).unwrap_or_else(|| panic!("{p} is not a number"));

    assert_eq!((num("/nodes"), num("/machines")), (500.0, 500.0));
    assert_eq!(num("/failed"), 25.0, "5% of 500");
    assert_eq!(num("/detected"), num("/failed"), "every failed target was remediated");
    assert_eq!(num("/checks/machine") + num("/checks/node"), 7.0);

    // Never before the timeout expired; ordered percentiles; seconds, not minutes, even in debug.
    assert!(num("/detect_ms/min") >= 0.0, "a remediation was seen before its timeout expired");
    assert!(num("/detect_ms/min") <= num("/detect_ms/p50"));
    assert!(num("/detect_ms/p50") <= num("/detect_ms/p99"));
    assert!(num("/detect_ms/p99") <= num("/detect_ms/max"));
    assert!(num("/detect_ms/max") < 10_000.0, "detection took over 10 s");

    // Heartbeats alone write nothing; each remediation is one write; the wave's other writes
    // are bounded (status and events, no storm).
    assert!(num("/heartbeats/sent") >= 500.0 && num("/heartbeats/errors") == 0.0);
    assert_eq!(num("/writes/steady"), 0.0, "writes in the steady state");
    assert_eq!(num("/writes/per_remediation"), 1.0, "writes per remediation");
    assert!(num("/writes/wave/status") <= 3.0 * num("/failed"), "status write storm");
    assert!(num("/writes/wave/event") <= 3.0 * num("/failed"), "event storm");
    // The only other writes: the node Lease a NodeHealthCheck takes (medik8s' `node-<name>`)
    // before each remediation, at most one per failed target.
    assert!(num("/writes/wave/other") <= num("/failed"), "other writes: {}", num("/writes/wave/other"));

    // The controller listed and watched, and did not poll.
    assert!(num("/requests/watch") >= 6.0 && num("/requests/list") >= 6.0);
    assert!(num("/requests/get") < 100.0, "gets: {}", num("/requests/get"));

    // Resources were measured.
    assert!(num("/cpu_s/steady") > 0.0 && num("/cpu_s/wave") > 0.0);
    assert!(num("/rss_mib/peak") > 1.0 && num("/rss_mib/peak") >= num("/rss_mib/steady"));
    assert!(num("/cold_start_ms") > 0.0);
    assert_eq!(s["config"]["profile"], "debug");
}
