//! `POST /v1/embeddings` (and `/embeddings`): OpenAI's embeddings, pooled as the server was
//! started (`--pooling`, else the model's own), computed on the engine thread between passes.

use super::read_body;
use crate::server::errors::ApiError;
use crate::server::scheduler::{CancelGuard, EmbedJob};
use crate::server::state::Shared;
use axum::extract::{Request, State};
use axum::Json;
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tinyllm::openai::embeddings::{embeddings_json, EmbeddingLimits, EmbeddingsRequest};
use tinyllm::openai::parse_body;

pub async fn embeddings(State(st): State<Shared>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (EmbeddingsRequest, Value) = parse_body(&body)?;
    let model = super::lease(&st, &raw).await?;
    let limits = EmbeddingLimits {
        n_vocab: model.n_vocab,
        n_embd: model.engine.model.info().n_embd,
        n_ctx: model.n_ctx,
        pooling: model.pooling,
    };
    let job = req.prepare(&model.engine.tokenizer, limits)?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    // Dropped with this future if the client goes away: the job is skipped if not yet begun.
    let mut guard = CancelGuard::new(cancel.clone());
    model.scheduler.submit_embed(EmbedJob {
        id: st.next_id(),
        inputs: job.inputs,
        pooling: model.pooling,
        cancel,
        reply,
    })?;
    let vectors = answer
        .await
        .map_err(|_| ApiError::internal("the engine dropped the request"))?
        .map_err(|e| ApiError::internal(format!("embedding failed: {e}")))?;
    guard.disarm();
    Ok(Json(embeddings_json(&vectors, job.encoding, &model.name)))
}
