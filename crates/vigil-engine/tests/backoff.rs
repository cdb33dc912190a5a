//! Remediation back-off (`spec.backoff`) rules, as tables: pools, when a pool backs off and
//! resumes (to the instant), what is reported, the history in status (restart, bounds), and how
//! it meets the short-circuit and dry-run. The properties over random event sequences are in
//! `backoff_props.rs`.

mod support;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use support::*;
use vigil_api::NodeHealthCheck;
use vigil_api::machine_health_check::MachineHealthCheckStatus;
use vigil_api::node_health_check::NodeHealthCheckStatus;
use vigil_api::shared::FeatureStatus;
use vigil_api::shared::RemediationRecord;
use vigil_api::views::NodeView;
use vigil_api::views::{MachineView, RemediationView, TemplateView};
use vigil_engine::backoff::{self, HISTORY_CAP};
use vigil_engine::node::{self, NhcInput};
use vigil_engine::plan::{NoticeKind, Plan};

const DEPLOYMENT: &str = "cluster.x-k8s.io/deployment-name";

/// A sick Machine (Ready=False since T0, with its Node) of MachineDeployment `md`.
fn sick(w: MhcWorld, name: &str, md: &str) -> MhcWorld {
    w.machine_with_node(machine(name).label(DEPLOYMENT, md), "False", t0())
}

fn with_backoff(w: MhcWorld, max: i32, window: &str) -> MhcWorld {
    w.spec("backoff", json!({"maxRemediations": max, "window": window}))
}

/// Machines asked for remediation by the plan (owner or external).
fn started(plan: &Plan<MachineHealthCheckStatus>) -> Vec<String> {
    let mut out: Vec<String> = machine_writes(plan)
        .into_iter()
        .filter(|(_, w)| {
            w.iter().any(|(t, s, _)| (t == "OwnerRemediated" || t == "ExternallyRemediated") && s == "False")
        })
        .map(|(name, _)| name)
        .collect();
    out.sort();
    out
}

fn history(list: &[RemediationRecord]) -> Vec<(String, String, Timestamp, bool)> {
    list.iter().map(|r| (r.pool.clone(), r.target.clone(), r.started.0, r.dry_run)).collect()
}

fn rec(pool: &str, target: &str, started: Timestamp) -> RemediationRecord {
    RemediationRecord { pool: pool.into(), target: target.into(), started: Time(started), dry_run: false }
}

fn kinds<S>(plan: &Plan<S>, kind: NoticeKind) -> Vec<String> {
    plan.notices.iter().filter(|n| n.kind == kind).map(|n| n.message.clone()).collect()
}

#[test]
fn a_machine_pool_is_its_deployment_else_its_controlling_owner_else_itself() {
    let owned = |kind: &str, controller: bool| {
        let mut v = machine("m1").json();
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": "owner-1", "uid": "u", "controller": controller}]);
        v
    };
    let mut both = owned("MachineSet", true);
    both["metadata"]["labels"][DEPLOYMENT] = json!("md-0");
    let rows: [(&str, Value, &str); 5] = [
        ("deployment label wins", both, "MachineDeployment/md-0"),
        ("controlling MachineSet", owned("MachineSet", true), "MachineSet/owner-1"),
        ("controlling control plane", owned("KubeadmControlPlane", true), "KubeadmControlPlane/owner-1"),
        ("an owner that is not the controller does not group", owned("MachineSet", false), "Machine/m1"),
        ("no owner: a pool of one", machine("m1").json(), "Machine/m1"),
    ];
    for (what, v, want) in rows {
        let view = MachineView::read(&v).expect("named");
        assert_eq!(backoff::machine_pool(&view), want, "{what}");
    }
    let labelled = node("n1").label("karpenter.sh/nodepool", "gpu").build();
    assert_eq!(backoff::node_pool(&labelled, "karpenter.sh/nodepool"), "karpenter.sh/nodepool=gpu");
    assert_eq!(backoff::node_pool(&node("n2").build(), "karpenter.sh/nodepool"), "Node/n2", "no label: its own pool");
}

#[test]
fn a_pool_at_its_limit_waits_until_the_window_allows_and_other_pools_go_on() {
    let w = sick(
        sick(sick(sick(with_backoff(MhcWorld::new(), 2, "30m"), "a1", "md-a"), "a2", "md-a"), "a3", "md-a"),
        "b1",
        "md-b",
    );
    let mut w = w;
    let first = w.decide(at(301));
    assert_eq!(started(&first), ["a1", "a2", "b1"], "two in md-a, md-b unaffected");
    assert_eq!(written(&first, "a3", "HealthCheckSucceeded").map(|(c, _)| c.status.as_str()), Some("False"));
    assert_eq!(first.status.current_healthy, 0, "a waiting Machine still counts unhealthy");
    let pools = &first.status.features.backed_off_pools;
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(
        (
            pools[0].pool.as_str(),
            pools[0].started,
            pools[0].resumes_at.0,
            pools[0].waiting.clone(),
            pools[0].waiting_count
        ),
        ("MachineDeployment/md-a", 2, at(301 + 1800), vec!["a3".to_string()], 1)
    );
    assert_eq!(first.next_wake, Some(at(2101)), "woken exactly when the window allows");
    assert_eq!(
        history(&first.status.features.remediation_history),
        vec![
            ("MachineDeployment/md-a".into(), "a1".into(), at(301), false),
            ("MachineDeployment/md-a".into(), "a2".into(), at(301), false),
            ("MachineDeployment/md-b".into(), "b1".into(), at(301), false),
        ]
    );
    let told = kinds(&first, NoticeKind::RemediationBackoff);
    assert_eq!(told.len(), 1, "{:?}", first.notices);
    for words in [
        "MachineDeployment/md-a",
        "2 remediation(s) started within 30m0s (maxRemediations 2)",
        "a1 at 2030-01-01T00:05:01Z",
        "a2 at",
        "waiting: a3",
        "resumes at 2030-01-01T00:35:01Z",
    ] {
        assert!(told[0].contains(words), "{words:?} in {}", told[0]);
    }
    let condition = check_condition(&first.status.conditions, backoff::CONDITION).expect("condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "RemediationBackoff"));
    w.apply(&first);

    // Decided again, through a restart (the status read back from its JSON): still backed off,
    // nothing new told, nothing written.
    w.status = Some(serde_json::from_value(serde_json::to_value(w.status.clone()).expect("json")).expect("status"));
    let again = w.decide(at(2100));
    assert_eq!(started(&again), Vec::<String>::new(), "a second before the window allows");
    assert_eq!(again.notices, vec![], "told once");
    assert_eq!(again.status, first.status, "the status does not move");
    assert_eq!(again.next_wake, Some(at(2101)));

    let resumed = w.decide(at(2101));
    assert_eq!(started(&resumed), ["a3"], "at the instant the window allows");
    assert_eq!(resumed.status.features.backed_off_pools, vec![]);
    assert_eq!(kinds(&resumed, NoticeKind::RemediationBackoffEnded).len(), 1, "{:?}", resumed.notices);
    let condition = check_condition(&resumed.status.conditions, backoff::CONDITION).expect("condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "NoPoolBackedOff"));
    let kept: Vec<(String, Timestamp)> =
        resumed.status.features.remediation_history.iter().map(|r| (r.target.clone(), r.started.0)).collect();
    assert_eq!(kept, [("a3".into(), at(2101))], "the starts at 301s left the window at 2101s");
}

/// The back-off's memory is the status: a decision that cannot judge (the Cluster paused, the
/// workload cluster unreachable) must carry the history and the backed-off pools over, or the
/// pool would be allowed its whole budget again once the outage ends.
#[test]
fn a_pause_or_an_unreachable_cluster_keeps_the_history_and_the_limit_holds_after_it() {
    let mut w = sick(sick(sick(with_backoff(MhcWorld::new(), 2, "30m"), "a1", "md-a"), "a2", "md-a"), "a3", "md-a");
    let first = w.decide(at(301));
    assert_eq!(started(&first), ["a1", "a2"]);
    w.apply(&first);
    let kept = history(&first.status.features.remediation_history);
    for (what, outage) in [
        (
            "unreachable",
            Box::new(|w: &mut MhcWorld| w.unreachable = Some("connection refused".into()))
                as Box<dyn Fn(&mut MhcWorld)>,
        ),
        ("paused", Box::new(|w: &mut MhcWorld| w.cluster = Some(cluster().paused().json()))),
    ] {
        let mut during = w.clone();
        outage(&mut during);
        let plan = during.decide(at(400));
        assert_eq!(started(&plan), Vec::<String>::new(), "{what}: nothing starts");
        assert_eq!(history(&plan.status.features.remediation_history), kept, "{what}: the history is kept");
        assert_eq!(plan.status.features.backed_off_pools, first.status.features.backed_off_pools, "{what}");
        during.apply(&plan);
        // The outage ends: md-a is still at its limit until the window allows.
        let after_outage = MhcWorld { unreachable: None, cluster: w.cluster.clone(), ..during };
        assert_eq!(started(&after_outage.decide(at(500))), Vec::<String>::new(), "{what}: the limit still holds");
    }
}

#[test]
fn history_keeps_only_what_still_counts_and_starts_round_up_to_the_second() {
    let mut w = sick(with_backoff(MhcWorld::new(), 2, "30m"), "a9", "md-a");
    w.status = Some(MachineHealthCheckStatus {
        features: FeatureStatus {
            remediation_history: vec![
                rec("MachineDeployment/md-a", "old", at(-3000)),
                rec("MachineDeployment/md-a", "out", at(301 - 1800)),
                rec("MachineDeployment/md-x", "x1", at(10)),
                rec("MachineDeployment/md-x", "x2", at(20)),
                rec("MachineDeployment/md-x", "x3", at(30)),
            ],
            ..Default::default()
        },
        ..Default::default()
    });
    let now = plus_ns(at(301), 5);
    let plan = w.decide(now);
    assert_eq!(started(&plan), ["a9"], "records outside (now - window, now] do not count");
    let kept: Vec<(&str, Timestamp)> =
        plan.status.features.remediation_history.iter().map(|r| (r.target.as_str(), r.started.0)).collect();
    assert_eq!(kept, [("x2", at(20)), ("x3", at(30)), ("a9", at(302))], "newest maxRemediations per pool; rounded up");
}

#[test]
fn a_full_history_holds_back_new_pools_rather_than_forget_a_start() {
    let mut w = sick(with_backoff(MhcWorld::new(), 1, "1h"), "a1", "md-a");
    let full: Vec<RemediationRecord> =
        (0..HISTORY_CAP as i64).map(|i| rec(&format!("MachineDeployment/p{i}"), &format!("m{i}"), at(i))).collect();
    w.status = Some(MachineHealthCheckStatus {
        features: FeatureStatus { remediation_history: full, ..Default::default() },
        ..Default::default()
    });
    let plan = w.decide(at(301));
    assert_eq!(started(&plan), Vec::<String>::new());
    assert_eq!(plan.status.features.remediation_history.len(), HISTORY_CAP);
    let pool = &plan.status.features.backed_off_pools[0];
    assert!(pool.history_full, "{pool:?}");
    assert_eq!(pool.resumes_at.0, at(3600), "when the oldest record leaves the window");
    assert!(kinds(&plan, NoticeKind::RemediationBackoff)[0].contains("history is full"), "{:?}", plan.notices);
}

#[test]
fn external_remediation_counts_when_its_object_is_asked_for() {
    let w = sick(sick(with_backoff(MhcWorld::new().with_template(), 1, "10m"), "a1", "md-a"), "a2", "md-a");
    let plan = w.decide(at(301));
    assert_eq!(created_names(&plan), ["a1"]);
    assert_eq!(plan.status.features.backed_off_pools[0].waiting, ["a2"]);
}

#[test]
fn the_short_circuit_is_applied_first_and_the_feature_is_off_by_default() {
    // maxUnhealthy 1 with two unhealthy: nothing starts, and no pool is said to be backed off.
    let w =
        sick(sick(with_backoff(MhcWorld::new().spec("maxUnhealthy", json!(1)), 1, "10m"), "a1", "md-a"), "b1", "md-b");
    let plan = w.decide(at(301));
    assert_eq!(started(&plan), Vec::<String>::new());
    assert_eq!((plan.status.features.backed_off_pools.len(), plan.status.features.remediation_history.len()), (0, 0));
    assert!(check_condition(&plan.status.conditions, backoff::CONDITION).is_none());
    // Without spec.backoff: every Machine of the pool is remediated, no history is kept.
    let off = sick(sick(sick(MhcWorld::new(), "a1", "md-a"), "a2", "md-a"), "a3", "md-a").decide(at(301));
    assert_eq!(started(&off), ["a1", "a2", "a3"]);
    assert_eq!(off.status.features.remediation_history, vec![]);
}

#[test]
fn dry_run_backs_off_its_would_be_remediations_and_never_holds_back_a_live_check() {
    let mut w =
        sick(sick(with_backoff(MhcWorld::new().spec("dryRun", json!(true)), 1, "30m"), "a1", "md-a"), "a2", "md-a");
    let plan = w.decide(at(301));
    assert_eq!(plan.actions, vec![]);
    let would: Vec<&str> = plan.status.features.would_remediate.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(would, ["a1"], "a2 would wait for the back-off");
    assert_eq!(
        history(&plan.status.features.remediation_history),
        [("MachineDeployment/md-a".into(), "a1".into(), at(301), true)]
    );
    w.apply(&plan);
    let again = w.decide(at(900));
    assert_eq!(again.status, plan.status, "the would-be start is not counted again");
    w.apply(&again);
    // Turned live: the dry-run record does not count, so a1 starts; a2 waits for a1's start.
    let live = w.spec("dryRun", json!(false)).decide(at(1000));
    assert_eq!(started(&live), ["a1"]);
    assert_eq!(
        history(&live.status.features.remediation_history),
        [("MachineDeployment/md-a".into(), "a1".into(), at(1000), false)]
    );
}

// ----------------------------------------------------------------------------------------------
// NodeHealthCheck
// ----------------------------------------------------------------------------------------------

const NS: &str = "medik8s";
const POOL: &str = "karpenter.sh/nodepool";

fn nhc_spec(max: i32) -> Value {
    json!({
        "selector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "maxUnhealthy": "100%",
        "escalatingRemediations": [
            {"remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": NS}, "order": 0, "timeout": "5m"},
            {"remediationTemplate": {"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1", "kind": "FenceAgentsRemediationTemplate", "name": "far", "namespace": NS}, "order": 1, "timeout": "5m"},
        ],
        "backoff": {"maxRemediations": max, "window": "1h", "poolLabel": POOL},
    })
}

fn templates() -> Vec<TemplateView> {
    [("self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediationTemplate", "snr"), ("fence-agents-remediation.medik8s.io/v1alpha1", "FenceAgentsRemediationTemplate", "far")]
        .iter()
        .map(|(api, kind, name)| {
            TemplateView::read(&json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": {"template": {"spec": {}}}}))
                .expect("template")
        })
        .collect()
}

fn decide_nhc(
    spec: &Value,
    status: Option<&NodeHealthCheckStatus>,
    nodes: &[NodeView],
    objects: &[RemediationView],
    now: Timestamp,
) -> Plan<NodeHealthCheckStatus> {
    let mut v = json!({"apiVersion": "vigil.dev/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "nhc", "uid": "nhc-uid", "generation": 1}, "spec": spec});
    if let Some(s) = status {
        v["status"] = serde_json::to_value(s).expect("status");
    }
    let check: NodeHealthCheck = serde_json::from_value(v).expect("check");
    let policy = vigil_api::validate::node_health_check(&check).expect("valid");
    let refs: Vec<&NodeView> = nodes.iter().collect();
    let templates = templates();
    let template_refs: Vec<Option<&TemplateView>> = templates.iter().map(Some).collect();
    let objects: Vec<&RemediationView> = objects.iter().collect();
    node::decide(
        &NhcInput {
            check: &check,
            policy: &policy,
            nodes: &refs,
            templates: &template_refs,
            remediations: &objects,
            around: Default::default(),
        },
        now,
    )
}

/// The object a create action asks for, as the API server would return it at `now`.
fn made(plan: &Plan<NodeHealthCheckStatus>, now: Timestamp) -> Vec<RemediationView> {
    creates(plan)
        .into_iter()
        .map(|o| {
            let mut o = o.clone();
            let name =
                format!("{}-{}", o["metadata"]["name"].as_str().expect("name"), o["kind"].as_str().expect("kind"));
            o["metadata"]["uid"] = json!(format!("uid-{name}"));
            o["metadata"]["creationTimestamp"] = json!(now.to_string());
            RemediationView::read(&o).expect("named")
        })
        .collect()
}

#[test]
fn node_pools_come_from_the_pool_label_and_escalation_does_not_count_again() {
    let sick = |n: &str, pool: Option<&str>| {
        let b = node(n).ready("False", t0());
        match pool {
            Some(p) => b.label(POOL, p),
            None => b,
        }
        .build()
    };
    let nodes =
        [sick("n1", Some("gpu")), sick("n2", Some("gpu")), sick("n3", Some("cpu")), sick("n4", None), sick("n5", None)];
    let spec = nhc_spec(1);
    let first = decide_nhc(&spec, None, &nodes, &[], at(301));
    let targets: Vec<&str> = creates(&first).iter().map(|o| o["metadata"]["name"].as_str().expect("name")).collect();
    assert_eq!(targets, ["n1", "n3", "n4", "n5"], "n2 waits for gpu; unlabelled Nodes are pools of their own");
    let pools: Vec<(&str, &[String])> =
        first.status.features.backed_off_pools.iter().map(|p| (p.pool.as_str(), p.waiting.as_slice())).collect();
    assert_eq!(pools, [("karpenter.sh/nodepool=gpu", &["n2".to_string()][..])]);
    let n2 = first.status.unhealthy_nodes.iter().find(|e| e.name == "n2").expect("n2 listed");
    assert!(n2.remediations.is_empty(), "n2 is listed as unhealthy, with nothing started");

    // The first step times out after 5m: n1 escalates to the second step although gpu is at its
    // limit, since escalation only moves a started remediation along.
    let objects = made(&first, at(301));
    let later = decide_nhc(&spec, Some(&first.status), &nodes, &objects, at(301 + 301));
    let fence: Vec<&str> = creates(&later)
        .iter()
        .filter(|o| o["kind"] == "FenceAgentsRemediation")
        .map(|o| o["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(fence, ["n1", "n3", "n4", "n5"]);
    assert_eq!(later.status.features.remediation_history.len(), 4, "escalation steps are not counted");
    assert!(creates(&later).iter().all(|o| o["metadata"]["name"] != "n2"), "n2 still waits");
}

#[test]
fn a_node_that_fails_again_counts_again() {
    let spec = nhc_spec(1);
    let gpu = |status: &str, since: Timestamp| node("n1").ready(status, since).label(POOL, "gpu").build();
    let first = decide_nhc(&spec, None, &[gpu("False", t0())], &[], at(301));
    assert_eq!(creates(&first).len(), 1);
    let objects = made(&first, at(301));
    // Recovers at 400s: its object is removed.
    let healthy = decide_nhc(&spec, Some(&first.status), &[gpu("True", at(400))], &objects, at(401));
    assert_eq!(deleted_names(&healthy).len(), 1);
    let cleared = decide_nhc(&spec, Some(&healthy.status), &[gpu("True", at(400))], &[], at(402));
    // Fails again at 500s: a new incident in the same hour waits.
    let again = decide_nhc(&spec, Some(&cleared.status), &[gpu("False", at(500))], &[], at(801));
    assert_eq!(creates(&again).len(), 0, "{:?}", again.status);
    assert_eq!(again.status.features.backed_off_pools[0].resumes_at.0, at(301 + 3600));
    assert_eq!(again.next_wake, Some(at(3901)));
    let resumed = decide_nhc(&spec, Some(&again.status), &[gpu("False", at(500))], &[], at(3901));
    assert_eq!(creates(&resumed).len(), 1);
}

#[test]
fn node_dry_run_lists_only_what_the_back_off_allows_and_settles() {
    let mut spec = nhc_spec(1);
    spec["dryRun"] = json!(true);
    let sick = |n: &str| node(n).ready("False", t0()).label(POOL, "gpu").build();
    let nodes = [sick("n1"), sick("n2")];
    let first = decide_nhc(&spec, None, &nodes, &[], at(301));
    assert_eq!(first.actions, vec![]);
    let would: Vec<&str> = first.status.features.would_remediate.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(would, ["n1"], "n2 would wait for the back-off");
    assert_eq!(first.status.features.backed_off_pools[0].waiting, ["n2"]);
    assert!(
        first.status.features.remediation_history.iter().all(|r| r.dry_run),
        "{:?}",
        first.status.features.remediation_history
    );
    // Decided again on its own status: n1 is not counted again, nothing moves or is told again.
    let again = decide_nhc(&spec, Some(&first.status), &nodes, &[], at(900));
    assert_eq!(again.status, first.status);
    assert_eq!(again.notices, vec![]);
    // Live: the dry-run record does not hold the pool back.
    let live = decide_nhc(&nhc_spec(1), Some(&again.status), &nodes, &[], at(901));
    let targets: Vec<&str> = creates(&live).iter().map(|o| o["metadata"]["name"].as_str().expect("name")).collect();
    assert_eq!(targets, ["n1"]);
    assert_eq!(history_of(&live.status.features.remediation_history), [("n1".to_string(), at(901), false)]);
}

fn history_of(list: &[RemediationRecord]) -> Vec<(String, Timestamp, bool)> {
    list.iter().map(|r| (r.target.clone(), r.started.0, r.dry_run)).collect()
}
