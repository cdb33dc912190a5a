//! The read side of Vigil, shared by `vigil run` and `vigil simulate`: the observed objects kept
//! as typed stores ([`index`]), which checks a change concerns (the stores' `put_*` methods),
//! who holds which target ([`claims`]) and a check's decision gathered from them ([`gather`]).
//! No I/O and no clock: the controller fills the stores from its watches, the simulator from its
//! scenario, and both apply the same [`gather::Job`]s.

pub mod around;
pub mod claims;
pub mod decision;
pub mod gather;
pub mod index;
pub mod lenient;
pub mod sources;
pub mod upstream;
