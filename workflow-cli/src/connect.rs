//! Opening the store a command inspects: a SQLite file (`--db`) or a PostgreSQL database
//! (`--database-url`, with the `postgres` feature), through a client-only runtime, so that
//! cancel and resume take the same paths as in an application.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use workflow_core::{Keys, Runtime};

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
    /// For messages: the file, or the connection string without its passwords.
    pub fn describe(&self) -> String {
        match self {
            Target::Sqlite(p) => p.display().to_string(),
            Target::Postgres { url, schema } => format!("{} (schema {schema})", redact(url)),
        }
    }

    /// `message` with every password of the connection string replaced by `***`, wherever it
    /// appears: a driver's error may quote the string it was given.
    pub fn scrub(&self, message: &str) -> String {
        match self {
            Target::Sqlite(_) => message.to_owned(),
            Target::Postgres { url, .. } => scrub(message, url),
        }
    }
}

/// Keys whose values are secrets: `password`, and libpq's `sslpassword` for a client key.
fn is_secret_key(key: &str) -> bool {
    key.trim().to_ascii_lowercase().ends_with("password")
}

/// Where the secrets are in `conn`, a URL (`postgres://user:secret@host/db?password=..`) or a
/// libpq `key=value` string (`host=db password='it''s'`).
fn secret_spans(conn: &str) -> Vec<Range<usize>> {
    match conn.find("://") {
        Some(i) => url_secrets(conn, i + 3),
        None => key_value_secrets(conn),
    }
}

fn url_secrets(conn: &str, start: usize) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let query = conn[start..].find('?').map_or(conn.len(), |q| start + q);
    // The host follows the *last* `@`: a password typed unencoded may hold `@` itself.
    if let Some(at) = conn[start..query].rfind('@').map(|a| start + a) {
        if let Some(colon) = conn[start..at].find(':').map(|c| start + c) {
            spans.push(colon + 1..at);
        }
    }
    if query < conn.len() {
        let mut pos = query + 1;
        for param in conn[query + 1..].split('&') {
            if let Some((key, _)) = param.split_once('=') {
                if is_secret_key(key) {
                    spans.push(pos + key.len() + 1..pos + param.len());
                }
            }
            pos += param.len() + 1;
        }
    }
    spans
}

/// libpq's `key = value` pairs, values bare or single-quoted with `\` escapes. An unterminated
/// quote runs to the end, so a malformed string hides too much rather than too little.
fn key_value_secrets(conn: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut i = 0;
    let skip_space = |i: usize| {
        conn[i..]
            .find(|c: char| !c.is_whitespace())
            .map_or(conn.len(), |n| i + n)
    };
    loop {
        i = skip_space(i);
        if i >= conn.len() {
            return spans;
        }
        let key_end = conn[i..]
            .find(|c: char| c == '=' || c.is_whitespace())
            .map_or(conn.len(), |n| i + n);
        let key = &conn[i..key_end];
        i = skip_space(key_end);
        if !conn[i..].starts_with('=') {
            // Not a pair; the word was skipped above (or the string ended).
            continue;
        }
        let value = skip_space(i + 1);
        let end = if conn[value..].starts_with('\'') {
            let mut escaped = false;
            conn[value + 1..]
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(conn.len(), |(n, _)| value + 1 + n + 1)
        } else {
            conn[value..]
                .find(char::is_whitespace)
                .map_or(conn.len(), |n| value + n)
        };
        if is_secret_key(key) {
            spans.push(value..end);
        }
        // An empty key (`=x`) still moves on: `end` is past the `=`.
        i = end.max(i + 1);
    }
}

/// `conn` with each password replaced by `***`.
fn redact(conn: &str) -> String {
    let mut out = String::with_capacity(conn.len());
    let mut from = 0;
    for span in secret_spans(conn) {
        out.push_str(&conn[from..span.start]);
        out.push_str("***");
        from = span.end;
    }
    out.push_str(&conn[from..]);
    out
}

/// `message` with the passwords of `conn` replaced by `***`, as written in `conn`, unquoted, and
/// percent-decoded, the forms a driver may echo.
fn scrub(message: &str, conn: &str) -> String {
    let mut secrets = Vec::new();
    for span in secret_spans(conn) {
        let raw = &conn[span];
        secrets.push(raw.to_owned());
        secrets.push(percent_decode(raw));
        if let Some(inner) = raw
            .strip_prefix('\'')
            .map(|r| r.strip_suffix('\'').unwrap_or(r))
        {
            secrets.push(inner.replace("\\'", "'").replace("\\\\", "\\"));
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = message.to_owned();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(s.as_str(), "***");
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A runtime on `target` that executes nothing: it only reads and acts on runs.
/// With `keys`, it reads encrypted payloads.
pub async fn open(target: &Target, keys: Option<Keys>) -> Result<Runtime, CliError> {
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
    let builder = match keys {
        Some(keys) => builder.encryption(keys),
        None => builder,
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
    fn hides_passwords_in_urls() {
        let cases = [
            (
                "postgres://app:s3cret@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            ("postgres://db/x", "postgres://db/x"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            // Unencoded `@` and `:` in the password: the host follows the last `@`.
            ("postgres://app:p@ss:w@rd@db/x", "postgres://app:***@db/x"),
            ("postgresql://app:@db/x", "postgresql://app:***@db/x"),
            (
                "postgres://app@db/x?sslmode=require&password=s3cret&application_name=a",
                "postgres://app@db/x?sslmode=require&password=***&application_name=a",
            ),
            (
                "postgres://db/x?PASSWORD=a@b",
                "postgres://db/x?PASSWORD=***",
            ),
            (
                "postgres://db/x?sslpassword=k",
                "postgres://db/x?sslpassword=***",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn hides_passwords_in_key_value_strings() {
        let cases = [
            (
                "host=db user=app password=s3cret dbname=x",
                "host=db user=app password=*** dbname=x",
            ),
            (
                "host=db password = 'it\\'s a secret' dbname=x",
                "host=db password = *** dbname=x",
            ),
            ("password='never closed dbname=x", "password=***"),
            ("host=db sslpassword=k", "host=db sslpassword=***"),
            ("host=db stray password", "host=db stray password"),
            ("=x password=", "=x password=***"),
        ];
        for (conn, want) in cases {
            assert_eq!(redact(conn), want, "{conn}");
        }
    }

    #[test]
    fn scrubs_passwords_from_messages() {
        let conn = "postgres://app:p%40ss@db/x?password=two";
        assert_eq!(
            scrub("auth failed for p%40ss, p@ss and two", conn),
            "auth failed for ***, *** and ***"
        );
        assert_eq!(scrub("bad: it's", "host=db password='it\\'s'"), "bad: ***");
        assert_eq!(scrub("no secret here", "postgres://db/x"), "no secret here");
    }
}
