//! Which models each backend serves, and which backends a request for a model may go to.
//!
//! A backend's list comes from config (`backends[].models`) or from polling its
//! `GET /v1/models`; until either is known the backend may get any model. A request names a
//! model (after aliases); it goes to the backends that list it or whose list is unknown.

use super::{Backend, Snapshot};
use arc_swap::ArcSwapOption;
use serde::Serialize;
use std::sync::Arc;

/// Where a backend's model list came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// `backends[].models`.
    Config,
    /// Its `GET /v1/models`.
    Discovered,
}

/// One served model, as `GET /v1/models` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelInfo {
    /// Model id.
    pub id: String,
    /// `owned_by`, as the backend said (config: `gpulb`).
    pub owned_by: String,
    /// `created`, Unix seconds, as the backend said (config: 0).
    pub created: u64,
    /// The context length the backend said it serves (vLLM's `max_model_len`), passed on so
    /// clients that size prompts by it see it through gpulb.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

/// A backend's model list and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelList {
    /// Where it came from.
    pub source: ModelSource,
    /// The models, in the order given.
    pub models: Vec<ModelInfo>,
}

impl ModelList {
    /// A list from config.
    pub fn configured(ids: &[String]) -> ModelList {
        ModelList {
            source: ModelSource::Config,
            models: ids
                .iter()
                .map(|id| ModelInfo {
                    id: id.clone(),
                    owned_by: "gpulb".to_string(),
                    created: 0,
                    max_model_len: None,
                })
                .collect(),
        }
    }

    /// Whether it lists `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.models.iter().any(|m| m.id == model)
    }
}

/// A backend's served models: live state, replaced whole by config or discovery.
#[derive(Debug, Default)]
pub struct ServedModels(ArcSwapOption<ModelList>);

impl ServedModels {
    /// The list, when known.
    pub fn get(&self) -> Option<Arc<ModelList>> {
        self.0.load_full()
    }

    /// Replaces the list (`None`: unknown again).
    pub fn set(&self, list: Option<ModelList>) {
        self.0.store(list.map(Arc::new));
    }

    /// Whether a request routed as `route` may go to this backend.
    pub fn admits(&self, route: &ModelRoute) -> bool {
        match route {
            ModelRoute::Any => true,
            ModelRoute::Unlisted => self.0.load().is_none(),
            // The backend is chosen by who stored the response, not by its list.
            ModelRoute::Stored(_) => true,
            ModelRoute::Listed(model) => self.0.load().as_ref().is_none_or(|l| l.serves(model)),
        }
    }
}

/// Which backends a request may go to, by the model it names. Also the key of a class's
/// per-model queue: its values are bounded by the models served.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum ModelRoute {
    /// It names no model (or its body was not read), or no backend of its pools has a list.
    #[default]
    Any,
    /// A model some backend of its pools lists: those backends, and those with no list.
    Listed(Arc<str>),
    /// A model no backend lists: only backends whose list is unknown.
    Unlisted,
    /// It names a stored response (Responses API): only the backend that stored it, by its
    /// [`crate::routing::BackendState::id`] (see [`crate::routing::responses`]).
    Stored(u32),
}

impl ModelRoute {
    /// The label of this route in `/status`: the model, `*` or `unlisted`.
    pub fn label(&self) -> &str {
        match self {
            ModelRoute::Any => "*",
            ModelRoute::Listed(model) => model,
            ModelRoute::Unlisted => "unlisted",
            ModelRoute::Stored(_) => "stored-response",
        }
    }
}

/// Why a request cannot be placed by its model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRefusal {
    /// No backend of the class's pools serves the model named; the models they serve.
    NotServed(Vec<String>),
    /// The body names no model, and the class's backends do not all serve the same models, so
    /// which model answers would depend on the backend; the models they serve.
    Required(Vec<String>),
}

impl Snapshot {
    /// Where a request of class `class` naming `model` (after aliases; `None` when its body was
    /// not read) may go; refused when none of its pools serves `model` and every backend's
    /// list is known.
    pub fn model_route(
        &self,
        class: usize,
        model: Option<&str>,
    ) -> Result<ModelRoute, ModelRefusal> {
        let Some(model) = model else {
            return Ok(ModelRoute::Any);
        };
        let (mut listed, mut unknown, mut serves) = (false, false, false);
        for b in self.class_members(class) {
            match b.state.models.get() {
                None => unknown = true,
                Some(list) => {
                    listed = true;
                    serves |= list.serves(model);
                }
            }
        }
        match (listed, serves, unknown) {
            (false, _, _) => Ok(ModelRoute::Any),
            (true, true, _) => Ok(ModelRoute::Listed(model.into())),
            (true, false, true) => Ok(ModelRoute::Unlisted),
            (true, false, false) => Err(ModelRefusal::NotServed(self.class_models(class))),
        }
    }

    /// Where a request of class `class` whose body names no model may go: any backend while
    /// every one of its pools' backends serves the same models (or some list is not known
    /// yet); refused when their lists differ.
    pub fn unnamed_model_route(&self, class: usize) -> Result<ModelRoute, ModelRefusal> {
        let lists: Option<Vec<Arc<ModelList>>> = self
            .class_members(class)
            .map(|b| b.state.models.get())
            .collect();
        let Some(lists) = lists else {
            return Ok(ModelRoute::Any);
        };
        let sets: Vec<Vec<&str>> = lists
            .iter()
            .map(|list| {
                let mut ids: Vec<&str> = list.models.iter().map(|m| m.id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        if sets.windows(2).all(|pair| pair[0] == pair[1]) {
            Ok(ModelRoute::Any)
        } else {
            Err(ModelRefusal::Required(self.class_models(class)))
        }
    }

    /// The models the backends of `class`'s pools list, sorted, once each.
    fn class_models(&self, class: usize) -> Vec<String> {
        let ids = self.class_members(class).flat_map(|b| {
            let list = b.state.models.get();
            list.map(|l| l.models.iter().map(|m| m.id.clone()).collect::<Vec<_>>())
                .unwrap_or_default()
        });
        let mut served: Vec<String> = ids.collect();
        served.sort();
        served.dedup();
        served
    }

    /// The backends of `class`'s pool and fallback pool.
    pub(super) fn class_members(&self, class: usize) -> impl Iterator<Item = &Backend> + '_ {
        let c = self.classes.get(class);
        let pools = c
            .into_iter()
            .flat_map(|c| std::iter::once(c.pool).chain(c.fallback.as_ref().map(|(p, _)| *p)));
        pools
            .filter_map(|p| self.pools.get(p))
            .flat_map(|p| p.members.iter().map(|&i| &self.backends[i]))
    }

    /// Every model a backend that may take traffic now lists, once each, by id.
    pub fn served_models(&self, now_ms: u64) -> Vec<ModelInfo> {
        let mut models: Vec<ModelInfo> = Vec::new();
        for b in self.backends.iter().filter(|b| b.state.eligible(now_ms)) {
            for m in b.state.models.get().iter().flat_map(|l| l.models.iter()) {
                if !models.iter().any(|known| known.id == m.id) {
                    models.push(m.clone());
                }
            }
        }
        models.sort_by(|a, b| a.id.cmp(&b.id));
        models
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_admit_by_list() {
        let known = ServedModels::default();
        known.set(Some(ModelList::configured(&["llama".into()])));
        let unknown = ServedModels::default();
        let llama = ModelRoute::Listed("llama".into());
        let qwen = ModelRoute::Listed("qwen".into());
        assert!(known.admits(&llama) && !known.admits(&qwen));
        assert!(unknown.admits(&llama) && unknown.admits(&qwen));
        assert!(!known.admits(&ModelRoute::Unlisted) && unknown.admits(&ModelRoute::Unlisted));
        assert!(known.admits(&ModelRoute::Any));
        assert_eq!(known.get().unwrap().source, ModelSource::Config);
    }
}
