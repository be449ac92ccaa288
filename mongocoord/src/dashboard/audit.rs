//! The audit log: every action the dashboard takes, who asked for it (the
//! client's address) and what it touched, logged at `warn` under the target
//! [`TARGET`], so the CLI's default filter (`warn`) records it without
//! `--verbose`.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

/// The `tracing` target of the audit records (filter on it to keep them
/// apart: `RUST_LOG=warn,mongocoord::audit=warn`).
pub(crate) const TARGET: &str = "mongocoord::audit";

/// Who sent a request: the peer's address as the server saw it (a proxy's,
/// behind one), and the `X-Forwarded-For` it sent, as given (unchecked).
#[derive(Debug, Clone)]
pub(crate) struct Client {
    peer: Option<SocketAddr>,
    forwarded: Option<String>,
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.peer {
            Some(p) => write!(f, "{p}")?,
            None => f.write_str("unknown")?,
        }
        match &self.forwarded {
            Some(x) => write!(f, " (forwarded for {x:?})"),
            None => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // Present when served with `into_make_service_with_connect_info`, as
        // `dashboard::run` serves; absent in tests that call the router.
        let peer = parts.extensions.get::<ConnectInfo<super::conns::Peer>>().map(|c| c.0 .0);
        let forwarded = parts.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok(Client { peer, forwarded })
    }
}

/// Records that `who` did `what` on `queue` to `ids` (task ids, or the
/// agent or schedule name).
pub(crate) fn record(who: &Client, what: &str, queue: &str, ids: &[String]) {
    tracing::warn!(target: TARGET, client = %who, action = what, queue, count = ids.len(), ids = ?ids, "dashboard action");
}
