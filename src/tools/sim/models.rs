//! The model ids a simulated worker serves: the `/v1/models` list and which model a request gets, switchable at run time.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde_json::{json, Value};

/// A request named a model the worker does not serve (or named none while none is served).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NotServed {
    /// The model the request named, if any.
    pub model: Option<String>,
}

impl fmt::Display for NotServed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.model {
            Some(m) => write!(f, "The model `{m}` does not exist."),
            None => f.write_str("No model is served."),
        }
    }
}

/// The served model list of one worker; read on every request, replaced whole by `set`.
pub(crate) struct ServedModels {
    list: ArcSwap<Vec<String>>,
    /// Answer unknown models with 404 (vLLM) instead of serving them under the requested name.
    strict: bool,
    /// `created` of every entry, fixed when the worker starts.
    created: u64,
    /// `max_model_len` of every entry.
    max_model_len: usize,
}

impl ServedModels {
    /// A list created at `created` (UNIX seconds).
    pub fn new(models: Vec<String>, strict: bool, created: u64, max_model_len: usize) -> Self {
        ServedModels {
            list: ArcSwap::from_pointee(models),
            strict,
            created,
            max_model_len,
        }
    }

    /// Replaces the list; requests arriving from now on see the new one.
    pub fn set(&self, models: Vec<String>) {
        self.list.store(Arc::new(models));
    }

    /// The current list, in order.
    pub fn current(&self) -> Arc<Vec<String>> {
        self.list.load_full()
    }

    /// The model a request naming `requested` (or none) is served by.
    pub fn resolve(&self, requested: Option<String>) -> Result<String, NotServed> {
        resolve(&self.list.load(), self.strict, requested)
    }

    /// The `GET /v1/models` body, in vLLM's shape.
    pub fn list_body(&self) -> Value {
        let data: Vec<Value> = self
            .list
            .load()
            .iter()
            .map(|id| {
                json!({"id": id, "object": "model", "created": self.created, "owned_by": "gpulb-sim",
                       "root": id, "parent": null, "max_model_len": self.max_model_len})
            })
            .collect();
        json!({"object": "list", "data": data})
    }
}

/// No model means the first served one; a named one must be served unless `strict` is off.
fn resolve(
    served: &[String],
    strict: bool,
    requested: Option<String>,
) -> Result<String, NotServed> {
    match requested {
        Some(m) if !strict || served.contains(&m) => Ok(m),
        None if !served.is_empty() => Ok(served[0].clone()),
        model => Err(NotServed { model }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Vec<String> {
        vec!["a".to_string(), "b".to_string()]
    }

    #[test]
    fn resolves_named_default_and_unknown() {
        assert_eq!(resolve(&served(), true, Some("b".into())), Ok("b".into()));
        assert_eq!(resolve(&served(), true, None), Ok("a".into()));
        let err = resolve(&served(), true, Some("c".into())).unwrap_err();
        assert_eq!(err.to_string(), "The model `c` does not exist.");
        assert_eq!(resolve(&served(), false, Some("c".into())), Ok("c".into()));
        assert_eq!(resolve(&[], false, None), Err(NotServed { model: None }));
    }

    #[test]
    fn list_follows_set() {
        let m = ServedModels::new(served(), true, 7, 100);
        let body = m.list_body();
        assert_eq!(body["object"], "list");
        assert_eq!(
            body["data"][1],
            json!({"id": "b", "object": "model", "created": 7, "owned_by": "gpulb-sim",
                   "root": "b", "parent": null, "max_model_len": 100})
        );
        m.set(vec!["b".to_string()]);
        assert_eq!(m.current().as_slice(), ["b".to_string()]);
        assert_eq!(m.list_body()["data"][0]["id"], "b");
        assert!(m.resolve(Some("a".into())).is_err());
        assert_eq!(m.resolve(None), Ok("b".into()));
    }
}
