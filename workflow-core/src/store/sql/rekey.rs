//! [`RekeyStore`](crate::store::RekeyStore) in the SQL stores, written once: the statements
//! each dialect supplies ([`RekeySql`]), the cursor of each table's scan, the decoding of the
//! rows read, and which compare-and-set statement a replacement is (a [`Replace`]). A row is
//! replaced only while its column holds the exact text that was read (`... AND data = old`):
//! one statement, so nothing written by another writer in between is ever overwritten.

use super::rows::{EventRow, PayloadRow};
use super::{corrupt, json, payload_id_of, to_json};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::rekey::{holds_marker, mismatched};
use crate::store::{Inbound, SealedAt, SealedRow, SealedValue};

/// The statements each dialect writes for rekeying (its `rekey.rs`), side by side. Each scan
/// takes its cursor's columns then the limit; each replacement its keys, then the old text,
/// then the new one, and changes one row or none.
pub(in crate::store) struct RekeySql {
    /// Runs after id `1` holding the marker in `input`, `output` or `error`, by id, at most
    /// `2`: `id, input, output, error`.
    pub runs: &'static str,
    /// Inbox rows after id `1` holding the marker, by id, at most `2`:
    /// `id, run_id, token, topic, payload`.
    pub inbox: &'static str,
    /// Events after (`1` run, `2` seq) holding the marker, in that order, at most `3`:
    /// `run_id, seq, at, data`.
    pub events: &'static str,
    /// Chunks after (`1` run, `2` stream, `3` index) holding the marker, at most `4`:
    /// `run_id, name, idx, value`.
    pub chunks: &'static str,
    /// Published values after (`1` run, `2` key) holding the marker, at most `3`:
    /// `run_id, key, value`.
    pub published: &'static str,
    /// Replies after (`1` run, `2` request id) holding the marker, at most `3`:
    /// `run_id, id, reply`.
    pub replies: &'static str,
    /// Run `1`'s input, `2` -> `3`.
    pub set_input: &'static str,
    /// Run `1`'s output, `2` -> `3`.
    pub set_output: &'static str,
    /// Run `1`'s error, `2` -> `3`.
    pub set_error: &'static str,
    /// Event (`1` run, `2` seq), `3` -> `4`.
    pub set_event: &'static str,
    /// Inbox row `1` of run `2`, `3` -> `4`.
    pub set_inbox: &'static str,
    /// Chunk (`1` run, `2` stream, `3` index), `4` -> `5`.
    pub set_chunk: &'static str,
    /// Published value (`1` run, `2` key), `3` -> `4`.
    pub set_published: &'static str,
    /// Reply (`1` run, `2` request id), `3` -> `4`.
    pub set_reply: &'static str,
}

/// Where a table's scan resumes: the columns of its order, from the start when no row was
/// read yet (every run id is longer than "", every number above -1).
#[derive(Debug, Clone, Default)]
pub(in crate::store) struct Cursor {
    pub run: String,
    pub name: String,
    pub num: i64,
}

impl Cursor {
    /// The cursor after `at` (`None`: the start).
    pub fn after(at: Option<&SealedAt>) -> Cursor {
        let Some(at) = at else {
            return Cursor {
                num: -1,
                ..Cursor::default()
            };
        };
        let run = at.run().to_string();
        let num = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        match at {
            SealedAt::RunInput(_) | SealedAt::RunOutput(_) | SealedAt::RunError(_) => Cursor {
                run,
                name: String::new(),
                num: -1,
            },
            SealedAt::Event { seq, .. } => Cursor {
                run,
                name: String::new(),
                num: num(*seq),
            },
            SealedAt::Inbox { id, .. } | SealedAt::Reply { id, .. } => Cursor {
                run,
                name: String::new(),
                num: num(*id),
            },
            SealedAt::Chunk { stream, index, .. } => Cursor {
                run,
                name: stream.clone(),
                num: num(*index),
            },
            SealedAt::Published { key, .. } => Cursor {
                run,
                name: key.clone(),
                num: -1,
            },
        }
    }
}

/// A scan's limit as bound.
pub(in crate::store) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn run_of(run: &str) -> Result<RunId, StoreError> {
    run.parse().map_err(|e| corrupt(run, "id", e))
}

fn marked(at: SealedAt, value: SealedValue, stored: String) -> Option<SealedRow> {
    holds_marker(&stored).then_some(SealedRow { at, value, stored })
}

/// The rows of `runs` rows (`id, input, output, error`): one per column holding the marker.
pub(in crate::store) fn decode_runs(
    rows: Vec<(String, String, Option<String>, Option<String>)>,
) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for (id, input, output, error) in rows {
        let run = run_of(&id)?;
        let value = SealedValue::Value(json(&input, &id, "input")?);
        out.extend(marked(SealedAt::RunInput(run), value, input));
        if let Some(output) = output {
            let value = SealedValue::Value(json(&output, &id, "output")?);
            out.extend(marked(SealedAt::RunOutput(run), value, output));
        }
        if let Some(error) = error {
            let value = SealedValue::Error(json(&error, &id, "error")?);
            out.extend(marked(SealedAt::RunError(run), value, error));
        }
    }
    Ok(out)
}

/// The rows of `hook_inbox` rows (`id, run_id, token, topic, payload`).
pub(in crate::store) fn decode_inbox(
    rows: Vec<(i64, String, String, Option<String>, String)>,
) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for (id, run_id, token, topic, payload) in rows {
        let stored = payload.clone();
        let entry = PayloadRow {
            id,
            token,
            topic,
            payload,
        }
        .decode(&run_id)?;
        let at = SealedAt::Inbox {
            run: run_of(&run_id)?,
            id: payload_id_of(id)?,
        };
        out.extend(marked(at, SealedValue::Inbound(entry.what), stored));
    }
    Ok(out)
}

/// The rows of `events` rows.
pub(in crate::store) fn decode_events(rows: Vec<EventRow>) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for row in rows {
        let (run, stored) = (run_of(&row.run_id)?, row.data.clone());
        let record = row.decode()?;
        let at = SealedAt::Event {
            run,
            seq: record.seq,
        };
        out.extend(marked(at, SealedValue::Event(record.event), stored));
    }
    Ok(out)
}

/// The rows of `stream_chunks` rows (`run_id, name, idx, value`).
pub(in crate::store) fn decode_chunks(
    rows: Vec<(String, String, i64, String)>,
) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for (run_id, stream, idx, value) in rows {
        let what = format!("stream {stream:?}, chunk {idx}");
        let v = SealedValue::Value(json(&value, &run_id, &what)?);
        let at = SealedAt::Chunk {
            run: run_of(&run_id)?,
            index: u64::try_from(idx).map_err(|e| corrupt(&run_id, &what, e))?,
            stream,
        };
        out.extend(marked(at, v, value));
    }
    Ok(out)
}

/// The rows of `run_events` rows (`run_id, key, value`).
pub(in crate::store) fn decode_published(
    rows: Vec<(String, String, String)>,
) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for (run_id, key, value) in rows {
        let v = SealedValue::Value(json(&value, &run_id, &format!("event {key:?}"))?);
        let at = SealedAt::Published {
            run: run_of(&run_id)?,
            key,
        };
        out.extend(marked(at, v, value));
    }
    Ok(out)
}

/// The rows of `run_requests` rows (`run_id, id, reply`).
pub(in crate::store) fn decode_replies(
    rows: Vec<(String, i64, String)>,
) -> Result<Vec<SealedRow>, StoreError> {
    let mut out = Vec::new();
    for (run_id, id, reply) in rows {
        let what = format!("the reply to request {id}");
        let v = SealedValue::Reply(json(&reply, &run_id, &what)?);
        let at = SealedAt::Reply {
            run: run_of(&run_id)?,
            id: payload_id_of(id)?,
        };
        out.extend(marked(at, v, reply));
    }
    Ok(out)
}

/// Which statement of [`RekeySql`] a replacement runs, with its keys.
pub(in crate::store) enum Replace {
    /// `set_input`, `set_output` or `set_error` (the statement), with the run.
    Run(&'static str, String),
    /// `set_event`: run, seq.
    Event(String, i64),
    /// `set_inbox`: id, run.
    Inbox(i64, String),
    /// `set_chunk`: run, stream, index.
    Chunk(String, String, i64),
    /// `set_published`: run, key.
    Published(String, String),
    /// `set_reply`: run, request id.
    Reply(String, i64),
}

/// The statement replacing `row`'s value by `value`, and `value` as the column's new text.
pub(in crate::store) fn replacement(
    sql: &RekeySql,
    row: &SealedRow,
    value: &SealedValue,
) -> Result<(Replace, String), StoreError> {
    if let Some(e) = mismatched(row, value) {
        return Err(e);
    }
    let text = match value {
        SealedValue::Value(v) => to_json(v, "a payload")?,
        SealedValue::Error(e) => to_json(e, "an error")?,
        SealedValue::Reply(r) => to_json(r, "a reply")?,
        SealedValue::Event(e) => to_json(e, "an event")?,
        SealedValue::Inbound(
            Inbound::Hook { payload, .. }
            | Inbound::Message { payload, .. }
            | Inbound::Request { payload, .. },
        ) => to_json(payload, "a payload")?,
        SealedValue::Inbound(Inbound::ChildEnded(notice)) => to_json(notice, "a child's end")?,
    };
    let run = row.at.run().to_string();
    let num = |n: u64| i64::try_from(n).map_err(|e| corrupt(&run, "rekey", e));
    let replace = match &row.at {
        SealedAt::RunInput(_) => Replace::Run(sql.set_input, run.clone()),
        SealedAt::RunOutput(_) => Replace::Run(sql.set_output, run.clone()),
        SealedAt::RunError(_) => Replace::Run(sql.set_error, run.clone()),
        SealedAt::Event { seq, .. } => Replace::Event(run.clone(), num(*seq)?),
        SealedAt::Inbox { id, .. } => Replace::Inbox(num(*id)?, run.clone()),
        SealedAt::Chunk { stream, index, .. } => {
            Replace::Chunk(run.clone(), stream.clone(), num(*index)?)
        }
        SealedAt::Published { key, .. } => Replace::Published(run.clone(), key.clone()),
        SealedAt::Reply { id, .. } => Replace::Reply(run.clone(), num(*id)?),
    };
    Ok((replace, text))
}
