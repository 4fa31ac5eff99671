// gpulb's patch: the task pipe between the two halves of an HTTP/1 proxy session.

//! A bounded single-sender, single-receiver channel for the two halves of an HTTP/1 proxy
//! session (`proxy_h1.rs`), with the part of tokio's `mpsc` API they use and tokio's error
//! types. tokio's channel allocates a block of 32 slots whatever its bound (1,312 bytes for
//! `HttpTask`) and a cache-padded shared state (512 bytes); a proxied request makes two and
//! holds them until its response ends. This one holds its bound (4 tasks) in one small
//! allocation.

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
pub(crate) use tokio::sync::mpsc::error::{SendError, TrySendError};

struct State<T> {
    queue: VecDeque<T>,
    /// Slots promised to permits not used yet.
    reserved: usize,
    bound: usize,
    receiver_alive: bool,
    sender_alive: bool,
    receiver_waker: Option<Waker>,
    sender_waker: Option<Waker>,
}

impl<T> State<T> {
    fn has_room(&self) -> bool {
        self.queue.len() + self.reserved < self.bound
    }
}

type Shared<T> = Arc<Mutex<State<T>>>;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, State<T>> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// A channel holding at most `bound` values (sent or reserved).
pub(crate) fn channel<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
    assert!(bound > 0, "a task pipe needs room for one task");
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::with_capacity(bound),
        reserved: 0,
        bound,
        receiver_alive: true,
        sender_alive: true,
        receiver_waker: None,
        sender_waker: None,
    }));
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

pub(crate) struct Sender<T> {
    shared: Shared<T>,
}

pub(crate) struct Receiver<T> {
    shared: Shared<T>,
}

/// A slot reserved for one value; given back if dropped unused.
pub(crate) struct Permit<'a, T> {
    sender: &'a Sender<T>,
}

impl<T> Sender<T> {
    fn poll_reserve(&self, cx: &Context<'_>) -> Poll<Result<(), SendError<()>>> {
        let mut state = lock(&self.shared);
        if !state.receiver_alive {
            return Poll::Ready(Err(SendError(())));
        }
        if state.has_room() {
            state.reserved += 1;
            return Poll::Ready(Ok(()));
        }
        register(&mut state.sender_waker, cx);
        Poll::Pending
    }

    /// Waits for a free slot; an error once the receiver is gone.
    pub(crate) async fn reserve(&self) -> Result<Permit<'_, T>, SendError<()>> {
        poll_fn(|cx| self.poll_reserve(cx)).await?;
        Ok(Permit { sender: self })
    }

    /// A free slot now, or why not.
    pub(crate) fn try_reserve(&self) -> Result<Permit<'_, T>, TrySendError<()>> {
        let mut state = lock(&self.shared);
        if !state.receiver_alive {
            return Err(TrySendError::Closed(()));
        }
        if !state.has_room() {
            return Err(TrySendError::Full(()));
        }
        state.reserved += 1;
        Ok(Permit { sender: self })
    }

    /// Waits for a free slot and sends `value`; the value back once the receiver is gone.
    pub(crate) async fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.reserve().await {
            Ok(permit) => {
                permit.send(value);
                Ok(())
            }
            Err(_) => Err(SendError(value)),
        }
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !lock(&self.shared).receiver_alive
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.sender_alive = false;
        let waker = state.receiver_waker.take();
        drop(state);
        wake(waker);
    }
}

impl<T> Permit<'_, T> {
    /// Sends `value` in the reserved slot.
    pub(crate) fn send(self, value: T) {
        let sender = self.sender;
        // The slot is used, not given back: skip `Drop`.
        std::mem::forget(self);
        let mut state = lock(&sender.shared);
        state.reserved -= 1;
        let waker = if state.receiver_alive {
            state.queue.push_back(value);
            state.receiver_waker.take()
        } else {
            None
        };
        drop(state);
        wake(waker);
    }
}

impl<T> Drop for Permit<'_, T> {
    fn drop(&mut self) {
        let mut state = lock(&self.sender.shared);
        state.reserved -= 1;
        let waker = state.sender_waker.take();
        drop(state);
        wake(waker);
    }
}

impl<T> fmt::Debug for Permit<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

impl<T> Receiver<T> {
    fn poll_recv(&mut self, cx: &Context<'_>) -> Poll<Option<T>> {
        let mut state = lock(&self.shared);
        if let Some(value) = state.queue.pop_front() {
            let waker = state.sender_waker.take();
            drop(state);
            wake(waker);
            return Poll::Ready(Some(value));
        }
        if !state.sender_alive {
            return Poll::Ready(None);
        }
        register(&mut state.receiver_waker, cx);
        Poll::Pending
    }

    /// The next value; `None` once the sender is gone and every value was received.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.receiver_alive = false;
        let unreceived = std::mem::take(&mut state.queue);
        let waker = state.sender_waker.take();
        drop(state);
        drop(unreceived);
        wake(waker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn values_arrive_in_order_and_the_bound_holds() {
        let (tx, mut rx) = channel::<u32>(2);
        tx.send(1).await.unwrap();
        let permit = tx.reserve().await.unwrap();
        assert!(matches!(tx.try_reserve(), Err(TrySendError::Full(()))));
        permit.send(2);
        // A zero timeout polls the send once: it must not complete.
        let third = tokio::time::timeout(Duration::ZERO, tx.send(3)).await;
        assert!(third.is_err(), "a third value waits");
        assert_eq!(rx.recv().await, Some(1));
        tx.send(3).await.unwrap();
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
        drop(tx);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn an_unused_permit_gives_its_slot_back_and_a_gone_receiver_closes() {
        let (tx, rx) = channel::<u32>(1);
        drop(tx.reserve().await.unwrap());
        let permit = tx.try_reserve().unwrap();
        drop(permit);
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert!(matches!(tx.send(7).await, Err(SendError(7))));
        assert!(matches!(tx.try_reserve(), Err(TrySendError::Closed(()))));
    }

    #[tokio::test]
    async fn a_waiting_sender_wakes_when_the_receiver_takes_a_value() {
        let (tx, mut rx) = channel::<u32>(1);
        tx.send(1).await.unwrap();
        let sender = tokio::spawn(async move {
            tx.send(2).await.unwrap();
        });
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        sender.await.unwrap();
        assert_eq!(rx.recv().await, None);
    }
}
