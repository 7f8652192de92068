//! Schedules: recurring runs of a workflow at the nominal times of a cron expression in a time
//! zone, or of a fixed period. This module holds what a schedule's times are (`timing`); the
//! runtime's firing of ticks, their records in the store, and the client API build on it.

// Used by the schedules capability as it lands; only the tests call it yet.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod timing;

#[cfg(test)]
mod tests;
