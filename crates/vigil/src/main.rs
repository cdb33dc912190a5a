//! The `vigil` command: `simulate` (the decision engine on a scenario, no cluster needed),
//! `validate` (the admission rules on manifests) and `crd` (the CustomResourceDefinitions).

mod convert_cmd;
mod run_cmd;
mod validate_cmd;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vigil_simulator::{Scenario, output, simulate};

/// The scenario `vigil simulate` runs when given no file.
const DEFAULT_SCENARIO: (&str, &str) =
    ("examples/single-node-failure.yaml", include_str!("../../../examples/single-node-failure.yaml"));

#[derive(Parser)]
#[command(name = "vigil", version, about = "Health checking and remediation of Kubernetes machines and nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the decision engine against a scenario on a virtual clock.
    Simulate {
        /// Scenario file (format v1, see README); without it, a built-in single-node-failure scenario.
        file: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Write every object at the end to this file as multi-document YAML.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
    /// Check MachineHealthCheck / NodeHealthCheck manifests against the admission rules.
    Validate {
        /// Manifest files (multi-document YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the vigil.dev/v1alpha1 manifests equivalent to the upstream health checks in the files
    /// (Cluster API v1beta1/v1beta2 MachineHealthCheck, medik8s NodeHealthCheck).
    Convert {
        /// Manifest files (multi-document YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Run the controller against a cluster (kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster).
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
        #[command(flatten)]
        election: run_cmd::Election,
    },
    /// Print the CustomResourceDefinitions of MachineHealthCheck and NodeHealthCheck as YAML.
    Crd {
        /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead (e.g. deploy/crds).
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
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
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<bool> {
    let mut stdout = std::io::stdout().lock();
    match cli.command {
        Command::Simulate { file, output: format, dump } => {
            let (path, text) = match &file {
                Some(path) => (
                    path.display().to_string(),
                    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
                ),
                None => (DEFAULT_SCENARIO.0.to_string(), DEFAULT_SCENARIO.1.to_string()),
            };
            let scenario = Scenario::parse(&text).with_context(|| path.clone())?;
            let report = simulate(&scenario).with_context(|| path.clone())?;
            let rendered = match format {
                Format::Text => output::text(&report.name, &report.events, &report.final_statuses),
                Format::Json => output::json_lines(&report.events, &report.final_statuses, report.end_t),
            };
            stdout.write_all(rendered.as_bytes())?;
            if let Some(dump) = dump {
                let yaml =
                    vigil_simulator::output::dump_yaml(&report.store).context("cannot render the objects as YAML")?;
                std::fs::write(&dump, yaml).with_context(|| format!("cannot write {}", dump.display()))?;
            }
            Ok(true)
        }
        Command::Validate { files } => validate_cmd::run(&files, &mut stdout),
        Command::Convert { files } => convert_cmd::run(&files, &mut stdout, &mut std::io::stderr().lock()),
        Command::Run { kubeconfig, workers, metrics_addr, dry_run, election } => {
            run_cmd::run(kubeconfig, usize::from(workers), metrics_addr, dry_run, election)
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
            Ok(true)
        }
    }
}
