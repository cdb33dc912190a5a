//! The benchmark reads in one order: the fleet's objects, the audit log, /proc and the summary at
//! the bottom; the simulated kubelet, the watches that observe the controller and the measured
//! runs (`snapshot`, `clusters`) above them; `main.rs` on top. `bin/vigil-floor.rs` is a binary of
//! its own. This test fails on any import cycle between its modules (and between its folders,
//! each counted as one module), naming it, and on a function longer than a screen.

use std::path::Path;

#[test]
fn the_bench_keeps_the_house_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = vigil_module_graph::house_rules(&src, 5).expect("read src/");
    assert!(broken.is_empty(), "the bench breaks the house rules:\n{}", broken.join("\n"));
}
