//! The shipped example scenarios: each one's outcome is asserted explicitly, and its whole
//! JSON-lines output is pinned by a snapshot so any change of behaviour shows in review.

use serde_json::Value;
use vigil_simulator::output::{Event, json_lines};
use vigil_simulator::{Report, Scenario, simulate};

fn text(name: &str) -> String {
    let path = format!("{}/../../examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).expect("example exists")
}

fn run_text(text: &str) -> Report {
    let scenario = Scenario::parse(text).expect("example parses");
    simulate(&scenario).expect("example runs")
}

fn run(name: &str) -> Report {
    run_text(&text(name))
}

#[test]
fn an_example_written_as_json_simulates_as_the_yaml() {
    for name in ["zone-outage", "dry-run", "stale-signal", "remediation-backoff"] {
        let yaml = text(name);
        let value: Value = serde_saphyr::from_str(&yaml).expect("example is YAML");
        let json = serde_json::to_string(&value).expect("JSON");
        let (from_yaml, from_json) = (run_text(&yaml), run_text(&json));
        assert!(!from_yaml.events.is_empty(), "{name} does something");
        assert_eq!(
            json_lines(&from_json.events, &from_json.final_statuses, from_json.end_t),
            json_lines(&from_yaml.events, &from_yaml.final_statuses, from_yaml.end_t),
            "{name}"
        );
    }
}

fn events<'a>(r: &'a Report, event: &str) -> Vec<&'a Event> {
    r.events.iter().filter(|e| e.event == event).collect()
}

fn at(e: &Event) -> (f64, Option<&str>) {
    (e.t, e.target.as_deref())
}

fn status<'a>(r: &'a Report, check: &str) -> &'a Value {
    r.final_statuses.get(check).expect("check has a final status")
}

fn snapshot(name: &str, r: &Report) {
    insta::assert_snapshot!(name, json_lines(&r.events, &r.final_statuses, r.end_t));
}

#[test]
fn single_node_failure_is_remediated_by_the_owner() {
    let r = run("single-node-failure");
    // Ready=Unknown at 1m + 5m timeout: unhealthy at 6m, not a moment earlier.
    assert_eq!(
        events(&r, "MachineMarkedUnhealthy").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(360.0, Some("default/workers-b"))]
    );
    assert_eq!(
        events(&r, "RemediationRequested").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(360.0, Some("default/workers-b"))]
    );
    assert!(events(&r, "RemediationRestricted").is_empty());
    let s = status(&r, "MachineHealthCheck/default/workers");
    assert_eq!((s["expectedMachines"].as_i64(), s["currentHealthy"].as_i64()), (Some(3), Some(3)));
    snapshot("single-node-failure", &r);
}

#[test]
fn zone_outage_short_circuits_until_the_zone_returns() {
    let r = run("zone-outage");
    let blocked = events(&r, "RemediationRestricted");
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].t, 120.0);
    assert!(
        blocked[0].details["message"]
            .as_str()
            .unwrap_or("")
            .contains("exceeds maxUnhealthy (total: 5, unhealthy: 3, maxUnhealthy: 20%)")
    );
    // Health verdicts are still written while blocked, but nothing is requested until 20m.
    assert_eq!(events(&r, "MachineMarkedUnhealthy").len(), 3);
    let requested = events(&r, "RemediationRequested");
    assert_eq!(requested.iter().map(|e| at(e)).collect::<Vec<_>>(), [(1200.0, Some("default/w-a3"))]);
    assert_eq!(events(&r, "RemediationAllowed")[0].t, 1200.0);
    let s = status(&r, "MachineHealthCheck/default/workers");
    assert_eq!(s["currentHealthy"].as_i64(), Some(5));
    snapshot("zone-outage", &r);
}

#[test]
fn external_remediation_object_is_created_and_removed() {
    let r = run("external-remediation");
    let created = events(&r, "RemediationCreated");
    assert_eq!(created.len(), 1);
    assert_eq!(
        (created[0].t, created[0].details["kind"].as_str(), created[0].details["name"].as_str()),
        (180.0, Some("Metal3Remediation"), Some("metal-1"))
    );
    let deleted = events(&r, "RemediationRemoved");
    assert_eq!(deleted.iter().map(|e| e.t).collect::<Vec<_>>(), [420.0]);
    assert!(events(&r, "RemediationRequested").is_empty(), "a template replaces the owner request");
    // The object made from the template: spec copied, owned by the Machine, labelled.
    let dump = vigil_simulator::output::dump_yaml(&r.store).expect("dump");
    assert!(!dump.contains("kind: Metal3Remediation\n"), "deleted at the end");
    snapshot("external-remediation", &r);
}

#[test]
fn paused_cluster_does_nothing_until_resumed() {
    let r = run("paused-cluster");
    assert_eq!(events(&r, "Paused").iter().map(|e| e.t).collect::<Vec<_>>(), [0.0]);
    assert_eq!(events(&r, "Resumed").iter().map(|e| e.t).collect::<Vec<_>>(), [900.0]);
    let first_action = r
        .events
        .iter()
        .find(|e| matches!(e.event.as_str(), "MachineMarkedUnhealthy" | "RemediationRequested"))
        .expect("acts after resume");
    assert_eq!(first_action.t, 900.0);
    snapshot("paused-cluster", &r);
}

#[test]
fn nhc_escalates_from_reboot_to_fencing() {
    let r = run("nhc-escalation");
    let created = events(&r, "RemediationCreated");
    let kinds: Vec<_> = created.iter().map(|e| (e.t, e.details["kind"].as_str().unwrap_or(""))).collect();
    // Ready=False at 1m + 300s: reboot at 6m; it reports failure at 8m; fencing starts then.
    assert_eq!(kinds, [(360.0, "SelfNodeRemediation"), (480.0, "FenceAgentsRemediation")]);
    assert_eq!(events(&r, "RemediationTimedOut").iter().map(|e| at(e)).collect::<Vec<_>>(), [(480.0, Some("w-2"))]);
    // Fencing brings the node back at 11m; after the 1m healthyDelay both objects go.
    let deleted: Vec<_> =
        events(&r, "RemediationRemoved").iter().map(|e| (e.t, e.details["kind"].as_str().unwrap_or(""))).collect();
    assert_eq!(deleted.len(), 2);
    assert!(deleted.iter().all(|(t, _)| *t == 720.0), "{deleted:?}");
    let s = status(&r, "NodeHealthCheck/workers");
    assert_eq!(
        (s["observedNodes"].as_i64(), s["healthyNodes"].as_i64(), s["phase"].as_str()),
        (Some(4), Some(4), Some("Enabled"))
    );
    snapshot("nhc-escalation", &r);
}

#[test]
fn nothing_is_remediated_under_maintenance_another_holders_lease_or_an_upgrade() {
    let r = run("upgrade-and-maintenance");
    let created: Vec<_> = events(&r, "RemediationCreated").iter().map(|e| at(e)).collect();
    // w-1 broke; w-3 once the maintenance operator released its Lease; w-5 once the upgrade ended.
    assert_eq!(created, [(360.0, Some("w-1")), (900.0, Some("w-3")), (2700.0, Some("w-5"))]);
    // Postponements and a Lease held elsewhere are both `RemediationSkipped`, as medik8s tells them.
    let skipped: Vec<_> = events(&r, "RemediationSkipped")
        .iter()
        .map(|e| (e.t, e.target.as_deref(), e.details["reason"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        skipped,
        [
            (480.0, Some("w-2"), "NodeUnderMaintenance"),
            (600.0, Some("w-3"), "NodeLeaseHeld"),
            (1200.0, Some("w-2"), "MaintenanceGrace"),
            (1800.0, None, "ClusterUpgrading")
        ]
    );
    let held =
        events(&r, "RemediationSkipped").into_iter().find(|e| e.details["reason"] == "NodeLeaseHeld").expect("held");
    assert!(held.details["message"].as_str().is_some_and(|m| m.contains("held by node-maintenance")));
    // w-1 counted as remediated until its remediator let go of its object, a minute after the delete.
    let healthy: Vec<_> = events(&r, "NodeHealthy").iter().map(|e| at(e)).collect();
    assert!(healthy.contains(&(600.0, Some("w-1"))), "{healthy:?}");
    assert_eq!(events(&r, "RemediationResumed").iter().map(|e| e.t).collect::<Vec<_>>(), [2700.0]);
    snapshot("upgrade-and-maintenance", &r);
}

#[test]
fn the_same_scenario_gives_the_same_output() {
    let a = run("zone-outage");
    let b = run("zone-outage");
    assert_eq!(json_lines(&a.events, &a.final_statuses, a.end_t), json_lines(&b.events, &b.final_statuses, b.end_t));
}

#[test]
fn overlapping_nhcs_remediate_a_node_one_at_a_time() {
    let r = run("overlapping-checks");
    let created: Vec<_> = events(&r, "RemediationCreated")
        .iter()
        .map(|e| (e.t, e.check.as_deref().unwrap_or(""), e.details["kind"].as_str().unwrap_or("")))
        .collect();
    // reboot-first holds w-2 from 6m; fence, unhealthy at 11m, waits until the reboot gives up at
    // 14m and only then fences: never two remediators at once.
    assert_eq!(
        created,
        [
            (360.0, "NodeHealthCheck/reboot-first", "SelfNodeRemediation"),
            (840.0, "NodeHealthCheck/fence", "FenceAgentsRemediation")
        ]
    );
    let skipped = events(&r, "RemediationSkipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!((skipped[0].t, skipped[0].check.as_deref()), (660.0, Some("NodeHealthCheck/fence")));
    assert_eq!(skipped[0].details["reason"], "TargetHeldByAnotherCheck");
    assert_eq!(
        skipped[0].details["message"],
        "node w-2 is being remediated by NodeHealthCheck/reboot-first; NodeHealthCheck/fence waits"
    );
    let told = events(&r, "OtherCheckWaiting");
    assert_eq!(
        told.iter().map(|e| (e.t, e.check.as_deref())).collect::<Vec<_>>(),
        [(660.0, Some("NodeHealthCheck/reboot-first"))]
    );
    let waiting = status(&r, "NodeHealthCheck/fence")["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "WaitingForOtherCheck").cloned())
        .expect("the waiting check keeps the condition");
    assert_eq!((waiting["status"].as_str(), waiting["reason"].as_str()), (Some("False"), Some("NoTargetWaiting")));
    snapshot("overlapping-checks", &r);
}

#[test]
fn an_mhc_waits_for_the_nhc_remediating_the_same_node() {
    let r = run("overlapping-mhc-nhc");
    let skipped = events(&r, "RemediationSkipped");
    assert_eq!(skipped.iter().map(|e| at(e)).collect::<Vec<_>>(), [(540.0, Some("default/workers-b"))]);
    assert_eq!(
        skipped[0].details["message"],
        "node workers-b is being remediated by NodeHealthCheck/reboot; MachineHealthCheck/default/workers waits"
    );
    // The owner is asked only once the reboot gave up (10m), not when the Machine turned
    // unhealthy (9m) while the NodeHealthCheck was rebooting it.
    assert_eq!(
        events(&r, "RemediationRequested").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(600.0, Some("default/workers-b"))]
    );
    snapshot("overlapping-mhc-nhc", &r);
}

#[test]
fn dry_run_reports_what_it_would_remediate_and_does_nothing() {
    let r = run("dry-run");
    let would: Vec<(f64, Option<&str>, Option<&str>)> =
        events(&r, "WouldRemediate").iter().map(|e| (e.t, e.check.as_deref(), e.target.as_deref())).collect();
    assert_eq!(
        would,
        [
            (360.0, Some("NodeHealthCheck/infra"), Some("n-2")),
            (420.0, Some("MachineHealthCheck/default/workers"), Some("default/w-a1")),
            (1500.0, Some("MachineHealthCheck/default/workers"), Some("default/w-a1")),
        ]
    );
    // The budget is evaluated in dry-run too: three not healthy of five stops even the shadow.
    assert_eq!(events(&r, "RemediationRestricted").iter().map(|e| e.t).collect::<Vec<_>>(), [600.0]);
    // Nothing was marked, created or deleted, so no model ever acted.
    for none in ["RemediationRequested", "RemediationCreated", "RemediationRemoved", "MachineReplaced", "NodeRecovered"]
    {
        assert!(events(&r, none).is_empty(), "{none} in dry-run");
    }
    let s = status(&r, "MachineHealthCheck/default/workers");
    assert_eq!(s["wouldRemediate"][0]["name"].as_str(), Some("w-a1"));
    assert_eq!(s["wouldRemediate"][0]["since"].as_str(), Some("2030-01-01T00:25:00Z"));
    assert!(status(&r, "NodeHealthCheck/infra").get("wouldRemediate").is_none(), "n-2 recovered");
    snapshot("dry-run", &r);
}

#[test]
fn remediation_backoff_stops_a_failing_pool_and_resumes_when_the_window_allows() {
    let r = run("remediation-backoff");
    let requested: Vec<(f64, Option<&str>)> = events(&r, "RemediationRequested").iter().map(|e| at(e)).collect();
    assert_eq!(
        requested,
        [
            (360.0, Some("default/a-1")),
            (720.0, Some("default/a-1-r2")),
            (1800.0, Some("default/b-1")),
            (2160.0, Some("default/b-1-r8")),
            // 6m1s (the first start, rounded up to the second) + 30m: not a moment earlier.
            (2161.0, Some("default/a-1-r5")),
        ]
    );
    let backoff = events(&r, "RemediationBackoff");
    assert_eq!(backoff.iter().map(|e| e.t).collect::<Vec<_>>(), [1080.0], "told once, when md-a backs off");
    let message = backoff[0].details["message"].as_str().unwrap_or("");
    for words in [
        "pool MachineDeployment/md-a: 2 remediation(s) started within 30m0s (maxRemediations 2)",
        "a-1 at 2030-01-01T00:06:01Z, a-1-r2 at 2030-01-01T00:12:01Z",
        "waiting: a-1-r5",
        "resumes at 2030-01-01T00:36:01Z",
    ] {
        assert!(message.contains(words), "{words:?} in {message}");
    }
    assert_eq!(events(&r, "RemediationBackoffEnded").iter().map(|e| e.t).collect::<Vec<_>>(), [2161.0]);
    // The waiting Machine was counted unhealthy while it waited, and md-b was never held back.
    let s = status(&r, "MachineHealthCheck/default/workers");
    assert!(s.get("backedOffPools").is_none(), "{s}");
    let history: Vec<(&str, &str, &str)> = s["remediationHistory"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|h| {
                    (
                        h["pool"].as_str().unwrap_or(""),
                        h["target"].as_str().unwrap_or(""),
                        h["started"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        history,
        [
            ("MachineDeployment/md-a", "a-1-r2", "2030-01-01T00:12:01Z"),
            ("MachineDeployment/md-b", "b-1", "2030-01-01T00:30:01Z"),
            ("MachineDeployment/md-a", "a-1-r5", "2030-01-01T00:36:01Z"),
            ("MachineDeployment/md-b", "b-1-r8", "2030-01-01T00:36:01Z"),
        ],
        "a-1's start left the window at 36m1s"
    );
    snapshot("remediation-backoff", &r);
}

#[test]
fn overlapping_mhcs_settle_with_one_condition_writer() {
    // Before the rule this run stopped: "did not settle … decided 50 times in one instant".
    let r = run("overlapping-mhcs");
    let owner = "MachineHealthCheck/default/workers";
    let other = "MachineHealthCheck/default/workers-slow";
    // The older check marks workers-b at 6m (1m + 5m) and asks its owner to remediate it.
    let by = |event: &str, check: &str| -> Vec<(f64, Option<String>)> {
        events(&r, event)
            .iter()
            .filter(|e| e.check.as_deref() == Some(check))
            .map(|e| (e.t, e.target.clone()))
            .collect()
    };
    assert_eq!(by("MachineMarkedUnhealthy", owner), [(360.0, Some("default/workers-b".to_string()))]);
    assert_eq!(by("RemediationRequested", owner), [(360.0, Some("default/workers-b".to_string()))]);
    // The other check never writes the Machine nor remediates it, even past its own 10m timeout,
    // and is told once, at its first decision, which check writes which Machines.
    for event in
        ["MachineMarkedUnhealthy", "MachineHealthy", "RemediationRequested", "RemediationSkipped", "TargetHeldTwice"]
    {
        assert!(by(event, other).is_empty(), "{event} on {other}: {:?}", by(event, other));
    }
    let told = by("MachinesSelectedByAnotherCheck", other);
    assert_eq!(told, [(0.0, None)]);
    assert!(events(&r, "MachinesSelectedByAnotherCheck").iter().all(|e| e.check.as_deref() == Some(other)));
    // It still counts them: workers-b is unhealthy for it too.
    let s = status(&r, other);
    assert_eq!((s["expectedMachines"].as_i64(), s["currentHealthy"].as_i64()), (Some(3), Some(2)));
    let condition = s["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "MachinesSelectedByAnotherCheck"))
        .expect("the other check has the condition");
    assert_eq!(condition["status"], "True");
    assert_eq!(
        condition["message"],
        "MachineHealthCheck/default/workers writes the health-check conditions of and remediates Machines default/workers-a, default/workers-b, default/workers-c, which this check also selects; this check counts them but writes nothing on them"
    );
    let owner_status = status(&r, owner);
    assert!(
        owner_status["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["type"] != "MachinesSelectedByAnotherCheck"))
    );
    snapshot("overlapping-mhcs", &r);
}

#[test]
fn zone_budget_pauses_the_failing_zone_only() {
    let r = run("zone-budget");
    let check = "NodeHealthCheck/workers";
    // zone-a loses 3 of 5 at 1m: paused at once, the event names the zone and the counts.
    let short = events(&r, "FailureDomainShortCircuit");
    assert_eq!(short.iter().map(|e| (e.t, e.check.as_deref())).collect::<Vec<_>>(), [(60.0, Some(check))]);
    let message = short[0].details["message"].as_str().unwrap_or("");
    assert!(message.contains("zone-a: 3 of 5 unhealthy, 1 allowed"), "{message}");
    // b-1 (zone-b) and c-1 (the 2-Node zone-c) are remediated at 7m; zone-a's Nodes, unhealthy
    // since 6m, only once the zone is back within its budget at 20m (a-3, still down).
    let created: Vec<(f64, Option<&str>)> = events(&r, "RemediationCreated").iter().map(|e| at(e)).collect();
    assert_eq!(created, [(420.0, Some("b-1")), (420.0, Some("c-1")), (1200.0, Some("a-3"))]);
    let resumed = events(&r, "FailureDomainResumed");
    assert_eq!(resumed.iter().map(|e| e.t).collect::<Vec<_>>(), [1200.0]);
    assert!(resumed[0].details["message"].as_str().unwrap_or("").contains("zone-a: 1 of 5 unhealthy, 1 allowed"));
    // The check-wide budget never tripped.
    assert!(events(&r, "RemediationRestricted").is_empty());
    let s = status(&r, check);
    let domains: Vec<(&str, i64, i64, bool)> = s["failureDomains"]
        .as_array()
        .expect("status.failureDomains")
        .iter()
        .map(|d| {
            let n = |k: &str| d[k].as_i64().unwrap_or(-1);
            (d["name"].as_str().unwrap_or(""), n("targets"), n("allowed"), d["paused"].as_bool().unwrap_or(true))
        })
        .collect();
    assert_eq!(domains, [("zone-a", 5, 1, false), ("zone-b", 4, 1, false), ("zone-c", 2, 1, false)]);
    snapshot("zone-budget", &r);
}

#[test]
fn stale_signal_a_dead_detector_remediates_nothing_and_blocks_nothing() {
    let r = run("stale-signal");
    // n1's deadlock with live heartbeats: remediated after its 10m, then the dead kubelet at 30m.
    assert_eq!(
        events(&r, "RemediationCreated").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(720.0, Some("n1")), (1800.0, Some("n1"))],
        "nothing but n1 is ever remediated"
    );
    assert_eq!(
        events(&r, "DetectedUnhealthy").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(720.0, Some("n1")), (1800.0, Some("n1"))],
        "n2..n5 never count as unhealthy: stale at 23m, before their 10m ran out at 30m"
    );
    let stale = events(&r, "StaleCondition");
    assert_eq!(
        stale.iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(1380.0, Some("n2")), (1380.0, Some("n3")), (1380.0, Some("n4")), (1380.0, Some("n5"))],
        "told once each, when the last heartbeat (20m) got older than maxConditionAge (3m)"
    );
    let message = stale[0].details["message"].as_str().unwrap_or("");
    for words in ["NodeHealthCheck/workers", "KernelDeadlock=True", "2030-01-01T00:20:00Z", "maxConditionAge 3m0s"] {
        assert!(message.contains(words), "{words:?} missing in {message}");
    }
    // While the four fresh conditions were still pending (20m..23m), they were not healthy; from
    // 23m they count as healthy again, so the budget lets n1's remediation through.
    assert_eq!(events(&r, "RemediationRestricted").iter().map(|e| e.t).collect::<Vec<_>>(), [1200.0]);
    assert_eq!(events(&r, "RemediationAllowed").iter().map(|e| e.t).collect::<Vec<_>>(), [1380.0]);
    let s = status(&r, "NodeHealthCheck/workers");
    assert_eq!((s["observedNodes"].as_i64(), s["healthyNodes"].as_i64()), (Some(5), Some(5)));
    assert_eq!(s["staleTargetCount"].as_i64(), Some(4));
    let listed: Vec<(&str, &str, &str)> = s["staleTargets"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    let f = |k: &str| t[k].as_str().unwrap_or("");
                    (f("name"), f("condition"), f("lastHeartbeatTime"))
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(listed, ["n2", "n3", "n4", "n5"].map(|n| (n, "KernelDeadlock=True", "2030-01-01T00:20:00Z")).to_vec());
    snapshot("stale-signal", &r);
}

#[test]
fn reason_aware_rules_remediate_a_failing_disk_but_not_a_full_one() {
    let r = run("reason-aware-rules");
    let created: Vec<_> = events(&r, "RemediationCreated").iter().map(|e| at(e)).collect();
    // w-2 fails at 2m: 5m later. w-1 was full from 1m (never matched), re-read as failing at 10m
    // with its transition time kept at 1m: at once.
    assert_eq!(created, [(420.0, Some("w-2")), (600.0, Some("w-1"))]);
    assert_eq!(events(&r, "DetectedUnhealthy").iter().map(|e| at(e)).collect::<Vec<_>>(), created);
    // While w-1's disk was only full it counted as healthy: at 7m only w-2 is listed.
    let at_7m = r
        .history
        .iter()
        .rfind(|(t, check, _)| *t <= 420.0 && check == "NodeHealthCheck/workers")
        .map(|(_, _, s)| {
            (
                s["healthyNodes"].as_i64(),
                s["unhealthyNodes"][0]["name"].clone(),
                s["unhealthyNodes"].as_array().map(Vec::len),
            )
        })
        .expect("a status at 7m");
    assert_eq!(at_7m, (Some(4), serde_json::json!("w-2"), Some(1)), "a full disk matches no rule");
    assert_eq!(
        events(&r, "RemediationRemoved").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(720.0, Some("w-2")), (900.0, Some("w-1"))]
    );
    let s = status(&r, "NodeHealthCheck/workers");
    assert_eq!((s["observedNodes"].as_i64(), s["healthyNodes"].as_i64()), (Some(5), Some(5)));
    assert!(events(&r, "RemediationChosen").is_empty(), "no rule names its own remediation");
    snapshot("reason-aware-rules", &r);
}

#[test]
fn remediation_per_condition_reboots_a_deadlock_and_replaces_a_failing_disk() {
    let r = run("remediation-per-condition");
    let nhc = |e: &&Event| e.check.as_deref() == Some("NodeHealthCheck/workers");
    let created: Vec<_> = events(&r, "RemediationCreated")
        .into_iter()
        .filter(nhc)
        .map(|e| (e.t, e.target.as_deref().unwrap_or(""), e.details["kind"].as_str().unwrap_or("")))
        .collect();
    // w-1's deadlock (1m + 2m): the check's own reboot. w-2's failing disk (2m + 2m): the rule's
    // replacement, and nothing else for w-2 when Ready=Unknown (rule 0) holds from 10m.
    assert_eq!(created, [(180.0, "w-1", "SelfNodeRemediation"), (240.0, "w-2", "MachineDeletionRemediation")]);
    let chosen: Vec<_> = events(&r, "RemediationChosen")
        .into_iter()
        .filter(nhc)
        .map(|e| (e.t, e.target.as_deref().unwrap_or(""), e.details["message"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(chosen.len(), 2, "told once per incident: {chosen:?}");
    assert!(chosen[0].2.contains("rule spec.unhealthyConditions[1] KernelDeadlock=True"), "{chosen:?}");
    assert!(
        chosen[0].2.contains("spec.remediationTemplate (SelfNodeRemediationTemplate medik8s/reboot)"),
        "{chosen:?}"
    );
    assert!(chosen[1].2.contains("rule spec.unhealthyConditions[2] DiskProblem=True"), "{chosen:?}");
    assert!(
        chosen[1].2.contains(
            "spec.unhealthyConditions[2].remediationTemplate (MachineDeletionRemediationTemplate medik8s/replace)"
        ),
        "{chosen:?}"
    );
    // Mid-incident (after Ready=Unknown also held at 10m) the status still reports the disk rule.
    let at_11m = r
        .history
        .iter()
        .rfind(|(t, check, _)| *t <= 660.0 && check == "NodeHealthCheck/workers")
        .map(|(_, _, s)| s["chosenRemediations"].clone())
        .unwrap_or_default();
    assert_eq!(at_11m[0]["name"], "w-2", "{at_11m}");
    assert_eq!(at_11m[0]["rule"], "spec.unhealthyConditions[2] DiskProblem=True", "{at_11m}");
    assert_eq!(at_11m[0]["since"], "2030-01-01T00:04:00Z", "{at_11m}");
    assert_eq!(
        events(&r, "RemediationRemoved").into_iter().filter(nhc).map(|e| at(e)).collect::<Vec<_>>(),
        [(300.0, Some("w-1")), (720.0, Some("w-2"))]
    );
    let s = status(&r, "NodeHealthCheck/workers");
    assert_eq!((s["healthyNodes"].as_i64(), s.get("chosenRemediations")), (Some(5), None), "all healthy: none listed");

    // The MachineHealthCheck: bm-1's failing disk (3m + 2m) gets the rule's Metal3Remediation,
    // bm-2's silent kubelet (4m + 5m) its owner; bm-1's own silent kubelet (from 11m) changes
    // nothing: its owner is never asked.
    let mhc = |e: &&Event| e.check.as_deref() == Some("MachineHealthCheck/metal/metal-workers");
    let created: Vec<_> = events(&r, "RemediationCreated")
        .into_iter()
        .filter(mhc)
        .map(|e| (e.t, e.target.as_deref().unwrap_or(""), e.details["kind"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(created, [(300.0, "metal/bm-1", "Metal3Remediation")]);
    assert_eq!(
        events(&r, "RemediationRequested").into_iter().filter(mhc).map(|e| at(e)).collect::<Vec<_>>(),
        [(540.0, Some("metal/bm-2"))],
        "only bm-2 goes to its owner"
    );
    let chosen: Vec<_> = events(&r, "RemediationChosen")
        .into_iter()
        .filter(mhc)
        .map(|e| (e.target.as_deref().unwrap_or(""), e.details["message"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(chosen.len(), 2, "{chosen:?}");
    assert!(
        chosen[0]
            .1
            .contains("spec.unhealthyConditions[1].remediationTemplate (Metal3RemediationTemplate metal/reprovision)")
    );
    assert!(chosen[1].1.contains("rule spec.unhealthyConditions[0] Ready=Unknown") && chosen[1].1.contains("by owner"));
    let m = status(&r, "MachineHealthCheck/metal/metal-workers");
    assert_eq!(m["currentHealthy"].as_i64(), Some(3), "bm-1 reprovisioned, bm-2 replaced");
    snapshot("remediation-per-condition", &r);
}

#[test]
fn max_in_flight_replaces_a_wave_two_at_a_time_longest_unhealthy_first() {
    let r = run("max-in-flight");
    let requested: Vec<(f64, Option<&str>)> = events(&r, "RemediationRequested").iter().map(|e| at(e)).collect();
    assert_eq!(
        requested,
        [
            (360.0, Some("default/w-6")),
            (362.0, Some("default/w-5")),
            // A slot frees when the owner has replaced a Machine (it is gone), not before.
            (420.0, Some("default/w-4")),
            (422.0, Some("default/w-3")),
            (480.0, Some("default/w-2")),
            (482.0, Some("default/w-1")),
        ],
        "in pairs, in the order they failed (not by name)"
    );
    let queued: Vec<(f64, Option<&str>)> = events(&r, "RemediationQueued").iter().map(|e| at(e)).collect();
    assert_eq!(
        queued,
        [
            (364.0, Some("default/w-4")),
            (366.0, Some("default/w-3")),
            (368.0, Some("default/w-2")),
            (370.0, Some("default/w-1"))
        ]
    );
    for (e, place) in events(&r, "RemediationQueued").iter().zip(1..) {
        let message = e.details["message"].as_str().unwrap_or("");
        assert!(message.contains(&format!("it is number {place} in the queue")), "{message}");
        assert!(message.contains("2 of 2 in flight (maxInFlight 2)"), "{message}");
    }
    let dequeued: Vec<(f64, Option<&str>)> = events(&r, "RemediationDequeued").iter().map(|e| at(e)).collect();
    assert_eq!(
        dequeued,
        [
            (420.0, Some("default/w-4")),
            (422.0, Some("default/w-3")),
            (480.0, Some("default/w-2")),
            (482.0, Some("default/w-1"))
        ]
    );
    // At no instant more than two Machines asked for and not yet replaced.
    let mut in_flight: Vec<&str> = Vec::new();
    for e in &r.events {
        match e.event.as_str() {
            "RemediationRequested" => in_flight.push(e.target.as_deref().unwrap_or("")),
            "MachineReplaced" => in_flight.retain(|t| Some(*t) != e.target.as_deref()),
            _ => {}
        }
        assert!(in_flight.len() <= 2, "at {}: {in_flight:?}", e.t);
    }
    let s = status(&r, "MachineHealthCheck/default/workers");
    assert_eq!((s["expectedMachines"].as_i64(), s["currentHealthy"].as_i64()), (Some(8), Some(8)));
    assert!(s.get("queued").is_none() && s.get("queuedCount").is_none(), "{s}");
    let condition = s["conditions"].as_array().and_then(|l| l.iter().find(|c| c["type"] == "RemediationQueued"));
    assert_eq!(
        condition.map(|c| (c["status"].clone(), c["reason"].clone())),
        Some(("False".into(), "NoRemediationQueued".into()))
    );
    snapshot("max-in-flight", &r);
}

#[test]
fn a_scale_down_and_a_failure_share_one_budget() {
    let r = run("shared-disruption-budget");
    // w-1 fails at 2m while the autoscaler removes w-5 and w-6: three out, over maxUnhealthy 2.
    let blocked = events(&r, "RemediationRestricted");
    assert_eq!(blocked.iter().map(|e| e.t).collect::<Vec<_>>(), [120.0]);
    let message = blocked[0].details["message"].as_str().unwrap_or("");
    assert!(message.contains("2 taken down on purpose (ClusterAutoscaler 2)"), "{message}");
    // Unhealthy at 7m, rebooted only when the autoscaler has deleted w-6 at 10m.
    assert_eq!(events(&r, "DetectedUnhealthy").iter().map(|e| at(e)).collect::<Vec<_>>(), [(420.0, Some("w-1"))]);
    assert_eq!(events(&r, "RemediationCreated").iter().map(|e| at(e)).collect::<Vec<_>>(), [(600.0, Some("w-1"))]);
    let s = status(&r, "NodeHealthCheck/workers");
    assert_eq!((s["observedNodes"].as_i64(), s["healthyNodes"].as_i64()), (Some(4), Some(4)));
    assert!(s.get("disruptions").is_none(), "nothing is taken down at the end: {s}");
    snapshot("shared-disruption-budget", &r);
}

#[test]
fn without_the_shared_budget_the_same_failure_is_remediated_during_the_scale_down() {
    let text = text("shared-disruption-budget").replace("      voluntaryDisruptions: Count\n", "");
    let r = run_text(&text);
    assert_eq!(events(&r, "RemediationCreated").iter().map(|e| at(e)).collect::<Vec<_>>(), [(420.0, Some("w-1"))]);
}

#[test]
fn a_machine_is_replaced_only_once_the_scale_down_is_done() {
    let r = run("scale-down-and-repair");
    let blocked = events(&r, "RemediationRestricted");
    assert_eq!(blocked.iter().map(|e| e.t).collect::<Vec<_>>(), [120.0]);
    let message = blocked[0].details["message"].as_str().unwrap_or("");
    assert!(
        message.contains("(total: 5, unhealthy: 2, maxUnhealthy: 1; 1 taken down on purpose (ClusterAutoscaler 1))"),
        "{message}"
    );
    assert_eq!(
        events(&r, "MachineMarkedUnhealthy").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(420.0, Some("default/workers-b"))]
    );
    assert_eq!(
        events(&r, "RemediationRequested").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(720.0, Some("default/workers-b"))]
    );
    snapshot("scale-down-and-repair", &r);
}

#[test]
fn a_node_that_flaps_three_times_within_the_hour_is_remediated_at_its_third_episode() {
    let r = run("flapping-node");
    // f-1 is NotReady 3m at a time, never its rule's 5m: only its third episode (21m) counts.
    let flapping = events(&r, "Flapping");
    assert_eq!(flapping.iter().map(|e| at(e)).collect::<Vec<_>>(), [(1260.0, Some("f-1"))]);
    let message = flapping[0].details["message"].as_str().unwrap_or("");
    assert!(message.contains("3 times within 1h0m0s"), "{message}");
    // once, though f-1 flaps twice more after its remediation; f-2 flaps twice, never
    assert_eq!(events(&r, "RemediationCreated").iter().map(|e| at(e)).collect::<Vec<_>>(), [(1260.0, Some("f-1"))]);
    assert!(events(&r, "DetectedUnhealthy").is_empty(), "no episode lasted the rule's duration");
    let s = status(&r, "NodeHealthCheck/workers");
    let listed: Vec<(&str, usize)> = s["flapping"]
        .as_array()
        .map(|l| {
            l.iter().map(|t| (t["name"].as_str().unwrap_or(""), t["episodes"].as_array().map_or(0, Vec::len))).collect()
        })
        .unwrap_or_default();
    assert_eq!(listed, [("f-1", 2), ("f-2", 2)], "the episodes since the remediation, and f-2's: {s}");
    snapshot("flapping-node", &r);
}

#[test]
fn without_flapping_the_same_flaps_are_never_remediated() {
    let text = text("flapping-node").replace("      flapping: {episodes: 3, window: 1h}\n", "");
    let r = run_text(&text);
    assert!(events(&r, "RemediationCreated").is_empty());
    assert!(status(&r, "NodeHealthCheck/workers").get("flapping").is_none());
}

#[test]
fn a_machine_health_check_remediates_by_an_expression_with_its_own_template_and_for_flapping() {
    let r = run("machine-expression-and-flapping");
    // g-1 labelled at 2m, unhealthy at 4m by the expression; g-3's one minute never counts
    let unhealthy = events(&r, "MachineMarkedUnhealthy");
    assert_eq!(unhealthy.iter().map(|e| at(e)).collect::<Vec<_>>(), [(240.0, Some("ml/g-1"))]);
    assert_eq!(unhealthy[0].details["reason"], "ExpressionMatched");
    // the expression's own template, not the owner
    let created = events(&r, "RemediationCreated");
    assert_eq!(created.iter().map(|e| at(e)).collect::<Vec<_>>(), [(240.0, Some("ml/g-1"))]);
    assert_eq!(created[0].details["kind"], "Metal3Remediation", "{created:?}");
    // g-2 is NotReady 3m at a time, never the 5m timeout: its third episode (25m) is a flap
    let flapping = events(&r, "Flapping");
    assert_eq!(flapping.iter().map(|e| at(e)).collect::<Vec<_>>(), [(1500.0, Some("ml/g-2"))]);
    assert_eq!(
        events(&r, "RemediationRequested").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(1500.0, Some("ml/g-2"))],
        "the owner replaces g-2"
    );
    snapshot("machine-expression-and-flapping", &r);
}

#[test]
fn without_flapping_the_machines_short_flaps_are_never_remediated() {
    let text = text("machine-expression-and-flapping").replace("      flapping: {episodes: 3, window: 1h}\n", "");
    let r = run_text(&text);
    assert!(events(&r, "Flapping").is_empty());
    // only g-2's last episode, which lasts, is remediated once it outlasts the 5m timeout
    assert_eq!(
        events(&r, "RemediationRequested").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(1800.0, Some("ml/g-2"))]
    );
}

#[test]
fn an_expression_rule_remediates_a_node_once_it_held_for_its_duration_on_vigils_clock() {
    let r = run("expression-rule");
    // e-1 labelled failing at 2m: unhealthy at 12m; e-2's six minutes never count; e-3 at 35m,
    // 10m after its temperature became a number over 90
    let unhealthy = events(&r, "DetectedUnhealthy");
    assert_eq!(unhealthy.iter().map(|e| at(e)).collect::<Vec<_>>(), [(720.0, Some("e-1")), (2100.0, Some("e-3"))]);
    assert!(unhealthy.iter().all(|e| e.details["reason"] == "ExpressionMatched"), "{unhealthy:?}");
    let message = unhealthy[0].details["message"].as_str().unwrap_or("");
    assert!(message.contains("spec.unhealthyExpressions[0].expression"), "{message}");
    assert_eq!(
        events(&r, "RemediationCreated").iter().map(|e| at(e)).collect::<Vec<_>>(),
        [(720.0, Some("e-1")), (2100.0, Some("e-3"))]
    );
    // e-3's "hot" cannot be evaluated: no decision, and why
    let unknown: Vec<&Event> =
        events(&r, "NoDecision").into_iter().filter(|e| e.details["reason"] == "ExpressionUnknown").collect();
    assert!(!unknown.is_empty() && unknown.iter().all(|e| e.target.as_deref() == Some("e-3")), "{unknown:?}");
    let message = unknown[0].details["message"].as_str().unwrap_or("");
    assert!(
        message.contains("spec.unhealthyExpressions[1].expression could not be evaluated for Node e-3"),
        "{message}"
    );
    snapshot("expression-rule", &r);
}
