//! Start failures are reported at once, with the failing process's log, and bounded in time.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use vigil_testenv::{Result, TestEnv, kube_bin_dir};

/// Writes an executable shell script.
fn script(path: &Path, body: &str) -> Result<()> {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A bin dir with the real etcd and a fake kube-apiserver running `apiserver`.
async fn real_etcd_fake_apiserver(apiserver: &str) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    symlink(kube_bin_dir().await?.join("etcd"), dir.path().join("etcd"))?;
    script(&dir.path().join("kube-apiserver"), apiserver)?;
    Ok(dir)
}

#[tokio::test]
async fn an_etcd_that_exits_is_reported_with_the_last_40_lines_of_its_log() -> Result<()> {
    let dir = tempfile::tempdir()?;
    script(&dir.path().join("etcd"), "for i in $(seq 1 50); do echo \"line $i\"; done; exit 3")?;
    script(&dir.path().join("kube-apiserver"), "exit 1")?;
    let err = format!("{:#}", TestEnv::start_with_binaries(dir.path()).await.expect_err("must fail"));
    assert!(err.contains("etcd exited early (exit status: 3)"), "{err}");
    assert!(err.contains("line 11\n") && err.ends_with("line 50"), "{err}");
    assert!(!err.contains("line 10\n"), "more than 40 lines: {err}");
    Ok(())
}

#[tokio::test]
async fn an_apiserver_that_exits_is_reported_at_once() -> Result<()> {
    let dir = real_etcd_fake_apiserver("echo 'fake apiserver: boom' >&2; exit 2").await?;
    let t = Instant::now();
    let err = format!("{:#}", TestEnv::start_with_binaries(dir.path()).await.expect_err("must fail"));
    assert!(err.contains("kube-apiserver exited early (exit status: 2)"), "{err}");
    assert!(err.contains("fake apiserver: boom"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "not reported at once: {:?}", t.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_lost_port_race_is_retried() -> Result<()> {
    let dir = real_etcd_fake_apiserver("").await?;
    let count = dir.path().join("runs");
    script(
        &dir.path().join("kube-apiserver"),
        &format!(
            "echo run >> '{}'; echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1",
            count.display()
        ),
    )?;
    let err = format!("{:#}", TestEnv::start_with_binaries(dir.path()).await.expect_err("must fail"));
    assert!(err.contains("address already in use"), "{err}");
    assert_eq!(std::fs::read_to_string(&count)?.lines().count(), 3, "three attempts");
    Ok(())
}

#[tokio::test]
async fn an_apiserver_that_never_gets_ready_times_out_at_its_limit_with_its_log() -> Result<()> {
    let dir = real_etcd_fake_apiserver("echo 'fake apiserver: stuck'; exec sleep 600").await?;
    let t = Instant::now();
    let err =
        format!("{:#}", TestEnv::start_with_limit(dir.path(), Duration::from_secs(8)).await.expect_err("must fail"));
    let took = t.elapsed();
    assert!(err.contains("kube-apiserver was not ready within 8s"), "{err}");
    assert!(err.contains("fake apiserver: stuck"), "{err}");
    assert!(took >= Duration::from_secs(8) && took < Duration::from_secs(30), "{took:?}");
    Ok(())
}
