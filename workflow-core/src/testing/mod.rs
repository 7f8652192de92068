//! Support for testing code built on this crate, behind the `testing` feature: what a crate
//! needs to hold its own code to the contracts this crate's code is held to.
//!
//! - [`store`]: the store conformance suite, for authors of a [`Store`](crate::store::Store).
//! - [`replay()`]: replay tests of workflow code against exported run histories
//!   ([`replay_with_keys()`] for encrypted ones).
//!
//! Enable it for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! workflow-core = { version = "0.1", features = ["testing"] }
//! ```

mod failpoint;
mod replay;
pub mod store;

pub use failpoint::{failpoint, FAILPOINT_ENV};

pub use replay::{replay, replay_with_keys, ReplayError};
