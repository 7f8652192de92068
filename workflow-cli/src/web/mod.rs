//! `workflow web`: the dashboard. Pages are rendered here on the server from the same views as
//! the command line; the only script refreshes them in place and confirms a cancel. Assets are
//! compiled into the binary, so it works offline and without a front-end build.
//!
//! Actions are plain HTML forms (POST, then a redirect back), refused when another site posts
//! them: a page on any site can make a browser post to `127.0.0.1`. [`guard`] stands in front of
//! every route: the `Host` check against DNS rebinding, the token, and the security headers.

mod activity;
mod guard;
mod metrics;
mod pages;
mod timeline;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde::Deserialize;
use workflow_core::store::{HookFilter, RunFilter};
use workflow_core::{RunStatus, Runtime};

use crate::connect::Target;
use crate::error::CliError;
use crate::ops;
use crate::view::{QueueView, QueuedRun};

const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/app.js");
const ICON: &str = include_str!("assets/icon.svg");

struct App {
    rt: Runtime,
    /// Shown in the header, so it is clear which database the pages describe.
    database: String,
}

type Shared = State<Arc<App>>;

/// The dashboard's routes over `rt`, for a server bound to `local`, asking for `token` if set.
pub fn router(rt: Runtime, target: &Target, local: SocketAddr, token: Option<String>) -> Router {
    let app = Arc::new(App {
        rt,
        database: target.describe(),
    });
    let guard = Arc::new(guard::Guard::new(local, token));
    Router::new()
        .route("/", get(runs_page))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/retry", post(retry))
        .route("/hooks", get(hooks_page))
        .route("/queues", get(queues_page))
        .route("/schedules", get(schedules_page))
        .route("/schedules/{name}", get(schedule_page))
        .route("/hooks/resume", post(resume))
        .route("/api/runs", get(api_runs))
        .route("/api/runs/{id}", get(api_run))
        .route("/api/runs/{id}/events", get(api_events))
        .route("/api/runs/{id}/streams", get(api_streams))
        .route("/api/runs/{id}/streams/{name}", get(api_stream))
        .route("/api/hooks", get(api_hooks))
        .route("/api/queues", get(api_queues))
        .route("/metrics", get(metrics_text))
        .route("/activity", get(activity_page))
        .route("/assets/style.css", get(|| asset("text/css", STYLE)))
        .route("/assets/app.js", get(|| asset("text/javascript", SCRIPT)))
        .route("/favicon.ico", get(|| asset("image/svg+xml", ICON)))
        .fallback(not_found)
        .with_state(app)
        // The last layer added runs first: headers go on every answer, the guard's refusals too.
        .layer(middleware::from_fn_with_state(guard, guard::check))
        .layer(middleware::map_response(guard::headers))
}

async fn not_found() -> WebError {
    WebError::page(CliError::NotFound("no such page".to_owned()))
}

/// Listens on `addr` until interrupted (Ctrl-C or SIGTERM); with `token`, only requests
/// carrying it are answered.
pub async fn serve(
    rt: Runtime,
    target: Target,
    addr: SocketAddr,
    token: Option<String>,
) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Other(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Other(format!("cannot listen on {addr}: {e}")))?;
    if !local.ip().is_loopback() {
        eprintln!(
            "warning: the dashboard speaks plain HTTP: its token and pages cross the network \
             unencrypted; it answers requests addressed to {local} or to localhost only"
        );
    }
    // Tests and scripts read this line to learn the port chosen for `--port 0`.
    println!(
        "workflow dashboard on http://{local}/ (database {})",
        crate::text::printable(&target.describe(), false)
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    axum::serve(listener, router(rt, &target, local, token))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| CliError::Other(format!("the dashboard stopped: {e}")))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An error as a page (or as JSON under `/api`), with a status that fits it.
struct WebError {
    error: CliError,
    json: bool,
}

impl WebError {
    fn page(error: CliError) -> Self {
        WebError { error, json: false }
    }

    fn api(error: CliError) -> Self {
        WebError { error, json: true }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = match &self.error {
            CliError::Usage(_) => StatusCode::BAD_REQUEST,
            CliError::NotFound(_) => StatusCode::NOT_FOUND,
            CliError::Database(_) => StatusCode::SERVICE_UNAVAILABLE,
            CliError::Refused(_) => StatusCode::CONFLICT,
            CliError::Other(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = self.error.to_string();
        if self.json {
            (status, Json(serde_json::json!({ "error": message }))).into_response()
        } else {
            (status, Html(pages::error(status, &message))).into_response()
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct RunsQuery {
    status: Option<String>,
    workflow: Option<String>,
    queue: Option<String>,
    /// Only runs started by a build of this version.
    version: Option<String>,
    limit: Option<usize>,
    /// The page after this run (newest first).
    after: Option<String>,
    notice: Option<String>,
    error: Option<String>,
}

impl RunsQuery {
    fn filter(&self) -> Result<RunFilter, CliError> {
        let mut f = RunFilter::new().limit(self.limit.unwrap_or(100).min(10_000));
        if let Some(id) = self.after.as_deref().filter(|a| !a.is_empty()) {
            f = f.after(&ops::parse_run_id(id)?);
        }
        if let Some(s) = self.status.as_deref().filter(|s| !s.is_empty()) {
            f = f.status(ops::parse_status(s)?);
        }
        if let Some(w) = self
            .workflow
            .as_deref()
            .map(str::trim)
            .filter(|w| !w.is_empty())
        {
            f = f.workflow(w);
        }
        if let Some(q) = self.queue.as_deref().filter(|q| !q.is_empty()) {
            f = f.queue(q);
        }
        if let Some(v) = self
            .version
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            f = f.version(v);
        }
        Ok(f)
    }
}

/// The runs `filter` selects; with a queue, also the queue and each waiting run's position.
async fn listed(
    rt: &Runtime,
    filter: &RunFilter,
) -> Result<(Option<QueueView>, Vec<QueuedRun>), CliError> {
    if let Some(name) = &filter.queue {
        let (queue, runs) = ops::queue_runs(rt, name, filter).await?;
        return Ok((Some(queue), runs));
    }
    let runs = ops::list_runs(rt, filter).await?;
    let runs = runs
        .into_iter()
        .map(|run| QueuedRun {
            run,
            position: None,
        })
        .collect();
    Ok((None, runs))
}

/// The one-off message a redirect after an action carries.
#[derive(Debug, Default, Deserialize)]
struct Flash {
    notice: Option<String>,
    error: Option<String>,
}

impl Flash {
    fn banner(&self) -> pages::Banner<'_> {
        match (&self.error, &self.notice) {
            (Some(e), _) => pages::Banner::Error(e),
            (None, Some(n)) => pages::Banner::Notice(n),
            (None, None) => pages::Banner::None,
        }
    }
}

async fn runs_page(
    State(app): Shared,
    Query(q): Query<RunsQuery>,
) -> Result<Html<String>, WebError> {
    let filter = q.filter().map_err(WebError::page)?;
    let (queue, runs) = listed(&app.rt, &filter).await.map_err(WebError::page)?;
    let flash = Flash {
        notice: q.notice.clone(),
        error: q.error.clone(),
    };
    Ok(Html(pages::runs(
        &app.database,
        &filter,
        queue.as_ref(),
        &runs,
        flash.banner(),
    )))
}

async fn schedules_page(State(app): Shared) -> Result<Html<String>, WebError> {
    let schedules = crate::schedules::list_schedules(&app.rt)
        .await
        .map_err(WebError::page)?;
    Ok(Html(pages::schedules(&app.database, &schedules)))
}

async fn schedule_page(
    State(app): Shared,
    Path(name): Path<String>,
) -> Result<Html<String>, WebError> {
    let detail = crate::schedules::detail(&app.rt, &name)
        .await
        .map_err(WebError::page)?;
    Ok(Html(pages::schedule(&app.database, &detail)))
}

async fn queues_page(State(app): Shared) -> Result<Html<String>, WebError> {
    let queues = ops::list_queues(&app.rt).await.map_err(WebError::page)?;
    Ok(Html(pages::queues(&app.database, &queues)))
}

async fn activity_page(State(app): Shared) -> Result<Html<String>, WebError> {
    let activity = activity::gather(&app.rt).await.map_err(WebError::page)?;
    Ok(Html(pages::activity(&app.database, &activity)))
}

async fn metrics_text(State(app): Shared) -> Result<Response, WebError> {
    let text = metrics::render(&app.rt).await.map_err(WebError::api)?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

async fn api_queues(State(app): Shared) -> Result<Response, WebError> {
    let queues = ops::list_queues(&app.rt).await.map_err(WebError::api)?;
    Ok(Json(queues).into_response())
}

async fn run_page(
    State(app): Shared,
    Path(id): Path<String>,
    Query(flash): Query<Flash>,
) -> Result<Html<String>, WebError> {
    let id = ops::parse_run_id(&id).map_err(WebError::page)?;
    let (detail, events) = ops::run_with_events(&app.rt, id)
        .await
        .map_err(WebError::page)?;
    Ok(Html(pages::run(
        &app.database,
        &detail,
        &events,
        flash.banner(),
    )))
}

#[derive(Debug, Default, Deserialize)]
struct HooksQuery {
    token: Option<String>,
    notice: Option<String>,
    error: Option<String>,
}

async fn hooks_page(
    State(app): Shared,
    Query(q): Query<HooksQuery>,
) -> Result<Html<String>, WebError> {
    let mut filter = HookFilter::new().limit(500);
    if let Some(t) = q.token.as_deref().filter(|t| !t.is_empty()) {
        filter = filter.token(t);
    }
    let hooks = ops::list_hooks(&app.rt, &filter)
        .await
        .map_err(WebError::page)?;
    let flash = Flash {
        notice: q.notice.clone(),
        error: q.error.clone(),
    };
    Ok(Html(pages::hooks(
        &app.database,
        q.token.as_deref().unwrap_or_default(),
        &hooks,
        flash.banner(),
    )))
}

async fn cancel(
    State(app): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Redirect, WebError> {
    same_origin(&headers).map_err(WebError::page)?;
    let id = ops::parse_run_id(&id).map_err(WebError::page)?;
    let back = format!("/runs/{id}");
    Ok(match ops::cancel(&app.rt, id).await {
        Ok(done) if done.cancelled => flash_redirect(&back, "notice", "Run cancelled."),
        Ok(done) => flash_redirect(
            &back,
            "notice",
            &format!(
                "The run had already ended ({}); nothing changed.",
                done.status
            ),
        ),
        Err(e) => flash_redirect(&back, "error", &e.to_string()),
    })
}

async fn retry(
    State(app): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Redirect, WebError> {
    same_origin(&headers).map_err(WebError::page)?;
    let id = ops::parse_run_id(&id).map_err(WebError::page)?;
    let back = format!("/runs/{id}");
    Ok(match ops::retry(&app.rt, id).await {
        Ok(done) if done.was == RunStatus::Failed => flash_redirect(
            &back,
            "notice",
            "Run re-opened: its failed step gets a fresh set of attempts.",
        ),
        Ok(_) => flash_redirect(
            &back,
            "notice",
            "Retry requested: a worker picks the run up now.",
        ),
        Err(e) => flash_redirect(&back, "error", &e.to_string()),
    })
}

#[derive(Debug, Deserialize)]
struct ResumeForm {
    token: String,
    payload: String,
    /// The page to return to (a local path).
    back: Option<String>,
}

async fn resume(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<ResumeForm>,
) -> Result<Redirect, WebError> {
    same_origin(&headers).map_err(WebError::page)?;
    // Only local paths: a form must not turn the dashboard into a redirector.
    let back = guard::local_path(form.back.as_deref());
    // An empty box is a slip, not a payload: a workflow expecting `T` would fail on `null`.
    let result = match ops::parse_payload(&form.payload) {
        Ok(payload) => ops::resume(&app.rt, &form.token, payload).await,
        Err(e) => Err(e),
    };
    Ok(match result {
        Ok(done) => flash_redirect(
            back,
            "notice",
            &format!(
                "Payload delivered to hook {:?} of run {}.",
                done.token, done.run_id
            ),
        ),
        Err(e) => flash_redirect(back, "error", &e.to_string()),
    })
}

async fn api_runs(State(app): Shared, Query(q): Query<RunsQuery>) -> Result<Response, WebError> {
    let filter = q.filter().map_err(WebError::api)?;
    let (queue, runs) = listed(&app.rt, &filter).await.map_err(WebError::api)?;
    Ok(match queue {
        // With a queue: the queue and its runs, each with its position.
        Some(queue) => Json(serde_json::json!({ "queue": queue, "runs": runs })).into_response(),
        None => {
            let runs: Vec<_> = runs.into_iter().map(|r| r.run).collect();
            Json(runs).into_response()
        }
    })
}

async fn api_run(State(app): Shared, Path(id): Path<String>) -> Result<Response, WebError> {
    let id = ops::parse_run_id(&id).map_err(WebError::api)?;
    let detail = ops::run_detail(&app.rt, id).await.map_err(WebError::api)?;
    Ok(Json(detail).into_response())
}

async fn api_events(State(app): Shared, Path(id): Path<String>) -> Result<Response, WebError> {
    let id = ops::parse_run_id(&id).map_err(WebError::api)?;
    let events = ops::events(&app.rt, id).await.map_err(WebError::api)?;
    Ok(Json(events).into_response())
}

async fn api_streams(State(app): Shared, Path(id): Path<String>) -> Result<Response, WebError> {
    let id = ops::parse_run_id(&id).map_err(WebError::api)?;
    app.rt
        .get_run(&id)
        .info()
        .await
        .map_err(|e| WebError::api(e.into()))?;
    let streams = ops::streams(&app.rt, id).await.map_err(WebError::api)?;
    Ok(Json(streams).into_response())
}

#[derive(Debug, Deserialize)]
struct ChunksQuery {
    #[serde(default)]
    from: u64,
    limit: Option<usize>,
}

/// A stream's chunks from `from` on, at most `limit` (1000 by default), as they are now.
async fn api_stream(
    State(app): Shared,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<ChunksQuery>,
) -> Result<Response, WebError> {
    let id = ops::parse_run_id(&id).map_err(WebError::api)?;
    let limit = q.limit.unwrap_or(1000).min(10_000);
    let chunks = ops::chunks(&app.rt, id, &name, q.from, limit)
        .await
        .map_err(WebError::api)?;
    Ok(Json(chunks).into_response())
}

async fn api_hooks(State(app): Shared, Query(q): Query<HooksQuery>) -> Result<Response, WebError> {
    let mut filter = HookFilter::new().limit(500);
    if let Some(t) = q.token.as_deref().filter(|t| !t.is_empty()) {
        filter = filter.token(t);
    }
    let hooks = ops::list_hooks(&app.rt, &filter)
        .await
        .map_err(WebError::api)?;
    Ok(Json(hooks).into_response())
}

/// Refuses a form posted by another site: browsers send `Origin` with every POST, and
/// `Sec-Fetch-Site` where they support it.
fn same_origin(headers: &HeaderMap) -> Result<(), CliError> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if get("sec-fetch-site").is_some_and(|s| s == "cross-site" || s == "same-site") {
        return Err(CliError::Usage(
            "refused: the request came from another site".to_owned(),
        ));
    }
    if let (Some(origin), Some(host)) = (get("origin"), get("host")) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        if origin_host != host {
            return Err(CliError::Usage(format!(
                "refused: the request came from {origin}, not from this dashboard"
            )));
        }
    }
    Ok(())
}

/// `path` (a local path, visible ASCII) with the message added to its query.
fn flash_redirect(path: &str, kind: &str, message: &str) -> Redirect {
    let join = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!(
        "{path}{join}{kind}={}",
        pages::url_encode(message)
    ))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn refuses_posts_from_other_sites() {
        assert!(same_origin(&headers(&[])).is_ok());
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
        ]))
        .is_ok());
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "https://evil.example"),
        ]))
        .is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "cross-site")])).is_err());
    }
}
