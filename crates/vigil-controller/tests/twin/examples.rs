//! Every file in `examples/`, run both ways: the stories the README and the docs tell with
//! `vigil simulate` are what `vigil run` does. Each runs [`SPEED`] times faster (see
//! [`crate::scaled`]) so that the forty-odd minutes of a story take forty-odd seconds; a few run
//! at once, each with API servers of its own.

use crate::{scaled, twin_scenario};
use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use jiff::Timestamp;
use std::path::PathBuf;
use vigil_simulator::Scenario;

/// How much faster than the files tell them the examples run: a minute becomes a second.
const SPEED: i32 = 60;

/// How many examples run at once: each mostly waits for its timeline.
const AT_ONCE: usize = 4;

/// The example files, in name order; `VIGIL_TWIN_EXAMPLES` (names without `.yaml`, by commas)
/// keeps only some, to look at one while changing it.
fn example_files() -> Result<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "yaml"));
    if let Ok(only) = std::env::var("VIGIL_TWIN_EXAMPLES") {
        let stem = |f: &PathBuf| f.file_stem().and_then(|s| s.to_str()).map(str::to_string);
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        if let Some(unknown) = only.iter().find(|o| !files.iter().any(|f| stem(f).as_deref() == Some(**o))) {
            bail!("VIGIL_TWIN_EXAMPLES names {unknown:?}, which is not an example under {}", dir.display());
        }
        files.retain(|f| stem(f).is_some_and(|s| only.contains(&s.as_str())));
    }
    files.sort();
    Ok(files)
}

/// One example, both ways, and once more when the two worlds differ: an example with several
/// failures within a few hundred milliseconds of the faster clock (`max-in-flight`: six in 167 ms)
/// can see one deadline fall into the next whole second in one world only when the machine is
/// busy, and a difference counts only when it comes again. The first difference stays in the
/// output.
async fn run_twice_if_needed(file: PathBuf) -> Result<()> {
    match run(file.clone()).await {
        Ok(()) => Ok(()),
        Err(first) => {
            eprintln!("TWIN {}: differed, run again: {first:#}", file.display());
            run(file).await.with_context(|| format!("differed twice; the first time: {first:#}"))
        }
    }
}

/// One example, faster, both ways.
async fn run(file: PathBuf) -> Result<()> {
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let scenario = Scenario::parse(&text).with_context(|| file.display().to_string())?;
    let faster = scaled::faster(scenario, SPEED, Timestamp::now())?;
    twin_scenario(&faster).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_example_is_the_same_in_both_worlds() -> Result<()> {
    let files = example_files()?;
    let narrowed = std::env::var_os("VIGIL_TWIN_EXAMPLES").is_some();
    assert!(narrowed || files.len() >= 10, "the examples are found: {files:?}");
    let results: Vec<(PathBuf, Result<()>)> = futures::stream::iter(files)
        // Each on a task of its own: one example's simulation does not hold another's timeline.
        .map(|file| async move {
            let joined = tokio::spawn(run_twice_if_needed(file.clone())).await;
            (file, joined.map_err(anyhow::Error::from).and_then(|r| r))
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let failed: Vec<String> =
        results.iter().filter_map(|(file, r)| r.as_ref().err().map(|e| format!("{}: {e:#}", file.display()))).collect();
    if !failed.is_empty() {
        bail!("{} of {} examples differ:\n{}", failed.len(), results.len(), failed.join("\n\n"));
    }
    Ok(())
}
