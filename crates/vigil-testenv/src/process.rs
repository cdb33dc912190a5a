//! Child processes (etcd, kube-apiserver): spawning with logs to files, killing, log tails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tokio::sync::OnceCell;

use crate::Result;

/// How many log lines an error about a process quotes.
pub(crate) const LOG_TAIL_LINES: usize = 40;

/// A running child whose stdout and stderr go to `log`.
pub(crate) struct Proc {
    /// What it is, for error messages ("etcd", "kube-apiserver").
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    /// How it was started, to start it again.
    program: PathBuf,
    args: Vec<String>,
}

impl Proc {
    /// Starts `program` with `args`, output appended to `log`, killed when dropped.
    ///
    /// When util-linux `setpriv` is available the child also gets a parent-death signal
    /// (SIGKILL), so it dies even if the test process is killed without unwinding. Linux sends
    /// it when the *thread* that spawned the child exits, hence the documented rule that a
    /// `TestEnv` is used by the test that started it.
    pub(crate) async fn spawn(name: &'static str, program: &Path, args: &[String], log: PathBuf) -> Result<Proc> {
        Self::spawn_with_env(name, program, args, &[], log).await
    }

    /// As [`Proc::spawn`] with extra environment variables (e.g. the provider's `POD_IP`).
    pub(crate) async fn spawn_with_env(
        name: &'static str,
        program: &Path,
        args: &[String],
        vars: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Proc> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("create {}", log.display()))?;
        let err = out.try_clone().with_context(|| format!("dup {}", log.display()))?;
        let mut cmd = if has_setpriv().await {
            let mut c = Command::new("setpriv");
            c.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.envs(vars.iter().copied());
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(err)).kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("cannot start {name} ({})", program.display()))?;
        Ok(Proc { name, child, log, program: program.to_path_buf(), args: args.to_vec() })
    }

    /// Kills the process (SIGKILL, as a crash) and starts it again with the same arguments,
    /// its output appended to the same log.
    pub(crate) async fn restart(&mut self) -> Result<()> {
        self.kill_now();
        let fresh = Proc::spawn(self.name, &self.program.clone(), &self.args.clone(), self.log.clone()).await?;
        // The old process was killed and reaped above: dropping it does nothing more.
        drop(std::mem::replace(self, fresh));
        Ok(())
    }

    /// Sends `signal` (SIGSTOP freezes the process, SIGCONT thaws it).
    pub(crate) fn signal(&self, signal: rustix::process::Signal) -> Result<()> {
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .with_context(|| format!("{} is not running", self.name))?;
        rustix::process::kill_process(pid, signal).with_context(|| format!("cannot signal {}", self.name))?;
        Ok(())
    }

    /// Fails when the process has already exited, quoting its log: a crash at startup
    /// should be reported at once, not after the readiness time limit.
    pub(crate) fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!(
                "{} exited early ({status}); last {LOG_TAIL_LINES} lines of its log:\n{}",
                self.name,
                self.log_tail(LOG_TAIL_LINES)
            ),
            Err(e) => Err(e).with_context(|| format!("cannot check whether {} runs", self.name)),
        }
    }

    /// The last `n` lines of the log, for error messages.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// Whether the log says a port was taken (another test grabbed one of our free ports).
    pub(crate) fn lost_a_port_race(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains("address already in use"))
    }

    /// SIGKILL and reap, waiting at most a few seconds: used from `Drop`, which cannot await,
    /// so the temp dir is removed only after the process stopped writing to it.
    pub(crate) fn kill_now(&mut self) {
        if self.child.start_kill().is_err() {
            // Already exited (and reaped).
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Ok(Some(_)) | Err(_) => return,
            }
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`: a clean shutdown.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        if let Some(pid) =
            self.child.id().and_then(|id| i32::try_from(id).ok()).and_then(rustix::process::Pid::from_raw)
        {
            // ESRCH just means it already exited.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                status.with_context(|| format!("waiting for {} to exit", self.name))?;
            }
            Err(_) => {
                self.child.kill().await.with_context(|| format!("killing {}", self.name))?;
            }
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// The last `n` lines of a file (or a note saying it cannot be read).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Whether `setpriv --pdeathsig` works here; checked once per test process.
async fn has_setpriv() -> bool {
    static HAS: OnceCell<bool> = OnceCell::const_new();
    *HAS.get_or_init(|| async {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success())
    })
    .await
}

/// Runs the `openssl` CLI, which makes the API server's service-account key pair; says plainly
/// how to get it when it is missing.
pub(crate) async fn openssl(args: &[&str]) -> Result<()> {
    let out = match Command::new("openssl").args(args).stdin(Stdio::null()).output().await {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "vigil-testenv needs the `openssl` command (to make the API server's service-account \
             key pair) and it is not on PATH: install it (Debian/Ubuntu: apt-get install openssl)"
        ),
        Err(e) => return Err(e).context("cannot run openssl"),
    };
    if !out.status.success() {
        bail!("openssl {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
