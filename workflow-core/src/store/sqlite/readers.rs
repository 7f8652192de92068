//! The reader threads: each holds a read-only connection and runs the read requests queued to
//! them, beside the writer (WAL lets them see the last commit without waiting). They must
//! never write.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use rusqlite::{Connection, OpenFlags};

use super::schema::open_error;
use super::{Stats, BUSY_TIMEOUT};
use crate::error::StoreError;

pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let fail = |e: rusqlite::Error| open_error(path, e);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(fail)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
    conn.pragma_update(None, "query_only", true).map_err(fail)?;
    Ok(conn)
}

pub(super) type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

pub(super) fn reader_loop(
    conn: Connection,
    jobs: Arc<Mutex<mpsc::Receiver<ReadJob>>>,
    _stats: Arc<Stats>,
) {
    loop {
        // The lock is held only while waiting for the next job, never while running one.
        let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(job) => job(&conn),
            Err(_) => return,
        }
    }
}
