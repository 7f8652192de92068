//! Failpoints for crash tests with real processes: a worker process started with
//! `WORKFLOW_FAILPOINT=<name>` aborts (as a SIGKILL would stop it) when it reaches the point of
//! that name, e.g. `continue_as_new.before_commit`, after the decision was taken and before
//! the store call that commits it.

use std::sync::OnceLock;

/// The environment variable naming the failpoint a process aborts at.
pub const FAILPOINT_ENV: &str = "WORKFLOW_FAILPOINT";

/// Aborts the process if [`FAILPOINT_ENV`] names `name`; nothing otherwise (the variable is
/// read once).
#[doc(hidden)]
pub fn failpoint(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(FAILPOINT_ENV).ok());
    if armed.as_deref() == Some(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
