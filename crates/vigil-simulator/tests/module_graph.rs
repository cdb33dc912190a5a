//! The simulator reads in one order: its store and the scenario format at the bottom, the feed
//! of the store into the shared read side above them, the simulation (its clock, applying plans,
//! the models) on top of those, and the output. This test fails on any import cycle between its modules (and
//! between its folders, each counted as one module), naming it, and on a function longer than a
//! screen.

use std::path::Path;

#[test]
fn the_simulator_keeps_the_house_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = vigil_module_graph::house_rules(&src, 5).expect("read src/");
    assert!(broken.is_empty(), "the simulator breaks the house rules:\n{}", broken.join("\n"));
}
