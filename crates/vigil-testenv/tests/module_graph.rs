//! The test env's modules import downwards only: child processes, the CRDs, the proxies and the
//! write hold at the bottom; the harnesses that run next to a `TestEnv` (`capi`, `medik8s`, the
//! stand-in remediators under `standins/`) above them. The crate root (`TestEnv` and the helpers
//! every module shares) is left out, as in every crate's graph. This test fails on any import
//! cycle between its modules (and between its folders, each counted as one module), naming it,
//! and on a function longer than a screen.

use std::path::Path;

#[test]
fn the_testenv_keeps_the_house_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = vigil_module_graph::house_rules(&src, 5).expect("read src/");
    assert!(broken.is_empty(), "the testenv breaks the house rules:\n{}", broken.join("\n"));
}
