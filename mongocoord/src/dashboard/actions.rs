//! The write actions (absent in read-only mode, behind the token): requeue,
//! cancel, an agent name's pause or resume and a schedule's, each a preview
//! of what it will touch (`confirm.rs`) and then the change; enqueue from
//! JSON; and the login that sets the token's cookie.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use bson::{doc, Document};
use mongoagent::{NewTask, Queue};
use serde::Deserialize;
use store_trait::Store;

use super::confirm::{self, TaskAction};
use super::pages::{self, Page};
use super::routes::{html, known_queue, page, AppState, Fail};
use super::{auth, App};
use crate::data;
use crate::schedules::Action;

/// The form of both steps of a requeue or a cancel: a task id, or a JSON
/// equality filter.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct TaskForm {
    queue: String,
    filter: String,
    id: String,
}

impl TaskForm {
    fn filter(&self) -> Result<Document, Fail> {
        if !self.id.is_empty() {
            return Ok(doc! { "_id": data::task_id(&self.id) });
        }
        let text = if self.filter.trim().is_empty() { "{}" } else { &self.filter };
        data::parse_object("filter", text).map_err(Fail::Bad)
    }
}

fn queue_of<S: Store + Clone>(app: &App<S>, name: &str) -> Result<Queue<S>, Fail> {
    let q = known_queue(app, Some(name))?;
    Queue::new(app.store.clone(), q).map_err(|e| Fail::Bad(e.to_string()))
}

/// Requeues or cancels (or with `dry_run`, lists) the tasks `f` selects, by
/// the library's operation: the preview and the action read alike.
async fn apply<S: Store + Clone>(
    app: &App<S>,
    action: TaskAction,
    f: &TaskForm,
    dry_run: bool,
) -> Result<Vec<String>, Fail> {
    let q = queue_of(app, &f.queue)?;
    let filter = f.filter()?;
    let done = match action {
        TaskAction::Requeue => q.requeue(filter).dry_run(dry_run).await,
        TaskAction::Cancel => q.cancel(filter).dry_run(dry_run).await,
    };
    Ok(done.map_err(|e| Fail::Store(e.to_string()))?.iter().map(ToString::to_string).collect())
}

async fn preview<S: Store + Clone>(
    app: &App<S>,
    headers: &HeaderMap,
    action: TaskAction,
    f: TaskForm,
) -> Result<Response, Fail> {
    let ids = apply(app, action, &f, true).await?;
    let live = confirm::tasks(action, &f.queue, &f.filter, &f.id, &ids);
    let title = if action == TaskAction::Requeue { "Requeue?" } else { "Cancel?" };
    Ok(page(app, headers, Page { title: title.into(), live, ..Page::default() }))
}

async fn act<S: Store + Clone>(app: &App<S>, action: TaskAction, f: TaskForm) -> Result<Response, Fail> {
    let done = apply(app, action, &f, false).await?;
    app.changed().await;
    tracing::info!(queue = %f.queue, action = ?action, count = done.len(), "dashboard changed tasks");
    if !f.id.is_empty() {
        return Ok(
            Redirect::to(&format!("/tasks/{}?queue={}", pages::url(&f.id), pages::url(&f.queue))).into_response()
        );
    }
    let (title, text) = match action {
        TaskAction::Requeue => ("Requeued", format!("Requeued {} task(s).", done.len())),
        TaskAction::Cancel => ("Cancelled", format!("Cancelled {} task(s).", done.len())),
    };
    Ok(html(pages::message(title, &text, "/").render(false, app.cfg.read_only)))
}

pub(super) async fn requeue_preview<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    preview(&app, &headers, TaskAction::Requeue, f).await
}

pub(super) async fn requeue<S: Store + Clone>(
    State(app): AppState<S>,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    act(&app, TaskAction::Requeue, f).await
}

pub(super) async fn cancel_preview<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    preview(&app, &headers, TaskAction::Cancel, f).await
}

pub(super) async fn cancel<S: Store + Clone>(
    State(app): AppState<S>,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    act(&app, TaskAction::Cancel, f).await
}

/// The form of both steps of an agent name's pause or resume.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct AgentForm {
    queue: String,
    agent: String,
    action: String,
}

impl AgentForm {
    /// Whether the action pauses (`true`) or resumes.
    fn pause(&self) -> Result<bool, Fail> {
        if self.agent.trim().is_empty() {
            return Err(Fail::Bad("name the agent to pause or resume".into()));
        }
        match self.action.as_str() {
            "pause" => Ok(true),
            "resume" => Ok(false),
            other => Err(Fail::Bad(format!("unknown agent action {other:?}: pause or resume"))),
        }
    }
}

pub(super) async fn agent_preview<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Form(f): Form<AgentForm>,
) -> Result<Response, Fail> {
    let q = known_queue(&app, Some(&f.queue))?;
    let pause = f.pause()?;
    let counts = data::queue_counts(&app.store, q, Some(&f.agent)).await.map_err(Fail::Store)?;
    let row = counts.agents.get(&f.agent).filter(|r| r.counts().iter().any(|n| *n > 0) || r.paused);
    let live = confirm::agent(q, &f.agent, pause, row);
    Ok(page(&app, &headers, Page { title: format!("{} {}?", f.action, f.agent), live, ..Page::default() }))
}

pub(super) async fn agent<S: Store + Clone>(
    State(app): AppState<S>,
    Form(f): Form<AgentForm>,
) -> Result<Response, Fail> {
    let q = queue_of(&app, &f.queue)?;
    let pause = f.pause()?;
    q.set_paused(&f.agent, pause).await.map_err(|e| Fail::Store(e.to_string()))?;
    app.changed().await;
    tracing::info!(queue = %f.queue, agent = %f.agent, paused = pause, "dashboard paused or resumed an agent name");
    Ok(Redirect::to("/").into_response())
}

/// The enqueue form: the task's fields as a JSON object.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct EnqueueForm {
    queue: String,
    agent: String,
    data: String,
    priority: String,
}

pub(super) async fn enqueue<S: Store + Clone>(
    State(app): AppState<S>,
    Form(f): Form<EnqueueForm>,
) -> Result<Response, Fail> {
    let q = queue_of(&app, &f.queue)?;
    if f.agent.trim().is_empty() {
        return Err(Fail::Bad("the task needs an agent".into()));
    }
    let data = data::parse_object("task", &f.data).map_err(Fail::Bad)?;
    let priority: i64 = match f.priority.trim() {
        "" => 0,
        p => p.parse().map_err(|_| Fail::Bad(format!("the priority must be an integer, not {p:?}")))?,
    };
    let task = NewTask::new(f.agent.trim(), data).priority(priority);
    let (id, inserted) = q.enqueue(task).await.map_err(|e| Fail::Bad(e.to_string()))?;
    app.changed().await;
    tracing::info!(queue = %f.queue, %id, inserted, "dashboard enqueued a task");
    Ok(Redirect::to(&format!("/tasks/{}?queue={}", pages::url(&id.to_string()), pages::url(&f.queue))).into_response())
}

pub(super) async fn login_form<S>(State(app): AppState<S>, headers: HeaderMap) -> Response {
    page(&app, &headers, Page { title: "Log in".into(), live: pages::login(), ..Page::default() })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LoginForm {
    token: String,
}

pub(super) async fn login<S>(State(app): AppState<S>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    let Some(token) = app.token.as_ref() else { return StatusCode::NOT_FOUND.into_response() };
    if !auth::same_origin(&headers, app.cfg.public.as_ref()) {
        return (StatusCode::FORBIDDEN, "forbidden: cross-origin request\n").into_response();
    }
    if !token.matches(f.token.trim()) {
        return (
            StatusCode::UNAUTHORIZED,
            html(pages::message("Log in", "That is not the token.", "/login").render(false, false)),
        )
            .into_response();
    }
    let mut res = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::cookie(token, app.cfg.public.as_ref())) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// The form of both steps of a schedule's pause or resume.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ScheduleForm {
    queue: String,
    name: String,
    action: String,
}

impl ScheduleForm {
    fn action(&self) -> Result<Action, Fail> {
        match self.action.as_str() {
            "pause" => Ok(Action::Pause),
            "resume" => Ok(Action::Resume),
            other => Err(Fail::Bad(format!("unknown schedule action {other:?}: pause or resume"))),
        }
    }
}

pub(super) async fn schedule_preview<S: Store + Clone>(
    State(app): AppState<S>,
    headers: HeaderMap,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, Fail> {
    let q = known_queue(&app, Some(&f.queue))?;
    f.action()?;
    let rows = crate::schedules::rows(&app.store, q, None).await.map_err(Fail::Store)?;
    let row = rows
        .iter()
        .find(|r| r["name"] == f.name.as_str())
        .ok_or_else(|| Fail::NotFound(format!("no schedule {} in {q}", f.name)))?;
    let live = confirm::schedule(q, &f.name, &f.action, row);
    Ok(page(&app, &headers, Page { title: format!("{} {}?", f.action, f.name), live, ..Page::default() }))
}

pub(super) async fn schedule<S: Store + Clone>(
    State(app): AppState<S>,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, Fail> {
    let q = known_queue(&app, Some(&f.queue))?;
    let found = crate::schedules::apply(&app.store, q, None, f.action()?, &f.name).await.map_err(Fail::Store)?;
    if !found {
        return Err(Fail::NotFound(format!("no schedule {} in {q}", f.name)));
    }
    app.changed().await;
    tracing::info!(queue = q, schedule = %f.name, action = %f.action, "dashboard changed a schedule");
    Ok(Redirect::to("/").into_response())
}
