//! `earliest_finish`: the fastest free backend, and a request held in its queue rather than
//! started on a clearly slower one when a faster one will free up sooner; the bigger the
//! request (estimated tokens against its class's mean), the more a slow backend costs it.

use super::{Choice, Placement};
use crate::config::PlacementKind;
use crate::routing::balance;
use rand::RngCore;

/// The fastest speed tier first, least loaded within it; may hold for a faster backend.
#[derive(Debug)]
pub struct EarliestFinish;

impl Placement for EarliestFinish {
    fn kind(&self) -> PlacementKind {
        PlacementKind::EarliestFinish
    }

    fn uses_speeds(&self) -> bool {
        true
    }

    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize> {
        balance::pick_fastest(choice.candidates, rng)
    }

    fn may_hold(&self, chosen: usize, choice: &Choice<'_>, queued: usize) -> bool {
        choice.speeds.is_some_and(|s| {
            s.should_hold(chosen, choice.candidates, queued, choice.relative_size())
        })
    }
}
