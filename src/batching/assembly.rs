//! Batches being assembled: each class keeps one open batch per compatibility key; a request
//! joins it while it stays under its limits, or opens the next one. A batch whose `max_wait` has
//! passed but that waits for a backend slot still takes members (up to its limits): they cost
//! it no time. A member whose client goes away before the batch is sent leaves it.

use super::input::BatchInput;
use crate::config::BatchingConfig;
use crate::error::ProxyError;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// An answer for one member, written by gpulb itself.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The backend's response headers worth passing on (no framing headers).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

/// What a member's request gets back from its batch.
#[derive(Debug)]
pub struct Reply {
    /// The backend that served the batch, as an index of the batch's snapshot.
    pub backend: Option<usize>,
    /// Its answer, or the error to answer with.
    pub outcome: Result<Answer, ProxyError>,
}

/// One request in a batch.
#[derive(Debug)]
pub struct Member {
    /// Its items and their estimates.
    pub input: BatchInput,
    /// Its tenant.
    pub tenant: String,
    /// Its body as received, sent alone when the batch it was in was refused.
    pub body: Bytes,
    /// Where its reply goes.
    pub reply: oneshot::Sender<Reply>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Taking members, within its `max_wait`.
    Open,
    /// Its `max_wait` is over and it waits for a backend slot; still taking members.
    Waiting,
    /// Full, or a request did not fit: it takes no more.
    Closed,
    /// Its members were taken for the upstream call.
    Sent,
}

#[derive(Debug)]
struct Inner {
    members: Vec<(u64, Member)>,
    items: usize,
    tokens: u64,
    stage: Stage,
}

/// One batch: its settings (those in force when it opened, kept to the end), and its members.
#[derive(Debug)]
pub struct Batch {
    /// The settings it was opened with.
    pub settings: BatchingConfig,
    /// When its first member joined.
    pub opened: Instant,
    /// Signalled when it closes before its `max_wait` (full, or a request did not fit).
    pub closed_early: Notify,
    /// Signalled when its last member leaves.
    pub emptied: Notify,
    /// Signalled when its wait for company ends (see [`Batch::end_wait`]).
    pub company_over: Notify,
    wait_ended: AtomicBool,
    key: (u64, String),
    inner: Mutex<Inner>,
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether every member has left.
    pub fn is_empty(&self) -> bool {
        self.lock().members.is_empty()
    }

    /// The tenant of its first member still there.
    pub fn first_tenant(&self) -> Option<String> {
        self.lock().members.first().map(|(_, m)| m.tenant.clone())
    }

    /// Estimated tokens of its members' items.
    pub fn tokens(&self) -> u64 {
        self.lock().tokens
    }

    /// Ends its wait for company (its `max_wait` is over, or it goes now): it goes on taking
    /// members while it waits for a slot. Whether this call ended it (only the first does).
    pub fn end_wait(&self) -> bool {
        if self.wait_ended.swap(true, Ordering::AcqRel) {
            return false;
        }
        let mut inner = self.lock();
        if inner.stage == Stage::Open {
            inner.stage = Stage::Waiting;
        }
        drop(inner);
        self.company_over.notify_one();
        true
    }

    /// Takes its members for the upstream call; from now on nobody joins or leaves it.
    pub fn take(&self) -> Vec<Member> {
        let mut inner = self.lock();
        inner.stage = Stage::Sent;
        inner.members.drain(..).map(|(_, m)| m).collect()
    }
}

/// Whether `settings` let a batch of `items` and `tokens` take `more` items of `more_tokens`.
fn fits(settings: &BatchingConfig, inner: &Inner, more: usize, more_tokens: u64) -> bool {
    inner.items + more <= settings.max_batch
        && settings
            .max_batch_tokens
            .is_none_or(|max| inner.tokens + more_tokens <= max)
}

/// Whether a batch can take nothing more.
fn is_full(settings: &BatchingConfig, inner: &Inner) -> bool {
    inner.items >= settings.max_batch
        || settings
            .max_batch_tokens
            .is_some_and(|max| inner.tokens >= max)
}

/// A request's place in a batch; dropping it before the batch is sent takes it out.
#[derive(Debug)]
pub struct Membership {
    batch: Arc<Batch>,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut inner = self.batch.lock();
        if inner.stage == Stage::Sent {
            return;
        }
        if let Some(at) = inner.members.iter().position(|(id, _)| *id == self.id) {
            let (_, member) = inner.members.remove(at);
            inner.items -= member.input.items.len();
            inner.tokens -= member.input.tokens();
            if inner.members.is_empty() {
                self.batch.emptied.notify_one();
            }
        }
    }
}

/// How a request got into a batch.
#[derive(Debug)]
pub struct Joined {
    /// Its place.
    pub membership: Membership,
    /// The batch it opened, when it was the first: the caller starts the batch's runner.
    pub opened: Option<Arc<Batch>>,
}

/// The open batches of one class, by snapshot generation and compatibility key; kept across
/// reloads with the class (a batch opened before a reload keeps its generation, so requests
/// under the new config open batches with the new settings).
#[derive(Debug, Default)]
pub struct OpenBatches {
    open: Mutex<HashMap<(u64, String), Arc<Batch>>>,
    next_id: AtomicU64,
    /// How late the class's batch timers have lately rung, which sets them earlier.
    pub timer: Arc<super::timer::TimerLateness>,
}

impl OpenBatches {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, String), Arc<Batch>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `member` in the open batch of its key under `generation`, or in a new batch with
    /// `settings` when there is none or it cannot take the member (that one closes now).
    /// The member must fit `settings` alone.
    pub fn join(&self, generation: u64, settings: BatchingConfig, member: Member) -> Joined {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let key = (generation, member.input.key.clone());
        let (more, more_tokens) = (member.input.items.len(), member.input.tokens());
        let mut open = self.lock();
        if let Some(batch) = open.get(&key).cloned() {
            let mut inner = batch.lock();
            let joinable = matches!(inner.stage, Stage::Open | Stage::Waiting);
            if joinable && fits(&batch.settings, &inner, more, more_tokens) {
                inner.items += more;
                inner.tokens += more_tokens;
                inner.members.push((id, member));
                if is_full(&batch.settings, &inner) {
                    inner.stage = Stage::Closed;
                    open.remove(&key);
                    batch.closed_early.notify_one();
                }
                drop(inner);
                return Joined {
                    membership: Membership { batch, id },
                    opened: None,
                };
            }
            // It cannot take this request: send it as it is, and start the next one.
            if joinable {
                inner.stage = Stage::Closed;
                batch.closed_early.notify_one();
            }
            open.remove(&key);
        }
        let mut inner = Inner {
            members: Vec::new(),
            items: more,
            tokens: more_tokens,
            stage: Stage::Open,
        };
        inner.members.push((id, member));
        let full = is_full(&settings, &inner);
        if full {
            inner.stage = Stage::Closed;
        }
        let batch = Arc::new(Batch {
            settings,
            opened: Instant::now(),
            closed_early: Notify::new(),
            emptied: Notify::new(),
            company_over: Notify::new(),
            wait_ended: AtomicBool::new(false),
            key: key.clone(),
            inner: Mutex::new(inner),
        });
        if full {
            batch.closed_early.notify_one();
        } else {
            open.insert(key, Arc::clone(&batch));
        }
        Joined {
            membership: Membership {
                batch: Arc::clone(&batch),
                id,
            },
            opened: Some(batch),
        }
    }

    /// Closes `batch` when every member has left (nobody can join it meanwhile); whether it did.
    pub fn close_if_empty(&self, batch: &Arc<Batch>) -> bool {
        let mut open = self.lock();
        let mut inner = batch.lock();
        if !inner.members.is_empty() {
            return false;
        }
        if open.get(&batch.key).is_some_and(|b| Arc::ptr_eq(b, batch)) {
            open.remove(&batch.key);
        }
        inner.stage = Stage::Closed;
        true
    }

    /// Closes `batch` (it is about to be sent): nobody joins it any more.
    pub fn close(&self, batch: &Arc<Batch>) {
        let mut open = self.lock();
        if open.get(&batch.key).is_some_and(|b| Arc::ptr_eq(b, batch)) {
            open.remove(&batch.key);
        }
        let mut inner = batch.lock();
        if matches!(inner.stage, Stage::Open | Stage::Waiting) {
            inner.stage = Stage::Closed;
        }
    }

    /// Whether a batch of `key` under `generation` is taking members now.
    pub fn is_open(&self, generation: u64, key: &str) -> bool {
        self.lock().contains_key(&(generation, key.to_string()))
    }

    /// Batches taking members now.
    pub fn open_count(&self) -> usize {
        self.lock().len()
    }

    /// Requests waiting in the batches taking members now.
    pub fn waiting(&self) -> usize {
        self.lock().values().map(|b| b.lock().members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn member(input: serde_json::Value) -> (Member, oneshot::Receiver<Reply>) {
        let (reply, rx) = oneshot::channel();
        let body = input.to_string();
        let member = Member {
            input: BatchInput::parse(body.as_bytes(), None).unwrap(),
            tenant: "t".into(),
            body: body.into(),
            reply,
        };
        (member, rx)
    }

    fn settings(max_batch: usize, max_tokens: Option<u64>) -> BatchingConfig {
        BatchingConfig {
            max_batch,
            max_wait: Duration::from_millis(5),
            max_batch_tokens: max_tokens,
            send_when_idle: true,
        }
    }

    #[test]
    fn compatible_requests_share_a_batch_until_it_is_full() {
        let batches = OpenBatches::default();
        let s = settings(3, None);
        let a = batches.join(1, s, member(json!({"model": "e", "input": "a"})).0);
        let b = batches.join(1, s, member(json!({"model": "e", "input": ["b"]})).0);
        let other = batches.join(1, s, member(json!({"model": "f", "input": "c"})).0);
        let newer = batches.join(2, s, member(json!({"model": "e", "input": "d"})).0);
        assert!(a.opened.is_some() && b.opened.is_none());
        assert!(
            other.opened.is_some() && newer.opened.is_some(),
            "other key, other generation"
        );
        assert_eq!(batches.open_count(), 3);
        // An array that would pass max_batch closes the batch and opens the next.
        let big = batches.join(1, s, member(json!({"model": "e", "input": ["x", "y"]})).0);
        let first = a.opened.unwrap();
        assert!(big.opened.is_some());
        assert_eq!(first.take().len(), 2);
        // One that fills it exactly closes it at once.
        let fill = batches.join(1, s, member(json!({"model": "e", "input": "z"})).0);
        assert!(fill.opened.is_none());
        assert_eq!(
            batches.open_count(),
            2,
            "only model f and generation 2 stay open"
        );
    }

    #[test]
    fn token_limits_count_and_a_leaving_member_takes_its_items() {
        let batches = OpenBatches::default();
        let s = settings(10, Some(4));
        let a = batches.join(1, s, member(json!({"input": "abcdefgh"})).0); // 2 tokens
        let b = batches.join(1, s, member(json!({"input": "abcd"})).0); // 1 token
        let batch = a.opened.clone().unwrap();
        assert_eq!(batch.tokens(), 3);
        drop(b);
        assert_eq!(batch.tokens(), 2);
        drop(a);
        assert!(batch.is_empty());
        let c = batches.join(1, s, member(json!({"input": "abcdefghijkl"})).0); // 3 tokens
        assert!(c.opened.is_none(), "the emptied batch is still open");
        let d = batches.join(1, s, member(json!({"input": "abcdefgh"})).0);
        assert!(d.opened.is_some(), "3 + 2 tokens pass max_batch_tokens 4");
        // Past its max_wait, waiting for a slot, it still takes members; closed, it does not.
        let next = d.opened.clone().unwrap();
        assert!(next.end_wait() && !next.end_wait(), "ended once");
        let e = batches.join(1, s, member(json!({"input": "ab"})).0);
        assert!(e.opened.is_none());
        batches.close(&next);
        let f = batches.join(1, s, member(json!({"input": "ab"})).0);
        let last = f.opened.clone().unwrap();
        assert!(!batches.close_if_empty(&last), "it has a member");
        drop(f);
        assert!(batches.close_if_empty(&last), "its last member left");
        assert!(batches
            .join(1, s, member(json!({"input": "ab"})).0)
            .opened
            .is_some());
        let members = batch.take();
        assert_eq!(members.len(), 1);
        drop(c);
        assert!(
            !members.is_empty(),
            "a member leaving after the send changes nothing"
        );
    }
}
