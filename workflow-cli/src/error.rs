//! The command's errors: each says what went wrong and what to do, and maps to an exit status
//! scripts can tell apart.

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments are wrong (a malformed run id or JSON payload): exit status 2, like clap's
    /// own usage errors.
    #[error("{0}")]
    Usage(String),
    /// No such run, no active hook for the token: exit status 1.
    #[error("{0}")]
    NotFound(String),
    /// The database could not be opened, reached or read: exit status 3.
    #[error("{0}")]
    Database(String),
    /// The run is not in a state the command applies to (retrying a run that completed,
    /// forking past its last step); nothing was changed: exit status 4.
    #[error("{0}")]
    Refused(String),
    /// Anything else (the dashboard could not listen, output could not be written): exit 1.
    #[error("{0}")]
    Other(String),
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::NotFound(_) | CliError::Other(_) => 1,
            CliError::Database(_) => 3,
            CliError::Refused(_) => 4,
        }
    }

    /// The same error with its message passed through `f` (to scrub secrets from it).
    pub fn map_message(self, f: impl FnOnce(&str) -> String) -> Self {
        match self {
            CliError::Usage(m) => CliError::Usage(f(&m)),
            CliError::NotFound(m) => CliError::NotFound(f(&m)),
            CliError::Database(m) => CliError::Database(f(&m)),
            CliError::Refused(m) => CliError::Refused(f(&m)),
            CliError::Other(m) => CliError::Other(f(&m)),
        }
    }
}

/// No run `id` in this database.
pub fn not_found(id: workflow_core::RunId) -> CliError {
    CliError::NotFound(format!(
        "run {id} not found (`workflow runs` lists the runs in this database)"
    ))
}

impl From<workflow_core::StoreError> for CliError {
    fn from(e: workflow_core::StoreError) -> Self {
        match e {
            workflow_core::StoreError::RunNotFound(id) => {
                CliError::NotFound(format!("run {id} not found"))
            }
            other => CliError::Database(other.to_string()),
        }
    }
}

impl From<workflow_core::RunError> for CliError {
    fn from(e: workflow_core::RunError) -> Self {
        match e {
            workflow_core::RunError::NotFound(id) => not_found(id),
            workflow_core::RunError::Store(e) => e.into(),
            refused @ (workflow_core::RunError::NotRetryable { .. }
            | workflow_core::RunError::CannotFork { .. }
            | workflow_core::RunError::Ended { .. }
            | workflow_core::RunError::TooLarge(_)) => CliError::Refused(refused.to_string()),
            other => CliError::Other(other.to_string()),
        }
    }
}

impl From<workflow_core::RekeyError> for CliError {
    fn from(e: workflow_core::RekeyError) -> Self {
        match e {
            workflow_core::RekeyError::Store(e) => e.into(),
            workflow_core::RekeyError::NoKeys => CliError::Usage(e.to_string()),
            // A missing key or an unreadable payload: nothing past it was changed.
            other => CliError::Refused(other.to_string()),
        }
    }
}
