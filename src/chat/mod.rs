//! STUB: chat templates (being written).

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template: {0}")]
    Other(String),
}
