//! [`RekeyStore`] on SQLite: the statements of `store::sql::rekey` in this dialect; scans on
//! a reader thread, each compare-and-set one statement on the writer.

use rusqlite::params;

use super::tx::{all, exec};
use super::SqliteStore;
use crate::error::StoreError;
use crate::store::sql::rekey::{
    decode_chunks, decode_events, decode_inbox, decode_published, decode_replies, decode_runs,
    replacement, sql_limit, Cursor, RekeySql, Replace,
};
use crate::store::sql::rows::EventRow;
use crate::store::{PayloadTable, RekeyStore, SealedAt, SealedRow, SealedValue};

/// The statements of this file (`RekeySql`); `'%$wf_sealed%'` matches the envelope marker.
const SQL: RekeySql = RekeySql {
    runs: "SELECT id, input, output, error FROM runs
           WHERE id > ?1 AND (input LIKE '%$wf_sealed%' OR output LIKE '%$wf_sealed%'
                              OR error LIKE '%$wf_sealed%')
           ORDER BY id LIMIT ?2",
    inbox: "SELECT id, run_id, token, topic, payload FROM hook_inbox
            WHERE id > ?1 AND payload LIKE '%$wf_sealed%' ORDER BY id LIMIT ?2",
    events: "SELECT run_id, seq, at, data FROM events
             WHERE (run_id, seq) > (?1, ?2) AND data LIKE '%$wf_sealed%'
             ORDER BY run_id, seq LIMIT ?3",
    chunks: "SELECT run_id, name, idx, value FROM stream_chunks
             WHERE (run_id, name, idx) > (?1, ?2, ?3) AND value LIKE '%$wf_sealed%'
             ORDER BY run_id, name, idx LIMIT ?4",
    published: "SELECT run_id, key, value FROM run_events
                WHERE (run_id, key) > (?1, ?2) AND value LIKE '%$wf_sealed%'
                ORDER BY run_id, key LIMIT ?3",
    replies: "SELECT run_id, id, reply FROM run_requests
              WHERE (run_id, id) > (?1, ?2) AND reply LIKE '%$wf_sealed%'
              ORDER BY run_id, id LIMIT ?3",
    set_input: "UPDATE runs SET input = ?3 WHERE id = ?1 AND input = ?2",
    set_output: "UPDATE runs SET output = ?3 WHERE id = ?1 AND output = ?2",
    set_error: "UPDATE runs SET error = ?3 WHERE id = ?1 AND error = ?2",
    set_event: "UPDATE events SET data = ?4 WHERE run_id = ?1 AND seq = ?2 AND data = ?3",
    set_inbox: "UPDATE hook_inbox SET payload = ?4 WHERE id = ?1 AND run_id = ?2 AND payload = ?3",
    set_chunk: "UPDATE stream_chunks SET value = ?5
                WHERE run_id = ?1 AND name = ?2 AND idx = ?3 AND value = ?4",
    set_published: "UPDATE run_events SET value = ?4 WHERE run_id = ?1 AND key = ?2 AND value = ?3",
    set_reply: "UPDATE run_requests SET reply = ?4 WHERE run_id = ?1 AND id = ?2 AND reply = ?3",
};

#[async_trait::async_trait]
impl RekeyStore for SqliteStore {
    async fn sealed_rows(
        &self,
        table: PayloadTable,
        after: Option<&SealedAt>,
        limit: usize,
    ) -> Result<Vec<SealedRow>, StoreError> {
        let (c, limit) = (Cursor::after(after), sql_limit(limit));
        self.read(move |conn| match table {
            PayloadTable::Runs => decode_runs(all(conn, SQL.runs, params![c.run, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?),
            PayloadTable::Inbox => {
                let args = params![c.num, limit];
                decode_inbox(all(conn, SQL.inbox, args, |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?)
            }
            PayloadTable::Events => {
                let args = params![c.run, c.num, limit];
                decode_events(all(conn, SQL.events, args, EventRow::from_sqlite)?)
            }
            PayloadTable::Chunks => {
                let args = params![c.run, c.name, c.num, limit];
                decode_chunks(all(conn, SQL.chunks, args, |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?)
            }
            PayloadTable::Published => {
                let args = params![c.run, c.name, limit];
                decode_published(all(conn, SQL.published, args, |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?)
            }
            PayloadTable::Replies => {
                let args = params![c.run, c.num, limit];
                decode_replies(all(conn, SQL.replies, args, |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?)
            }
        })
        .await
    }

    async fn replace_sealed(
        &self,
        row: &SealedRow,
        value: &SealedValue,
    ) -> Result<bool, StoreError> {
        let (replace, new) = replacement(&SQL, row, value)?;
        let old = row.stored.clone();
        self.write(move |tx| {
            let changed = match &replace {
                Replace::Run(sql, run) => exec(tx, sql, params![run, old, new])?,
                Replace::Event(run, seq) => exec(tx, SQL.set_event, params![run, seq, old, new])?,
                Replace::Inbox(id, run) => exec(tx, SQL.set_inbox, params![id, run, old, new])?,
                Replace::Chunk(run, name, idx) => {
                    exec(tx, SQL.set_chunk, params![run, name, idx, old, new])?
                }
                Replace::Published(run, key) => {
                    exec(tx, SQL.set_published, params![run, key, old, new])?
                }
                Replace::Reply(run, id) => exec(tx, SQL.set_reply, params![run, id, old, new])?,
            };
            Ok(changed == 1)
        })
        .await
    }
}
