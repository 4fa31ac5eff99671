//! A class's admission queues, one per model route: a request waits only for backends that
//! serve its model, so a busy model never holds up requests for an idle one.

use super::models::ModelRoute;
use super::state::Grant;
use crate::admission::{ClassQueue, WaitTally};
use crate::fast_hash::FastMap;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};

/// The queues of one class, by model route; kept across reloads with the class.
#[derive(Default)]
pub struct ClassQueues {
    by_route: RwLock<FastMap<ModelRoute, Arc<ClassQueue<Grant>>>>,
    /// What waits in all of them, also added to the process-wide count it was made with.
    tally: Arc<WaitTally>,
}

impl ClassQueues {
    /// No queues yet; what waits in them will also be counted in `anywhere`.
    pub fn new(anywhere: Arc<AtomicUsize>) -> Self {
        ClassQueues {
            by_route: RwLock::default(),
            tally: Arc::new(WaitTally::new(anywhere)),
        }
    }

    /// The queue of `route`, made on first use. Routes are bounded by the models served.
    pub fn get(&self, route: &ModelRoute) -> Arc<ClassQueue<Grant>> {
        if let Some(q) = self.read().get(route) {
            return Arc::clone(q);
        }
        let mut map = self.by_route.write().unwrap_or_else(|e| e.into_inner());
        let queue = map
            .entry(route.clone())
            .or_insert_with(|| Arc::new(ClassQueue::tallied(Arc::clone(&self.tally))));
        Arc::clone(queue)
    }

    /// Every queue with someone waiting, with its route.
    pub fn waiting(&self) -> Vec<(ModelRoute, Arc<ClassQueue<Grant>>)> {
        self.read()
            .iter()
            .filter(|(_, q)| q.depth() > 0)
            .map(|(r, q)| (r.clone(), Arc::clone(q)))
            .collect()
    }

    /// Requests waiting now, over every route (no lock taken).
    pub fn depth(&self) -> usize {
        self.tally.class_depth()
    }

    /// Requests waiting now, per tenant with any, over every route.
    pub fn depth_by_tenant(&self) -> BTreeMap<String, usize> {
        let mut by_tenant = BTreeMap::new();
        for q in self.read().values() {
            for (tenant, n) in q.depth_by_tenant() {
                *by_tenant.entry(tenant).or_insert(0) += n;
            }
        }
        by_tenant
    }

    /// Requests waiting now, per model route with any (`*` for requests naming none,
    /// `stored-response` for those naming a stored response).
    pub fn depth_by_model(&self) -> BTreeMap<String, usize> {
        let mut by_model = BTreeMap::new();
        for (route, queue) in self.read().iter() {
            let depth = queue.depth();
            if depth > 0 {
                // Routes to stored responses share one label.
                *by_model.entry(route.label().to_string()).or_insert(0) += depth;
            }
        }
        by_model
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, FastMap<ModelRoute, Arc<ClassQueue<Grant>>>> {
        self.by_route.read().unwrap_or_else(|e| e.into_inner())
    }
}
