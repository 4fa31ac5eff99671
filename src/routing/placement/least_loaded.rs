//! `least_loaded`: the fewest outstanding requests relative to weight, ties at random.

use super::{Choice, Placement};
use crate::config::PlacementKind;
use crate::routing::balance;
use rand::RngCore;

/// Least outstanding requests relative to weight; measured speed plays no part.
#[derive(Debug)]
pub struct LeastLoaded;

impl Placement for LeastLoaded {
    fn kind(&self) -> PlacementKind {
        PlacementKind::LeastLoaded
    }

    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize> {
        balance::pick(choice.candidates, rng)
    }
}
