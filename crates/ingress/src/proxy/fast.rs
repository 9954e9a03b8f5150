//! The HTTP/1 fast path: a client connection's task reads each request head itself, routes it
//! as the general path does, writes it to a pooled bare endpoint connection ([`Wire`]) and
//! passes the response back, with no hyper dispatcher, channel or task in between. It takes
//! plain keep-alive HTTP/1.1 requests without a body ([`h1::parse::request`]); at the first
//! request it does not take, it hands the connection, with the bytes it read, to hyper (the
//! general path), which then serves it to its end. Responses are framed anew for the client:
//! `Content-Length` kept, anything else chunked by us ([`h1::chunked`]); a response whose framing
//! is doubtful is a 502 and its endpoint connection is closed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use hyper::http::request::Parts;
use hyper::{Method, StatusCode, header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;
use tracing::debug;

use super::{
    Answer, Conn, Failure, Forward, Forwarding, MIN_REQUEST_HEAD, Next, Routed, TargetState, edited_headers,
    endpoint_host, request_timed_out,
};
use crate::decision::Actions;
use crate::drain::DrainWatch;
use crate::h1::body::BodyDecoder;
use crate::h1::encode::{self, Body};
use crate::h1::parse::{self, FastRequest, FinalResponse, Framing, RequestHead, ResponseHead};
use crate::pool::{NoConnection, Wire};

/// Bytes read from an endpoint at a time.
pub(super) const READ: usize = 16 << 10;

/// The buffers and the response timer of one client connection, reused from request to request
/// (an HTTP/2 request on a bare connection has its own).
pub(super) struct Buffers {
    /// Bytes from the client not yet taken.
    client: Vec<u8>,
    /// Bytes from the endpoint.
    pub(super) upstream: Vec<u8>,
    /// Bytes to write (request heads to endpoints, responses to the client).
    out: Vec<u8>,
    /// The time an endpoint has for its response head. Moved later for each request, which
    /// costs tokio no timer wheel update (a new timer per request would, twice).
    timer: Pin<Box<Sleep>>,
}

impl Default for Buffers {
    fn default() -> Self {
        let timer = Box::pin(tokio::time::sleep(Duration::from_secs(86_400)));
        Self { client: Vec::new(), upstream: Vec::new(), out: Vec::new(), timer }
    }
}

/// How an exchange went on for the client connection.
enum After {
    /// Ready for the next request.
    KeepAlive,
    /// Closed after the response, or broken in the middle of one.
    Close,
}

/// Serves requests of `conn` on `io` until the client closes, asks to close, the connection is
/// drained (`None`), or a request comes that the fast path does not take: then returns the bytes
/// read from `io` that the general path is to read first.
pub(super) async fn serve<IO>(conn: &Conn, mut io: IO, drain: &mut DrainWatch) -> Option<Vec<u8>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let limit = conn.worker.proxy.config.max_request_head.max(MIN_REQUEST_HEAD);
    let mut buffers = Buffers::default();
    loop {
        conn.activity.reading(true);
        let request = loop {
            match parse::request(&buffers.client) {
                RequestHead::Fast(request) => break request,
                RequestHead::Partial if buffers.client.len() < limit => {}
                RequestHead::Partial | RequestHead::General => {
                    conn.activity.reading(false);
                    return Some(buffers.client);
                }
            }
            let room = (limit - buffers.client.len()).min(8192);
            buffers.client.reserve(room);
            let mut limited = (&mut io).take(room as u64);
            let read = if buffers.client.is_empty() {
                // Between requests a drained connection closes at once.
                tokio::select! {
                    biased;
                    read = limited.read_buf(&mut buffers.client) => read,
                    () = drain.signalled() => return None,
                }
            } else {
                limited.read_buf(&mut buffers.client).await
            };
            match read {
                Ok(0) => return None,
                Ok(_) => {}
                Err(err) => {
                    debug!(peer = %conn.peer, "read: {err}");
                    return None;
                }
            }
        };
        conn.activity.reading(false);
        buffers.client.drain(..request.len);
        match conn.exchange(request, &mut io, &mut buffers, drain.is_signalled()).await {
            After::KeepAlive => {}
            After::Close => {
                let _ = io.shutdown().await;
                return None;
            }
        }
    }
}

impl Conn {
    /// Answers one request of the fast path, as [`Conn::handle`] does one of the general path.
    async fn exchange<IO>(&self, request: FastRequest, io: &mut IO, buffers: &mut Buffers, draining: bool) -> After
    where
        IO: AsyncWrite + Unpin,
    {
        let started = Instant::now();
        let waiting = self.activity.wait();
        let FastRequest { parts, close, .. } = request;
        let close = close || draining;
        let method = parts.method.clone();
        let Routed { uri, host, decided, next } = self.route(parts);
        let forwarded = match next {
            Next::Answer(answer) => Err((answer, None)),
            Next::Forward(forwarding) => self.forward_fast(forwarding, buffers).await,
        };
        let (status, endpoint) = match &forwarded {
            Ok(exchange) => (exchange.response.status, Some(exchange.endpoint)),
            Err((answer, endpoint)) => (answer.status, *endpoint),
        };
        self.record(&method, &uri, &host, decided.as_ref(), status, endpoint, started.elapsed());
        drop(waiting);
        let written = match forwarded {
            Ok(exchange) => self.pass_response(exchange, io, buffers, close).await,
            Err((answer, _)) => write_answer(answer, &method, io, &mut buffers.out, close).await,
        };
        match written {
            Ok(()) if !close => After::KeepAlive,
            Ok(()) => After::Close,
            Err(err) => {
                debug!(peer = %self.peer, "response: {err}");
                After::Close
            }
        }
    }

    /// [`Conn::forward`] for the fast path: the response head from an endpoint, with the
    /// endpoint connection its body comes on, or the answer to give instead.
    async fn forward_fast(
        &self,
        mut forwarding: Forwarding,
        buffers: &mut Buffers,
    ) -> Result<Exchange, (Answer, Option<SocketAddr>)> {
        self.prepare(&mut forwarding, 0).map_err(|answer| (answer, None))?;
        self.send_bare(forwarding, buffers).await
    }

    /// Sends a request without a body, [`Conn::prepare`]d, to an endpoint on a bare connection
    /// within the request timeout, if there is one: the response head, with the endpoint
    /// connection its body comes on, or the answer to give instead.
    pub(super) async fn send_bare(
        &self,
        forwarding: Forwarding,
        buffers: &mut Buffers,
    ) -> Result<Exchange, (Answer, Option<SocketAddr>)> {
        let Forwarding { parts, forward, state, .. } = forwarding;
        let mut tried = None;
        let attempts = self.attempts_fast(parts, &forward, &state, buffers, &mut tried);
        let Some(limit) = forward.actions.as_ref().and_then(|actions| actions.request_timeout) else {
            return attempts.await;
        };
        match tokio::time::timeout(limit, attempts).await {
            Ok(answered) => answered,
            Err(_elapsed) => Err((request_timed_out(&state), tried)),
        }
    }

    /// [`Conn::attempts`] for the fast path: a request without a body is retried once on
    /// another endpoint after a connect failure or when all connections to its endpoint stay
    /// busy.
    async fn attempts_fast(
        &self,
        mut parts: Parts,
        forward: &Forward,
        state: &TargetState,
        buffers: &mut Buffers,
        tried: &mut Option<SocketAddr>,
    ) -> Result<Exchange, (Answer, Option<SocketAddr>)> {
        let proxy = &*self.worker.proxy;
        let (target, actions) = (&*forward.target, forward.actions.as_deref());
        let timeout = self.backend_timeout(actions);
        let mut retry = target.endpoints.len() > 1;
        // An HTTP/1.0 client may send no `Host`; HTTP/1.1 requires one: the endpoint's address.
        let host_of_endpoint = !parts.headers.contains_key(header::HOST);
        let endpoints = &target.endpoints[..];
        let mut index = proxy.health.pick(endpoints, state.next.fetch_add(1, Relaxed), None).expect("endpoints");
        loop {
            let endpoint = endpoints[index];
            *tried = Some(endpoint);
            if host_of_endpoint {
                parts.headers.insert(header::HOST, endpoint_host(endpoint));
            }
            let Buffers { out, upstream, timer, .. } = buffers;
            out.clear();
            encode::request_head(&parts, out);
            timer.as_mut().reset(tokio::time::Instant::now() + timeout);
            let sent = tokio::select! {
                biased;
                sent = self.send(endpoint, &parts.method, out, upstream) => sent,
                () = timer.as_mut() => Err(Failure::Timeout),
            };
            let failure = match sent {
                Ok((wire, response)) => {
                    proxy.health.succeeded(endpoint);
                    return Ok(Exchange { wire, endpoint, response, actions: forward.actions.clone() });
                }
                Err(failure) => failure,
            };
            failure.count(&state.labels);
            if let Some(next) = proxy.health.next_after(&failure, endpoints, index)
                && retry
            {
                (retry, index) = (false, next);
                continue;
            }
            return Err((failure.answer(), Some(endpoint)));
        }
    }

    /// Writes the request head `out` to `endpoint` on a pooled connection and reads the response
    /// head into `upstream`. The pool hands out no connection with anything readable on it (the
    /// endpoint's end among it); a reused connection that the endpoint closes after that but
    /// before answering (its keep-alive timeout ran out meanwhile) is replaced by another for a
    /// method that may be repeated.
    async fn send(
        &self,
        endpoint: SocketAddr,
        method: &Method,
        out: &[u8],
        upstream: &mut Vec<u8>,
    ) -> Result<(Wire, FinalResponse), Failure> {
        let pool = &self.worker.wires;
        loop {
            let (mut wire, reused) = match pool.checkout(endpoint).await {
                Ok(connection) => connection,
                Err(NoConnection::Connect | NoConnection::Handshake(_)) => return Err(Failure::Connect),
                Err(NoConnection::Busy) => return Err(Failure::Busy),
            };
            let repeatable =
                matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE);
            upstream.clear();
            let answered = async {
                wire.tcp.write_all(out).await?;
                read_response_head(&mut wire, method, upstream).await
            };
            match answered.await {
                Ok(response) => return Ok((wire, response)),
                Err(Upstream::Io(err)) if reused && repeatable && upstream.is_empty() => {
                    debug!(%endpoint, "reused connection failed before answering, retrying: {err}");
                }
                Err(err) => {
                    debug!(%endpoint, "upstream: {err}");
                    return Err(Failure::Reset);
                }
            }
        }
    }

    /// Passes an endpoint's response on to the client: its head (with the response header edits,
    /// without hop-by-hop fields), then its body; the endpoint connection goes back to the pool
    /// if the response ended where its framing said and the endpoint keeps it open.
    async fn pass_response<IO>(
        &self,
        exchange: Exchange,
        io: &mut IO,
        buffers: &mut Buffers,
        close: bool,
    ) -> std::io::Result<()>
    where
        IO: AsyncWrite + Unpin,
    {
        let Exchange { mut wire, endpoint, response, actions } = exchange;
        let framing = match response.body {
            Framing::Empty | Framing::Length(_) => Body::AsFields,
            Framing::Chunked | Framing::UntilClose => Body::Chunked,
        };
        let (out, upstream) = (&mut buffers.out, &mut buffers.upstream);
        out.clear();
        let (status, reason) = (response.status, &upstream[response.reason.clone()]);
        match actions.as_deref().map(|actions| &actions.response_headers).filter(|edits| !edits.is_empty()) {
            None => {
                let fields = encode::end_to_end(response.fields(upstream));
                encode::response_head(status, reason, fields, framing, close, out);
            }
            Some(edits) => {
                let headers = edited_headers(&response, upstream, Some(edits));
                encode::response_head(status, reason, encode::map_fields(&headers), framing, close, out);
            }
        }
        // The body's first bytes follow the head in `upstream[len..]`.
        let FinalResponse { len, body, mut reusable, .. } = response;
        let chunked = matches!(framing, Body::Chunked);
        let mut decoder = BodyDecoder::new(body);
        let mut start = len;
        loop {
            let fed = decoder.feed(&upstream[start..], |data| match chunked {
                true => encode::chunk(data, out),
                false => out.extend_from_slice(data),
            });
            // What came before a broken coding is passed on; the client connection is then cut.
            let ended = match fed {
                Ok(ended) => ended,
                Err(err) => {
                    deliver(io, out).await?;
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, err));
                }
            };
            if let Some(taken) = ended {
                reusable &= taken == upstream.len() - start;
                break;
            }
            deliver(io, out).await?;
            out.clear();
            upstream.clear();
            start = 0;
            match read_some(&mut wire, upstream).await {
                Ok(0) if decoder.ends_at_close() => {
                    reusable = false;
                    break;
                }
                Ok(0) | Err(_) => return Err(cut_short()),
                Ok(_) => {}
            }
        }
        if chunked {
            out.extend_from_slice(encode::LAST_CHUNK);
        }
        deliver(io, out).await?;
        if reusable {
            self.worker.wires.put_back(endpoint, wire);
        }
        Ok(())
    }
}

/// A response head from an endpoint, and where its body comes from.
pub(super) struct Exchange {
    pub(super) wire: Wire,
    pub(super) endpoint: SocketAddr,
    pub(super) response: FinalResponse,
    /// The route's actions, for the response header edits.
    pub(super) actions: Option<Arc<Actions>>,
}

/// Why an endpoint connection gave no usable response head.
#[derive(Debug, thiserror::Error)]
enum Upstream {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Bad(#[from] parse::BadResponse),
}

/// Reads from `wire` into `buf` until it holds a final response head (skipping interim ones).
async fn read_response_head(wire: &mut Wire, method: &Method, buf: &mut Vec<u8>) -> Result<FinalResponse, Upstream> {
    loop {
        match parse::response(buf, method)? {
            ResponseHead::Final(response) => return Ok(response),
            ResponseHead::Interim(len) => {
                buf.drain(..len);
                continue;
            }
            ResponseHead::Partial => {}
        }
        if read_some(wire, buf).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
}

/// Reads what `wire` has, up to [`READ`] bytes, onto the end of `buf`.
async fn read_some(wire: &mut Wire, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(READ);
    let mut limited = (&mut wire.tcp).take(READ as u64);
    limited.read_buf(buf).await
}

/// Writes the proxy's own answer: its head with `Content-Length` (none for 204), and its body
/// unless the request was HEAD.
async fn write_answer<IO>(
    answer: Answer,
    method: &Method,
    io: &mut IO,
    out: &mut Vec<u8>,
    close: bool,
) -> std::io::Result<()>
where
    IO: AsyncWrite + Unpin,
{
    let Answer { status, headers, body } = answer;
    let framing = if status == StatusCode::NO_CONTENT { Body::AsFields } else { Body::Length(body.len()) };
    out.clear();
    encode::response_head(status, b"", encode::map_fields(&headers), framing, close, out);
    if method != Method::HEAD {
        out.extend_from_slice(&body);
    }
    deliver(io, out).await
}

/// Writes `bytes` to the client and flushes them: a TLS stream keeps what the socket did not
/// take until the next write or flush, and the next may be a while (a streamed body).
async fn deliver<IO: AsyncWrite + Unpin>(io: &mut IO, bytes: &[u8]) -> std::io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// The error that ends a client connection whose response body the endpoint cut short.
pub(super) fn cut_short() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the endpoint closed in the middle of a response body")
}
