//! Who may do what: the Host check on every request (DNS rebinding), and on
//! write actions the Origin check (CSRF) and the token, compared in constant
//! time, from a header or a `SameSite=Strict` cookie.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The header a script sends the token in.
pub(crate) const TOKEN_HEADER: &str = "x-mongocoord-token";
/// The cookie the login page sets.
pub(crate) const COOKIE: &str = "mongocoord_token";

/// The secret that write actions require. Its `Debug` does not show it.
#[derive(Clone)]
pub(crate) struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// The token in `path` (surrounding whitespace trimmed); at least 16
    /// characters, so that it cannot be guessed.
    pub(crate) fn from_file(path: &std::path::Path) -> Result<Token, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Token::new(text.trim())
    }

    /// A token given as text; at least 16 characters.
    pub(crate) fn new(text: &str) -> Result<Token, String> {
        if text.chars().count() < 16 {
            return Err("the dashboard token must have at least 16 characters".into());
        }
        Ok(Token(text.into()))
    }

    /// A random token: 32 bytes from the operating system, in hex.
    pub(crate) fn random() -> Result<Token, String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for the dashboard token: {e}"))?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into()))
    }

    /// The token itself, to print once at start.
    pub(crate) fn reveal(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the token, in time that does not depend on where
    /// they differ.
    pub(crate) fn matches(&self, given: &str) -> bool {
        bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }
}

/// The `Host` values a request may carry: the bound address, and `localhost`
/// when bound to loopback. `None` (any) when bound to every interface.
pub(crate) fn allowed_hosts(addr: SocketAddr) -> Option<Vec<String>> {
    if addr.ip().is_unspecified() {
        return None;
    }
    let mut hosts = vec![addr.to_string()];
    if addr.ip().is_loopback() {
        hosts.push(format!("localhost:{}", addr.port()));
    }
    Some(hosts)
}

fn forbidden(why: &str) -> Response {
    (StatusCode::FORBIDDEN, format!("forbidden: {why}\n")).into_response()
}

fn host(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

/// The Host check, on every route: a page served to another name (DNS
/// rebinding) is refused.
pub(crate) async fn check_host(State(allowed): State<Arc<Option<Vec<String>>>>, req: Request, next: Next) -> Response {
    if let Some(allowed) = allowed.as_ref() {
        if !host(req.headers()).is_some_and(|h| allowed.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            return forbidden("unexpected Host header");
        }
    }
    next.run(req).await
}

/// Whether a state-changing request comes from this dashboard's own pages: its
/// `Origin` (or, without one, `Sec-Fetch-Site`) must say so. Requests without
/// either are not from a browser, and still need the token.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Some(h) = host(headers) else { return false };
        return origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&format!("http://{h}")));
    }
    match headers.get("sec-fetch-site").map(|v| v.to_str().unwrap_or("")) {
        Some(site) => matches!(site, "same-origin" | "none"),
        None => true,
    }
}

/// The token a request carries, from the header or the cookie.
pub(crate) fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(t);
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE).and_then(|r| r.strip_prefix('=')))
}

/// The guard of every write action: same origin, then the token.
pub(crate) async fn require_token(State(token): State<Token>, req: Request, next: Next) -> Response {
    if !same_origin(req.headers()) {
        return forbidden("cross-origin request");
    }
    if !presented(req.headers()).is_some_and(|t| token.matches(t)) {
        return (StatusCode::UNAUTHORIZED, "this action needs the dashboard token: log in at /login\n").into_response();
    }
    next.run(req).await
}

/// The `Set-Cookie` value that carries the token to later requests.
pub(crate) fn cookie(token: &Token) -> String {
    format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/", token.reveal())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        let t = Token::new("0123456789abcdef").unwrap();
        assert!(t.matches("0123456789abcdef"));
        assert!(!t.matches("0123456789abcdeF") && !t.matches("0123456789abcde") && !t.matches(""));
        assert!(Token::new("short").is_err());
        let r = Token::random().unwrap();
        assert_eq!(r.reveal().len(), 64);
        assert_ne!(r.reveal(), Token::random().unwrap().reveal());
        assert_eq!(format!("{r:?}"), "Token(…)");
    }

    #[test]
    fn origin_and_cookie() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&h), "a non-browser client");
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h));
        h.insert(header::COOKIE, "a=b; mongocoord_token=xyz".parse().unwrap());
        assert_eq!(presented(&h), Some("xyz"));
        let hosts = allowed_hosts("127.0.0.1:80".parse().unwrap()).unwrap();
        assert_eq!(hosts, ["127.0.0.1:80", "localhost:80"]);
        assert!(allowed_hosts("0.0.0.0:80".parse().unwrap()).is_none());
    }
}
