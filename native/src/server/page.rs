//! The chat page at `/`: the same page as the npm package's in-browser chat (`web/chat/`),
//! compiled into the binary. Served from here it talks to this server's API over HTTP.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page's files: path under `/`, content type, contents.
const FILES: &[(&str, &str, &str)] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_str!("../../../web/chat/index.html"),
    ),
    (
        "chat.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/chat/chat.js"),
    ),
    (
        "chat.css",
        "text/css; charset=utf-8",
        include_str!("../../../web/chat/chat.css"),
    ),
    (
        "vendor/marked.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/chat/vendor/marked.js"),
    ),
    (
        "vendor/purify.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/chat/vendor/purify.js"),
    ),
    (
        "vendor/idb-keyval.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/chat/vendor/idb-keyval.js"),
    ),
];

fn file(path: &str) -> Response {
    match FILES.iter().find(|(p, _, _)| *p == path) {
        Some((_, mime, body)) => ([(header::CONTENT_TYPE, *mime)], *body).into_response(),
        None => super::errors::ApiError::not_found(&format!("/{path}")).into_response(),
    }
}

/// The page, told to use the HTTP transport (it defaults to running the model in the tab).
static PAGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let worker = r#"<meta name="tinyllm-transport" content="worker">"#;
    let page = FILES[0].2;
    debug_assert!(page.contains(worker), "web/chat/index.html lost its transport meta tag");
    page.replacen(worker, r#"<meta name="tinyllm-transport" content="http">"#, 1)
});

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, FILES[0].1)], PAGE.as_str()).into_response()
}

pub async fn asset(uri: axum::http::Uri) -> Response {
    file(uri.path().trim_start_matches('/'))
}
