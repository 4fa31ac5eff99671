//! Response body helpers: boxed body type, JSON responses, and a body that counts completed responses.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use serde_json::Value;

/// Error type of response bodies.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response body type used by every route.
pub(crate) type Body = BoxBody<Bytes, BoxError>;

/// A complete in-memory body.
pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A JSON response with the given status.
pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Wraps a body and bumps a counter once, when its last frame has been produced.
pub(crate) struct Counted {
    inner: Body,
    counter: Option<Arc<AtomicU64>>,
}

impl Counted {
    /// Wraps `inner`; `counter` (if any) is incremented when the body completes without error.
    pub(crate) fn new(inner: Body, counter: Option<Arc<AtomicU64>>) -> Self {
        Counted { inner, counter }
    }

    fn finish(&mut self) {
        if let Some(c) = self.counter.take() {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let res = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &res {
            None => this.finish(),
            Some(Ok(_)) if this.inner.is_end_stream() => this.finish(),
            Some(Err(_)) => this.counter = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        // Until counted, report "not ended" so hyper polls us to completion.
        self.counter.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
