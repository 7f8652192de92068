//! An HTTP service whose `POST /api/orders` is idempotent per order:
//! the first request for an order starts its workflow and claims the hook token
//! `order:<orderId>`; every duplicate — concurrent or later — sends its note to the run that
//! owns the token. `.or_resume(..)` decides which in one store transaction, so a duplicate
//! never finds the token owned but no hook to take its note.
//!
//! ```text
//! cargo run --example orders_http            # listens on 127.0.0.1:3000 (PORT overrides)
//! curl -s localhost:3000/api/orders -H 'content-type: application/json' \
//!      -d '{"orderId":"42","note":"gift wrap"}'          # {"runId":"01J…","started":true}
//! curl -s localhost:3000/api/orders -H 'content-type: application/json' \
//!      -d '{"orderId":"42","note":"leave at the door"}'  # {"runId":"01J…","started":false}
//! curl -s localhost:3000/api/orders/42                   # the notes recorded for order 42
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use workflow_core::prelude::*;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderRequest {
    order_id: String,
    note: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderUpdate {
    note: String,
}

/// The service's own data: the notes recorded per order (a database table in a real service).
fn notes() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static NOTES: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    NOTES.get_or_init(Default::default)
}

#[step]
async fn record_note(order_id: String, note: String) -> Result<()> {
    notes()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(order_id)
        .or_default()
        .push(note);
    Ok(())
}

/// Records the first note, then every update sent to the order's hook, in order, until a
/// `"close"` note.
#[workflow]
async fn process_order(order_id: String, note: String) -> Result<u32> {
    record_note(order_id.clone(), note).await?;
    // Binds to the hook claimed at start: no conflict possible, nothing recorded.
    let mut updates = create_hook::<OrderUpdate>(format!("order:{order_id}"));
    let mut recorded = 1;
    loop {
        let OrderUpdate { note } = updates.recv().await?;
        if note == "close" {
            return Ok(recorded);
        }
        record_note(order_id.clone(), note).await?;
        recorded += 1;
    }
}

/// An error answered as JSON.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

async fn create_order(
    State(rt): State<Runtime>,
    Json(req): Json<OrderRequest>,
) -> std::result::Result<Json<Value>, ApiError> {
    let token = format!("order:{}", req.order_id);
    // The first request starts the run (its note is the run's argument); a duplicate's note
    // goes to the run that owns the token.
    match rt
        .start(process_order, (req.order_id, req.note.clone()))
        .hook(token)
        .or_resume(OrderUpdate { note: req.note })
        .await
    {
        Ok(StartOrResume::Started(run)) => Ok(Json(json!({ "runId": run.id(), "started": true }))),
        Ok(StartOrResume::Resumed(hook)) => {
            Ok(Json(json!({ "runId": hook.run_id, "started": false })))
        }
        // Only with `min_retention`: the order's run ended and its token is still retained.
        Err(StartError::HookConflict(e)) => Err(ApiError(StatusCode::CONFLICT, e.to_string())),
        Err(StartError::InvalidToken(e)) => Err(ApiError(StatusCode::BAD_REQUEST, e)),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

async fn order_notes(Path(order_id): Path<String>) -> Json<Value> {
    let notes = notes()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&order_id)
        .cloned();
    Json(json!({ "orderId": order_id, "notes": notes.unwrap_or_default() }))
}

/// The service's routes.
pub fn app(rt: Runtime) -> Router {
    Router::new()
        .route("/api/orders", post(create_order))
        .route("/api/orders/{order_id}", get(order_notes))
        .with_state(rt)
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| "orders_http.db".into());
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
    axum::serve(listener, app(rt)).await?;
    Ok(())
}
