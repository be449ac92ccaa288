//! Who may do what: the Host check on every request (DNS rebinding); on
//! write actions the Origin check (CSRF) and the token; on reads the token
//! too when the dashboard is not bound to loopback (or with `--auth-reads`).
//! The token comes from a header (`X-Mongocoord-Token`, or `Authorization:
//! Bearer` for a Prometheus scrape) or a `SameSite=Strict` cookie, and is
//! compared in constant time, its length included.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::CliError;

/// The header a script sends the token in.
pub(crate) const TOKEN_HEADER: &str = "x-mongocoord-token";
/// The cookie the login page sets.
pub(crate) const COOKIE: &str = "mongocoord_token";
/// How long a login lasts: the cookie's `Max-Age`, in seconds (12 hours).
pub(crate) const COOKIE_MAX_AGE: u32 = 12 * 60 * 60;
/// The shortest token accepted, in characters (so at least as many bytes).
const MIN_TOKEN: usize = 16;

/// The secret that write actions (and reads, when they need it) require. Its
/// `Debug` does not show it.
#[derive(Clone)]
pub(crate) struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// The token in `path` (surrounding whitespace trimmed); at least 16
    /// characters, so that it cannot be guessed, in a file that only its
    /// owner may read or write: a token others can read is no secret.
    pub(crate) fn from_file(path: &std::path::Path) -> Result<Token, CliError> {
        let cannot_read = |e| CliError::io(format!("cannot read {}", path.display()), e);
        let meta = std::fs::metadata(path).map_err(cannot_read)?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        if mode & 0o077 != 0 {
            return Err(CliError::invalid(format!(
                "the token file {} may be read or written by others (mode {mode:03o}): run `chmod 600` on it",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(cannot_read)?;
        Token::new(text.trim())
    }

    /// A token given as text; at least 16 characters.
    pub(crate) fn new(text: &str) -> Result<Token, CliError> {
        if text.chars().count() < MIN_TOKEN {
            return Err(CliError::invalid(format!("the dashboard token must have at least {MIN_TOKEN} characters")));
        }
        Ok(Token(text.into()))
    }

    /// A random token: 32 bytes from the operating system, in hex.
    pub(crate) fn random() -> Result<Token, CliError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(CliError::Random)?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into()))
    }

    /// The token itself, to print once at start.
    pub(crate) fn reveal(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the token, in time that depends neither on where
    /// they differ nor on their lengths: the two are hashed to 32 bytes each
    /// and the hashes compared in constant time (`subtle`'s comparison of
    /// slices returns at once on a length mismatch, which would tell an
    /// attacker the token's length).
    pub(crate) fn matches(&self, given: &str) -> bool {
        let (ours, theirs) = (Sha256::digest(self.0.as_bytes()), Sha256::digest(given.as_bytes()));
        bool::from(ours.as_slice().ct_eq(theirs.as_slice()))
    }
}

/// Where browsers reach the dashboard when it is not at its bound address
/// (`--public-url`, e.g. behind a TLS-terminating proxy): its origin is
/// accepted by the Origin check and its host by the Host check, and an
/// `https` one makes the token cookie `Secure`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicUrl {
    /// `scheme://host[:port]`, lower case, as browsers send it in `Origin`.
    origin: String,
    /// `host[:port]`, as the proxy may forward it in `Host`.
    host: String,
    secure: bool,
}

impl PublicUrl {
    /// Parses `http(s)://host[:port][/]`: no user, path or query, which an
    /// `Origin` never carries.
    pub(crate) fn parse(text: &str) -> Result<PublicUrl, CliError> {
        let bad = |why: &str| {
            Err(CliError::invalid(format!("--public-url {text:?}: {why} (give e.g. https://dash.example.com)")))
        };
        let Ok(uri) = text.parse::<axum::http::Uri>() else { return bad("not a URL") };
        let secure = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return bad("the scheme must be http or https"),
        };
        let Some(authority) = uri.authority() else { return bad("no host") };
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return bad("give a host without a user name");
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return bad("no path or query: the dashboard is served at the root");
        }
        let host = authority.as_str().to_ascii_lowercase();
        let scheme = if secure { "https" } else { "http" };
        Ok(PublicUrl { origin: format!("{scheme}://{host}"), host, secure })
    }
}

/// The `Host` values a request may carry: the bound address, `localhost`
/// and `127.0.0.1` when bound to loopback or to every interface, and the
/// public URL's host. `None` (any) when bound to every interface without a
/// public URL: any name may reach it then, and reads need the token.
pub(crate) fn allowed_hosts(addr: SocketAddr, public: Option<&PublicUrl>) -> Option<Vec<String>> {
    if addr.ip().is_unspecified() && public.is_none() {
        return None;
    }
    let mut hosts = Vec::new();
    if !addr.ip().is_unspecified() {
        hosts.push(addr.to_string());
    }
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        for local in [format!("localhost:{}", addr.port()), format!("127.0.0.1:{}", addr.port())] {
            if !hosts.contains(&local) {
                hosts.push(local);
            }
        }
    }
    hosts.extend(public.map(|p| p.host.clone()));
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
/// `Origin` (or, without one, `Sec-Fetch-Site`) must say so: the page's own
/// `http://` host, or the public URL's origin. Requests without either are
/// not from a browser, and still need the token.
pub(crate) fn same_origin(headers: &HeaderMap, public: Option<&PublicUrl>) -> bool {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Ok(origin) = origin.to_str() else { return false };
        if public.is_some_and(|p| origin.eq_ignore_ascii_case(&p.origin)) {
            return true;
        }
        let Some(h) = host(headers) else { return false };
        return origin.eq_ignore_ascii_case(&format!("http://{h}"));
    }
    match headers.get("sec-fetch-site").map(|v| v.to_str().unwrap_or("")) {
        Some(site) => matches!(site, "same-origin" | "none"),
        None => true,
    }
}

/// The token a request carries, from a header (`X-Mongocoord-Token`, or
/// `Authorization: Bearer`, which Prometheus sends) or the cookie.
pub(crate) fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(t);
    }
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Some(t) = bearer.and_then(|v| v.strip_prefix("Bearer ")) {
        return Some(t.trim());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE).and_then(|r| r.strip_prefix('=')))
}

/// What the guard of the write actions checks against.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) token: Token,
    pub(crate) public: Option<PublicUrl>,
}

/// The guard of every write action: same origin, then the token.
pub(crate) async fn require_token(State(Guard { token, public }): State<Guard>, req: Request, next: Next) -> Response {
    if !same_origin(req.headers(), public.as_ref()) {
        return forbidden("cross-origin request");
    }
    if !presented(req.headers()).is_some_and(|t| token.matches(t)) {
        return (StatusCode::UNAUTHORIZED, "this action needs the dashboard token: log in at /login\n").into_response();
    }
    next.run(req).await
}

/// The guard of the reads when they need the token (`Config::auth_reads`):
/// the token, from any place [`presented`] looks. No Origin check: a read
/// changes nothing, and the cookie is `SameSite=Strict`.
pub(crate) async fn require_read_token(State(token): State<Token>, req: Request, next: Next) -> Response {
    if presented(req.headers()).is_some_and(|t| token.matches(t)) {
        return next.run(req).await;
    }
    let mut res = (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        super::pages::message("Log in", "This dashboard needs its token to be read: log in.", "/login")
            .render(false, true),
    )
        .into_response();
    res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The `Set-Cookie` value that carries the token to later requests for
/// [`COOKIE_MAX_AGE`] (`Secure` when the public URL is `https`).
pub(crate) fn cookie(token: &Token, public: Option<&PublicUrl>) -> String {
    let secure = if public.is_some_and(|p| p.secure) { "; Secure" } else { "" };
    format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={COOKIE_MAX_AGE}{secure}", token.reveal())
}

/// The `Set-Cookie` value of a logout: the cookie emptied and expired.
pub(crate) fn cleared_cookie(public: Option<&PublicUrl>) -> String {
    let secure = if public.is_some_and(|p| p.secure) { "; Secure" } else { "" };
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}")
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
        assert!(same_origin(&h, None), "a non-browser client");
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&h, None));
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&h, None));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h, None));
        h.insert(header::COOKIE, "a=b; mongocoord_token=xyz".parse().unwrap());
        assert_eq!(presented(&h), Some("xyz"));
        let hosts = allowed_hosts("127.0.0.1:80".parse().unwrap(), None).unwrap();
        assert_eq!(hosts, ["127.0.0.1:80", "localhost:80"]);
        assert!(allowed_hosts("0.0.0.0:80".parse().unwrap(), None).is_none());
        let mut bearer = HeaderMap::new();
        bearer.insert(header::AUTHORIZATION, "Bearer xyz".parse().unwrap());
        assert_eq!(presented(&bearer), Some("xyz"));
    }

    /// Bound to every interface behind a proxy, the Host check still holds:
    /// the public host and the local names pass, any other is refused.
    #[test]
    fn every_interface_with_a_public_url_checks_the_host() {
        let public = PublicUrl::parse("https://dash.example.com").unwrap();
        let hosts = allowed_hosts("0.0.0.0:8080".parse().unwrap(), Some(&public)).unwrap();
        assert_eq!(hosts, ["localhost:8080", "127.0.0.1:8080", "dash.example.com"]);
    }

    /// A token file others may read is refused, whatever it holds; the
    /// owner's alone is read.
    #[test]
    fn token_files_others_may_read_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mongocoord-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "0123456789abcdef-from-a-file\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Token::from_file(&f).unwrap_err().to_string();
            assert!(e.contains("chmod 600") && e.contains(&format!("{mode:03o}")), "{mode:o}: {e}");
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Token::from_file(&f).unwrap().reveal(), "0123456789abcdef-from-a-file");
        std::fs::write(&f, "short\n").unwrap();
        assert!(Token::from_file(&f).unwrap_err().to_string().contains("at least 16"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Behind a TLS-terminating proxy the browser's origin is the public URL's,
    /// and the proxy may forward either Host.
    #[test]
    fn a_public_url_behind_a_proxy() {
        let public = PublicUrl::parse("https://Dash.Example.com").unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        h.insert(header::ORIGIN, "https://dash.example.com".parse().unwrap());
        assert!(!same_origin(&h, None), "refused without --public-url");
        assert!(same_origin(&h, Some(&public)));
        h.insert(header::ORIGIN, "http://dash.example.com".parse().unwrap());
        assert!(!same_origin(&h, Some(&public)), "another scheme is another origin");
        h.insert(header::ORIGIN, "https://dash.example.com.evil.example".parse().unwrap());
        assert!(!same_origin(&h, Some(&public)));
        let hosts = allowed_hosts("127.0.0.1:8080".parse().unwrap(), Some(&public)).unwrap();
        assert_eq!(hosts, ["127.0.0.1:8080", "localhost:8080", "dash.example.com"]);
        let t = Token::new("0123456789abcdef").unwrap();
        assert!(cookie(&t, Some(&public)).ends_with("; Secure"));
        assert!(!cookie(&t, None).contains("Secure"));
        assert!(cookie(&t, None).contains("; Max-Age=43200"), "a login expires");
        assert!(
            cleared_cookie(Some(&public)).starts_with("mongocoord_token=; ")
                && cleared_cookie(None).contains("Max-Age=0")
        );
        assert_eq!(PublicUrl::parse("http://10.0.0.5:8443/").unwrap().origin, "http://10.0.0.5:8443");
        for bad in ["dash.example.com", "ftp://x", "https://u:p@x", "https://x/dash", "https://x/?a=1", "", "https://"]
        {
            assert!(PublicUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
