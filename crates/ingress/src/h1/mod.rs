//! HTTP/1.1 messages as the proxy's fast path reads and writes them (pure): request and response
//! heads ([`parse`]), response bodies ([`body`], chunked ones by [`chunked`]) and what is
//! written ([`encode`]). The connection loop that uses them is the proxy's (`proxy::fast`).

pub mod body;
pub mod chunked;
pub mod encode;
pub mod parse;

/// What the fuzz target `h1` checks, with `data` as a request head, a response head (to GET and
/// HEAD) and a chunked body: no panic; a request the fast path takes is all within `data` and
/// parses the same from its own bytes; a response's fields and reason lie within its head; a
/// chunked body decodes to the same data and end whether it comes in one piece or in two (split
/// where the first byte says).
pub fn check(data: &[u8]) {
    if let parse::RequestHead::Fast(request) = parse::request(data) {
        assert!(request.len <= data.len());
        assert!(
            matches!(parse::request(&data[..request.len]), parse::RequestHead::Fast(again) if again.len == request.len)
        );
    }
    for method in [hyper::Method::GET, hyper::Method::HEAD] {
        if let Ok(parse::ResponseHead::Final(response)) = parse::response(data, &method) {
            assert!(response.len <= data.len() && response.reason.end <= response.len);
            assert!(response.fields.iter().all(|(name, value)| name.end <= response.len && value.end <= response.len));
        }
    }
    let whole = dechunk(&[data]);
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let (first, second) = data.split_at(split);
    assert_eq!(whole, dechunk(&[first, second]));
}

/// The data and end (or error) of a chunked body coming in `pieces`.
fn dechunk(pieces: &[&[u8]]) -> Result<(Vec<u8>, Option<usize>), chunked::BadChunk> {
    let mut decoder = body::BodyDecoder::new(parse::Framing::Chunked);
    let (mut data, mut offset) = (Vec::new(), 0);
    for piece in pieces {
        if let Some(end) = decoder.feed(piece, |run| data.extend_from_slice(run))? {
            return Ok((data, Some(offset + end)));
        }
        offset += piece.len();
    }
    Ok((data, None))
}
