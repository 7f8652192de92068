//! What every dashboard request passes before a handler sees it, and what every response
//! carries. The `Host` must name this dashboard: a page on another site can rebind its own DNS
//! name to 127.0.0.1, and the browser then sends that name, so a request naming anything else is
//! refused before any handler runs. When a token is set, each request must carry it, as
//! `Authorization: Bearer` or as the cookie the login form sets. Every response, refusals
//! included, forbids framing, sniffing and scripts or styles from anywhere but the dashboard.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Form, FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, PreEscaped};
use serde::Deserialize;

use super::pages;

/// The pages load their script and stylesheet from `/assets` and use no inline script or
/// `<style>`. The timeline's bars are placed by `style="left:..%;width:..%"` attributes whose
/// values are numbers the server formats (nothing from the store), hence `style-src-attr`;
/// it admits no stylesheet, selector or script.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    style-src-attr 'unsafe-inline'; img-src 'self'; connect-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// Who may use the dashboard.
pub struct Guard {
    /// `host:port`, lower case: the bound address and the loopback names, all on its port.
    hosts: Vec<String>,
    token: Option<String>,
    /// Named after the port: browsers share cookies between the ports of one host.
    cookie: String,
}

impl Guard {
    /// For a dashboard bound to `local` (its real port, after `--port 0`).
    pub fn new(local: SocketAddr, token: Option<String>) -> Self {
        let port = local.port();
        let mut hosts = vec![
            local.to_string().to_ascii_lowercase(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        hosts.sort();
        hosts.dedup();
        Guard {
            hosts,
            token,
            cookie: format!("workflow_token_{port}"),
        }
    }

    /// Whether `host` (a `Host` header or a URI authority) names this dashboard: name and port
    /// exactly, the name in any case, no port meaning 80.
    fn host_allowed(&self, host: &str) -> bool {
        canonical_host(host).is_some_and(|h| self.hosts.contains(&h))
    }

    /// Whether the request carries the token (always, when none is set).
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            // The scheme's name is case-insensitive (RFC 9110, section 11.1).
            .filter_map(|v| {
                let (scheme, given) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(given)
            })
            .any(|given| same(given.trim().as_bytes(), token.as_bytes()));
        bearer
            || cookies(headers, &self.cookie)
                .any(|given| same(given.as_bytes(), cookie_value(token).as_bytes()))
    }

    /// `Set-Cookie` for a browser that typed the right token.
    fn login_cookie(&self, token: &str) -> String {
        // HttpOnly: no script reads it. SameSite=Strict: no other site's page sends it.
        format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            self.cookie,
            cookie_value(token)
        )
    }
}

/// `host` as `name:port` in lower case, or `None` when it is not a host with an optional port.
fn canonical_host(host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => {
            let (inner, after) = v6.split_once(']')?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (format!("[{inner}]"), port)
        }
        None => match host.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.clone(), None),
        },
    };
    let port: u16 = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
    };
    if name.is_empty() {
        return None;
    }
    Some(format!("{name}:{port}"))
}

/// Equality whose time depends on the lengths only, not on where the first difference is, so
/// timing answers do not spell out a token byte by byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y)));
    diff == 0
}

/// A cookie value may not hold spaces, `;`, `,` or quotes: the token percent-encoded.
fn cookie_value(token: &str) -> String {
    pages::url_encode(token)
}

/// The values of cookie `name` in the request.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// The middleware in front of every route: the `Host` check, then the token (with the login
/// form, which answers here so that it needs no token itself).
pub async fn check(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    // Every `Host` a request carries, and the URI's authority (HTTP/2 and absolute-form
    // requests name the host there): at least one, and all naming this dashboard.
    let named: Vec<&str> = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|h| h.to_str().unwrap_or_default())
        .chain(req.uri().authority().map(|a| a.as_str()))
        .collect();
    if named.is_empty() || named.iter().any(|h| !guard.host_allowed(h)) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: the Host header does not name this dashboard (open it at its own address)",
        );
    }
    if guard.token.is_none() {
        return next.run(req).await;
    }
    if req.uri().path() == "/login" {
        return login(&guard, req).await;
    }
    if !guard.authorized(req.headers()) {
        return login_page(StatusCode::UNAUTHORIZED, "");
    }
    next.run(req).await
}

/// `GET /login`: the form; `POST /login`: the cookie if the token is right.
async fn login(guard: &Guard, req: Request) -> Response {
    if req.method() != Method::POST {
        return login_page(StatusCode::OK, "");
    }
    let Ok(Form(form)) = Form::<Login>::from_request(req, &()).await else {
        return login_page(StatusCode::BAD_REQUEST, "The form was not understood.");
    };
    let right = guard
        .token
        .as_deref()
        .is_some_and(|t| same(form.token.as_bytes(), t.as_bytes()));
    if !right {
        return login_page(
            StatusCode::UNAUTHORIZED,
            "That is not this dashboard's token.",
        );
    }
    let cookie = guard.login_cookie(&form.token);
    match HeaderValue::from_str(&cookie) {
        Ok(cookie) => (
            StatusCode::SEE_OTHER,
            [
                (header::SET_COOKIE, cookie),
                (header::LOCATION, HeaderValue::from_static("/")),
            ],
        )
            .into_response(),
        Err(_) => login_page(StatusCode::BAD_REQUEST, "The token cannot be stored."),
    }
}

/// A bare page (no stylesheet: assets need the token too) asking for the token.
fn login_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        (PreEscaped("<!doctype html>\n"))
        html lang="en" {
            head { meta charset="utf-8"; title { "Log in · workflow" } }
            body {
                h1 { "This dashboard needs its token" }
                @if !message.is_empty() { p role="alert" { (message) } }
                form method="post" action="/login" {
                    label {
                        "Token "
                        input type="password" name="token" autocomplete="current-password"
                            required autofocus;
                    }
                    button type="submit" { "Log in" }
                }
                p {
                    "Scripts can send " code { "Authorization: Bearer <token>" } " instead."
                }
            }
        }
    };
    (status, Html(body.into_string())).into_response()
}

fn refuse(status: StatusCode, why: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        why,
    )
        .into_response()
}

/// Adds the security headers to `res`, whatever answered it.
pub async fn headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// Where a form may send the browser back to: a path on this dashboard (one `/`, then visible
/// ASCII without `\`), else `/`. `//host` and `/\host` would leave the site, and browsers drop
/// tabs and newlines from URLs, so `/\t/host` would too.
pub fn local_path(back: Option<&str>) -> &str {
    back.filter(|b| {
        let rest = b.strip_prefix('/');
        rest.is_some_and(|r| !r.starts_with('/'))
            && b.bytes().all(|c| c.is_ascii_graphic() && c != b'\\')
    })
    .unwrap_or("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_its_hosts() {
        let g = Guard::new(([127, 0, 0, 1], 8080).into(), None);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost.evil.example:8080",
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost",
            "localhost:",
            "localhost:8080x",
            "localhost:+8080",
            ":8080",
            "127.0.0.1:8080@evil",
            "[::1]8080",
            "",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        let lan = Guard::new(([192, 168, 1, 5], 80).into(), None);
        assert!(lan.host_allowed("192.168.1.5"));
        assert!(lan.host_allowed("192.168.1.5:80"));
        assert!(lan.host_allowed("localhost"));
        assert!(!lan.host_allowed("192.168.1.6"));
        let v6 = Guard::new("[2001:db8::1]:9000".parse().unwrap(), None);
        assert!(v6.host_allowed("[2001:DB8::1]:9000"));
        assert!(!v6.host_allowed("[2001:db8::2]:9000"));
    }

    #[test]
    fn compares_tokens_whole() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3creT"));
        assert!(!same(b"s3cret", b"s3cre"));
        assert!(!same(b"", b"x"));
    }

    #[test]
    fn finds_the_token_in_header_or_cookie() {
        let g = Guard::new(([0, 0, 0, 0], 8080).into(), Some("a b;c".to_owned()));
        let with = |name: header::HeaderName, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_str(value).unwrap());
            h
        };
        assert!(!g.authorized(&HeaderMap::new()));
        assert!(g.authorized(&with(header::AUTHORIZATION, "Bearer a b;c")));
        assert!(g.authorized(&with(header::AUTHORIZATION, "bearer a b;c")));
        assert!(!g.authorized(&with(header::AUTHORIZATION, "Bearer a b;d")));
        assert!(!g.authorized(&with(header::AUTHORIZATION, "Basic a b;c")));
        let cookie = g.login_cookie("a b;c");
        let value = cookie.split(';').next().unwrap();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        assert!(g.authorized(&with(header::COOKIE, &format!("x=1; {value}"))));
        // Another port's dashboard set this one.
        assert!(!g.authorized(&with(header::COOKIE, "workflow_token_8081=a+b%3Bc")));
        assert!(!g.authorized(&with(header::COOKIE, "workflow_token_8080=a+b%3Bd")));
    }

    #[test]
    fn sends_back_only_to_local_paths() {
        for ok in ["/", "/hooks", "/runs/01J9?x=1"] {
            assert_eq!(local_path(Some(ok)), ok);
        }
        for bad in [
            "//evil.example",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/runs\r\nSet-Cookie: x=1",
            "/runs/\u{7f}",
            "/caf\u{e9}",
            "/a b",
            "https://evil.example/",
            "evil",
            "",
        ] {
            assert_eq!(local_path(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(local_path(None), "/");
    }
}
