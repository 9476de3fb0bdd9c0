//! Which web pages may use the API from a browser.
//!
//! A server on someone's desktop answers every page the user visits: with
//! `access-control-allow-origin: *` any site could drive the local model and read its
//! answers. So, as Ollama does, only the server's own pages (same origin) and pages served
//! from this machine (`http(s)://localhost`, `127.0.0.1`, `[::1]`, any port) are allowed by
//! default; `--cors-origin URL` adds an origin, `--cors-origin '*'` allows every one.
//!
//! Two guards: the CORS layer answers a foreign origin's preflight without
//! `access-control-allow-origin` (so the browser sends nothing), and [`guard`] refuses with
//! 403 any request that carries a foreign `Origin`, since "simple" requests (a form POST,
//! `text/plain` bodies) skip the preflight and would otherwise still run.

use axum::extract::{Request, State};
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use super::errors::ApiError;

/// The origins allowed besides the server's own and this machine's.
#[derive(Debug, Clone, PartialEq)]
pub enum Origins {
    /// `--cors-origin '*'`.
    Any,
    /// `--cors-origin` values (`scheme://host[:port]`, compared without a trailing slash).
    Listed(Vec<String>),
}

impl Origins {
    /// From the `--cors-origin` values; each must be `*` or `http(s)://host[:port]`.
    pub fn parse(values: &[String]) -> anyhow::Result<Self> {
        if values.iter().any(|o| o == "*") {
            return Ok(Origins::Any);
        }
        let mut list = Vec::new();
        for v in values {
            let o = v.trim_end_matches('/');
            match authority(o) {
                Some(authority) if !authority.is_empty() && !authority.contains(['/', '?', '#', ' ']) => {
                    list.push(o.to_ascii_lowercase())
                }
                _ => anyhow::bail!("--cors-origin {v:?} is not an origin: write * or http(s)://host[:port]"),
            }
        }
        Ok(Origins::Listed(list))
    }

    /// Whether a request from `origin` (its `Origin` header) to a server reached as `host`
    /// (its `Host` header) may go ahead.
    pub fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.to_ascii_lowercase();
        let Some(authority) = authority(&origin) else {
            // `null` (sandboxed frames, file:// pages) and other schemes: only with `*`.
            return *self == Origins::Any;
        };
        if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) || is_loopback(authority) {
            return true;
        }
        match self {
            Origins::Any => true,
            Origins::Listed(list) => list.contains(&origin),
        }
    }

    /// The CORS layer: the allowed origins echoed back, none for the others.
    pub fn cors_layer(self: &Arc<Self>) -> CorsLayer {
        let allow = if **self == Origins::Any {
            AllowOrigin::any()
        } else {
            let me = Arc::clone(self);
            AllowOrigin::predicate(move |origin: &HeaderValue, parts: &Parts| {
                origin.to_str().is_ok_and(|o| me.allows(o, host_of(&parts.headers)))
            })
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(Any)
    }
}

/// The `host[:port]` of an `http://` or `https://` origin.
fn authority(origin: &str) -> Option<&str> {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
}

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_loopback(authority: &str) -> bool {
    let split = match authority.find(']') {
        Some(i) if authority.starts_with('[') => i + 1,
        _ => authority.find(':').unwrap_or(authority.len()),
    };
    let (host, port) = authority.split_at(split);
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok && matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

fn host_of(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

/// Refuse (403) a request whose `Origin` is not allowed; requests without one (curl, SDKs)
/// pass.
pub async fn guard(State(origins): State<Arc<Origins>>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let o = origin.to_str().unwrap_or("");
        if !origins.allows(o, host_of(req.headers())) {
            return ApiError::forbidden_origin(o).into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_allow_the_own_origin_and_this_machine_only() {
        let o = Origins::parse(&[]).unwrap();
        let host = Some("127.0.0.1:8080");
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:3000",
            "http://localhost",
            "https://LOCALHOST:5173",
            "http://[::1]:9000",
            "http://127.0.0.1",
        ] {
            assert!(o.allows(ok, host), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "http://localhost:abc",
            "null",
            "file://",
            "http://192.168.1.5:8080",
        ] {
            assert!(!o.allows(bad, host), "{bad}");
        }
        // Reached on the LAN: its own pages still work.
        assert!(o.allows("http://192.168.1.5:8080", Some("192.168.1.5:8080")));
    }

    #[test]
    fn listed_origins_and_the_wildcard() {
        let o = Origins::parse(&["https://app.example.com/".into()]).unwrap();
        assert!(o.allows("https://app.example.com", None));
        assert!(!o.allows("http://app.example.com", None));
        assert!(!o.allows("https://evil.example", None));
        let any = Origins::parse(&["*".into()]).unwrap();
        assert!(any.allows("https://evil.example", None));
        assert!(any.allows("null", None));
        for bad in ["app.example.com", "ftp://x", "http://", "http://a/b"] {
            assert!(Origins::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
