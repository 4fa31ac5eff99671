//! How a class chooses among the candidate backends of a pool: the [`Placement`] interface and
//! one implementation per file. A new policy is a new file here and a line in [`build`].

mod earliest_finish;
mod least_loaded;
mod least_work;
pub mod prefix_affinity;
mod speed;
mod speed_weighted;

pub use speed::PoolSpeeds;

use crate::config::PlacementKind;
use crate::routing::balance::Candidate;
use rand::RngCore;
use std::fmt::Debug;
use std::sync::Arc;

/// What a placement is given for one choice: the pool's candidates, the request's estimated
/// size and, when it asked for them ([`Placement::uses_speeds`]), the class's measured speeds.
pub struct Choice<'a> {
    /// The pool's members as selection sees them, in member order.
    pub candidates: &'a mut [Candidate],
    /// Measured speeds of the class on each member, when asked for.
    pub speeds: Option<&'a PoolSpeeds>,
    /// The request's estimated tokens (prompt + max_tokens); 0 when unknown.
    pub tokens: u64,
    /// The class's mean estimated tokens per request; 0 when unknown.
    pub mean_tokens: u64,
    /// What is known of the request's prompt prefix on each member, when the placement asked
    /// ([`Placement::uses_prefix`]) and the prompt has one.
    pub affinity: Option<Affinity>,
}

/// A prompt prefix as seen from each member of a pool, in member order.
#[derive(Debug, Clone, Default)]
pub struct Affinity {
    /// Blocks of the prompt's prefix fingerprint.
    pub blocks: u32,
    /// Leading blocks of the prompt last sent to each member.
    pub matched: Vec<u32>,
    /// Each member's rendezvous score for the prompt's first block.
    pub rendezvous: Vec<u64>,
}

impl Choice<'_> {
    /// The request's estimated size relative to its class's mean request; 1 when either is
    /// unknown.
    pub fn relative_size(&self) -> f64 {
        if self.tokens == 0 || self.mean_tokens == 0 {
            1.0
        } else {
            self.tokens as f64 / self.mean_tokens as f64
        }
    }
}

/// A placement policy: ranks the candidates from what was measured, picks one, and may
/// prefer to keep the request queued rather than place it on the one picked.
pub trait Placement: Send + Sync + Debug {
    /// The config name of this policy (shown in `/status`).
    fn kind(&self) -> PlacementKind;

    /// Whether this policy reads measured service times; reading them costs a lock per class.
    fn uses_speeds(&self) -> bool {
        false
    }

    /// Whether this policy reads (and feeds) the prompt prefix index.
    fn uses_prefix(&self) -> bool {
        false
    }

    /// Adjusts the candidates from the measured facts before picking (e.g. their slowness).
    fn rank(&self, choice: &mut Choice<'_>) {
        if let Some(speeds) = choice.speeds {
            for (member, c) in choice.candidates.iter_mut().enumerate() {
                c.slowness_milli = speeds.slowness_milli(member);
            }
        }
    }

    /// The candidate to try, among the available ones; `None` when none is.
    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize>;

    /// Whether the request does better waiting in its queue (`queued` requests of the class,
    /// this one included) than taking `chosen` now. Never for a request already admitted.
    fn may_hold(&self, _chosen: usize, _choice: &Choice<'_>, _queued: usize) -> bool {
        false
    }
}

/// The policy configured as `kind`.
pub fn build(kind: PlacementKind) -> Arc<dyn Placement> {
    match kind {
        PlacementKind::LeastLoaded => Arc::new(least_loaded::LeastLoaded),
        PlacementKind::SpeedWeighted => Arc::new(speed_weighted::SpeedWeighted),
        PlacementKind::EarliestFinish => Arc::new(earliest_finish::EarliestFinish),
        PlacementKind::LeastWork => Arc::new(least_work::LeastWork),
        PlacementKind::PrefixAffinity => Arc::new(prefix_affinity::PrefixAffinity),
    }
}
