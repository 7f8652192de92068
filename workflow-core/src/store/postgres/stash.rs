//! The connections: the `Stash` keeping connections between uses instead of giving them back
//! to sqlx's pool, the transactions opened on them (`StashTx`) and how a transaction ends
//! (`settle`). It runs no statement of its own beyond BEGIN, COMMIT and ROLLBACK.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{Executor, PgConnection, Postgres};

use crate::error::StoreError;

/// Connections out through the `Stash` at most, in use or kept between uses: twice this
/// machine's cores, from 4 to 16. Each operation holds one for a few round trips. More
/// connections than the work can keep busy cost more than they give: each warms up on its own
/// (statements prepared and planned, catalogs read), and PostgreSQL serves them in turns. On
/// this project's 2-core test machine, W3 (1,000 one-step runs, 100 in flight) printed
/// 5,221 and 5,038 runs/s with 4, 4,619-4,699 with 6, 4,552-4,591 with 8, 3,486-4,447 with 12.
pub(super) fn stash_size() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (2 * cores).clamp(4, 16)
}
/// How long an operation waits for a free pooled connection.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections kept between uses instead of given back to sqlx's pool, which pings each
/// connection given back (one more round trip, and a task, per use). A kept connection is
/// used again as it is: sqlx reads whatever an earlier, cancelled use left unread before its
/// next statement. One whose use failed on the database's or the network's side goes back to
/// the pool, which checks it and closes it if it is broken.
///
/// At most [`stash_size`] connections are out through the stash at a time, and a caller waits for
/// a permit rather than for the pool: a connection given back to the stash reaches the next
/// caller, where one waiting on the pool would never see it.
pub(super) struct Stash {
    pub(super) pool: PgPool,
    pub(super) idle: std::sync::Mutex<Vec<PoolConnection<Postgres>>>,
    pub(super) permits: tokio::sync::Semaphore,
}

impl Stash {
    pub(super) fn new(pool: PgPool) -> Self {
        Stash {
            pool,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: tokio::sync::Semaphore::new(stash_size()),
        }
    }

    /// A kept connection, or else one from the pool.
    pub(super) async fn conn(&self) -> Result<Conn<'_>, StoreError> {
        // A free permit at once, as usual; the timer only for a wait.
        let permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) => tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.acquire())
                .await
                .map_err(|_| StoreError::from(sqlx::Error::PoolTimedOut))?
                .map_err(|_| StoreError::from(sqlx::Error::PoolClosed))?,
        };
        let kept = crate::sync::lock(&self.idle).pop();
        let conn = match kept {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        Ok(Conn {
            stash: self,
            conn: Some(conn),
            keep: true,
            _permit: permit,
        })
    }
}

/// A connection from the [`Stash`], kept again when dropped unless its use failed.
pub(super) struct Conn<'a> {
    pub(super) stash: &'a Stash,
    /// Always `Some` until dropped.
    pub(super) conn: Option<PoolConnection<Postgres>>,
    pub(super) keep: bool,
    /// Given back after the connection (fields drop in order).
    pub(super) _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Conn<'_> {
    /// Passes on `result`, the outcome of this connection's use: after a database error the
    /// connection goes back to the pool instead of being kept.
    pub(super) fn kept<T, E: Into<StoreError>>(
        mut self,
        result: Result<T, E>,
    ) -> Result<T, StoreError> {
        let result = result.map_err(Into::into);
        if matches!(result, Err(StoreError::Database(_))) {
            self.keep = false;
        }
        result
    }
}

impl<'a> Conn<'a> {
    /// Opens a transaction on this connection.
    pub(super) async fn begin(mut self) -> Result<StashTx<'a>, StoreError> {
        if let Err(e) = self.execute("BEGIN").await {
            self.keep = false;
            return Err(e.into());
        }
        Ok(StashTx {
            conn: self,
            open: true,
        })
    }
}

/// A transaction on a stashed connection, from BEGIN to COMMIT or ROLLBACK. Dropped while open
/// (its caller stopped waiting), it closes its connection, which ends the transaction on the
/// server; a connection is never kept or given back to the pool in a transaction.
pub(super) struct StashTx<'a> {
    pub(super) conn: Conn<'a>,
    pub(super) open: bool,
}

impl StashTx<'_> {
    pub(super) async fn commit(self) -> Result<(), StoreError> {
        self.end("COMMIT").await
    }

    pub(super) async fn rollback(self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }

    pub(super) async fn end(mut self, how: &str) -> Result<(), StoreError> {
        self.conn.execute(how).await?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for StashTx<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for StashTx<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for StashTx<'_> {
    fn drop(&mut self) {
        if self.open {
            self.conn.keep = false;
            if let Some(conn) = &mut self.conn.conn {
                conn.close_on_drop();
            }
        }
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match &self.conn {
            Some(conn) => conn,
            None => unreachable!("a stashed connection is only taken when dropped"),
        }
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a stashed connection is only taken when dropped"),
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.keep {
            crate::sync::lock(&self.stash.idle).push(conn);
        }
    }
}

/// Ends `tx` the way `result` says: commit on success, roll back on error. Every transaction
/// ends here, at once, so an error never leaves a connection holding locks until its next use.
/// (An `Ok` that wrote nothing, such as a conflict, commits nothing.)
pub(super) async fn settle<T>(
    tx: StashTx<'_>,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    match result {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            if let Err(why) = tx.rollback().await {
                // The connection is closed or broken; the server rolls back on its own.
                tracing::debug!(error = %why, "rolling back after an error failed");
            }
            Err(e)
        }
    }
}
