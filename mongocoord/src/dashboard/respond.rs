//! What every handler answers with: an HTML page or fragment, or a [`Fail`]
//! whose status says whose fault it was; and the one check of the queue a
//! request names.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::pages::{self, Page};
use super::App;
use crate::error::CliError;

pub(super) type AppState<S> = State<Arc<App<S>>>;

/// An error page with its status: the status says whose fault it is, the
/// error (kept with its source) what went wrong.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The request is wrong (bad JSON, an unknown queue, a bad number, a task
    /// the queue refuses).
    Bad(CliError),
    /// No such task or schedule.
    NotFound(String),
    /// The store failed.
    Store(CliError),
}

impl Fail {
    /// A wrong request, with the dashboard's own message.
    pub(super) fn bad(message: impl Into<String>) -> Fail {
        Fail::Bad(CliError::invalid(message))
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let (status, title, text) = match self {
            Fail::Bad(e) => (StatusCode::BAD_REQUEST, "Bad request", e.to_string()),
            Fail::NotFound(t) => (StatusCode::NOT_FOUND, "Not found", t),
            Fail::Store(e) => (StatusCode::SERVICE_UNAVAILABLE, "The store failed", e.to_string()),
        };
        (status, html(pages::message(title, &text, "/").render(false, true))).into_response()
    }
}

pub(super) fn html(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

pub(super) fn page<S>(app: &App<S>, headers: &HeaderMap, p: Page) -> Response {
    html(p.render(headers.contains_key("x-fragment"), app.cfg.read_only))
}

/// The queue named by a request: one the dashboard was started with.
pub(super) fn known_queue<'a, S>(app: &'a App<S>, q: Option<&str>) -> Result<&'a str, Fail> {
    match q {
        None | Some("") => app
            .cfg
            .queues
            .first()
            .map(String::as_str)
            .ok_or_else(|| Fail::bad("the dashboard shows no queue: start it with --queue NAME")),
        Some(q) => app
            .cfg
            .queues
            .iter()
            .find(|k| *k == q)
            .map(String::as_str)
            .ok_or_else(|| Fail::bad(format!("the dashboard does not show queue {q}"))),
    }
}
