//! Who may use the dashboard: the access token (required off loopback),
//! the Host check that stops DNS rebinding on loopback, the read-only
//! switch and the anti-CSRF token every form carries.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::pages::{error_page, Refusal};
use super::Shared;

const COOKIE: &str = "kjob_ui_token";

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
                // address bar (and from the history).
                let path = req.uri().path().to_string();
                let mut resp = Redirect::to(&path).into_response();
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
    if req.method() == Method::POST && !state.allow_actions {
        return error_page(
            StatusCode::FORBIDDEN,
            "the dashboard is read-only; start it with --allow-actions to re-drive or resolve",
        );
    }
    next.run(req).await
}

/// Refuses a form whose anti-CSRF token is not this process's.
pub(super) fn check_csrf(state: &Shared, given: &str) -> Result<(), Refusal> {
    if same(given, &state.csrf) {
        Ok(())
    } else {
        Err(Refusal(
            StatusCode::FORBIDDEN,
            "the form's anti-CSRF token is missing or stale (the dashboard restarted?); reload the page and try again".into(),
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
}
