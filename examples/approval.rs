//! An approval flow over HTTP: a document waits for a person's approval, for at most a week.
//!
//! The workflow publishes its state (`set_event`), then waits durably for a message on the
//! topic `"approval"` (`recv`) under a durable `timeout`: a worker may restart any number of
//! times during the week, and the wait goes on where it was. The routes talk to the run by its
//! id: `run.send(..)` delivers the approval (stored in one transaction, received exactly once),
//! `run.events()` and `run.status()` read where it stands.
//!
//! ```text
//! cargo run --example approval                     # listens on 127.0.0.1:3000 (PORT overrides)
//! curl -s localhost:3000/approvals -H 'content-type: application/json' \
//!      -d '{"document":"budget-2027.pdf"}'         # {"runId":"01J…"}
//! curl -s localhost:3000/approvals/01J…            # {"status":"running","state":"waiting",…}
//! curl -s localhost:3000/approvals/01J…/approve -H 'content-type: application/json' \
//!      -d '{"by":"ana"}'                           # {"sent":true}
//! curl -s localhost:3000/approvals/01J…            # {"status":"completed","outcome":"approved by ana",…}
//! ```

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use workflow_core::prelude::*;
use workflow_core::RunError;

/// How long a document waits for its approval.
pub const APPROVAL_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The message a person sends to approve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Approval {
    pub by: String,
}

/// Waits for an approval of `document`; the outcome is who approved it, or that the window
/// passed.
#[workflow(name = "approval.review")]
pub async fn review(document: String) -> Result<String> {
    set_event("state", &"waiting")?;
    let outcome = match timeout(APPROVAL_WINDOW, recv::<Approval>("approval")).await {
        Ok(approval) => format!("approved by {}", approval?.by),
        Err(_elapsed) => format!("{document} expired unapproved"),
    };
    set_event("state", &"done")?;
    Ok(outcome)
}

/// An API error: the run is unknown (404) or the store failed (500).
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::NotFound(_) => ApiError(StatusCode::NOT_FOUND, e.to_string()),
            RunError::Ended { .. } => ApiError(StatusCode::CONFLICT, e.to_string()),
            e => ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

#[derive(Deserialize)]
struct NewApproval {
    document: String,
}

/// `POST /approvals`: starts a review.
async fn start(
    State(rt): State<Runtime>,
    Json(req): Json<NewApproval>,
) -> Result<Json<Value>, ApiError> {
    let run = rt
        .start(review, (req.document,))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "runId": run.id() })))
}

fn run_id(id: &str) -> Result<RunId, ApiError> {
    id.parse()
        .map_err(|_| ApiError(StatusCode::NOT_FOUND, format!("no run {id:?}")))
}

/// `POST /approvals/{id}/approve`: sends the approval to the run.
async fn approve(
    State(rt): State<Runtime>,
    Path(id): Path<String>,
    Json(approval): Json<Approval>,
) -> Result<Json<Value>, ApiError> {
    let run = rt.get_run(&run_id(&id)?);
    run.send("approval", approval).await?;
    Ok(Json(json!({ "sent": true })))
}

/// `GET /approvals/{id}`: where the review stands.
async fn status(
    State(rt): State<Runtime>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = rt.get_run(&run_id(&id)?);
    let info = run.info().await?;
    let events = run.events().await?;
    Ok(Json(json!({
        "status": info.status.to_string(),
        "state": events.get("state"),
        "outcome": info.output,
    })))
}

/// The service's routes.
pub fn app(rt: Runtime) -> Router {
    Router::new()
        .route("/approvals", post(start))
        .route("/approvals/{id}", get(status))
        .route("/approvals/{id}/approve", post(approve))
        .with_state(rt)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| "approval.db".into());
    let rt = Runtime::builder().sqlite(&db).build().await?;
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    // TCP_NODELAY on every connection: short answers must not wait for delayed ACKs.
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
        .await?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    println!(
        "listening on http://{} (database {db})",
        listener.local_addr()?
    );
    axum::serve(listener, app(rt.clone()))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    rt.shutdown();
    Ok(())
}
