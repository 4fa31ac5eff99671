// gpulb's patch (vendor/README.md, pingora-proxy's fourth change).

//! The answer to a request whose header cannot be read as HTTP (bad syntax, a `Content-Length`
//! that does not resolve to one length): a `400` whose JSON body names the problem in the
//! OpenAI error shape the rest of gpulb's refusals use, instead of pingora's empty one.

use bytes::Bytes;
use http::header;
use pingora_core::protocols::http::ServerSession;
use pingora_error::Error;
use pingora_http::ResponseHeader;

/// The `400` header and JSON body for a request header refused with `error`.
pub(crate) fn bad_request(error: &Error) -> (ResponseHeader, Bytes) {
    let reason = error
        .context
        .as_ref()
        .map_or("the request header is not valid HTTP", |c| c.as_str());
    let body = format!(
        r#"{{"error":{{"message":"malformed request: {}","type":"invalid_request_error","code":"bad_request"}}}}"#,
        json_escaped(reason)
    );
    let mut header = ServerSession::generate_error(400);
    header.remove_header(&header::SERVER);
    let _ = header.insert_header(header::CONTENT_TYPE, "application/json");
    let _ = header.set_content_length(body.len());
    (header, Bytes::from(body))
}

/// `text` as the inside of a JSON string.
fn json_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}
