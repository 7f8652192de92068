//! Notices on the wire: the payloads every writer sends on the schema's channel, the notifier
//! task sending the notices of committed writes, and the `LISTEN` task turning other processes'
//! notifications into [`Notice`]s. Notices are hints: nothing here writes a run's data, and a
//! lost notice costs a listener only the wait until its next poll.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::stash::Stash;
use super::CONNECT_TIMEOUT;
use crate::store::Notice;

/// Notices buffered per receiver before it lags (lagging loses hints, never data).
pub(super) const NOTICE_CAPACITY: usize = 1024;
/// The listener's reconnect delay: doubled after each failure, up to the maximum.
pub(super) const LISTEN_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(super) const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Notice payloads on the wire: short, so a burst stays far below the queue's limits.
pub(super) const NOTE_READY: &str = "r";
pub(super) const NOTE_PAYLOAD: &str = "p:";
pub(super) const NOTE_ENDED: &str = "e:";
pub(super) const NOTE_CHUNK: &str = "c:";
/// The notice of a change to the schedules (defined, paused, resumed, deleted).
pub(super) const NOTE_SCHEDULES: &str = "s";
/// Sends every notice of `$2` on channel `$1`.
pub(super) const NOTIFY_ALL: &str = "SELECT count(pg_notify($1, n)) FROM UNNEST($2::text[]) AS n";

/// Sends the notices of committed writes (the hot ones: runs admitted, ended, chunks
/// written), a statement of its own for all the notices waiting. Announced inside the writes'
/// own transactions, they made PostgreSQL commit those one at a time: a transaction that
/// notifies holds a database-wide lock from its commit's start to its end, WAL flush
/// included. Sent after the commit, a notice still reaches listeners only once what it
/// announces is visible; it may be lost with this process, and then listeners find the change
/// at their next poll, as after any lost notice.
pub(super) struct Notifier {
    pub(super) queue: OnceLock<mpsc::UnboundedSender<Vec<String>>>,
    /// Where the notifier task runs: the runtime the store was connected in.
    pub(super) runtime: tokio::runtime::Handle,
}

/// The notifier task: takes every waiting batch of notices, drops repeats, sends the rest in
/// one statement; ends when every writer is gone.
pub(super) async fn notifier(
    stash: Arc<Stash>,
    channel: Arc<str>,
    mut queue: mpsc::UnboundedReceiver<Vec<String>>,
) {
    while let Some(mut notes) = queue.recv().await {
        while let Ok(more) = queue.try_recv() {
            notes.extend(more);
        }
        notes.sort_unstable();
        notes.dedup();
        let sent = async {
            let mut conn = stash.conn().await?;
            let sent = sqlx::query(NOTIFY_ALL)
                .bind(&*channel)
                .bind(&notes)
                .execute(&mut *conn)
                .await;
            conn.kept(sent)
        };
        if let Err(e) = sent.await {
            tracing::debug!(error = %e, notices = notes.len(), "sending notices failed; listeners catch up at their next poll");
        }
    }
}

/// Relays this schema's notifications to `sender` until `stop` fires (or its sender is
/// dropped). A lost connection is re-established with backoff; since anything sent meanwhile
/// is lost, every (re)subscription is followed by a `RunsReady`, which makes receivers look.
pub(super) async fn listen(
    options: PgConnectOptions,
    channel: String,
    sender: broadcast::Sender<Notice>,
    mut stop: oneshot::Receiver<()>,
) {
    // Its own pool of one: the listener holds its connection for good, which must not take a
    // slot from the store's operations.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(CONNECT_TIMEOUT)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options);
    let mut backoff = LISTEN_BACKOFF_MIN;
    'connect: loop {
        let subscribed = tokio::select! {
            _ = &mut stop => break 'connect,
            l = subscribe(&pool, &channel) => l,
        };
        match subscribed {
            Ok(mut listener) => {
                backoff = LISTEN_BACKOFF_MIN;
                let _ = sender.send(Notice::RunsReady);
                loop {
                    let next = tokio::select! {
                        _ = &mut stop => break 'connect,
                        n = listener.try_recv() => n,
                    };
                    match next {
                        Ok(Some(n)) => match parse_notice(n.payload()) {
                            // No receiver right now is fine: notices are hints.
                            Some(notice) => {
                                let _ = sender.send(notice);
                            }
                            None => tracing::debug!(
                                channel,
                                payload = n.payload(),
                                "ignoring an unknown notification"
                            ),
                        },
                        Ok(None) => {
                            // Reconnected already (and listening again), but whatever was sent
                            // in between is lost.
                            tracing::warn!(
                                channel,
                                "the notification connection was lost and re-established"
                            );
                            let _ = sender.send(Notice::RunsReady);
                        }
                        Err(e) => {
                            tracing::warn!(
                                channel,
                                error = %e,
                                retry_in = ?backoff,
                                "the notification connection failed; reconnecting"
                            );
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(
                channel,
                error = %e,
                retry_in = ?backoff,
                "cannot listen for workflow notifications; retrying"
            ),
        }
        tokio::select! {
            _ = &mut stop => break 'connect,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
    // Bounded: the listener's connection comes back to the pool through a spawned task.
    let _ = tokio::time::timeout(Duration::from_secs(1), pool.close()).await;
}

pub(super) async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

pub(super) fn parse_notice(payload: &str) -> Option<Notice> {
    if payload == NOTE_READY {
        return Some(Notice::RunsReady);
    }
    if let Some(run) = payload.strip_prefix(NOTE_PAYLOAD) {
        return run.parse().ok().map(Notice::Payload);
    }
    if let Some(run) = payload.strip_prefix(NOTE_ENDED) {
        return run.parse().ok().map(Notice::RunEnded);
    }
    if payload == NOTE_SCHEDULES {
        return Some(Notice::SchedulesChanged);
    }
    if let Some(run) = payload.strip_prefix(NOTE_CHUNK) {
        return run.parse().ok().map(Notice::Chunk);
    }
    None
}
