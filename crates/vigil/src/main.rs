//! The `vigil` command: `simulate` (the decision engine on a scenario, no cluster needed),
//! `validate` (the admission rules on manifests), `check` and `snapshot` (the live fleet, read
//! only), `run` (the controller), `crd` (the CustomResourceDefinitions) and `completions`. The
//! three that talk to a cluster are built with the `cluster` feature (on by default).

#[cfg(feature = "cluster")]
mod check_cmd;
mod convert_cmd;
mod documents;
#[cfg(feature = "cluster")]
mod live;
mod plot;
#[cfg(feature = "cluster")]
mod run_cmd;
#[cfg(feature = "cluster")]
mod snapshot_cmd;
mod validate_cmd;

/// The allocator of the build that runs the controller and reads live fleets: per-object and
/// per-request allocations cost almost a third of the controller's CPU under glibc's allocator.
#[cfg(feature = "cluster")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vigil_simulator::{Scenario, output, simulate_owned};

/// The scenario `vigil simulate` runs when given no file.
const DEFAULT_SCENARIO: (&str, &str) =
    ("examples/single-node-failure.yaml", include_str!("../../../examples/single-node-failure.yaml"));

/// What `vigil --version` prints after the version: the API versions Vigil reads and writes.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nhealth checks: vigil.dev/v1alpha1 MachineHealthCheck and NodeHealthCheck (served);",
    "\n  also read: cluster.x-k8s.io/v1beta1 MachineHealthCheck, remediation.medik8s.io/v1alpha1 NodeHealthCheck",
    "\nCluster API Machines and Clusters: cluster.x-k8s.io/v1beta1, cluster.x-k8s.io/v1beta2",
    "\nremediation objects: any kind made from a <Kind>Template (e.g. remediation.medik8s.io/v1alpha1 SelfNodeRemediation)",
);

#[derive(Parser)]
#[command(
    name = "vigil",
    version,
    long_version = LONG_VERSION,
    about = "Health checking and remediation of Kubernetes machines and nodes",
    long_about = "Health checking and remediation of Kubernetes machines and nodes: Cluster API \
        MachineHealthCheck and medik8s NodeHealthCheck, decided by one pure engine that the \
        simulator, `vigil check` and the controller share."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the decision engine against a scenario on a virtual clock (no cluster needed).
    #[command(after_help = "Example:\n  vigil simulate examples/zone-outage.yaml --plot zone-outage.svg")]
    Simulate {
        /// Scenario file (format v1, see docs/scenario.md); without it, a built-in single-node-failure scenario.
        file: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Write every object at the end to this file as multi-document YAML.
        #[arg(long)]
        dump: Option<PathBuf>,
        /// Draw the run as an SVG picture: per check, healthy / unhealthy / remediating over time.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Check MachineHealthCheck / NodeHealthCheck manifests against the admission rules.
    #[command(
        after_help = "Example:\n  vigil validate deploy/my-checks.yaml\n\nExit code: 0 when all are valid, 1 otherwise."
    )]
    Validate {
        /// Manifest files (multi-document YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the vigil.dev/v1alpha1 manifests equivalent to the upstream health checks in the files
    /// (Cluster API v1beta1/v1beta2 MachineHealthCheck, medik8s NodeHealthCheck).
    #[command(after_help = "Example:\n  vigil convert capi-mhcs.yaml > vigil-mhcs.yaml")]
    Convert {
        /// Manifest files (multi-document YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Say what Vigil would do to the live fleet right now, and what next (reads only).
    #[cfg(feature = "cluster")]
    #[command(after_help = "Example:\n  vigil check --policy new-mhc.yaml workers\n\n\
        Exit code: 0 when nothing is being or would be remediated now; 1 when the cluster cannot be \
        read or a check or candidate policy is invalid (nothing evaluated for it); 2 when at least \
        one target is being or would be remediated now.")]
    Check {
        /// Kubeconfig file to use instead of the default ones.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Read only the MachineHealthChecks, Clusters and Machines of this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// A candidate MachineHealthCheck / NodeHealthCheck manifest, evaluated as if applied.
        #[arg(long = "policy")]
        policies: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = CheckFormat::Text)]
        output: CheckFormat,
        /// Only report these checks (`Kind/ns/name`, `ns/name` or `name`); default: all.
        checks: Vec<String>,
    },
    /// Write the live fleet as a scenario for `vigil simulate` (reads only; no Secrets).
    #[cfg(feature = "cluster")]
    #[command(after_help = "Example:\n  vigil snapshot --namespace default > fleet.yaml\n  \
        # add timeline entries (e.g. at 5m, setNodeCondition on the Nodes of zone b), then:\n  \
        vigil simulate fleet.yaml")]
    Snapshot {
        /// Kubeconfig file to use instead of the default ones.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Read only the MachineHealthChecks, Clusters and Machines of this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// The scenario's duration (Go duration syntax).
        #[arg(long, default_value = "1h")]
        duration: String,
        /// Output format: YAML with a comment header, or compact JSON (read much faster by `simulate`).
        #[arg(long, value_enum, default_value_t = SnapshotFormat::Yaml)]
        output: SnapshotFormat,
    },
    /// Run the controller against a cluster (kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster).
    #[cfg(feature = "cluster")]
    #[command(
        after_help = "Example:\n  RUST_LOG=info vigil run --kubeconfig ~/.kube/config --metrics-addr 0.0.0.0:8080"
    )]
    Run {
        /// Kubeconfig file to use instead of the default ones.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// How many checks are decided and applied at once.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
        workers: u16,
        /// Serve Prometheus metrics at this address (e.g. 0.0.0.0:8080).
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Shadow mode for every check: decide and report (status.wouldRemediate, WouldRemediate
        /// events), never mark, create or delete anything.
        #[arg(long)]
        dry_run: bool,
        /// Also decide medik8s' own NodeHealthChecks (remediation.medik8s.io/v1alpha1) in place,
        /// status and events in the operator's terms; refused while the NodeHealthCheck operator
        /// runs (its leader Lease held), and stopped if it starts (docs/MIGRATING-FROM-MEDIK8S.md).
        #[arg(long)]
        serve_medik8s: bool,
        #[command(flatten)]
        election: run_cmd::Election,
        #[command(flatten)]
        node_leases: run_cmd::NodeLeases,
    },
    /// Print the CustomResourceDefinitions of MachineHealthCheck and NodeHealthCheck as YAML.
    #[command(after_help = "Example:\n  vigil crd | kubectl apply -f -")]
    Crd {
        /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead (e.g. deploy/crds).
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Print a shell completion script.
    #[command(after_help = "Example:\n  vigil completions bash > /etc/bash_completion.d/vigil")]
    Completions {
        /// The shell.
        shell: Shell,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Shell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

#[cfg(feature = "cluster")]
#[derive(Clone, Copy, ValueEnum)]
enum CheckFormat {
    /// One block per check.
    Text,
    /// One JSON document.
    Json,
}

#[cfg(feature = "cluster")]
#[derive(Clone, Copy, ValueEnum)]
enum SnapshotFormat {
    /// YAML, with a comment header.
    Yaml,
    /// Compact JSON on one line (no comments).
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// A readable timeline.
    Text,
    /// One JSON object per line, ending with a `Final` line.
    Json,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether to colour text for stdout: only a terminal, and never with `NO_COLOR` set (no-color.org).
fn colour_stdout() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stdout().is_terminal()
}

fn code(ok: bool) -> ExitCode {
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    match cli.command {
        Command::Simulate { file, output: format, dump, plot } => {
            simulate(file.as_deref(), format, dump, plot, &mut stdout)
        }
        Command::Validate { files } => validate_cmd::run(&files, &mut stdout).map(code),
        #[cfg(feature = "cluster")]
        Command::Check { kubeconfig, namespace, policies, output: format, checks } => {
            check(kubeconfig.as_deref(), namespace.as_deref(), &policies, format, &checks, &mut stdout)
        }
        #[cfg(feature = "cluster")]
        Command::Snapshot { kubeconfig, namespace, duration, output } => {
            snapshot(kubeconfig.as_deref(), namespace.as_deref(), &duration, output, &mut stdout)
        }
        Command::Convert { files } => convert_cmd::run(&files, &mut stdout, &mut std::io::stderr().lock()).map(code),
        #[cfg(feature = "cluster")]
        Command::Run { kubeconfig, workers, metrics_addr, dry_run, serve_medik8s, election, node_leases } => {
            let flags = (dry_run, serve_medik8s);
            run_cmd::run(kubeconfig, usize::from(workers), metrics_addr, flags, election, node_leases).map(code)
        }
        Command::Crd { out_dir } => {
            let files = vigil_api::crd::files().context("cannot render the CustomResourceDefinitions")?;
            match out_dir {
                None => stdout.write_all(vigil_api::crd::multi_document(&files).as_bytes())?,
                Some(dir) => {
                    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
                    for file in &files {
                        let path = dir.join(&file.name);
                        std::fs::write(&path, &file.text)
                            .with_context(|| format!("cannot write {}", path.display()))?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            clap_complete::generate(shell, &mut Cli::command(), "vigil", &mut stdout);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `vigil simulate`: runs the scenario in `file` (or the default one) and writes its events,
/// and on request the final objects (`dump`) and a picture (`plot`).
fn simulate(
    file: Option<&Path>,
    format: Format,
    dump: Option<PathBuf>,
    plot: Option<PathBuf>,
    stdout: &mut impl Write,
) -> Result<ExitCode> {
    let (path, text) = match file {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
        ),
        None => (DEFAULT_SCENARIO.0.to_string(), DEFAULT_SCENARIO.1.to_string()),
    };
    let scenario = Scenario::parse(&text).with_context(|| path.clone())?;
    let (_, report) = simulate_owned(scenario, |_| ()).with_context(|| path.clone())?;
    let rendered = match format {
        Format::Text => output::text_styled(&report.name, &report.events, &report.final_statuses, colour_stdout()),
        Format::Json => output::json_lines(&report.events, &report.final_statuses, report.end_t),
    };
    stdout.write_all(rendered.as_bytes())?;
    if let Some(dump) = dump {
        let yaml = vigil_simulator::output::dump_yaml(&report.store).context("cannot render the objects as YAML")?;
        std::fs::write(&dump, yaml).with_context(|| format!("cannot write {}", dump.display()))?;
    }
    if let Some(plot) = plot {
        let svg = plot::svg(&report).map_err(|e| anyhow::anyhow!("cannot draw the picture: {e}"))?;
        std::fs::write(&plot, svg).with_context(|| format!("cannot write {}", plot.display()))?;
    }
    report.discard();
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "cluster")]
/// `vigil check`: reads the live fleet once and writes what Vigil would do now and next; the exit
/// code says whether anything is being remediated.
fn check(
    kubeconfig: Option<&Path>,
    namespace: Option<&str>,
    policies: &[PathBuf],
    format: CheckFormat,
    checks: &[String],
    stdout: &mut impl Write,
) -> Result<ExitCode> {
    let candidates = check_cmd::candidates(policies)?;
    let runtime = runtime()?;
    let fleet = runtime.block_on(async {
        let client = live::client(kubeconfig).await?;
        live::read(&client, namespace, &candidates, live::Purpose::Check).await
    })?;
    for note in &fleet.notes {
        eprintln!("note: {note}");
    }
    let report = check_cmd::evaluate(fleet, candidates, checks, jiff::Timestamp::now())?;
    let rendered = match format {
        CheckFormat::Text => check_cmd::text(&report),
        CheckFormat::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
    };
    stdout.write_all(rendered.as_bytes())?;
    Ok(ExitCode::from(report.exit_code()))
}

#[cfg(feature = "cluster")]
/// `vigil snapshot`: reads the live fleet once and writes it as a scenario of `duration`.
fn snapshot(
    kubeconfig: Option<&Path>,
    namespace: Option<&str>,
    duration: &str,
    output: SnapshotFormat,
    stdout: &mut impl Write,
) -> Result<ExitCode> {
    vigil_api::duration::parse_go_duration(duration).ok().filter(|d| d.is_positive()).with_context(|| {
        format!("--duration: invalid value {duration:?}: expected a positive Go duration such as 1h or 45m")
    })?;
    let runtime = runtime()?;
    let fleet = runtime.block_on(async {
        let client = live::client(kubeconfig).await?;
        live::read(&client, namespace, &[], live::Purpose::Snapshot).await
    })?;
    for note in &fleet.notes {
        eprintln!("note: {note}");
    }
    for (cluster, why) in &fleet.unreachable {
        eprintln!("note: workload cluster {cluster} unreachable, its Nodes are left out: {why}");
    }
    let now = jiff::Timestamp::now();
    let text = match output {
        SnapshotFormat::Yaml => snapshot_cmd::scenario_yaml(&fleet, now, duration)?,
        SnapshotFormat::Json => snapshot_cmd::scenario_json(&fleet, now, duration)?,
    };
    stdout.write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "cluster")]
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")
}
