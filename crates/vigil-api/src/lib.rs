//! Vigil's API: the health-check resources, the rules that admit them, and read views of the
//! Cluster API and medik8s objects they act on.
//!
//! Specs keep upstream's wire shapes (strings for durations, int-or-string thresholds) so that an
//! upstream manifest works after changing its `apiVersion`; [`validate`] turns a spec into a typed
//! policy, and only a policy reaches the engine, so an invalid spec can never cause remediation.

pub mod admission;
pub mod api_version;
pub mod conditions;
pub mod crd;
pub mod duration;
pub mod failure_domains;
pub mod intern;
pub mod machine_health_check;
pub mod manifest;
pub mod node_health_check;
pub mod node_view;
pub mod reason;
pub mod schema;
pub mod selector;
pub mod shared;
pub mod threshold;
pub mod validate;
pub mod views;
pub mod well_known;

pub use machine_health_check::{MachineHealthCheck, MachineHealthCheckSpec, MachineHealthCheckStatus};
pub use node_health_check::{NodeHealthCheck, NodeHealthCheckSpec, NodeHealthCheckStatus};

/// API group of Vigil's own resources.
pub const GROUP: &str = "vigil.dev";
/// API version of Vigil's own resources.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` string of Vigil's own resources.
pub const API_VERSION: &str = "vigil.dev/v1alpha1";
