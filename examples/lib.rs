//! Runnable examples of workflow-rs; see the `[[example]]` targets.
