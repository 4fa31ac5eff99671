//! `least_work`: the least estimated work, counted in tokens (prompt + max_tokens of what is in
//! flight, or the KV-cache the server reports in use) rather than in requests.

use super::{Choice, Placement};
use crate::config::PlacementKind;
use crate::routing::balance;
use rand::RngCore;

/// Least estimated tokens of work relative to weight and measured speed: a backend with three
/// 4k-token jobs is busier than one with three 50-token chats.
#[derive(Debug)]
pub struct LeastWork;

impl Placement for LeastWork {
    fn kind(&self) -> PlacementKind {
        PlacementKind::LeastWork
    }

    fn uses_speeds(&self) -> bool {
        true
    }

    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize> {
        balance::pick_least_work(choice.candidates, choice.tokens, rng)
    }
}
