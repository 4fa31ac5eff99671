//! `speed_weighted`: least loaded, each backend's weight divided by its measured slowness.

use super::{Choice, Placement};
use crate::config::PlacementKind;
use crate::routing::balance;
use rand::RngCore;

/// Least loaded relative to weight and measured speed: a GPU at half speed gets half the
/// share of an equal-weight fast one.
#[derive(Debug)]
pub struct SpeedWeighted;

impl Placement for SpeedWeighted {
    fn kind(&self) -> PlacementKind {
        PlacementKind::SpeedWeighted
    }

    fn uses_speeds(&self) -> bool {
        true
    }

    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize> {
        balance::pick(choice.candidates, rng)
    }
}
