//! Who may use the dashboard: the access token (required off loopback),
//! the Host check that stops DNS rebinding on loopback, the read-only
//! switch, and two guards against cross-site request forgery on every
//! POST: the request must come from a page of this dashboard (`Sec-Fetch-Site`,
//! else `Origin`), and the form must carry the anti-CSRF token of the
//! browser session that loaded it.
//!
//! **The form token.** Each browser gets a random session id in a cookie
//! (`HttpOnly`, `SameSite=Strict`); the token its forms carry is the
//! HMAC-SHA256 of that id under a key random per process. A token is only
//! good with the cookie it was made for, so a token read in one session
//! (a screenshot, a log) is worthless in another, and a forger who can plant
//! a cookie (a sibling subdomain) still cannot make its token without the key.
//! Nothing is kept per session on the server.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::pages::{error_page, Refusal};
use super::Shared;

const COOKIE: &str = "kjob_ui_token";

/// The cookie holding the browser's session id, to which form tokens are
/// bound.
const SESSION_COOKIE: &str = "kjob_ui_session";

/// The anti-CSRF token of the request's browser session, for the forms a
/// page renders and for checking the one a POST carries. The guard puts it
/// in every request's extensions.
#[derive(Clone, Debug)]
pub(super) struct FormToken(pub(super) String);

/// The per-process key form tokens are made with: 64 random bytes (four
/// v4 UUIDs, 488 random bits), new at every start, so a restart makes open
/// forms stale rather than valid forever.
pub(super) fn new_form_key() -> Vec<u8> {
    (0..4)
        .flat_map(|_| uuid::Uuid::new_v4().into_bytes())
        .collect()
}

/// A fresh session id: 32 hex digits (a v4 UUID's 122 random bits).
fn new_session_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Whether a cookie's session id is one this dashboard could have made;
/// anything else (odd characters, another length) gets a fresh one.
fn session_id_ok(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The form token of session `id`: hex HMAC-SHA256 under `key`. `None`
/// only if the MAC refused the key, which HMAC never does (any length is
/// a key); callers then refuse the form rather than accept an empty token.
fn form_token(key: &[u8], id: &str) -> Option<String> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    mac.update(id.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in mac.finalize().into_bytes() {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
    }
    Some(hex)
}

/// Equal without an early exit, so response timing says nothing about
/// how much of a guessed token was right.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn query_token(req: &Request) -> Option<String> {
    req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    })
}

/// Where a `?token=` link goes once its token is a cookie: the same path
/// and the rest of its query (`/dlq/show?topic=..&at=..`), always as a
/// path of this server. A path starting with `//` or `/\` would be read by
/// a browser as another host (`GET //evil.example/?token=..` answered with
/// `Location: //evil.example/` is an open redirect), so the leading
/// slashes and backslashes are folded into one slash.
fn after_token(path: &str, query: Option<&str>) -> String {
    let mut target = String::from("/");
    target.push_str(path.trim_start_matches(['/', '\\']));
    let rest: Vec<(String, String)> = query
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k != "token")
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    if !rest.is_empty() {
        target.push('?');
        target.push_str(
            &form_urlencoded::Serializer::new(String::new())
                .extend_pairs(rest)
                .finish(),
        );
    }
    target
}

/// Why a POST must be refused as cross-site, if it must. Browsers say
/// where a request comes from: `Sec-Fetch-Site` (all current ones, on
/// trustworthy origins such as loopback and HTTPS) is decisive when sent;
/// only `same-origin` and `none` (typed by the user) pass: `same-site` is
/// refused too, since a sibling subdomain is not this dashboard. Without
/// it, an `Origin` must name this server's `Host`. With neither, the
/// request does not come from a browser page (a script, `curl`): nothing
/// to forge, and the form token is still required.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let value = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if let Some(site) = value("sec-fetch-site") {
        return match site.trim().to_ascii_lowercase().as_str() {
            "same-origin" | "none" => None,
            other => Some(format!(
                "the browser says this form was sent from another site (Sec-Fetch-Site: {other})"
            )),
        };
    }
    let origin = value(header::ORIGIN.as_str())?;
    let host = value(header::HOST.as_str()).unwrap_or_default();
    if same_authority(origin, host) {
        None
    } else {
        Some(format!(
            "the form was sent from {origin}, not from this dashboard ({host})"
        ))
    }
}

/// Whether an `Origin` (`http://host:port`) names the authority of a
/// `Host` header, with default ports made explicit on both sides.
fn same_authority(origin: &str, host: &str) -> bool {
    let (scheme, authority) = match origin.trim().split_once("://") {
        Some((s, a)) => (s.to_ascii_lowercase(), a.to_ascii_lowercase()),
        None => return false, // `null` (a sandboxed frame, a file) or junk
    };
    let default = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    // `[::1]` has colons but no port: a port is digits after the last one.
    let with_port = |a: &str| -> String {
        let has_port = a
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if has_port {
            a.to_string()
        } else {
            format!("{a}:{default}")
        }
    };
    let host = host.trim().to_ascii_lowercase();
    !host.is_empty() && !authority.contains('/') && with_port(&authority) == with_port(&host)
}

fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return true; // HTTP/1.0 without Host: nothing for a browser to rebind
    };
    let name = match host.rsplit_once(':') {
        Some((n, port)) if port.chars().all(|c| c.is_ascii_digit()) => n,
        _ => host,
    };
    matches!(name, "localhost" | "[::1]")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs before every handler: token, Host and read-only checks.
pub(super) async fn guard(State(state): State<Shared>, req: Request, next: Next) -> Response {
    match &state.token {
        Some(token) => {
            let bearer = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string);
            if let Some(q) = query_token(&req) {
                if !same(&q, token) {
                    return error_page(
                        StatusCode::UNAUTHORIZED,
                        "the access token in the link is wrong",
                    );
                }
                // Trade the link's token for a cookie and drop it from the
                // address bar (and from the history), keeping the rest of
                // the link.
                let target = after_token(req.uri().path(), req.uri().query());
                let mut resp = Redirect::to(&target).into_response();
                if let Ok(v) = format!("{COOKIE}={q}; HttpOnly; SameSite=Strict; Path=/").parse() {
                    resp.headers_mut().insert(header::SET_COOKIE, v);
                }
                return resp;
            }
            let given = bearer.or_else(|| cookie(req.headers(), COOKIE));
            if !given.is_some_and(|g| same(&g, token)) {
                return error_page(
                    StatusCode::UNAUTHORIZED,
                    "this dashboard needs its access token: open it as /?token=<the token> (or send Authorization: Bearer <the token>)",
                );
            }
        }
        None => {
            if !loopback_host(req.headers()) {
                return error_page(
                    StatusCode::FORBIDDEN,
                    "without --token the dashboard only answers to localhost / 127.0.0.1",
                );
            }
        }
    }
    if req.method() == Method::POST {
        if !state.allow_actions {
            return error_page(
                StatusCode::FORBIDDEN,
                "the dashboard is read-only; start it with --allow-actions to re-drive, resolve or cancel",
            );
        }
        if let Some(why) = cross_site(req.headers()) {
            return error_page(
                StatusCode::FORBIDDEN,
                &format!("{why}; actions are only taken from the dashboard's own pages"),
            );
        }
    }
    let known = cookie(req.headers(), SESSION_COOKIE).filter(|id| session_id_ok(id));
    let fresh = known.is_none();
    let session = known.unwrap_or_else(new_session_id);
    // An empty token matches no form (see `check_csrf`).
    let token = form_token(&state.form_key, &session).unwrap_or_default();
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let actor = state.proxy.actor(req.headers(), peer, &state.by);
    let mut req = req;
    req.extensions_mut().insert(FormToken(token));
    req.extensions_mut().insert(actor);
    let mut resp = next.run(req).await;
    if fresh {
        let cookie = format!("{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

/// Refuses a form whose anti-CSRF token is not the one of the session
/// (the cookie) it was posted with.
pub(super) fn check_csrf(session: &FormToken, given: &str) -> Result<(), Refusal> {
    if !session.0.is_empty() && same(given, &session.0) {
        Ok(())
    } else {
        Err(Refusal(
            StatusCode::FORBIDDEN,
            "the form's anti-CSRF token is missing, stale (the dashboard restarted?) or from another browser session; reload the page and try again".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_and_hosts() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        let mut h = HeaderMap::new();
        for (host, ok) in [
            ("127.0.0.1:9470", true),
            ("localhost:9470", true),
            ("[::1]:9470", true),
            ("evil.example:9470", false),
            ("127.0.0.1.evil.example", false),
        ] {
            h.insert(
                header::HOST,
                host.parse().unwrap_or_else(|_| unreachable!()),
            );
            assert_eq!(loopback_host(&h), ok, "{host}");
        }
    }

    #[test]
    fn the_token_redirect_keeps_the_query_and_stays_on_this_server() {
        assert_eq!(
            after_token("/dlq/show", Some("topic=orders&at=0:5&token=T")),
            "/dlq/show?topic=orders&at=0%3A5"
        );
        assert_eq!(after_token("/", Some("token=T")), "/");
        assert_eq!(after_token("/", None), "/");
        assert_eq!(
            after_token("/dlq", Some("token=T&job=a+b%26c")),
            "/dlq?job=a+b%26c"
        );
        for (path, want) in [
            ("//evil.example/", "/evil.example/"),
            ("///evil.example", "/evil.example"),
            ("/\\evil.example/", "/evil.example/"),
            ("/\\/\\evil.example", "/evil.example"),
            ("", "/"),
            ("/a//b", "/a//b"),
        ] {
            let t = after_token(path, Some("token=T"));
            assert_eq!(t, want, "{path}");
            assert!(!t.starts_with("//") && !t.starts_with("/\\"), "{t}");
        }
    }

    #[test]
    fn posts_from_other_sites_are_refused() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap_or_else(|_| unreachable!()));
            }
            h
        };
        let host = ("host", "127.0.0.1:9470");
        for (case, ok) in [
            (vec![host], true),
            (vec![host, ("origin", "http://127.0.0.1:9470")], true),
            // Behind a TLS-terminating proxy: the Host has no scheme.
            (
                vec![("host", "ops.example"), ("origin", "https://ops.example")],
                true,
            ),
            (
                vec![
                    ("host", "ops.example"),
                    ("origin", "https://ops.example:8443"),
                ],
                false,
            ),
            (
                vec![("host", "ops.example"), ("origin", "http://ops.example")],
                true,
            ),
            (
                vec![("host", "ops.example:80"), ("origin", "http://ops.example")],
                true,
            ),
            (
                vec![("host", "[::1]:9470"), ("origin", "http://[::1]:9470")],
                true,
            ),
            (vec![host, ("origin", "http://evil.example")], false),
            (vec![host, ("origin", "http://127.0.0.1:9471")], false),
            (vec![host, ("origin", "null")], false),
            (vec![("origin", "http://127.0.0.1:9470")], false),
            (vec![host, ("sec-fetch-site", "same-origin")], true),
            (vec![host, ("sec-fetch-site", "none")], true),
            (vec![host, ("sec-fetch-site", "cross-site")], false),
            (vec![host, ("sec-fetch-site", "same-site")], false),
            (
                vec![
                    host,
                    ("sec-fetch-site", "cross-site"),
                    ("origin", "http://127.0.0.1:9470"),
                ],
                false,
            ),
        ] {
            assert_eq!(cross_site(&headers(&case)).is_none(), ok, "{case:?}");
        }
    }

    #[test]
    fn form_tokens_are_bound_to_their_session_and_process() {
        let key = new_form_key();
        assert_eq!(key.len(), 64);
        let (a, b) = (new_session_id(), new_session_id());
        assert!(session_id_ok(&a) && session_id_ok(&b) && a != b);
        assert!(!session_id_ok("x") && !session_id_ok(&"g".repeat(32)));
        let ta = FormToken(form_token(&key, &a).unwrap_or_default());
        let tb = form_token(&key, &b).unwrap_or_default();
        assert_eq!(ta.0.len(), 64);
        assert!(check_csrf(&ta, &ta.0).is_ok());
        assert!(check_csrf(&ta, &tb).is_err(), "another session's token");
        assert!(check_csrf(&ta, "").is_err());
        let other_process = form_token(&new_form_key(), &a).unwrap_or_default();
        assert!(
            check_csrf(&ta, &other_process).is_err(),
            "another process's token"
        );
        assert!(
            check_csrf(&FormToken(String::new()), "").is_err(),
            "no token at all"
        );
    }
}
