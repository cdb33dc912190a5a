//! What the admission rules say and where their bounds lie, shared by the controller's validator
//! ([`crate::validate`]) and the CRD's schema rules ([`crate::schema`]) so both refuse a spec with
//! the same words.

use jiff::SignedDuration;

/// Largest `backoff.maxRemediations`: the history keeps that many records per pool.
pub const MAX_BACKOFF_REMEDIATIONS: i32 = 100;

/// How long a Node is still left alone after its maintenance ends, unless the check says.
pub const DEFAULT_MAINTENANCE_GRACE: SignedDuration = SignedDuration::from_mins(10);
/// The longest `plannedMaintenance.grace`: a longer one would hide a Node that did not come back.
pub const MAX_MAINTENANCE_GRACE: SignedDuration = SignedDuration::from_hours(24);

/// Machine conditions an `unhealthyMachineConditions` rule may not name (Cluster API's CRD rule):
/// summaries of the Machine, or conditions the health check itself writes, whose use would feed
/// a check's verdict back into itself.
pub const RESERVED_MACHINE_CONDITIONS: [&str; 5] =
    ["Ready", "Available", "HealthCheckSucceeded", "OwnerRemediated", "ExternallyRemediated"];

/// Template kind of medik8s' MachineDeletionRemediation, which upstream forbids with `maxUnhealthy`.
pub const MACHINE_DELETION_REMEDIATION_TEMPLATE: &str = "MachineDeletionRemediationTemplate";

/// Smallest non-zero `nodeStartupTimeout` upstream accepts.
pub const MIN_NODE_STARTUP_TIMEOUT: SignedDuration = SignedDuration::from_secs(30);
/// Default `nodeStartupTimeout`.
pub const DEFAULT_NODE_STARTUP_TIMEOUT: SignedDuration = SignedDuration::from_secs(600);
/// Smallest escalation step timeout medik8s accepts.
pub const MIN_ESCALATION_TIMEOUT: SignedDuration = SignedDuration::from_secs(60);
/// Smallest `maxConditionAge`: reporters heartbeat at intervals (a detector every few minutes,
/// the kubelet rewrites unchanged conditions every 5m), so a shorter age would call live
/// reporters stale between two heartbeats.
pub const MIN_MAX_CONDITION_AGE: SignedDuration = SignedDuration::from_secs(60);
/// Why `maxConditionAge` may not guard a `Ready` rule.
pub const MAX_CONDITION_AGE_ON_READY: &str = "must not be set on a Ready rule: the node lifecycle controller already turns a Ready whose kubelet stopped reporting into Unknown; a stale Ready is exactly the dead-kubelet signal";
/// Why `maxConditionAge` may not be set on a Machine condition rule.
pub const MAX_CONDITION_AGE_ON_MACHINE: &str =
    "must not be set on a Machine condition rule: Machine conditions carry no heartbeat";
/// Why an empty `reasons` list is refused.
pub const EMPTY_REASONS: &str =
    "must not be empty: leave reasons out to match the condition whatever its reason, or list at least one";
/// Most entries a rule's `reasons` may list (the CRD's `maxItems`); a detector has a handful
/// per condition.
pub const REASONS_MAX_ITEMS: usize = 32;
/// Longest reason a rule's `reasons` may list (the CRD's `maxLength`), in characters (condition
/// reasons are CamelCase words).
pub const REASON_MAX_LENGTH: usize = 256;
/// Why a `reasons` entry that repeats an earlier one is refused.
pub const DUPLICATE_REASON: &str = "must be unique: the same reason is listed twice";
/// Why a rule may not set both its own `remediationTemplate` and `escalatingRemediations`.
pub const RULE_REMEDIATION_BOTH: &str =
    "only one of remediationTemplate and escalatingRemediations may be set on a rule (neither: the check's own)";
/// Fewest `flapping.episodes`: one episode is an ordinary incident, not a flap.
pub const MIN_FLAPPING_EPISODES: i32 = 2;
/// Most `flapping.episodes`: the status keeps that many episodes per target.
pub const MAX_FLAPPING_EPISODES: i32 = 20;
/// Why a `flapping.episodes` out of bounds is refused.
pub const FLAPPING_EPISODES_MESSAGE: &str = "must be at least 2 and at most 20";
/// Why a `flapping.window` out of bounds is refused.
pub const FLAPPING_WINDOW_BOUNDS: &str = "must be at least 1m and at most 24h";
/// Why a `flapping.window` shorter than a rule's duration is refused (the longest is named).
pub const FLAPPING_WINDOW_SHORT: &str = "must not be shorter than the longest rule duration";
/// Most `unhealthyExpressions`: each is evaluated for every selected Node at every decision.
pub const MAX_EXPRESSIONS: usize = 16;
/// Why a list of more than [`MAX_EXPRESSIONS`] expressions is refused.
pub const TOO_MANY_EXPRESSIONS: &str = "must have at most 16 items";
/// Why a NodeHealthCheck expression that reads `machine` is refused.
pub const NO_MACHINE_ON_NODE_CHECK: &str =
    "reads `machine`, and a NodeHealthCheck's targets are Nodes without a Machine: read `node` only";
/// Longest `unhealthyExpressions[].expression`, the expression compiler's own bound.
pub const EXPRESSION_MAX_LENGTH: usize = vigil_expr::limits::MAX_SOURCE_BYTES;
/// Why a `voluntaryDisruptions` value is refused.
pub const VOLUNTARY_DISRUPTIONS_MESSAGE: &str = "must be one of Ignore, Count";
/// Why a `maxInFlight` of `0` or `0%` is refused.
pub const MAX_IN_FLIGHT_ZERO: &str = "must be at least 1 (or 1%): 0 would never remediate anything; to stop remediation use maxUnhealthy or pause the check";
/// Why a `maxConditionAge` below [`MIN_MAX_CONDITION_AGE`] is refused.
pub const MAX_CONDITION_AGE_TOO_SHORT: &str =
    "must be at least 1m: reporters heartbeat at intervals, so a shorter age calls a live reporter stale";

/// Why a MachineHealthCheck refuses `backoff.poolLabel` (shared with `validate.rs`).
pub const MHC_POOL_LABEL_MESSAGE: &str = "must not be set on a MachineHealthCheck: its pools are the Machines' \
     MachineDeployment, else their controlling owner";
/// Why a NodeHealthCheck needs `backoff.poolLabel` (shared with `validate.rs`).
pub const NHC_POOL_LABEL_MESSAGE: &str = "must be set on a NodeHealthCheck: the Node label whose value names \
     a Node's pool, e.g. karpenter.sh/nodepool";
