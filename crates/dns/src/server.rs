//! Serving: hickory-server's UDP and TCP front ends (wire format, EDNS0, truncation with the TC
//! bit, FORMERR for malformed requests) calling [`Handler`], which answers from the current
//! [`ZoneData`] snapshot or forwards upstream; over TCP, [`tcp`]'s bounded front end instead,
//! with the same handling of each message. One [`Serving`] per worker runtime ([`serve_on`]).

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::Record;
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo, Server};
use hickory_server::zone_handler::MessageResponseBuilder;
use metrics::{counter, histogram};
use tokio::task::JoinSet;

use crate::answer::{Outcome, Zones};
use crate::forward::Forwarder;
use crate::tcp::{self, TcpLimits};
use crate::wire::{self, MAX_UDP_PAYLOAD};
use crate::zone::ZoneData;

/// `roadkeeper_dns_requests_total{proto, type}`: requests by transport and question type.
pub const REQUESTS_TOTAL: &str = "roadkeeper_dns_requests_total";
/// `roadkeeper_dns_responses_total{rcode}`: responses by response code.
pub const RESPONSES_TOTAL: &str = "roadkeeper_dns_responses_total";
/// `roadkeeper_dns_request_duration_seconds{source}`: time to answer, from the zone or upstream.
pub const REQUEST_DURATION_SECONDS: &str = "roadkeeper_dns_request_duration_seconds";

/// The current zone snapshot, replaced as a whole on every change (readers never lock).
pub type SharedZone = Arc<ArcSwap<ZoneData>>;

/// Answers each request from the zone snapshot, or through the forwarder.
pub struct Handler {
    zones: Zones,
    data: SharedZone,
    forwarder: Forwarder,
}

impl Handler {
    /// A handler answering `zones` from `data`, forwarding the rest with `forwarder`.
    pub fn new(zones: Zones, data: SharedZone, forwarder: Forwarder) -> Self {
        Self { zones, data, forwarder }
    }

    /// The response to `request`, sent on `response`, cut to the size its transport carries.
    async fn respond<R: ResponseHandler>(&self, request: &Request, mut response: R) -> (ResponseInfo, &'static str) {
        let (edns, mut metadata) = wire::response_head(request);
        let questions = wire::echoed_questions(request);
        let limit = wire::size_limit(request, edns.as_ref());
        let (query, outcome) = match wire::plan(&self.zones, &self.data.load(), request) {
            Ok(planned) => planned,
            Err(code) => {
                let mut builder = MessageResponseBuilder::new(&questions, None);
                if let Some(edns) = &edns {
                    builder.edns(edns);
                }
                return (send(builder.error_msg(&request.metadata, code), &mut response).await, "zone");
            }
        };
        match outcome {
            Outcome::Answer(answer) => {
                let message = wire::authoritative(&questions, edns.as_ref(), metadata, &answer, limit);
                (send(message, &mut response).await, "zone")
            }
            Outcome::Forward => {
                let upstream = self.forwarder.forward(&forwarded(request, query)).await;
                metadata.response_code = upstream.metadata.response_code;
                let sections = [&upstream.answers[..], &upstream.authorities, &upstream.additionals];
                let message = wire::fitted(&questions, edns.as_ref(), metadata, sections, limit);
                (send(message, &mut response).await, "upstream")
            }
        }
    }
}

/// The request as sent upstream: the same question, recursion, checking-disabled and DNSSEC-OK
/// bits, and EDNS when the client sent it, with its payload size within 512..=[`MAX_UDP_PAYLOAD`]
/// (what the upstream sockets' buffers hold).
fn forwarded(request: &Request, query: Query) -> Message {
    let mut message = Message::new(request.metadata.id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = request.metadata.recursion_desired;
    message.metadata.checking_disabled = request.metadata.checking_disabled;
    message.queries.push(query);
    if let Some(asked) = &request.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(asked.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        edns.set_dnssec_ok(asked.flags().dnssec_ok);
        message.edns = Some(edns);
    }
    message
}

/// Sends `message`; a response that cannot be sent (client gone) is logged at debug level.
async fn send<'a, R: ResponseHandler>(
    message: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    response: &mut R,
) -> ResponseInfo {
    let metadata = *message.metadata();
    response.send_response(message).await.unwrap_or_else(|err| {
        tracing::debug!("sending a response: {err}");
        let mut failed = metadata;
        failed.response_code = ResponseCode::ServFail;
        hickory_proto::op::Header { metadata: failed, counts: Default::default() }.into()
    })
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, response: R) -> ResponseInfo {
        let started = Instant::now();
        let qtype = request.queries.queries().first().map_or("none", |q| q.query_type().into());
        let proto = if request.protocol() == hickory_server::net::xfer::Protocol::Tcp { "tcp" } else { "udp" };
        counter!(REQUESTS_TOTAL, "proto" => proto, "type" => qtype).increment(1);
        let (info, source) = self.respond(request, response).await;
        counter!(RESPONSES_TOTAL, "rcode" => rcode_label(info.response_code)).increment(1);
        histogram!(REQUEST_DURATION_SECONDS, "source" => source).record(started.elapsed().as_secs_f64());
        info
    }
}

/// The response code's mnemonic (`NOERROR`, `NXDOMAIN`, ...), as CoreDNS labels it.
fn rcode_label(code: ResponseCode) -> &'static str {
    match code {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        _ => "OTHER",
    }
}

/// One worker's handler, shared by its UDP and TCP front ends.
#[derive(Clone)]
struct Shared(Arc<Handler>);

#[async_trait::async_trait]
impl RequestHandler for Shared {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, response: R) -> ResponseInfo {
        self.0.handle_request::<R, T>(request, response).await
    }
}

/// One worker's DNS service: hickory-server on its UDP sockets, [`tcp`] on its TCP listeners.
pub struct Serving {
    udp: Server<Shared>,
    tcp: JoinSet<()>,
}

impl Serving {
    /// Stops serving: TCP connections are closed, answers being sent over UDP are finished.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.tcp.shutdown().await;
        self.udp.shutdown_gracefully().await.map_err(std::io::Error::other)
    }
}

/// A service of `handler` on `udp` sockets and `tcp` listeners, bound (and listening) already,
/// with `limits` on the TCP connections: tasks on the current tokio runtime.
pub fn serve_on(
    udp: Vec<std::net::UdpSocket>,
    tcp: Vec<std::net::TcpListener>,
    handler: Handler,
    limits: TcpLimits,
) -> std::io::Result<Serving> {
    let handler = Shared(Arc::new(handler));
    let mut server = Server::new(handler.clone());
    for socket in udp {
        server.register_socket(tokio::net::UdpSocket::from_std(socket)?);
    }
    Ok(Serving { udp: server, tcp: tcp::serve(tcp, handler, limits)? })
}
