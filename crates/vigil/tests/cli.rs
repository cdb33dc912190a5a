//! The `vigil` command as a user runs it.

use serde_json::Value;
use std::process::{Command, Output};

fn vigil(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("vigil runs")
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("vigil-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write temp file");
    path
}

#[test]
fn simulate_json_lines_have_the_documented_shape() {
    let out = vigil(&["simulate", "examples/zone-outage.yaml", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    for line in &lines[..lines.len() - 1] {
        for field in ["t", "event", "check", "target"] {
            assert!(line.get(field).is_some(), "{field} missing in {line}");
        }
    }
    let last = lines.last().expect("a final line");
    assert_eq!(last["event"], "Final");
    let status = &last["checks"]["MachineHealthCheck/default/workers"];
    assert_eq!(status["expectedMachines"], 5);
    assert!(status["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "RemediationAllowed")));
    let blocked = lines.iter().find(|l| l["event"] == "RemediationRestricted").expect("short-circuit reported");
    assert_eq!(blocked["check"], "MachineHealthCheck/default/workers");
    assert_eq!(blocked["reason"], "TooManyUnhealthy");
}

#[test]
fn simulate_without_a_file_runs_the_built_in_scenario() {
    let out = vigil(&["simulate"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("scenario single-node-failure"), "{text}");
    assert!(text.contains("RemediationRequested"), "{text}");
}

#[test]
fn dump_writes_every_object_as_yaml() {
    let dump = std::env::temp_dir().join(format!("vigil-cli-{}-dump.yaml", std::process::id()));
    let out = vigil(&["simulate", "examples/external-remediation.yaml", "--dump", dump.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&dump).expect("dump written");
    assert_eq!(text.matches("---\n").count(), 7, "Cluster, template, MHC, 2 Machines, 2 Nodes:\n{text}");
    assert!(text.contains("kind: MachineHealthCheck") && text.contains("apiVersion: vigil.dev/v1alpha1"));
    assert!(text.contains("HealthCheckSucceeded"), "conditions written on the Machines");
}

#[test]
fn an_invalid_scenario_names_the_entry_and_exits_1() {
    let path = temp_file(
        "bad.yaml",
        "name: bad\nduration: 10m\ntimeline:\n  - at: 20m\n    delete: {apiVersion: v1, kind: Node, name: n1}\n",
    );
    let out = vigil(&["simulate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"timeline[0].at: invalid value "20m": after the end of the scenario (10m)"#), "{err}");
}

#[test]
fn an_invalid_health_check_in_a_scenario_is_refused_with_its_field() {
    let path = temp_file(
        "bad-check.yaml",
        "name: bad\nduration: 10m\nobjects:\n  - apiVersion: vigil.dev/v1alpha1\n    kind: NodeHealthCheck\n    metadata: {name: x}\n    spec: {selector: {matchLabels: {a: b}}, minHealthy: 5, remediationTemplates: []}\n",
    );
    let out = vigil(&["simulate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("objects[0]") && err.contains("spec.remediationTemplates"), "{err}");
}

#[test]
fn a_policy_the_api_server_would_refuse_fails_the_simulation_with_its_field() {
    // `vigil simulate` is a policy test in CI: a policy the API server refuses must fail it.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/single-node-failure.yaml"))
        .expect("example")
        .replace("maxUnhealthy: 40%", "maxUnhealthy: 140%");
    let path = temp_file("invalid-policy.yaml", &text);
    let out = vigil(&["simulate", path.to_str().expect("utf-8 path"), "--output", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing ran: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "objects[1]: MachineHealthCheck/default/workers is invalid: spec.maxUnhealthy: invalid value \"140%\": must be a percentage between 0% and 100%"
        ),
        "{err}"
    );

    // The same in a timeline entry, in Cluster API v1beta2 form: the message names its field.
    let later = format!(
        "{}\n  - at: 1m\n    apply:\n      apiVersion: cluster.x-k8s.io/v1beta2\n      kind: MachineHealthCheck\n      metadata: {{name: later}}\n      spec:\n        clusterName: prod\n        selector: {{matchLabels: {{pool: a}}}}\n        checks: {{nodeStartupTimeoutSeconds: 10}}\n",
        "name: t\nduration: 5m\ntimeline:"
    );
    let path = temp_file("invalid-later.yaml", &later);
    let out = vigil(&["simulate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("timeline[0].apply: MachineHealthCheck/default/later is invalid: spec.checks.nodeStartupTimeoutSeconds: invalid value \"10\""),
        "{err}"
    );
}

#[test]
fn the_same_object_twice_is_refused_naming_both_entries() {
    let text = "name: dup\nduration: 5m\nobjects:\n  - {apiVersion: v1, kind: Node, metadata: {name: n1}}\n  - {apiVersion: cluster.x-k8s.io/v1beta1, kind: Machine, metadata: {name: n1}}\n  - {apiVersion: v1, kind: Node, metadata: {name: n1, labels: {a: b}}}\n";
    let path = temp_file("dup.yaml", text);
    let out = vigil(&["simulate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("objects[2]: Node n1 is already defined by objects[0]"), "{err}");
}

#[test]
fn validate_without_health_checks_exits_1_and_says_so() {
    let path = temp_file("empty.yaml", "");
    let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no health checks found"), "{text}");
}

#[test]
fn convert_then_validate_moves_an_upstream_check_over() {
    let upstream = "apiVersion: cluster.x-k8s.io/v1beta2\nkind: MachineHealthCheck\nmetadata: {name: workers, namespace: team-a}\nspec:\n  clusterName: prod\n  selector: {matchLabels: {pool: a}}\n  checks:\n    unhealthyNodeConditions: [{type: Ready, status: \"False\", timeoutSeconds: 300}]\n  remediation: {triggerIf: {unhealthyInRange: \"[1-3]\"}}\n";
    let path = temp_file("upstream.yaml", upstream);
    let out = vigil(&["convert", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let converted = temp_file("converted.yaml", &String::from_utf8_lossy(&out.stdout));
    let out = vigil(&["validate", converted.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("document 1: MachineHealthCheck/team-a/workers: valid\n"));
}

#[test]
fn every_subcommand_says_what_it_does_and_shows_an_example() {
    let out = vigil(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    let line =
        |cmd: &str| help.lines().find(|l| l.trim_start().starts_with(&format!("{cmd} "))).unwrap_or("").to_string();
    assert!(line("run").contains("Run the controller") && !line("run").contains("CustomResourceDefinitions"), "{help}");
    assert!(line("crd").contains("CustomResourceDefinitions"), "{help}");
    for cmd in ["simulate", "validate", "check", "snapshot", "run", "crd", "completions"] {
        assert!(line(cmd).len() > cmd.len() + 10, "{cmd} has a description:\n{help}");
        let out = vigil(&["help", cmd]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Example:") && text.contains(&format!("vigil {cmd}")), "{cmd}:\n{text}");
    }
    let check = String::from_utf8_lossy(&vigil(&["help", "check"]).stdout).into_owned();
    assert!(check.contains("Exit code: 0") && check.contains("1 when") && check.contains("2 when"), "{check}");
}

#[test]
fn version_names_the_supported_upstream_api_versions() {
    let out = vigil(&["--version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("vigil {}", env!("CARGO_PKG_VERSION"))), "{text}");
    for api in [
        "vigil.dev/v1alpha1",
        "cluster.x-k8s.io/v1beta1",
        "cluster.x-k8s.io/v1beta2",
        "remediation.medik8s.io/v1alpha1",
    ] {
        assert!(text.contains(api), "{api} in {text}");
    }
}

#[test]
fn completions_for_bash_zsh_and_fish_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = vigil(&["completions", shell]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        for word in ["snapshot", "check", "kubeconfig", "policy"] {
            assert!(text.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = vigil(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"));
}

#[test]
fn text_output_is_plain_when_not_a_terminal_and_ends_with_one_summary_line_per_check() {
    let out = vigil(&["simulate", "examples/zone-outage.yaml"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains('\x1b'), "no colour in a pipe");
    let summary = text.split("summary:\n").nth(1).expect("a summary at the end");
    assert_eq!(
        summary,
        "  MachineHealthCheck/default/workers: 3 unhealthy, 1 remediations, 1 short-circuits, 2 healthy again\n"
    );
}

/// The texts of an SVG document (element content, whitespace trimmed).
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>'))
        .map(|(_, rest)| rest.split('<').next().unwrap_or("").trim().to_string())
        .collect()
}

#[test]
fn simulate_plot_draws_every_series_with_labelled_axes_and_target_lanes() {
    let path = std::env::temp_dir().join(format!("vigil-cli-{}-plot.svg", std::process::id()));
    let out = vigil(&["simulate", "examples/zone-outage.yaml", "--plot", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&path).expect("picture written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let texts = svg_texts(&svg);
    for wanted in [
        "MachineHealthCheck/default/workers",
        "time (minutes since the start)",
        "targets",
        "healthy",
        "unhealthy",
        "remediating",
        "most unhealthy the short-circuit allows",
        "remediation requested",
        "short-circuited (remediation blocked)",
        "default/w-a1",
        "default/w-a3-r2",
        "45",
    ] {
        assert!(texts.iter().any(|t| t == wanted), "{wanted:?} not among {texts:?}");
    }
    // Healthy, unhealthy, remediating and the threshold are lines; the outage's short-circuit
    // (2m to 20m) is one shaded band.
    assert!(svg.matches("<polyline").count() >= 4, "{svg}");
    assert_eq!(svg.matches(r##"fill="#FFCDCD""##).count(), 2, "the band and its legend entry");

    let nhc = vigil(&["simulate", "examples/nhc-escalation.yaml", "--plot", path.to_str().expect("utf-8 path")]);
    assert!(nhc.status.success());
    let texts = svg_texts(&std::fs::read_to_string(&path).expect("picture written"));
    assert!(texts.iter().any(|t| t.starts_with("NodeHealthCheck/")), "{texts:?}");
}

#[test]
fn bad_leader_election_flags_are_refused_naming_the_flag_before_connecting() {
    // No cluster is reachable here: the flags must be refused first, by name.
    let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--lease-duration", "5s", "--renew-deadline", "10s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--renew-deadline") && stderr.contains("--lease-duration"), "{stderr}");
    assert!(!stderr.contains("kubeconfig"), "refused before the kubeconfig is read: {stderr}");
    // Accepted before: a renewal's right to write ends a second after a standby may take over
    // (with clocks a twelfth apart in rate).
    let out = vigil(&[
        "run",
        "--kubeconfig",
        "/nonexistent",
        "--lease-duration",
        "15s",
        "--renew-deadline",
        "14s",
        "--retry-period",
        "2s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for named in
        ["--lease-duration 15s", "--renew-deadline 14s", "--retry-period 2s", "two replicas could write at once"]
    {
        assert!(stderr.contains(named), "{named} not in: {stderr}");
    }
    assert!(!stderr.contains("kubeconfig"), "refused before the kubeconfig is read: {stderr}");
    let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--lease-duration", "soon"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--lease-duration") && stderr.contains("soon"), "{stderr}");
    let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--leader-elect", "maybe"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--leader-elect") && stderr.contains("maybe"), "{stderr}");
}

#[test]
fn serve_medik8s_is_offered_and_refused_with_dry_run_before_connecting() {
    let help = vigil(&["run", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("--serve-medik8s") && text.contains("remediation.medik8s.io/v1alpha1"), "{text}");
    let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--serve-medik8s", "--dry-run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--serve-medik8s cannot be combined with --dry-run"), "{stderr}");
    assert!(!stderr.contains("/nonexistent"), "refused before reading the kubeconfig: {stderr}");
}

#[test]
fn a_bad_shard_count_is_refused_naming_the_flag_and_value_before_connecting() {
    for bad in ["0", "1025", "-3", "many"] {
        let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--shards", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--shards {bad} accepted");
        assert!(stderr.contains("--shards") && stderr.contains(bad), "{stderr}");
        assert!(!stderr.contains("kubeconfig"), "refused before the kubeconfig is read: {stderr}");
    }
    // Shards are owned through Leases: without leader election there is nothing to own them by.
    let out = vigil(&["run", "--kubeconfig", "/nonexistent", "--shards", "4", "--leader-elect=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--shards 4") && stderr.contains("--leader-elect"), "{stderr}");
}

#[test]
fn validate_names_a_bad_backoff_field_and_its_value() {
    let text = "apiVersion: vigil.dev/v1alpha1\nkind: NodeHealthCheck\nmetadata: {name: workers}\nspec:\n  selector: {matchLabels: {role: worker}}\n  minHealthy: 1\n  remediationTemplate: {apiVersion: a.example/v1, kind: RebootTemplate, name: r, namespace: ops}\n  backoff: {maxRemediations: 0, window: 30m}\n---\napiVersion: vigil.dev/v1alpha1\nkind: MachineHealthCheck\nmetadata: {name: workers, namespace: team-a}\nspec:\n  clusterName: prod\n  selector: {matchLabels: {pool: a}}\n  backoff: {maxRemediations: 2, window: 30m}\n";
    let path = temp_file("backoff.yaml", text);
    let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for words in [
        "spec.backoff.maxRemediations: invalid value \"0\": must be between 1 and 100",
        "spec.backoff.poolLabel: must be set on a NodeHealthCheck",
        "MachineHealthCheck/team-a/workers: valid",
    ] {
        assert!(stdout.contains(words), "{words:?} in {stdout}");
    }
}

#[test]
fn validate_names_a_bad_failure_domains_field_and_accepts_a_good_one() {
    let bad = "apiVersion: vigil.dev/v1alpha1\nkind: NodeHealthCheck\nmetadata: {name: zones}\nspec:\n  selector: {matchLabels: {role: worker}}\n  minHealthy: 51%\n  remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: snr, namespace: medik8s}\n  failureDomains: {key: spec.failureDomain, maxUnhealthy: 150%}\n";
    let path = temp_file("bad-domains.yaml", bad);
    let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("spec.failureDomains.key: invalid value \"spec.failureDomain\""), "{text}");
    assert!(text.contains("spec.failureDomains.maxUnhealthy: invalid value \"150%\""), "{text}");
    let good = bad
        .replace("key: spec.failureDomain, maxUnhealthy: 150%", "key: topology.kubernetes.io/zone, maxUnhealthy: 30%");
    let path = temp_file("good-domains.yaml", &good);
    let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn validate_names_a_bad_max_in_flight_and_its_value_and_accepts_a_good_one() {
    let check = |max: &str| {
        format!(
            "apiVersion: vigil.dev/v1alpha1\nkind: NodeHealthCheck\nmetadata: {{name: workers}}\nspec:\n  selector: {{matchLabels: {{role: worker}}}}\n  minHealthy: 1\n  remediationTemplate: {{apiVersion: a.example/v1, kind: RebootTemplate, name: r, namespace: ops}}\n  maxInFlight: {max}\n---\napiVersion: vigil.dev/v1alpha1\nkind: MachineHealthCheck\nmetadata: {{name: workers, namespace: team-a}}\nspec:\n  clusterName: prod\n  selector: {{matchLabels: {{pool: a}}}}\n  maxInFlight: {max}\n"
        )
    };
    for (max, words) in [
        ("0", "spec.maxInFlight: invalid value \"0\": must be at least 1 (or 1%)"),
        ("\"0%\"", "spec.maxInFlight: invalid value \"0%\": must be at least 1 (or 1%)"),
        ("-3", "spec.maxInFlight: invalid value \"-3\": must not be negative"),
        ("\"120%\"", "spec.maxInFlight: invalid value \"120%\": must be a percentage between 0% and 100%"),
        ("\"2\"", "spec.maxInFlight: invalid value \"2\": a string must be a percentage such as 40%"),
    ] {
        let path = temp_file("max-in-flight.yaml", &check(max));
        let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
        assert_eq!(out.status.code(), Some(1), "{max}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.matches(words).count(), 2, "{words:?} for both kinds in {stdout}");
    }
    for max in ["2", "\"25%\""] {
        let path = temp_file("max-in-flight.yaml", &check(max));
        let out = vigil(&["validate", path.to_str().expect("utf-8 path")]);
        assert!(out.status.success(), "{max}: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn snapshot_refuses_an_output_format_it_does_not_write_before_reading_the_cluster() {
    // No kubeconfig is read: the flag is refused first, naming the flag, the value and the choices.
    let out = vigil(&["snapshot", "--kubeconfig", "/nonexistent/kubeconfig", "--output", "xml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'xml' for '--output <OUTPUT>'"), "{err}");
    assert!(err.contains("yaml") && err.contains("json"), "{err}");
}
