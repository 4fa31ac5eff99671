//! The life of one batch after it opens: wait for members (up to `max_wait`, or until full;
//! not at all when a backend slot is free at once),
//! be admitted and placed as one request (one class slot, one backend lease), make the upstream
//! call, and answer every member with its own part.

use super::assembly::{Answer, Batch, Member, OpenBatches, Reply};
use super::clock::BatchClock;
use super::input::merged_body;
use super::split::split;
use super::timer::TimerLateness;
use super::upstream::{post, CallFailed};
use crate::admission::TenantSlot;
use crate::error::ProxyError;
use crate::health::AttemptFailure;
use crate::metrics::ClassMetrics;
use crate::routing::{Demand, Lease, ModelRoute, Slot, Snapshot};
use http::HeaderValue;
use std::sync::Arc;
use tokio::time::Instant;

/// Everything a batch's runner needs, fixed when the batch opened.
pub struct BatchJob {
    /// The batch.
    pub batch: Arc<Batch>,
    /// The snapshot its first member ran under: the batch is admitted and placed under it.
    pub snapshot: Arc<Snapshot>,
    /// Index of its class in that snapshot.
    pub class: usize,
    /// Which backends its model allows.
    pub route: ModelRoute,
    /// The request path (`/v1/embeddings`).
    pub path: String,
    /// The members' `Authorization` (part of the batch's key, so the same for all).
    pub authorization: Option<HeaderValue>,
    /// Its class's metrics.
    pub metrics: Arc<ClassMetrics>,
    /// The shared upstream client.
    pub client: reqwest::Client,
}

/// Runs `job`'s batch to its end; every member still there gets exactly one reply.
pub async fn run(job: BatchJob) {
    let (batch, batches) = (&job.batch, job.batches());
    let tenant = batch.first_tenant().unwrap_or_default();
    let admitted = if batch.settings.send_when_idle {
        assemble_until_a_slot(&job, &tenant).await
    } else {
        assemble_then_queue(&job, &tenant).await
    };
    // Admitted or not, nobody joins it any more.
    batches.close(batch);
    let (mut lease, _slots) = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => return answer_refused(&job, refusal),
    };
    // What it carries now, members that joined while it waited for its slot included.
    let demand = job.demand();
    lease.set_tokens(demand.tokens);
    let members: Vec<Member> = batch
        .take()
        .into_iter()
        .filter(|m| !m.reply.is_closed())
        .collect();
    if members.is_empty() {
        return;
    }
    let items: usize = members.iter().map(|m| m.input.items.len()).sum();
    job.metrics.batch_sent(items);
    let body = merged_body(
        &members[0].input.options,
        members.iter().flat_map(|m| &m.input.items),
    );
    match send(&job, lease, &demand, body).await {
        Ok((lease, answer)) => answer_members(&job, lease, answer, members).await,
        Err((backend, error)) => {
            for m in members {
                let _ = m.reply.send(Reply {
                    backend,
                    outcome: Err(error.clone()),
                });
            }
        }
    }
}

impl BatchJob {
    /// The batch as one request to place: its route and the tokens of its members so far.
    fn demand(&self) -> Demand {
        Demand {
            route: self.route.clone(),
            tokens: self.batch.tokens(),
            prefix: Arc::from([]),
        }
    }

    /// Its class's open batches.
    fn batches(&self) -> &OpenBatches {
        &self.snapshot.classes[self.class].state.batches
    }

    /// Starts the batch's wait for company: the [`BatchClock`] ends it at its closing time,
    /// before its `max_wait`, early by the lateness of recent alarms (see [`super::timer`]),
    /// unless it ends sooner. Its closing time.
    fn start_wait(&self) -> Instant {
        let timer = Arc::clone(&self.batches().timer);
        let closing = timer.closing_time(self.batch.opened, self.batch.settings.max_wait);
        let batch = Arc::downgrade(&self.batch);
        let metrics = Arc::clone(&self.metrics);
        BatchClock::global().set(closing.into_std(), move || {
            if let Some(batch) = batch.upgrade() {
                end_wait(&batch, closing, &timer, &metrics);
            }
        });
        closing
    }

    /// Waits until the batch is full or its wait for company has ended.
    async fn company(&self) {
        tokio::select! {
            () = self.batch.company_over.notified() => {}
            () = self.batch.closed_early.notified() => {}
        }
    }

    /// Ends the batch's wait for company now, if the clock has not already.
    fn company_over(&self, closing: Instant) {
        end_wait(&self.batch, closing, &self.batches().timer, &self.metrics);
    }
}

/// Ends `batch`'s wait for company (once: the clock or its runner, whichever comes first): its
/// assembly delay recorded, and how late past `closing` this came when it did (the clock's
/// lateness, or a slot granted meanwhile), which sets later batches' closing times; it still
/// takes members while it waits for a slot.
fn end_wait(batch: &Batch, closing: Instant, timer: &TimerLateness, metrics: &ClassMetrics) {
    if !batch.end_wait() {
        return;
    }
    if Instant::now() >= closing {
        metrics.batch_timer_late(timer.woke(closing));
    }
    metrics.batch_assembled(batch.opened.elapsed());
}

/// `send_when_idle`: the batch asks for a slot as it opens and takes company until the slot
/// comes, it is full, or `max_wait` is over (then it goes on taking members in the queue). A
/// batch never waits for company while a slot is free for it: a batch that opens with a slot
/// free is sent at once, and one that opens with the backends busy goes when the first slot
/// frees, with everyone who joined meanwhile. Batches form while the backends are busy, which
/// is when they pay.
async fn assemble_until_a_slot(job: &BatchJob, tenant: &str) -> Admitted {
    let (demand, closing) = (job.demand(), job.start_wait());
    let admitting = admit(job, tenant, &demand);
    tokio::pin!(admitting);
    let granted = tokio::select! {
        biased;
        admitted = &mut admitting => Some(admitted),
        () = job.company() => None,
    };
    job.company_over(closing);
    match granted {
        Some(admitted) => admitted,
        None => admitting.await,
    }
}

/// Without `send_when_idle`: the batch waits for company until full or `max_wait` is over,
/// whether or not a slot is free, then asks for one (still taking members meanwhile).
async fn assemble_then_queue(job: &BatchJob, tenant: &str) -> Admitted {
    let closing = job.start_wait();
    job.company().await;
    if job.batches().close_if_empty(&job.batch) {
        return Err(None); // every member left
    }
    job.company_over(closing);
    // Emptied from now on: admission sees `emptied` and closes it.
    admit(job, tenant, &job.demand()).await
}

/// A batch's admission: its backend lease and the class and tenant slots it holds, or why not.
type Admitted = Result<(Lease, (Slot, TenantSlot)), Option<ProxyError>>;

/// Admits the batch as one request of `tenant`: its backend lease, and the class and tenant
/// slots it holds until it ends; or why not (`None`: every member left while it waited).
async fn admit(job: &BatchJob, tenant: &str, demand: &Demand) -> Admitted {
    let (snapshot, index, batch) = (&job.snapshot, job.class, &job.batch);
    let class = &snapshot.classes[index];
    let queue = class.state.queues.get(&demand.route);
    let admitting = queue.admit(tenant, &class.policy, || snapshot.grant(index, demand));
    tokio::pin!(admitting);
    let outcome = loop {
        tokio::select! {
            biased;
            outcome = &mut admitting => break outcome,
            () = batch.emptied.notified() => {
                if class.state.batches.close_if_empty(batch) {
                    return Err(None);
                }
            }
        }
    };
    match outcome {
        Ok(admitted) => {
            job.metrics.queue_wait(admitted.queued_for);
            let mut lease = admitted.lease.lease;
            lease.set_tokens(demand.tokens);
            Ok((lease, (admitted.lease.class_slot, admitted.tenant_slot)))
        }
        Err(shed) => {
            let pool = &snapshot.pools[class.pool].name;
            Err(Some(ProxyError::refused(
                &class.name,
                pool,
                tenant,
                &shed,
                &class.policy,
            )))
        }
    }
}

/// Answers every member of a batch that admission refused with `error`.
fn answer_refused(job: &BatchJob, error: Option<ProxyError>) {
    let Some(error) = error else { return };
    for m in job.batch.take() {
        job.metrics.shed(&m.tenant, error.code());
        let _ = m.reply.send(Reply {
            backend: None,
            outcome: Err(error.clone()),
        });
    }
}

/// Makes the batch's upstream call on `lease`'s backend, trying others (up to
/// `connect_retries`) when a connection cannot be made. The lease that answered and its answer,
/// or the backend last tried and the error for the members.
async fn send(
    job: &BatchJob,
    mut lease: Lease,
    demand: &Demand,
    body: Vec<u8>,
) -> Result<(Lease, Answer), (Option<usize>, ProxyError)> {
    let snapshot = &job.snapshot;
    let mut failed = Vec::new();
    loop {
        let backend = lease.backend;
        let Some(addr) = snapshot.backends[backend].state.address.get() else {
            return Err((Some(backend), no_backend(job)));
        };
        let timeouts = &snapshot.config.timeouts;
        let auth = job.authorization.as_ref();
        let upstream = &snapshot.backends[backend].upstream;
        match post(
            &job.client,
            upstream,
            addr,
            &job.path,
            body.clone(),
            auth,
            timeouts,
        )
        .await
        {
            Ok(answer) => {
                let outcome = match answer.status {
                    500..=599 => Err(AttemptFailure::ServerError(answer.status)),
                    _ => Ok(()),
                };
                snapshot.report(backend, outcome);
                return Ok((lease, answer));
            }
            Err(CallFailed {
                connect,
                attempt,
                error,
            }) => {
                snapshot.report(backend, Err(attempt));
                if !connect || failed.len() >= snapshot.config.connect_retries {
                    return Err((Some(backend), error));
                }
                failed.push(backend);
                drop(lease);
                lease = snapshot
                    .acquire_for_class(job.class, demand, &failed)
                    .ok_or((Some(backend), error))?;
            }
        }
    }
}

/// The error for "no backend of the batch's pool can take it".
fn no_backend(job: &BatchJob) -> ProxyError {
    let class = &job.snapshot.classes[job.class];
    ProxyError::NoBackendAvailable {
        class: class.name.clone(),
        pool: job.snapshot.pools[class.pool].name.clone(),
        retry_after: 1,
    }
}

/// Answers each member from the backend's `answer` to the batch: its own items on success; on
/// a client error to a batch of several (one bad item refuses the whole call), each member is
/// sent alone on the same backend and gets its own answer; anything else goes to all as it is.
async fn answer_members(job: &BatchJob, lease: Lease, answer: Answer, members: Vec<Member>) {
    let backend = Some(lease.backend);
    let reply = |m: Member, outcome| {
        let _ = m.reply.send(Reply { backend, outcome });
    };
    match answer.status {
        200..=299 => {
            let counts: Vec<usize> = members.iter().map(|m| m.input.items.len()).collect();
            let weights: Vec<u64> = members.iter().map(|m| m.input.tokens()).collect();
            match split(&answer.body, &counts, &weights) {
                Ok(bodies) => {
                    for (m, body) in members.into_iter().zip(bodies) {
                        let own = Answer {
                            body: body.into(),
                            ..answer.clone()
                        };
                        reply(m, Ok(own));
                    }
                }
                Err(e) => {
                    let error = ProxyError::UpstreamFailed(e.to_string());
                    members
                        .into_iter()
                        .for_each(|m| reply(m, Err(error.clone())));
                }
            }
        }
        400..=499 if members.len() > 1 => {
            let Some(addr) = job.snapshot.backends[lease.backend].state.address.get() else {
                let error = no_backend(job);
                members
                    .into_iter()
                    .for_each(|m| reply(m, Err(error.clone())));
                return;
            };
            let timeouts = &job.snapshot.config.timeouts;
            let auth = job.authorization.as_ref();
            let upstream = &job.snapshot.backends[lease.backend].upstream;
            let alone = members.iter().map(|m| {
                post(
                    &job.client,
                    upstream,
                    addr,
                    &job.path,
                    m.body.to_vec(),
                    auth,
                    timeouts,
                )
            });
            let answers = futures_util::future::join_all(alone).await;
            for (m, answer) in members.into_iter().zip(answers) {
                reply(m, answer.map_err(|failed| failed.error));
            }
        }
        _ => members
            .into_iter()
            .for_each(|m| reply(m, Ok(answer.clone()))),
    }
    drop(lease);
}
