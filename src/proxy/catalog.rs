//! gpulb's own answers to the OpenAI model endpoints: `GET /v1/models` (the union of what the
//! eligible backends serve) and `GET /v1/models/{id}` (one of those, or `model_not_found`);
//! `HEAD` gets the same header without the body (pingora writes none for a `HEAD`).

use super::ctx::RequestCtx;
use super::respond::{refuse, respond_json};
use crate::error::ProxyError;
use crate::routing::{ModelInfo, Snapshot};
use bytes::Bytes;
use pingora::prelude::*;
use pingora::proxy::Session;

const LIST: &str = "/v1/models";

/// What a request asks of the model endpoints.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// `GET /v1/models`.
    List,
    /// `GET /v1/models/{id}`: the id, percent-decoded (the OpenAI clients send a `/` in an id
    /// such as `meta-llama/Llama-3.1-8B-Instruct` as it is).
    One(String),
}

/// What `method` and `path` ask of the model endpoints, if they name one.
fn asked_by(method: &http::Method, path: &str) -> Option<Asked> {
    if method != http::Method::GET && method != http::Method::HEAD {
        return None;
    }
    let rest = path.strip_prefix(LIST)?;
    if rest.is_empty() {
        return Some(Asked::List);
    }
    let id = rest.strip_prefix('/').filter(|id| !id.is_empty())?;
    let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
    Some(Asked::One(id.into_owned()))
}

/// What the request asks of the model endpoints, when gpulb answers it itself: some backend's
/// model list is known (else the request goes to a backend like any other).
pub fn asked(session: &Session, snapshot: &Snapshot) -> Option<Asked> {
    let req = session.req_header();
    let asked = asked_by(&req.method, req.uri.path())?;
    let known = snapshot
        .backends
        .iter()
        .any(|b| b.state.models.get().is_some());
    known.then_some(asked)
}

/// The model `id` names among `served`: one of them, or an alias (`models.aliases`) of one,
/// answered under the alias.
fn find(snapshot: &Snapshot, served: &[ModelInfo], id: &str) -> Option<ModelInfo> {
    let target = snapshot
        .config
        .models
        .aliases
        .get(id)
        .map_or(id, String::as_str);
    let found = served.iter().find(|m| m.id == target)?;
    Some(ModelInfo {
        id: id.to_string(),
        ..found.clone()
    })
}

/// `m` in OpenAI's model shape: its fields, and `"object": "model"`.
fn model_object(m: &ModelInfo) -> serde_json::Value {
    let mut object = serde_json::to_value(m).unwrap_or_default();
    object["object"] = "model".into();
    object
}

/// Answers what was `asked` from the models served now; `Ok(true)`: the response is written.
pub async fn answer(
    session: &mut Session,
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    asked: Asked,
) -> Result<bool> {
    let served = snapshot.served_models(crate::health::now_ms());
    let object = match asked {
        Asked::List => {
            let data: Vec<_> = served.iter().map(model_object).collect();
            serde_json::json!({"object": "list", "data": data})
        }
        Asked::One(id) => match find(snapshot, &served, &id) {
            Some(model) => model_object(&model),
            None => {
                let served = served.into_iter().map(|m| m.id).collect();
                let error = ProxyError::ModelNotFound { model: id, served };
                return refuse(session, ctx, error).await;
            }
        },
    };
    let body = Bytes::from(object.to_string());
    respond_json(session, ctx, 200, body, None).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_and_one_model_by_id_are_asked_by_get_and_head_only() {
        let get = http::Method::GET;
        assert_eq!(asked_by(&get, "/v1/models"), Some(Asked::List));
        assert_eq!(
            asked_by(&get, "/v1/models/llama-3.1-8b"),
            Some(Asked::One("llama-3.1-8b".into()))
        );
        assert_eq!(
            asked_by(&get, "/v1/models/meta-llama/Llama-3.1-8B-Instruct"),
            Some(Asked::One("meta-llama/Llama-3.1-8B-Instruct".into()))
        );
        assert_eq!(
            asked_by(&get, "/v1/models/org%2Fmodel%3Av1"),
            Some(Asked::One("org/model:v1".into()))
        );
        for path in ["/v1/models/", "/v1/modelsx", "/v1/model", "/v2/models"] {
            assert_eq!(asked_by(&get, path), None, "{path}");
        }
        assert_eq!(
            asked_by(&http::Method::HEAD, "/v1/models/x"),
            Some(Asked::One("x".into()))
        );
        assert_eq!(asked_by(&http::Method::POST, "/v1/models"), None);
        assert_eq!(asked_by(&http::Method::DELETE, "/v1/models/x"), None);
    }
}
