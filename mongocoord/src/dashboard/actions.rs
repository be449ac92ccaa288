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
use store_trait::{Key, Store};

use super::confirm::{self, TaskAction};
use super::pages::{self, Page};
use super::respond::{html, known_queue, page, AppState, Fail};
use super::{audit, auth, escape, App};
use crate::data;
use crate::schedules::Action;

/// The form of both steps of a requeue or a cancel. The preview takes a task
/// id or a JSON equality filter; the confirmation takes `ids`, the ids the
/// preview listed (a JSON array of ids as extended JSON, so an `ObjectId`
/// stays one), or one task's `id`, and never a filter: a filter read again
/// at the confirmation would also touch the tasks that came to match it
/// since the preview.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct TaskForm {
    queue: String,
    filter: String,
    id: String,
    ids: String,
}

impl TaskForm {
    /// The preview's selection.
    fn filter(&self) -> Result<Document, Fail> {
        if !self.id.is_empty() {
            return Ok(doc! { "_id": data::task_id(&self.id) });
        }
        let text = if self.filter.trim().is_empty() { "{}" } else { &self.filter };
        data::parse_object("filter", text).map_err(Fail::Bad)
    }

    /// The confirmation's selection: the ids it acts on.
    fn pinned(&self) -> Result<Vec<Key>, Fail> {
        if !self.ids.is_empty() {
            return confirm::parse_ids(&self.ids).map_err(Fail::Bad);
        }
        if !self.id.is_empty() {
            return Key::from_bson(data::task_id(&self.id)).map(|k| vec![k]).map_err(|e| Fail::Bad(e.into()));
        }
        Err(Fail::bad("a confirmation acts on the ids its preview listed: preview the action first"))
    }
}

fn queue_of<S: Store + Clone>(app: &App<S>, name: &str) -> Result<Queue<S>, Fail> {
    let q = known_queue(app, Some(name))?;
    Queue::new(app.store.clone(), q).map_err(|e| Fail::Bad(e.into()))
}

/// Lists the tasks `f` selects as the requeue or cancel would (the library's
/// `dry_run`): the preview and the action read alike.
async fn preview<S: Store + Clone>(
    app: &App<S>,
    headers: &HeaderMap,
    action: TaskAction,
    f: TaskForm,
) -> Result<Response, Fail> {
    let q = queue_of(app, &f.queue)?;
    let filter = f.filter()?;
    let found = match action {
        TaskAction::Requeue => q.requeue(filter).dry_run(true).await,
        TaskAction::Cancel => q.cancel(filter).dry_run(true).await,
    };
    let ids = found.map_err(|e| Fail::Store(e.into()))?;
    let live = confirm::tasks(action, &f.queue, &f.id, &ids);
    let title = if action == TaskAction::Requeue { "Requeue?" } else { "Cancel?" };
    Ok(page(app, headers, Page { title: title.into(), live, ..Page::default() }))
}

/// Requeues or cancels the tasks the preview listed, by id, each under the
/// action's own condition (one that changed state since is passed over).
async fn act<S: Store + Clone>(
    app: &App<S>,
    who: &audit::Client,
    action: TaskAction,
    f: TaskForm,
) -> Result<Response, Fail> {
    let q = queue_of(app, &f.queue)?;
    let ids = f.pinned()?;
    let done = match action {
        TaskAction::Requeue => q.requeue_ids(&ids).await,
        TaskAction::Cancel => q.cancel_ids(&ids).await,
    };
    let done = done.map_err(|e| Fail::Store(e.into()))?;
    app.changed().await;
    let done_ids: Vec<String> = done.iter().map(ToString::to_string).collect();
    audit::record(who, action.verb(), &f.queue, &done_ids);
    if !f.id.is_empty() {
        return Ok(
            Redirect::to(&format!("/tasks/{}?queue={}", escape::url(&f.id), escape::url(&f.queue))).into_response()
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
    who: audit::Client,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    act(&app, &who, TaskAction::Requeue, f).await
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
    who: audit::Client,
    Form(f): Form<TaskForm>,
) -> Result<Response, Fail> {
    act(&app, &who, TaskAction::Cancel, f).await
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
            return Err(Fail::bad("name the agent to pause or resume"));
        }
        match self.action.as_str() {
            "pause" => Ok(true),
            "resume" => Ok(false),
            other => Err(Fail::bad(format!("unknown agent action {other:?}: pause or resume"))),
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
    who: audit::Client,
    Form(f): Form<AgentForm>,
) -> Result<Response, Fail> {
    let q = queue_of(&app, &f.queue)?;
    let pause = f.pause()?;
    q.set_paused(&f.agent, pause).await.map_err(|e| Fail::Store(e.into()))?;
    app.changed().await;
    audit::record(&who, &format!("{} agent", f.action), &f.queue, std::slice::from_ref(&f.agent));
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
    who: audit::Client,
    Form(f): Form<EnqueueForm>,
) -> Result<Response, Fail> {
    let q = queue_of(&app, &f.queue)?;
    if f.agent.trim().is_empty() {
        return Err(Fail::bad("the task needs an agent"));
    }
    let data = data::parse_object("task", &f.data).map_err(Fail::Bad)?;
    let priority: i64 = match f.priority.trim() {
        "" => 0,
        p => p.parse().map_err(|_| Fail::bad(format!("the priority must be an integer, not {p:?}")))?,
    };
    let task = NewTask::new(f.agent.trim(), data).priority(priority);
    let (id, inserted) = q.enqueue(task).await.map_err(|e| Fail::Bad(e.into()))?;
    app.changed().await;
    let what = if inserted { "enqueue" } else { "enqueue (a duplicate, not inserted)" };
    audit::record(&who, what, &f.queue, &[id.to_string()]);
    Ok(Redirect::to(&format!("/tasks/{}?queue={}", escape::url(&id.to_string()), escape::url(&f.queue)))
        .into_response())
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

/// Logs out: the cookie is emptied and expires. From this dashboard's own
/// pages only, so that no other site can log an operator out.
pub(super) async fn logout<S>(State(app): AppState<S>, headers: HeaderMap) -> Response {
    if !auth::same_origin(&headers, app.cfg.public.as_ref()) {
        return (StatusCode::FORBIDDEN, "forbidden: cross-origin request\n").into_response();
    }
    let mut res = Redirect::to("/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::cleared_cookie(app.cfg.public.as_ref())) {
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
            other => Err(Fail::bad(format!("unknown schedule action {other:?}: pause or resume"))),
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
    who: audit::Client,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, Fail> {
    let q = known_queue(&app, Some(&f.queue))?;
    let found = crate::schedules::apply(&app.store, q, None, f.action()?, &f.name).await.map_err(Fail::Store)?;
    if !found {
        return Err(Fail::NotFound(format!("no schedule {} in {q}", f.name)));
    }
    app.changed().await;
    audit::record(&who, &format!("{} schedule", f.action), q, std::slice::from_ref(&f.name));
    Ok(Redirect::to("/").into_response())
}
