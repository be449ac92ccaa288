//! The router: pages (a whole document, or with `X-Fragment` only the part
//! live updates replace), JSON, `/events`, `/metrics`, and unless read-only
//! the login and the write actions behind the token.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bson::{doc, Bson, Document};
use mongoagent::fields;
use serde::Deserialize;
use store_trait::Store;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use super::pages::{self, Overview, Page};
use super::respond::{known_queue, page, AppState, Fail};
use super::{actions, auth, escape, metrics, App, BODY_LIMIT};
use crate::data;

/// The router of `app`'s dashboard.
pub(crate) fn router<S: Store + Clone + 'static>(app: Arc<App<S>>) -> Router {
    let mut reads = Router::new()
        .route("/", get(overview::<S>))
        .route("/tasks", get(task_list::<S>))
        .route("/tasks/{id}", get(task_detail::<S>))
        .route("/events", get(events::<S>))
        .route("/metrics", get(metrics_text::<S>))
        .route("/api/overview", get(api_overview::<S>))
        .route("/api/tasks", get(api_tasks::<S>));
    if let (true, Some(token)) = (app.cfg.auth_reads, app.token.clone()) {
        reads = reads.route_layer(from_fn_with_state(token, auth::require_read_token));
    }
    // The login page and its assets are open: they are how one gets the cookie.
    let mut r = reads
        .route("/assets/app.js", get(|| async { asset("text/javascript", include_str!("assets/app.js")) }))
        .route("/assets/app.css", get(|| async { asset("text/css", include_str!("assets/app.css")) }));
    if let (false, Some(token)) = (app.cfg.read_only, app.token.clone()) {
        let actions = Router::new()
            .route("/requeue/preview", post(actions::requeue_preview::<S>))
            .route("/requeue", post(actions::requeue::<S>))
            .route("/cancel/preview", post(actions::cancel_preview::<S>))
            .route("/cancel", post(actions::cancel::<S>))
            .route("/agent/preview", post(actions::agent_preview::<S>))
            .route("/agent", post(actions::agent::<S>))
            .route("/enqueue", post(actions::enqueue::<S>))
            .route("/schedule/preview", post(actions::schedule_preview::<S>))
            .route("/schedule", post(actions::schedule::<S>))
            .route_layer(from_fn_with_state(
                auth::Guard { token, public: app.cfg.public.clone() },
                auth::require_token,
            ));
        r = r.merge(actions);
    }
    if app.token.is_some() {
        r = r
            .route("/login", get(actions::login_form::<S>).post(actions::login::<S>))
            .route("/logout", post(actions::logout::<S>));
    }
    let hosts = Arc::new(auth::allowed_hosts(app.cfg.addr, app.cfg.public.as_ref()));
    let limits = app.cfg.limits;
    // The limits are the outer layers: a request waits for its slot within
    // its time, and one refused by the Host check has cost a slot only.
    r.with_state(app)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(from_fn(security_headers))
        .layer(from_fn_with_state(hosts, auth::check_host))
        .layer(GlobalConcurrencyLimitLayer::new(limits.requests))
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limits.timeout))
}

/// No script but the dashboard's own file runs, whatever a page contains.
async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Not `no-referrer`: with it, browsers send `Origin: null` on the
    // dashboard's own form posts, and the Origin check refuses them.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    res
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// The overview, read at most once per [`FRESH`] for every tab and scrape
/// together: a change announced to many tabs makes them all re-fetch at once,
/// and they share one read of the store.
async fn gather<S: Store + Clone>(app: &App<S>) -> Result<Arc<Overview>, Fail> {
    // Held across the read, so concurrent requests wait for it instead of
    // reading again (a tokio mutex: holding it across an await is its purpose).
    let mut cached = app.overview.lock().await;
    if let Some((at, o)) = cached.as_ref() {
        if at.elapsed() < FRESH {
            return Ok(o.clone());
        }
    }
    let o = Arc::new(read_overview(app).await?);
    *cached = Some((tokio::time::Instant::now(), o.clone()));
    Ok(o)
}

/// How long a read of the overview is served again.
const FRESH: std::time::Duration = std::time::Duration::from_millis(250);

async fn read_overview<S: Store + Clone>(app: &App<S>) -> Result<Overview, Fail> {
    let s = &app.store;
    let elections = data::elections(s, &app.cfg.elections, &app.cfg.status).await.map_err(Fail::Store)?;
    let locks = data::locks(s, &app.cfg.locks).await.map_err(Fail::Store)?;
    let mut queues = Vec::new();
    for q in &app.cfg.queues {
        let counts = data::queue_counts(s, q, None).await.map_err(Fail::Store)?;
        let schedules = crate::schedules::rows(s, q, None).await.map_err(Fail::Store)?;
        queues.push((q.clone(), counts, schedules));
    }
    Ok(Overview { elections, locks, queues })
}

async fn overview<S: Store + Clone>(State(app): AppState<S>, headers: HeaderMap) -> Result<Response, Fail> {
    let o = gather(&app).await?;
    let mut sections = vec!["locks".to_owned(), "elections".to_owned()];
    sections.extend(app.cfg.queues.iter().map(|q| format!("queue:{q}")));
    let extra = if app.cfg.read_only { String::new() } else { pages::action_forms(&app.cfg.queues) };
    Ok(page(
        &app,
        &headers,
        Page { title: "Overview".into(), sections, live: pages::overview(&o, !app.cfg.read_only), extra },
    ))
}

async fn api_overview<S: Store + Clone>(State(app): AppState<S>) -> Result<Response, Fail> {
    let o = gather(&app).await?;
    let queues: serde_json::Map<String, serde_json::Value> = o
        .queues
        .iter()
        .map(|(q, c, s)| (q.clone(), serde_json::json!({ "agents": c.agents, "skipped": c.skipped, "schedules": s })))
        .collect();
    Ok(Json(serde_json::json!({ "elections": o.elections, "locks": o.locks, "queues": queues })).into_response())
}

/// The query of the task pages.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TaskQuery {
    queue: Option<String>,
    agent: Option<String>,
    state: Option<String>,
    /// One task's id (exact): a 24-digit hex id is an `ObjectId`.
    id: Option<String>,
    page: Option<String>,
}

const PAGE_SIZE: u32 = 50;
/// The last page number served: a page passes over the ids of every task
/// before it (the store has no offset), so pages stop at 10,000 tasks in;
/// the filters reach the rest.
const MAX_PAGE: u32 = 199;

/// The equality filter of a task-list state. States that need a time or
/// lease condition list their nearest superset (delayed with ready, lapsed
/// with claimed, also under its former name, which saved links hold);
/// waiting needs an existence test and is not listed.
fn state_filter(state: &str) -> Result<Document, Fail> {
    Ok(match state {
        "" => doc! {},
        "ready" | "delayed" => doc! { fields::READY: true },
        "running" | "lapsed" | "stuck" | "claimed" => doc! { fields::CLAIMED: true },
        "completed" => doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: false },
        // A cancelled task carries the error mark too; `null` matches a
        // missing field, so this is "not cancelled".
        "failed" => doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: true, fields::CANCELLED: Bson::Null },
        "cancelled" => doc! { fields::COMPLETE: true, fields::CANCELLED: true },
        other => return Err(Fail::bad(format!("unknown state {other:?}"))),
    })
}

async fn list<S: Store + Clone>(app: &App<S>, tq: &TaskQuery) -> Result<(String, data::TaskList, u32, bool), Fail> {
    let q = known_queue(app, tq.queue.as_deref())?.to_owned();
    let page: u32 = match tq.page.as_deref() {
        None | Some("") => 0,
        Some(p) => p.parse().map_err(|_| Fail::bad(format!("the page must be a number, not {p:?}")))?,
    };
    let mut f = state_filter(tq.state.as_deref().unwrap_or(""))?;
    if let Some(a) = tq.agent.as_deref().filter(|a| !a.is_empty()) {
        f.insert(fields::AGENT_NAME, a);
    }
    if let Some(id) = tq.id.as_deref().map(str::trim).filter(|id| !id.is_empty()) {
        f.insert("_id", data::task_id(id));
    }
    if page > MAX_PAGE {
        return Err(Fail::bad(format!(
            "pages stop at {MAX_PAGE}: filter by agent, state or id to see tasks further in"
        )));
    }
    let skip = page * PAGE_SIZE;
    // One more than a page tells whether there is a next one.
    let mut l = data::task_list(&app.store, &q, f, skip, PAGE_SIZE + 1).await.map_err(Fail::Store)?;
    let more = l.tasks.len() > PAGE_SIZE as usize;
    l.tasks.truncate(PAGE_SIZE as usize);
    Ok((q, l, page, more))
}

async fn task_list<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Query(tq): Query<TaskQuery>,
) -> Result<Response, Fail> {
    let (q, l, page, more) = list(&app, &tq).await?;
    let (agent, state) = (tq.agent.clone().unwrap_or_default(), tq.state.clone().unwrap_or_default());
    let id = tq.id.clone().unwrap_or_default();
    let query = format!(
        "queue={}&agent={}&state={}&id={}",
        escape::url(&q),
        escape::url(&agent),
        escape::url(&state),
        escape::url(&id)
    );
    let live = pages::task_list(&q, &l, &query, page, more, !app.cfg.read_only);
    let extra = pages::task_filters(&app.cfg.queues, &q, &pages::Filters { agent: &agent, state: &state, id: &id });
    let title = format!("Tasks in {q}");
    Ok(page_with_filters(&app, &headers, Page { title, sections: vec![format!("queue:{q}")], live, extra }))
}

fn page_with_filters<S>(app: &App<S>, headers: &HeaderMap, mut p: Page) -> Response {
    // The filters go above the list: put them first in the live part's page.
    if !headers.contains_key("x-fragment") {
        p.live = format!("{}{}", std::mem::take(&mut p.extra), p.live);
        p.live = format!(r#"<div class="list">{}</div>"#, p.live);
    }
    page(app, headers, p)
}

async fn api_tasks<S: Store + Clone>(State(app): AppState<S>, Query(tq): Query<TaskQuery>) -> Result<Response, Fail> {
    let (_, l, _, more) = list(&app, &tq).await?;
    Ok(Json(serde_json::json!({ "tasks": l.tasks, "skipped": l.skipped, "more": more })).into_response())
}

async fn task_detail<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(tq): Query<TaskQuery>,
) -> Result<Response, Fail> {
    let q = known_queue(&app, tq.queue.as_deref())?.to_owned();
    let d = data::task_detail(&app.store, &q, &id).await.map_err(Fail::Store)?;
    let d = d.ok_or_else(|| Fail::NotFound(format!("no task {id} in {q}")))?;
    let seen = app.history.of(&q, &pages::id_text(&d.task));
    let live = pages::task_detail(&q, &d, &seen, !app.cfg.read_only);
    Ok(page(
        &app,
        &headers,
        Page { title: format!("Task {id}"), sections: vec![format!("queue:{q}")], live, extra: String::new() },
    ))
}

async fn events<S: Store + Clone>(State(app): AppState<S>) -> Response {
    match app.live.events(app.shutdown.clone()) {
        Some(sse) => sse.into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "too many live tabs are open: reload later\n").into_response(),
    }
}

async fn metrics_text<S: Store + Clone>(State(app): AppState<S>) -> Result<Response, Fail> {
    let o = gather(&app).await?;
    let text = metrics::render(&o, &app.cfg.locks, &app.live.counters).map_err(Fail::Store)?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::state_filter;

    /// Every state a task list offers has a filter, and a saved link with
    /// lapsed's former name still lists the lapsed tasks.
    #[test]
    fn each_shown_state_has_a_filter_and_the_former_name_is_still_read() {
        for s in crate::data::StatsRow::STATES.iter().filter(|s| **s != "waiting") {
            assert!(state_filter(s).is_ok(), "{s}");
        }
        assert_eq!(state_filter("stuck").ok(), state_filter("lapsed").ok());
    }
}
