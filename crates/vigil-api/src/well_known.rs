//! Label, annotation and condition names shared with Cluster API and medik8s; they are contracts
//! with other controllers, so they live in one place.

/// Label on Cluster API objects naming their Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label naming the MachineDeployment of a Machine (a back-off pool).
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Label that marks a control-plane Machine.
pub const CONTROL_PLANE_MACHINE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Annotation that pauses reconciliation of a Cluster API object (and of an MHC).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation that keeps a Machine out of health checking entirely.
pub const SKIP_REMEDIATION_ANNOTATION: &str = "cluster.x-k8s.io/skip-remediation";
/// Annotation by which a user asks for a Machine to be remediated now.
pub const REMEDIATE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";

/// Node label that keeps a node out of NodeHealthCheck remediation.
pub const EXCLUDE_FROM_REMEDIATION_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// Remediation-object annotation naming the node it remediates.
pub const NODE_NAME_ANNOTATION: &str = "remediation.medik8s.io/node-name";
/// Remediation-object annotation naming the template it came from.
pub const TEMPLATE_NAME_ANNOTATION: &str = "remediation.medik8s.io/template-name";
/// Remediation-object annotation set when NHC gives up on it and escalates.
pub const NHC_TIMED_OUT_ANNOTATION: &str = "remediation.medik8s.io/nhc-timed-out";
/// Template annotation saying the remediator handles several objects per node (generateName).
pub const MULTIPLE_TEMPLATES_SUPPORT_ANNOTATION: &str = "remediation.medik8s.io/multiple-templates-support";
/// Node annotation by which an operator confirms a node healthy when `healthyDelay` is negative.
pub const MANUALLY_CONFIRMED_HEALTHY_ANNOTATION: &str = "remediation.medik8s.io/manually-confirmed-healthy";
/// Vigil's annotation on a remediation object it made under remediation per condition: the rule
/// that started the incident (`spec.unhealthyConditions[1] KernelDeadlock=True`), so the
/// incident keeps its remediation across restarts.
pub const RULE_ANNOTATION: &str = "vigil.dev/rule";
/// Node labels that mark a control-plane node.
pub const CONTROL_PLANE_NODE_LABELS: [&str; 2] =
    ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"];

/// Machine condition carrying the health verdict.
pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";
/// Machine condition asking the owner (MachineSet, KCP) to remediate.
pub const OWNER_REMEDIATED: &str = "OwnerRemediated";
/// Machine condition recording an external remediation request.
pub const EXTERNALLY_REMEDIATED: &str = "ExternallyRemediated";
/// Health-check condition saying whether the short-circuit allows remediation.
pub const REMEDIATION_ALLOWED: &str = "RemediationAllowed";
/// Health-check condition saying the check is paused.
pub const PAUSED: &str = "Paused";
/// NodeHealthCheck condition saying the check cannot work (e.g. template missing).
pub const DISABLED: &str = "Disabled";
/// Remediation-object condition a remediator sets when it finished (True) or gave up (False).
pub const SUCCEEDED: &str = "Succeeded";
/// Remediation-object condition saying the node is expected to be deleted for good.
pub const PERMANENT_NODE_DELETION_EXPECTED: &str = "PermanentNodeDeletionExpected";
/// Cluster condition: the control plane has been initialized.
pub const CONTROL_PLANE_INITIALIZED: &str = "ControlPlaneInitialized";
/// Cluster / Machine condition: infrastructure is ready.
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";

/// Namespace of medik8s' node Leases unless `LEASE_NAMESPACE` names another (medik8s/common).
pub const DEFAULT_LEASE_NAMESPACE: &str = "medik8s-leases";
/// Environment variable by which medik8s components move their node Leases to another namespace.
pub const LEASE_NAMESPACE_ENV: &str = "LEASE_NAMESPACE";
/// Holder identity of the node maintenance operator's node Lease.
pub const NODE_MAINTENANCE_LEASE_HOLDER: &str = "node-maintenance";
/// Taint the node maintenance operator puts on a Node it drains.
pub const MEDIK8S_DRAIN_TAINT: &str = "medik8s.io/drain";
/// Taint the cluster autoscaler puts on a Node it is about to delete (scale-down).
pub const CLUSTER_AUTOSCALER_DELETE_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Taint Karpenter (v1) puts on a Node it is disrupting (consolidation, drift, expiry).
pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// Taint Karpenter's v1beta1 releases put on a Node they are disrupting.
pub const KARPENTER_DISRUPTION_TAINT_V1BETA1: &str = "karpenter.sh/disruption";
/// Node annotation kured sets (with `--annotate-nodes`) while it drains and reboots the Node.
pub const KURED_REBOOT_IN_PROGRESS_ANNOTATION: &str = "weave.works/kured-reboot-in-progress";
/// Node annotation: the machine config a Node runs (OpenShift's machine config operator).
pub const CURRENT_MACHINE_CONFIG_ANNOTATION: &str = "machineconfiguration.openshift.io/currentConfig";
/// Node annotation: the machine config a Node is being moved to; differing from the current one
/// while the Node is updated (how a hosted control plane's upgrade shows on its Nodes).
pub const DESIRED_MACHINE_CONFIG_ANNOTATION: &str = "machineconfiguration.openshift.io/desiredConfig";
/// `ClusterVersion` condition that is `True` while OpenShift moves to another version.
pub const CLUSTER_VERSION_PROGRESSING: &str = "Progressing";
/// NodeHealthCheck condition: new remediations wait for the whole cluster (an upgrade).
pub const REMEDIATION_POSTPONED: &str = "RemediationPostponed";
/// The key that names a Machine's own `spec.failureDomain` (MachineHealthCheck only) instead of
/// a label of its Node.
pub const MACHINE_FAILURE_DOMAIN_KEY: &str = "spec.failureDomain";
/// `apiVersion` of Cluster API's MachineHealthCheck, read as Vigil's own.
pub const CAPI_MHC_API_VERSION: &str = "cluster.x-k8s.io/v1beta1";
/// `apiVersion` of Cluster API's current MachineHealthCheck (`spec.checks`, `spec.remediation`),
/// read by moving its fields to Vigil's names ([`crate::manifest::v1beta2_as_vigil`]).
pub const CAPI_MHC_V1BETA2_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";
/// `apiVersion` of medik8s' NodeHealthCheck, read as Vigil's own.
pub const MEDIK8S_NHC_API_VERSION: &str = "remediation.medik8s.io/v1alpha1";
/// Label medik8s puts on every remediation object a health check creates, naming the component
/// that made it (remediators and tools select them by it).
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// The value of [`PART_OF_LABEL`] on remediation objects: the NodeHealthCheck operator's name,
/// kept so that what a remediator sees does not change when Vigil makes the object.
pub const PART_OF_NODE_HEALTHCHECK: &str = "node-healthcheck-controller";
/// Label (empty value) on the remediation objects of control-plane Nodes: medik8s counts them,
/// whoever owns them, to remediate one control-plane Node at a time.
pub const CONTROL_PLANE_NODE_OBJECT_LABEL: &str = "remediation.medik8s.io/isControlPlaneNode";
/// Node annotation naming the Node's OpenShift Machine API Machine, as `namespace/name`.
pub const OPENSHIFT_MACHINE_ANNOTATION: &str = "machine.openshift.io/machine";
/// API version of OpenShift Machine API Machines (owners of a Node's remediation objects).
pub const OPENSHIFT_MACHINE_API_VERSION: &str = "machine.openshift.io/v1beta1";
