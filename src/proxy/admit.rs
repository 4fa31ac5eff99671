//! The admission step of `request_filter`: wait in the class queue for a grant, or be shed.

use super::ctx::RequestCtx;
use crate::client_watch::client_gone;
use crate::error::ProxyError;
use crate::routing::Snapshot;
use pingora::prelude::*;
use pingora::proxy::Session;
use std::sync::Arc;

/// Admits the request of `ctx` into its class: on success the class slot, tenant slot and first
/// backend lease are in `ctx`. A refusal comes back as the error to answer; a client that left
/// while queued comes back as a downstream error (nobody is left to answer).
pub async fn admit(
    session: &mut Session,
    ctx: &mut RequestCtx,
    snapshot: &Arc<Snapshot>,
) -> Result<Option<ProxyError>> {
    let index = ctx.class;
    let class = &snapshot.classes[index];
    let demand = &ctx.demand;
    let queue = class.state.queues.get(&demand.route);
    let waiting = queue.admit(&ctx.tenant, &class.policy, || snapshot.grant(index, demand));
    // `biased`: a request admitted at once never starts the client watch.
    let outcome = tokio::select! {
        biased;
        outcome = waiting => outcome,
        () = client_gone(session) => {
            ctx.failure = Some(ProxyError::ClientGone);
            return Error::e_explain(ErrorType::ConnectionClosed, "client went away while queued")
                .map_err(|e| e.into_down());
        }
    };
    match outcome {
        Ok(admitted) => {
            ctx.class_slot = Some(admitted.lease.class_slot);
            let mut lease = admitted.lease.lease;
            // A slot taken while queued was sized for the class's usual request.
            lease.set_tokens(ctx.demand.tokens);
            ctx.lease = Some(lease);
            ctx.tenant_slot = Some(admitted.tenant_slot);
            ctx.queued_for = admitted.queued_for;
            Ok(None)
        }
        Err(shed) => {
            let (class_name, pool) = ctx.class_and_pool();
            let error = ProxyError::refused(&class_name, &pool, &ctx.tenant, &shed, &class.policy);
            Ok(Some(error))
        }
    }
}
