//! The `vigil` command reads in one order: what several commands share at the bottom (`live`, the
//! read-only view of a cluster; `documents`, the manifests read from files; `plot`), the commands
//! above them (`*_cmd`), and `main.rs` on top, which only parses the command line and calls one.
//! This test fails on any import cycle between its modules (and between its folders, each counted
//! as one module), naming it, and on a function longer than a screen.

use std::path::Path;

#[test]
fn the_cli_keeps_the_house_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = vigil_module_graph::house_rules(&src, 5).expect("read src/");
    assert!(broken.is_empty(), "the CLI breaks the house rules:\n{}", broken.join("\n"));
}
