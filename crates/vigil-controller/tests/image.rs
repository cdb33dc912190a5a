//! The container image (Containerfile), built daemonlessly with podman by scripts/image.sh,
//! runs `vigil run` as UID 65532 on a read-only root filesystem, with the chart's arguments and a
//! token of the chart's ServiceAccount, against the test API server, and does its work.
//!
//! The image comes from `VIGIL_IMAGE` (scripts/test.sh builds it up front, with
//! `CONTAINERS_CONF` and friends from scripts/podman.sh in the environment), else this test runs
//! both scripts itself. It is skipped — loudly — only when podman cannot be installed at all.

mod deploy;
mod support;

use anyhow::{Context, Result, ensure};
use deploy::{NAMESPACE, apply_all, one, render, repo_root, run_bounded};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use support::*;
use vigil_testenv::{TestEnv, wait_for};

/// Time limit of scripts/podman.sh (apt-get) and of scripts/image.sh (a cold release build).
const SETUP_LIMIT: Duration = Duration::from_secs(25 * 60);
/// Time limit of one podman command.
const PODMAN_LIMIT: Duration = Duration::from_secs(120);

/// podman, its environment (containers.conf, storage.conf) and the image reference; `None` when
/// podman cannot be installed.
struct Image {
    podman: PathBuf,
    envs: Vec<(String, String)>,
    reference: String,
}

impl Image {
    async fn get() -> Result<Option<Image>> {
        if let Some(reference) = std::env::var_os("VIGIL_IMAGE") {
            let podman = std::env::var_os("VIGIL_PODMAN").map(PathBuf::from).unwrap_or_else(|| "podman".into());
            return Ok(Some(Image { podman, envs: Vec::new(), reference: reference.to_string_lossy().into_owned() }));
        }
        let scripts = repo_root().join("scripts");
        let mut setup = tokio::process::Command::new(scripts.join("podman.sh"));
        let out = tokio::time::timeout(SETUP_LIMIT, setup.kill_on_drop(true).output())
            .await
            .context("scripts/podman.sh: no answer in time")?
            .context("cannot run scripts/podman.sh")?;
        if out.status.code() == Some(3) {
            eprintln!(
                "\n\n!!!!!!!! SKIPPED: the image test did not run: podman cannot be installed on this machine \
                 (apt-get failed):\n{}\n!!!!!!!!\n",
                String::from_utf8_lossy(&out.stderr)
            );
            return Ok(None);
        }
        ensure!(out.status.success(), "scripts/podman.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let mut envs = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let (k, v) = line
                .strip_prefix("export ")
                .and_then(|l| l.split_once('='))
                .context("podman.sh printed no export line")?;
            envs.push((k.to_string(), v.trim_matches('\'').to_string()));
        }
        let podman =
            envs.iter().find(|(k, _)| k == "VIGIL_PODMAN").map(|(_, v)| PathBuf::from(v)).context("no VIGIL_PODMAN")?;
        let mut build = tokio::process::Command::new(scripts.join("image.sh"));
        build.envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let (ok, reference, err) = run_bounded(&mut build, SETUP_LIMIT, "scripts/image.sh").await?;
        ensure!(ok, "scripts/image.sh failed:\n{err}");
        Ok(Some(Image { podman, envs, reference: reference.trim().to_string() }))
    }

    fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.podman);
        cmd.envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    async fn podman(&self, args: &[&str]) -> Result<String> {
        let (ok, out, err) =
            run_bounded(self.command().args(args), PODMAN_LIMIT, &format!("podman {}", args.join(" "))).await?;
        ensure!(ok, "podman {} failed:\n{err}", args.join(" "));
        Ok(out)
    }
}

/// Removes the container when the test ends, however it ends.
struct Container<'a> {
    image: &'a Image,
    name: String,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let mut cmd = std::process::Command::new(&self.image.podman);
        cmd.envs(self.image.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let _ = cmd.args(["rm", "-f", "-t", "2", &self.name]).output();
    }
}

#[tokio::test]
async fn image_is_scratch_with_one_static_binary_run_as_65532() -> Result<()> {
    let Some(image) = Image::get().await? else { return Ok(()) };
    let config: Value = serde_json::from_str(&image.podman(&["image", "inspect", &image.reference]).await?)?;
    let config = &config[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(config["Entrypoint"], json!(["/vigil"]), "{config}");
    // The root filesystem holds the binary and nothing else (podman adds empty mount points).
    let name = format!("vigil-files-{}", std::process::id());
    let id = image.podman(&["create", "--name", &name, &image.reference]).await?;
    let _guard = Container { image: &image, name: name.clone() };
    let tar = tempfile::NamedTempFile::new()?;
    let tar_path = tar.path().to_str().context("temp path")?.to_string();
    image.podman(&["export", "-o", &tar_path, id.trim()]).await?;
    let (ok, listing, err) =
        run_bounded(tokio::process::Command::new("tar").args(["-tvf", &tar_path]), PODMAN_LIMIT, "tar").await?;
    ensure!(ok, "tar: {err}");
    let mut files: Vec<&str> =
        listing.lines().filter(|l| !l.starts_with('d')).filter_map(|l| l.split_whitespace().last()).collect();
    files.sort();
    assert_eq!(
        files,
        ["etc/ssl/certs/ca-certificates.crt", "vigil"],
        "the image must hold only /vigil and the CA bundle, besides empty directories:\n{listing}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vigil_runs_from_the_image_with_the_charts_args_and_service_account() -> Result<()> {
    let Some(image) = Image::get().await? else { return Ok(()) };
    let docs = render(&[]).await?;
    let env = TestEnv::start().await?;
    env.install_upstream_crds().await?;
    apply_all(&env, &docs, json!({})).await?;
    let token = deploy::service_account_token(&env, "vigil").await?;
    let dir = tempfile::tempdir()?;
    // World-readable: the container's user is 65532, not the test's.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let kubeconfig = dir.path().join("kubeconfig");
    // The server by name (`kubernetes`, which the API server's certificate holds; the
    // container's /etc/hosts maps it to 127.0.0.1), so the static binary's name resolution
    // inside the image is exercised too.
    let yaml = env.kubeconfig_yaml_with_token(&token, NAMESPACE)?;
    ensure!(yaml.contains("https://127.0.0.1:"), "unexpected server in the kubeconfig:\n{yaml}");
    std::fs::write(&kubeconfig, yaml.replace("https://127.0.0.1:", "https://kubernetes:"))?;
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644))?;

    cluster(&env, false).await?;
    self_hosted(&env).await?;
    node(&env, "n1", json!({})).await?;
    machine(&env, "m1", Some("n1"), json!({})).await?;
    mhc(&env, "workers", json!({})).await?;

    // The Deployment's args, with the metrics on a free loopback port (host network) and the
    // kubeconfig mounted instead of the in-cluster configuration.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let deployment = one(&docs, "Deployment")?;
    let help = image.podman(&["run", "--rm", &image.reference, "run", "--help"]).await?;
    let leader_election = help.contains("--leader-elect");
    if !leader_election {
        eprintln!(
            "\n!!!! NOTE: this vigil has no --leader-elect yet: the chart's leader-election args are left out of this run !!!!\n"
        );
    }
    let mut args: Vec<String> = Vec::new();
    for arg in deployment.pointer("/spec/template/spec/containers/0/args").and_then(Value::as_array).context("args")? {
        let arg = arg.as_str().context("an arg that is not a string")?;
        let election =
            ["--leader-elect", "--lease-", "--renew-deadline", "--retry-period"].iter().any(|p| arg.starts_with(p));
        if election && !leader_election {
            continue;
        }
        if arg.starts_with("--metrics-addr=") {
            args.push(format!("--metrics-addr=127.0.0.1:{port}"));
        } else {
            args.push(arg.replace("$(POD_NAMESPACE)", NAMESPACE));
        }
    }
    args.push("--kubeconfig=/config/kubeconfig".into());

    let name = format!("vigil-e2e-{}", std::process::id());
    let mount = format!("{}:/config/kubeconfig:ro", kubeconfig.display());
    let pod_name = format!("POD_NAME={name}");
    let pod_ns = format!("POD_NAMESPACE={NAMESPACE}");
    let mut run: Vec<&str> = vec![
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "host",
        "--add-host",
        "kubernetes:127.0.0.1",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-e",
        &pod_name,
        "-e",
        &pod_ns,
        "-e",
        "RUST_LOG=info",
        "-v",
        &mount,
        &image.reference,
    ];
    run.extend(args.iter().map(String::as_str));
    image.podman(&run).await?;
    let container = Container { image: &image, name: name.clone() };

    let logs = || async { image.podman(&["logs", &container.name]).await.unwrap_or_else(|e| format!("{e:#}")) };
    let worked = async {
        let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        wait_for("/readyz 200 from the container", Duration::from_secs(60), || async {
            Ok(http_ok(metrics, "/readyz").await.then_some(()))
        })
        .await?;
        wait_machine_condition(&env, "m1", "HealthCheckSucceeded", "True", "HealthCheckSucceeded").await?;
        set_ready(&env, "n1", "False", &secs_ago(60)).await?;
        wait_machine_condition(&env, "m1", "OwnerRemediated", "False", "WaitingForRemediation").await?;
        if leader_election {
            let lease = env.get_json("coordination.k8s.io/v1", "Lease", Some(NAMESPACE), "vigil").await?;
            let holder = lease.as_ref().and_then(|l| l.pointer("/spec/holderIdentity")).cloned();
            ensure!(holder == Some(json!(name)), "the Lease vigil/{NAMESPACE} is not held by {name}: {lease:?}");
        }
        let state =
            image.podman(&["inspect", "--format", "{{.State.Running}} {{.Config.User}}", &container.name]).await?;
        ensure!(state.trim() == "true 65532:65532", "container state: {state}");
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = worked {
        let status = env.get_json("vigil.dev/v1alpha1", "MachineHealthCheck", Some(NS), "workers").await;
        let ps = image.podman(&["ps", "-a"]).await.unwrap_or_default();
        anyhow::bail!("{e:#}\ncheck: {status:?}\n{ps}\ncontainer log:\n{}", logs().await);
    }
    drop(container);
    env.stop().await?;
    Ok(())
}

async fn http_ok(addr: std::net::SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        anyhow::Ok(buf)
    };
    matches!(tokio::time::timeout(Duration::from_secs(5), io).await, Ok(Ok(buf)) if buf.starts_with("HTTP/1.1 200"))
}
