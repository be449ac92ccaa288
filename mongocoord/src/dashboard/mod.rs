//! `mongocoord dashboard`: a live web view of elections, locks, queues and
//! schedules, with operator actions and Prometheus metrics.
//!
//! - `routes.rs`: the router and the read-only handlers (pages, JSON).
//! - `actions.rs`: requeue, cancel, enqueue, an agent name's and a
//!   schedule's pause and resume, login.
//! - `confirm.rs`: each action's confirmation: what it will touch.
//! - `pages.rs`: the HTML, every value escaped.
//! - `live.rs`: one watcher per collection, fanned out to tabs over SSE.
//! - `history.rs`: the events each task went through while the dashboard
//!   runs (one `Queue::events` feed per queue), for the task detail page.
//! - `auth.rs`: the Host check, the Origin check and the token (on actions,
//!   and on reads when not bound to loopback or with `--auth-reads`).
//! - `audit.rs`: every action, who asked and what it touched, at `warn`.
//! - `metrics.rs`: `/metrics` through `prometheus-client`.
//!
//! The data comes from `crate::data`, the same functions the CLI views print.

mod actions;
mod audit;
mod auth;
mod confirm;
mod conns;
mod escape;
mod history;
mod live;
mod metrics;
mod pages;
mod respond;
mod routes;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use store_trait::Store;
use tokio_util::sync::CancellationToken;

use crate::error::CliError;

pub(crate) use routes::router;

/// Largest request body an action accepts.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

/// What the dashboard shows and where: collections, mode, address.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The queue collections shown (and the only ones actions may touch).
    pub(crate) queues: Vec<String>,
    /// The lock collection.
    pub(crate) locks: String,
    /// The election lease collection.
    pub(crate) elections: String,
    /// The node status collection.
    pub(crate) status: String,
    /// No actions: no action routes, no buttons (and no login, unless reads
    /// need the token).
    pub(crate) read_only: bool,
    /// Reads (pages, JSON, `/events`, `/metrics`) need the token too: on
    /// when not bound to loopback, or with `--auth-reads`.
    pub(crate) auth_reads: bool,
    /// The address served (the Host check allows it).
    pub(crate) addr: SocketAddr,
    /// Where browsers reach it, when not at `addr` (a proxy in front).
    pub(crate) public: Option<auth::PublicUrl>,
    /// How often sections are re-announced when the store has no change
    /// notifications.
    pub(crate) poll: Duration,
    /// What one dashboard serves at once, and for how long.
    pub(crate) limits: Limits,
}

/// The dashboard's bounds on load, so that no client (with or without the
/// token) can hold it or the store without end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Requests handled at once (others wait their turn, within `timeout`);
    /// a live stream holds its slot only until its headers are sent.
    pub(crate) requests: usize,
    /// How long a request may take to answer (a 503 after it), waiting for
    /// its slot included; a live stream's body is not bounded by it.
    pub(crate) timeout: Duration,
    /// Live streams (`/events`: one per open tab) at once; past it, a 503,
    /// and the tab falls back to its reload link.
    pub(crate) live_clients: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { requests: 32, timeout: Duration::from_secs(30), live_clients: 256 }
    }
}

impl Config {
    /// Defaults for everything but the queues and the address.
    pub(crate) fn new(queues: Vec<String>, addr: SocketAddr) -> Config {
        Config {
            queues,
            locks: mongolock::DEFAULT_COLLECTION.into(),
            elections: mongoelector::DEFAULT_COLLECTION.into(),
            status: mongoelector::DEFAULT_STATUS_COLLECTION.into(),
            read_only: false,
            auth_reads: false,
            addr,
            public: None,
            poll: Duration::from_secs(1),
            limits: Limits::default(),
        }
    }
}

/// The server's shared state.
#[derive(Debug)]
pub(crate) struct App<S> {
    pub(crate) store: S,
    pub(crate) cfg: Config,
    /// `None` when nothing needs it (read-only, reads open).
    pub(crate) token: Option<auth::Token>,
    pub(crate) live: live::Live,
    /// The task events seen since the start.
    pub(crate) history: history::History,
    /// Cancelled at shutdown: ends the live streams, which would otherwise
    /// hold the graceful shutdown open.
    pub(crate) shutdown: CancellationToken,
    /// The last read of the overview and when it was made (`routes::gather`).
    pub(crate) overview: tokio::sync::Mutex<Option<(tokio::time::Instant, Arc<pages::Overview>)>>,
}

impl<S: Store + Clone + 'static> App<S> {
    /// The state, with the watchers started (one per watched collection).
    pub(crate) fn new(store: S, cfg: Config, token: Option<auth::Token>) -> Result<Arc<App<S>>, CliError> {
        let mut watched = vec![
            (crate::data::coll(&cfg.locks)?, "locks".to_owned()),
            (crate::data::coll(&cfg.elections)?, "elections".to_owned()),
            (crate::data::coll(&cfg.status)?, "elections".to_owned()),
        ];
        for q in &cfg.queues {
            watched.push((crate::data::coll(q)?, format!("queue:{q}")));
            let schedules = mongoagent::schedule::Schedules::new(store.clone(), q)?;
            watched.push((schedules.collection().clone(), format!("queue:{q}")));
        }
        let live = live::Live::start(&store, watched, cfg.poll, cfg.limits.live_clients);
        let history = history::History::start(&store, &cfg.queues, cfg.poll);
        let token = if cfg.read_only && !cfg.auth_reads { None } else { token };
        Ok(Arc::new(App {
            store,
            cfg,
            token,
            live,
            history,
            shutdown: CancellationToken::new(),
            overview: Default::default(),
        }))
    }
}

impl<S> App<S> {
    /// Forgets the cached overview: an action changed the store, and the page
    /// it redirects to must show it.
    pub(crate) async fn changed(&self) {
        *self.overview.lock().await = None;
    }
}

/// The command-line options of `mongocoord dashboard`.
#[derive(Debug)]
pub(crate) struct Opts {
    pub(crate) bind: String,
    pub(crate) read_only: bool,
    /// `--auth-reads`: reads need the token even on loopback.
    pub(crate) auth_reads: bool,
    pub(crate) token_file: Option<PathBuf>,
    /// `--public-url`.
    pub(crate) public_url: Option<String>,
    pub(crate) queues: Vec<String>,
    /// The lock, election lease and node status collections.
    pub(crate) collections: [String; 3],
}

/// `mongocoord dashboard`: serves until SIGINT or SIGTERM.
pub(crate) async fn run<S: Store + Clone + 'static>(store: S, o: Opts) -> Result<u8, CliError> {
    // The library figures count from now on (see `metrics.rs`).
    crate::exposition::installed();
    let public = o.public_url.as_deref().map(auth::PublicUrl::parse).transpose()?;
    let listener = tokio::net::TcpListener::bind(&o.bind)
        .await
        .map_err(|e| CliError::io(format!("cannot listen on {}", o.bind), e))?;
    let addr =
        listener.local_addr().map_err(|e| CliError::io(format!("cannot read the address bound for {}", o.bind), e))?;
    // Anyone on the network may read what a dashboard on another interface
    // shows (task data, lock holders, host names): then reads need the token.
    let auth_reads = o.auth_reads || !addr.ip().is_loopback();
    let token = match (&o.token_file, o.read_only && !auth_reads) {
        (_, true) => None,
        (Some(f), false) => Some(auth::Token::from_file(f)?),
        (None, false) => Some(auth::Token::random()?),
    };
    let mut cfg = Config::new(o.queues, addr);
    cfg.read_only = o.read_only;
    cfg.auth_reads = auth_reads;
    cfg.public = public;
    [cfg.locks, cfg.elections, cfg.status] = o.collections;
    let app = App::new(store, cfg, token.clone())?;
    eprintln!("mongocoord dashboard on http://{addr}/");
    let needs = match (o.read_only, auth_reads) {
        (false, false) => "actions need",
        (false, true) => "reads and actions need",
        (true, _) => "reads need",
    };
    match (&token, &o.token_file) {
        (Some(t), None) => eprintln!("{needs} this token (log in at http://{addr}/login): {}", t.reveal()),
        (Some(_), Some(f)) => eprintln!("{needs} the token in {}", f.display()),
        (None, _) => eprintln!("read-only: no actions"),
    }
    tracing::info!(%addr, read_only = o.read_only, auth_reads, "dashboard started");
    let shutdown = app.shutdown.clone();
    let router = router(app);
    let stop = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        shutdown.cancel();
    };
    // With the peer's address, for the audit log (`audit::Client`).
    let listener = conns::Bounded::new(listener, conns::MAX_CONNECTIONS, conns::IDLE);
    axum::serve(listener, router.into_make_service_with_connect_info::<conns::Peer>())
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| CliError::io("the dashboard failed", e))?;
    Ok(0)
}
