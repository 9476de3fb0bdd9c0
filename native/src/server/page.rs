//! The chat page at `/`: one self-contained HTML file compiled into the binary.

use axum::response::Html;

pub async fn index() -> Html<&'static str> {
    Html(include_str!("../../assets/chat.html"))
}
