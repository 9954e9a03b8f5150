//! HTTP/2 requests without a body (every GET, for one) go to their endpoint as the fast path's
//! do ([`Conn::send_bare`]): on a bare pooled connection, with no hyper client dispatcher,
//! channel or task in between. The response head becomes a hyper response whose body
//! ([`WireBody`]) hyper's server reads straight from the endpoint connection, which goes back to
//! the pool once the body ended where its framing said.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use http_body_util::Either;
use hyper::Response;
use hyper::body::{Body, Bytes, Frame, SizeHint};

use super::fast::{Buffers, Exchange, READ, cut_short};
use super::{Conn, Forwarding, ProxyBody, edited_headers};
use crate::h1::body::BodyDecoder;
use crate::pool::{Pool, Wire};

impl Conn {
    /// Sends a request without a body, [`Conn::prepare`]d, to an endpoint on a bare connection;
    /// returns the response and the endpoint.
    pub(super) async fn forward_bare(&self, forwarding: Forwarding) -> (Response<ProxyBody>, Option<SocketAddr>) {
        let mut buffers = Buffers::default();
        let Exchange { wire, endpoint, response, actions } = match self.send_bare(forwarding, &mut buffers).await {
            Ok(exchange) => exchange,
            Err((answer, endpoint)) => return (answer.into_response(), endpoint),
        };
        let edits = actions.as_deref().map(|actions| &actions.response_headers);
        let headers = edited_headers(&response, &buffers.upstream, edits);
        let first = Bytes::from(buffers.upstream).slice(response.len..);
        let mut body = WireBody {
            wire: Some(wire),
            home: (self.worker.wires.clone(), endpoint),
            decoder: BodyDecoder::new(response.body),
            first,
            read: BytesMut::new(),
            reusable: response.reusable,
        };
        // A body of no bytes has ended: hyper need not read it.
        if body.decoder.left() == Some(0) {
            body.end(body.first.is_empty());
        }
        let mut forwarded = Response::new(Either::Right(Either::Left(body)));
        *forwarded.status_mut() = response.status;
        *forwarded.headers_mut() = headers;
        (forwarded, Some(endpoint))
    }
}

/// A response body read from a bare endpoint connection.
pub(super) struct WireBody {
    /// The endpoint connection, until the body ended or broke.
    wire: Option<Wire>,
    /// Where the connection goes back to.
    home: (Arc<Pool<Wire>>, SocketAddr),
    decoder: BodyDecoder,
    /// The body's first bytes, read with the head.
    first: Bytes,
    /// The buffer reads from the endpoint go to (empty between reads).
    read: BytesMut,
    /// The endpoint keeps the connection open after the response.
    reusable: bool,
}

impl WireBody {
    /// The body's next data from `bytes` (read from the endpoint), or `None` if `bytes` held
    /// none; ends the body if it ended in them.
    fn decode(&mut self, bytes: Bytes) -> Result<Option<Bytes>, io::Error> {
        let mut data = Data::None;
        let fed = self.decoder.feed(&bytes, |run| data.push(bytes.slice_ref(run)));
        match fed {
            Ok(Some(taken)) => self.end(taken == bytes.len()),
            Ok(None) => {}
            Err(err) => {
                self.wire = None;
                return Err(io::Error::new(io::ErrorKind::InvalidData, err));
            }
        }
        Ok(data.into_bytes())
    }

    /// Ends the body: its connection goes back to the pool if the endpoint keeps it open and
    /// sent nothing past the body (`exact`).
    fn end(&mut self, exact: bool) {
        if let Some(wire) = self.wire.take()
            && self.reusable
            && exact
        {
            let (pool, endpoint) = &self.home;
            pool.put_back(*endpoint, wire);
        }
    }
}

impl Body for WireBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            let Some(wire) = &this.wire else { return Poll::Ready(None) };
            let bytes = if !this.first.is_empty() {
                std::mem::take(&mut this.first)
            } else {
                this.read.reserve(READ);
                ready!(wire.tcp.poll_read_ready(cx))?;
                match wire.tcp.try_read_buf(&mut this.read) {
                    Ok(0) if this.decoder.ends_at_close() => {
                        this.wire = None;
                        return Poll::Ready(None);
                    }
                    Ok(0) => {
                        this.wire = None;
                        return Poll::Ready(Some(Err(cut_short())));
                    }
                    Ok(_) => this.read.split().freeze(),
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(err) => {
                        this.wire = None;
                        return Poll::Ready(Some(Err(err)));
                    }
                }
            };
            match this.decode(bytes) {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) => {}
                Err(err) => return Poll::Ready(Some(Err(err))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.wire.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.wire, self.decoder.left()) {
            (None, _) => SizeHint::with_exact(0),
            (Some(_), Some(left)) => SizeHint::with_exact(left),
            (Some(_), None) => SizeHint::default(),
        }
    }
}

/// The data of one frame: one run of the bytes read (no copy), or several joined.
enum Data {
    None,
    One(Bytes),
    Many(BytesMut),
}

impl Data {
    fn push(&mut self, run: Bytes) {
        *self = match std::mem::replace(self, Data::None) {
            Data::None => Data::One(run),
            Data::One(first) => {
                let mut joined = BytesMut::from(&first[..]);
                joined.extend_from_slice(&run);
                Data::Many(joined)
            }
            Data::Many(mut joined) => {
                joined.extend_from_slice(&run);
                Data::Many(joined)
            }
        };
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Data::None => None,
            Data::One(bytes) => Some(bytes),
            Data::Many(joined) => Some(joined.freeze()),
        }
    }
}
