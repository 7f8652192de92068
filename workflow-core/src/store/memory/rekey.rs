//! [`RekeyStore`] in memory: the stored text of a value is its JSON as serde writes it, so
//! the compare-and-set compares what a reader saw with the value now held, under the one lock.

use serde::Serialize;

use super::state::State;
use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::rekey::{holds_marker, mismatched};
use crate::store::{Inbound, PayloadTable, RekeyStore, SealedAt, SealedRow, SealedValue};

/// `value` as the memory store's stored text.
fn text(value: &impl Serialize) -> String {
    // Values, errors, events and inbox entries always serialize.
    serde_json::to_string(value).unwrap_or_default()
}

fn row(at: SealedAt, value: SealedValue) -> Option<SealedRow> {
    let stored = match &value {
        SealedValue::Value(v) => text(v),
        SealedValue::Error(e) => text(e),
        SealedValue::Reply(r) => text(r),
        SealedValue::Event(e) => text(e),
        SealedValue::Inbound(
            Inbound::Hook { payload, .. }
            | Inbound::Message { payload, .. }
            | Inbound::Request { payload, .. },
        ) => text(payload),
        SealedValue::Inbound(Inbound::ChildEnded(notice)) => text(notice),
    };
    holds_marker(&stored).then_some(SealedRow { at, value, stored })
}

/// The value now at `at`, if any.
fn current(st: &State, at: &SealedAt) -> Option<SealedValue> {
    let r = st.runs.get(&at.run());
    match at {
        SealedAt::RunInput(_) => r.map(|r| SealedValue::Value(r.record.input.clone())),
        SealedAt::RunOutput(_) => r?.record.output.clone().map(SealedValue::Value),
        SealedAt::RunError(_) => r?.record.error.clone().map(SealedValue::Error),
        SealedAt::Event { seq, .. } => r?
            .events
            .iter()
            .find(|e| e.seq == *seq)
            .map(|e| SealedValue::Event(e.event.clone())),
        SealedAt::Inbox { run, id } => st
            .inbox
            .get(id)
            .filter(|(owner, _)| owner == run)
            .map(|(_, e)| SealedValue::Inbound(e.what.clone())),
        SealedAt::Chunk { stream, index, .. } => r?
            .streams
            .get(stream)?
            .chunks
            .iter()
            .find(|c| c.index == *index)
            .map(|c| SealedValue::Value(c.value.clone())),
        SealedAt::Published { key, .. } => r?.published.get(key).cloned().map(SealedValue::Value),
        SealedAt::Reply { id, .. } => r?.requests.get(id)?.reply.clone().map(SealedValue::Reply),
    }
}

/// Every row of `table` holding the marker, in order of place (runs: by run).
fn all_rows(st: &State, table: PayloadTable) -> Vec<(RunId, SealedRow)> {
    let mut ids: Vec<RunId> = st.runs.keys().copied().collect();
    ids.sort_unstable();
    let mut rows = Vec::new();
    if table == PayloadTable::Inbox {
        for (id, (run, _)) in &st.inbox {
            let at = SealedAt::Inbox { run: *run, id: *id };
            if let Some(r) = current(st, &at).and_then(|v| row(at, v)) {
                rows.push((*run, r));
            }
        }
        return rows;
    }
    for run in ids {
        let r = &st.runs[&run];
        let places: Vec<SealedAt> = match table {
            PayloadTable::Runs => vec![
                SealedAt::RunInput(run),
                SealedAt::RunOutput(run),
                SealedAt::RunError(run),
            ],
            PayloadTable::Events => r
                .events
                .iter()
                .map(|e| SealedAt::Event { run, seq: e.seq })
                .collect(),
            PayloadTable::Chunks => r
                .streams
                .iter()
                .flat_map(|(name, s)| {
                    s.chunks.iter().map(move |c| SealedAt::Chunk {
                        run,
                        stream: name.clone(),
                        index: c.index,
                    })
                })
                .collect(),
            PayloadTable::Published => r
                .published
                .keys()
                .map(|key| SealedAt::Published {
                    run,
                    key: key.clone(),
                })
                .collect(),
            PayloadTable::Replies => r
                .requests
                .keys()
                .map(|id| SealedAt::Reply { run, id: *id })
                .collect(),
            PayloadTable::Inbox => Vec::new(),
        };
        for at in places {
            if let Some(r) = current(st, &at).and_then(|v| row(at, v)) {
                rows.push((run, r));
            }
        }
    }
    rows
}

/// Whether `at` comes after `cursor` in `table`'s order (runs: by run only).
fn after(at: &SealedAt, cursor: &SealedAt) -> bool {
    match (at, cursor) {
        (SealedAt::Inbox { id, .. }, SealedAt::Inbox { id: c, .. }) => id > c,
        (
            SealedAt::RunInput(_) | SealedAt::RunOutput(_) | SealedAt::RunError(_),
            SealedAt::RunInput(_) | SealedAt::RunOutput(_) | SealedAt::RunError(_),
        ) => at.run() > cursor.run(),
        _ => at > cursor,
    }
}

#[async_trait::async_trait]
impl RekeyStore for MemoryStore {
    async fn sealed_rows(
        &self,
        table: PayloadTable,
        cursor: Option<&SealedAt>,
        limit: usize,
    ) -> Result<Vec<SealedRow>, StoreError> {
        let st = self.lock();
        let rows = all_rows(&st, table)
            .into_iter()
            .filter(|(_, r)| cursor.is_none_or(|c| after(&r.at, c)));
        if table != PayloadTable::Runs {
            return Ok(rows.take(limit).map(|(_, r)| r).collect());
        }
        let mut runs = 0;
        let mut last = None;
        let mut out = Vec::new();
        for (run, r) in rows {
            if last != Some(run) {
                if runs == limit {
                    break;
                }
                runs += 1;
                last = Some(run);
            }
            out.push(r);
        }
        Ok(out)
    }

    async fn replace_sealed(
        &self,
        row: &SealedRow,
        value: &SealedValue,
    ) -> Result<bool, StoreError> {
        if let Some(e) = mismatched(row, value) {
            return Err(e);
        }
        let mut st = self.lock();
        let now = current(&st, &row.at).and_then(|v| self::row(row.at.clone(), v));
        if now.is_none_or(|now| now.stored != row.stored) {
            return Ok(false);
        }
        if let (SealedAt::Inbox { id, .. }, SealedValue::Inbound(i)) = (&row.at, value) {
            if let Some((_, e)) = st.inbox.get_mut(id) {
                e.what = i.clone();
            }
            return Ok(true);
        }
        let run = row.at.run();
        let Some(r) = st.runs.get_mut(&run) else {
            return Ok(false);
        };
        match (&row.at, value.clone()) {
            (SealedAt::RunInput(_), SealedValue::Value(v)) => r.record.input = v,
            (SealedAt::RunOutput(_), SealedValue::Value(v)) => r.record.output = Some(v),
            (SealedAt::RunError(_), SealedValue::Error(e)) => r.record.error = Some(e),
            (SealedAt::Event { seq, .. }, SealedValue::Event(e)) => {
                if let Some(rec) = r.events.iter_mut().find(|x| x.seq == *seq) {
                    rec.event = e;
                }
            }
            (SealedAt::Chunk { stream, index, .. }, SealedValue::Value(v)) => {
                if let Some(c) = r
                    .streams
                    .get_mut(stream)
                    .and_then(|s| s.chunks.iter_mut().find(|c| c.index == *index))
                {
                    c.value = v;
                }
            }
            (SealedAt::Published { key, .. }, SealedValue::Value(v)) => {
                r.published.insert(key.clone(), v);
            }
            (SealedAt::Reply { id, .. }, SealedValue::Reply(v)) => {
                if let Some(req) = r.requests.get_mut(id) {
                    req.reply = Some(v);
                }
            }
            (at, _) => {
                return Err(StoreError::database(format!(
                    "replace_sealed: a value of another kind cannot replace the value at {at:?}"
                )))
            }
        }
        Ok(true)
    }
}
