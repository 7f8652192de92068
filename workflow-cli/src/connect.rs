//! Opening the store a command inspects: a SQLite file (`--db`) or a PostgreSQL database
//! (`--database-url`, with the `postgres` feature), through a client-only runtime, so that
//! cancel and resume take the same paths as in an application.

use std::path::PathBuf;
use std::time::Duration;

use workflow_core::Runtime;

use crate::error::CliError;

/// How long reaching a database may take before the command gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Where the store is.
#[derive(Debug, Clone)]
pub enum Target {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl Target {
    /// For messages: the file, or the URL without its password.
    pub fn describe(&self) -> String {
        match self {
            Target::Sqlite(p) => p.display().to_string(),
            Target::Postgres { url, schema } => format!("{} (schema {schema})", redact(url)),
        }
    }
}

/// `postgres://user:secret@host/db` without `secret`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

/// A runtime on `target` that executes nothing: it only reads and acts on runs.
pub async fn open(target: &Target) -> Result<Runtime, CliError> {
    let builder = match target {
        Target::Sqlite(path) => {
            // Opening a missing file would create an empty store and report nothing wrong.
            if !path.is_file() {
                return Err(CliError::Database(format!(
                    "no database at {}: the file does not exist (pass --db <path> to the \
                     SQLite file your workflows use, or --database-url for PostgreSQL)",
                    path.display()
                )));
            }
            Runtime::builder().sqlite(path)
        }
        #[cfg(feature = "postgres")]
        Target::Postgres { url, schema } => Runtime::builder().postgres(url).schema(schema),
        #[cfg(not(feature = "postgres"))]
        Target::Postgres { .. } => {
            return Err(CliError::Usage(
                "this `workflow` was built without PostgreSQL support; rebuild it with \
                 `--features postgres` to use --database-url"
                    .to_owned(),
            ))
        }
    };
    let built = tokio::time::timeout(CONNECT_TIMEOUT, builder.worker(false).build()).await;
    match built {
        Ok(Ok(rt)) => Ok(rt),
        Ok(Err(e)) => Err(CliError::Database(format!(
            "cannot open the database at {}: {e}",
            target.describe()
        ))),
        Err(_) => Err(CliError::Database(format!(
            "cannot open the database at {}: no answer within {}s",
            target.describe(),
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app@db:5432/x"
        );
        assert_eq!(redact("postgres://db/x"), "postgres://db/x");
    }
}
