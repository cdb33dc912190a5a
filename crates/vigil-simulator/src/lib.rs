//! `vigil simulate`: runs the real decision engine against a scenario — objects plus a
//! timeline — on a virtual clock, exactly as the controller would, and reports what happened.

mod feed;
pub mod output;
pub mod owner;
pub mod scenario;
pub mod simulation;
pub mod store;

pub use scenario::{Scenario, ScenarioError};
pub use simulation::{Report, Start, simulate, simulate_owned, simulate_packed};
