//! A run's stream served as server-sent events: `POST /api/stories` starts a run
//! whose step writes a story word by word to the run's stream `tokens`; `GET
//! /api/stories/<run-id>/tokens` serves that stream as `text/event-stream`, one `token` event
//! per chunk with `id: <index>`, then an `end` event once the stream is closed (or the run
//! ended). A client that loses the connection reconnects with `Last-Event-ID: <last id>`
//! (browsers' `EventSource` does this by itself) and receives every later chunk exactly once:
//! the chunks are durable and numbered, so a reader resumes from an index, never from "now".
//!
//! ```text
//! cargo run --example stream_sse            # listens on 127.0.0.1:3000 (PORT overrides)
//! curl -s localhost:3000/api/stories -H 'content-type: application/json' \
//!      -d '{"words":20,"delayMs":200}'                    # {"runId":"01J…"}
//! curl -N localhost:3000/api/stories/01J…/tokens          # id: 0 / event: token / data: …
//! curl -N localhost:3000/api/stories/01J…/tokens -H 'Last-Event-ID: 7'   # from index 8 on
//! ```

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use workflow_core::prelude::*;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoryRequest {
    words: u32,
    #[serde(default)]
    delay_ms: u64,
}

/// Writes `words` words to the run's stream `tokens`, one chunk each, `delay_ms` apart (a
/// language model's tokens, a job's progress lines), then closes it.
#[step]
async fn tell(words: u32, delay_ms: u64) -> Result<u32> {
    let tokens = stream::<String>("tokens");
    for i in 0..words {
        tokens.write(format!("word-{i}")).await?;
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    tokens.close().await?;
    Ok(words)
}

#[workflow]
async fn story(words: u32, delay_ms: u64) -> Result<u32> {
    tell(words, delay_ms).await
}

async fn start_story(
    State(rt): State<Runtime>,
    Json(req): Json<StoryRequest>,
) -> std::result::Result<Json<Value>, (StatusCode, String)> {
    let run = rt
        .start(story, (req.words, req.delay_ms))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "runId": run.id() })))
}

/// The index to resume from: the one after the client's `Last-Event-ID`, else 0.
fn resume_from(headers: &HeaderMap) -> std::result::Result<u64, (StatusCode, String)> {
    let Some(last) = headers.get("last-event-id") else {
        return Ok(0);
    };
    last.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|i| i.saturating_add(1))
        .ok_or((
            StatusCode::BAD_REQUEST,
            "Last-Event-ID must be a chunk index".to_owned(),
        ))
}

/// The run's stream as events: `token` per chunk (`id` = index, data `{attempt, value}`),
/// then `end`; a read error is an `error` event instead of `end`, and the response ends
/// (so a client reconnects with `Last-Event-ID` rather than taking the stream as finished).
fn events(
    chunks: impl Stream<Item = Result<Chunk<String>>> + Send + 'static,
) -> impl Stream<Item = std::result::Result<Event, Infallible>> + Send + 'static {
    // `None` once the stream is over: after its end, or after an error.
    let chunks = chunks
        .map(Some)
        .chain(futures::stream::once(async { None }));
    chunks.scan(false, |failed, chunk| {
        let event = match (chunk, *failed) {
            (_, true) => None,
            (Some(Ok(c)), false) => Some(
                Event::default()
                    .id(c.index.to_string())
                    .event("token")
                    .data(json!({ "attempt": c.attempt, "value": c.value }).to_string()),
            ),
            (Some(Err(e)), false) => {
                *failed = true;
                Some(Event::default().event("error").data(e.to_string()))
            }
            (None, false) => Some(Event::default().event("end").data("{}")),
        };
        futures::future::ready(event.map(Ok))
    })
}

async fn story_tokens(
    State(rt): State<Runtime>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> std::result::Result<Response, (StatusCode, String)> {
    let id: RunId = run_id
        .parse()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("run id: {e}")))?;
    let from = resume_from(&headers)?;
    let run = rt.get_run(&id);
    if run.status().await.is_err() {
        return Err((StatusCode::NOT_FOUND, format!("run {id} not found")));
    }
    let chunks = run.stream::<String>("tokens").from(from);
    Ok(Sse::new(events(chunks))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The service's routes.
pub fn app(rt: Runtime) -> Router {
    Router::new()
        .route("/api/stories", post(start_story))
        .route("/api/stories/{run_id}/tokens", get(story_tokens))
        .with_state(rt)
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| "stream_sse.db".into());
    let rt = Runtime::builder().sqlite(&db).build().await?;
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    // TCP_NODELAY on every connection: each event must leave at once, not wait for an ACK.
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
        .await?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    println!(
        "listening on http://{} (database {db})",
        listener.local_addr()?
    );
    axum::serve(listener, app(rt)).await?;
    Ok(())
}
