//! Choosing under the queue's lock: whom a full queue refuses or pushes out, and whose turn it
//! is (deficit round robin, minimum shares first).

use super::{Arc, Fairness, HashMap, QueuePolicy, ShedReason, State, Waiter};

impl<L> State<L> {
    /// Ok when there is room (pushing out the newest waiter of the tenant furthest over its share
    /// if the queue is full and fairness allows); else the reason to refuse `tenant`.
    pub(super) fn make_room(
        &mut self,
        tenant: &str,
        policy: &QueuePolicy,
    ) -> Result<Option<Waiter<L>>, ShedReason> {
        if self.depth() < policy.max_depth {
            return Ok(None);
        }
        let fairness = &policy.fairness;
        if policy.max_depth == 0 || !fairness.shares_queue() {
            return Err(ShedReason::QueueFull);
        }
        // A tenant's share of a full queue: max_depth * its weight / total weight of those waiting.
        let depth = policy.max_depth as u128;
        let weight = |name: &str| u128::from(fairness.weight(name));
        let queued = |name: &str| {
            self.tenants
                .get(name)
                .map_or(0, |t| t.waiting.len() as u128)
        };
        let (mine, my_weight) = (queued(tenant), weight(tenant));
        let mut total: u128 = self.ring.values().map(|n| weight(n)).sum();
        if mine == 0 {
            total += my_weight;
        }
        if mine * total > depth * my_weight {
            return Err(ShedReason::TenantOverShare);
        }
        if (mine + 1) * total > depth * my_weight {
            return Err(ShedReason::QueueFull);
        }
        let victim = self
            .ring
            .values()
            .map(|n| (n, queued(n), weight(n)))
            .filter(|&(_, q, w)| q * total > depth * w)
            .max_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)))
            .map(|(n, _, _)| Arc::clone(n));
        match victim {
            Some(victim) => Ok(self.pop_from(&victim, true)),
            None => Err(ShedReason::QueueFull),
        }
    }

    /// Deficit round robin with a cost of one per request: the tenant at the front of the ring
    /// is served `weight` times, then goes to the back.
    pub(super) fn next_in_turn(&mut self, fairness: &Fairness) -> Option<Arc<str>> {
        let (&turn, name) = self.ring.first_key_value()?;
        let name = Arc::clone(name);
        let t = self.tenants.get_mut(&*name)?;
        if t.deficit == 0 {
            t.deficit = fairness.weight(&name);
        }
        t.deficit -= 1;
        if t.deficit == 0 {
            self.ring.remove(&turn);
            self.ring.insert(self.next_turn, Arc::clone(&name));
            t.turn = Some(self.next_turn);
            self.next_turn += 1;
        }
        Some(name)
    }

    /// The waiting tenant furthest below its minimum share of the class's in-flight requests.
    pub(super) fn below_min_share(&self, min_share: &HashMap<String, f64>) -> Option<Arc<str>> {
        if min_share.is_empty() {
            return None;
        }
        let in_flight = self.outstanding.saturating_sub(self.depth()) as f64;
        min_share
            .iter()
            .filter_map(|(name, &min)| {
                let (key, t) = self.tenants.get_key_value(name.as_str())?;
                if t.waiting.is_empty() {
                    return None;
                }
                let share = if in_flight > 0.0 {
                    t.in_flight() as f64 / in_flight
                } else {
                    0.0
                };
                (share < min).then_some((key, min - share))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(key, _)| Arc::clone(key))
    }
}
