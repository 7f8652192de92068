//! The bookkeeping of schema migrations, the same for both dialects: every applied
//! migration is a row of `workflow_migrations (version, name, applied_at)`, and opening a
//! store decides from the tables it finds what to do — create the schema, migrate it,
//! accept it, or refuse it (another application's tables, a newer or a damaged store) —
//! before anything is written. The dialects run the decision's DDL in one transaction that
//! other processes opening the same store wait for.

use std::fmt;
use std::future::Future;

use crate::error::StoreError;

/// One step of a dialect's schema history. Released migrations are frozen: change the
/// schema by appending one.
pub(in crate::store) struct Migration {
    /// From 1, one more than the previous migration's.
    pub version: i64,
    /// What it does, recorded in `workflow_migrations.name`.
    pub name: &'static str,
    pub ddl: &'static str,
}

/// The table recording migrations (`{schema}` stands for the dialect's schema).
pub(in crate::store) const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS \
     {schema}.workflow_migrations (
         version    INTEGER PRIMARY KEY,
         name       TEXT NOT NULL,
         applied_at BIGINT NOT NULL
     )";

/// Where a store lives, for messages: a file or a schema.
pub(in crate::store) struct Place {
    /// `orders.db`, or ``schema `workflow` at app@db:5432/app``.
    pub shown: String,
    /// `file` or `schema`: what the user should give the store of its own.
    pub kind: &'static str,
    /// Says what else the place holds (`is a SQLite database but not a workflow-rs store`).
    pub foreign: &'static str,
    /// What the place may hold beside the store when the store is created in it.
    pub others: Others,
}

/// Whether a store may be created in a place that already holds tables of its own.
#[derive(Clone, Copy)]
pub(in crate::store) enum Others {
    /// No: the place is refused (a mistyped path must not gain a store's tables); `hint`
    /// says how to ask for the other answer, if there is one.
    Refused { hint: &'static str },
    /// Yes, when none of them has the name of a table the store creates: the application's
    /// tables stay as they are, beside the store's (SQLite's transactional steps write to
    /// the file that holds the store).
    Kept,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The migrations that bring a store to the newest version, given the tables found in
/// `place` and the last version `workflow_migrations` records (`None` when that table is
/// missing). `required` lists each table with the version that creates it: a store that
/// lacks one it should have is reported as damaged, not half-migrated.
pub(in crate::store) fn pending<'m>(
    migrations: &'m [Migration],
    required: &[(&str, i64)],
    place: &Place,
    tables: &[String],
    version: Option<i64>,
) -> Result<&'m [Migration], StoreError> {
    let newest = migrations.last().map_or(0, |m| m.version);
    let version = match version {
        Some(v) => v,
        None if tables.is_empty() => 0,
        None if matches!(place.others, Others::Kept) => {
            let created = created_tables(migrations);
            let taken: Vec<String> = tables
                .iter()
                .filter(|t| created.contains(&t.as_str()))
                .map(|t| format!("`{t}`"))
                .collect();
            if !taken.is_empty() {
                return Err(StoreError::Incompatible(format!(
                    "{place} {} and has tables the store would create ({}); give the store a \
                     {} of its own",
                    place.foreign,
                    taken.join(", "),
                    place.kind
                )));
            }
            0
        }
        None => {
            let hint = match place.others {
                Others::Refused { hint } => hint,
                Others::Kept => "",
            };
            let list = tables
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(StoreError::Incompatible(format!(
                "{place} {} (it has tables {list}); give the store a {} of its own{hint}",
                place.foreign, place.kind
            )));
        }
    };
    if version > newest {
        return Err(StoreError::Incompatible(format!(
            "{place} holds a workflow-rs store of schema version {version}, written by a newer \
             workflow-rs; this build reads schema versions up to {newest}; upgrade workflow-rs \
             to open it"
        )));
    }
    if version < 0 {
        return Err(StoreError::Incompatible(format!(
            "{place} holds a workflow-rs store with an unknown schema version \
             (this build reads schema versions 1 to {newest})"
        )));
    }
    for (needed, since) in required {
        if *since <= version && !tables.iter().any(|t| t == needed) {
            return Err(StoreError::Incompatible(format!(
                "{place} holds a damaged workflow-rs store: table `{needed}` is missing"
            )));
        }
    }
    let first = migrations.partition_point(|m| m.version <= version);
    Ok(&migrations[first..])
}

/// The names of the tables `migrations` create (`CREATE TABLE [IF NOT EXISTS]
/// [{schema}.]name`), the bookkeeping table included.
pub(in crate::store) fn created_tables(migrations: &[Migration]) -> Vec<&str> {
    let mut names = vec!["workflow_migrations"];
    for m in migrations {
        let mut rest = m.ddl;
        while let Some(at) = rest.find("CREATE TABLE ") {
            rest = &rest[at + "CREATE TABLE ".len()..];
            let name = rest.trim_start();
            let name = name
                .strip_prefix("IF NOT EXISTS ")
                .unwrap_or(name)
                .trim_start();
            let name = name.strip_prefix("{schema}.").unwrap_or(name);
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            if end > 0 && !names.contains(&&name[..end]) {
                names.push(&name[..end]);
            }
        }
    }
    names
}

/// What opening a store runs, inside the dialect's transaction.
pub(in crate::store) trait Schema {
    /// The tables and views in the store's place, by name.
    fn tables(&mut self) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// The last version `workflow_migrations` records (the table exists).
    fn recorded(&mut self) -> impl Future<Output = Result<i64, StoreError>>;

    /// The version of a store that keeps its bookkeeping in an older layout, if `tables` are
    /// one (SQLite's `workflow_meta`); nothing is converted yet.
    fn legacy(
        &mut self,
        tables: &[String],
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> {
        let _ = tables;
        async { Ok(None) }
    }

    /// Runs `ddl` (several statements; `{schema}` stands for the store's schema).
    fn execute(&mut self, ddl: &str) -> impl Future<Output = Result<(), StoreError>>;

    /// Records migration `m` as applied now.
    fn record(&mut self, m: &Migration) -> impl Future<Output = Result<(), StoreError>>;
}

/// Creates the schema in an empty place, accepts (and migrates) a workflow-rs store, and
/// rejects anything else, writing nothing then.
pub(in crate::store) async fn migrate(
    schema: &mut impl Schema,
    migrations: &[Migration],
    required: &[(&str, i64)],
    place: &Place,
) -> Result<(), StoreError> {
    let tables = schema.tables().await?;
    let (version, legacy) = if tables.iter().any(|t| t == "workflow_migrations") {
        (Some(schema.recorded().await?), false)
    } else {
        let legacy = schema.legacy(&tables).await?;
        (legacy, legacy.is_some())
    };
    let pending = pending(migrations, required, place, &tables, version)?;
    if pending.is_empty() {
        return Ok(());
    }
    let from = version.unwrap_or(0);
    schema.execute(MIGRATIONS_TABLE).await?;
    if legacy {
        // What the old layout said, as rows: the migrations the store already had.
        for m in migrations.iter().take_while(|m| m.version <= from) {
            schema.record(m).await?;
        }
    }
    for m in pending {
        schema.execute(m.ddl).await.map_err(|e| match e {
            StoreError::Database(e) => StoreError::Database(e.context(format!(
                "cannot migrate {place} to schema version {}",
                m.version
            ))),
            e => e,
        })?;
        schema.record(m).await?;
    }
    tracing::info!(store = %place, from, to = ?pending.last().map(|m| m.version), "migrated the workflow-rs store");
    Ok(())
}
