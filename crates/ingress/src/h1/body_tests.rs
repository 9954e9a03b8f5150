use super::*;

/// The data and end of a body of `framing` coming in `pieces`, with the offset of the end in
/// all the bytes.
fn decode(framing: Framing, pieces: &[&[u8]]) -> (Vec<u8>, Option<usize>) {
    let mut decoder = BodyDecoder::new(framing);
    let (mut data, mut offset) = (Vec::new(), 0);
    for piece in pieces {
        if let Some(end) = decoder.feed(piece, |run| data.extend_from_slice(run)).expect("valid body") {
            return (data, Some(offset + end));
        }
        offset += piece.len();
    }
    (data, None)
}

#[test]
fn an_empty_body_ends_at_once_taking_nothing() {
    assert_eq!(decode(Framing::Empty, &[b"HTTP/1.1 200 OK\r\n"]), (vec![], Some(0)));
    assert_eq!(decode(Framing::Length(0), &[b""]), (vec![], Some(0)));
}

#[test]
fn a_length_body_ends_at_its_length_whatever_follows() {
    assert_eq!(decode(Framing::Length(5), &[b"he", b"llo", b"HTTP/1.1"]), (b"hello".to_vec(), Some(5)));
    assert_eq!(decode(Framing::Length(5), &[b"hello world"]), (b"hello".to_vec(), Some(5)));
    assert_eq!(decode(Framing::Length(5), &[b"hel"]), (b"hel".to_vec(), None));
}

#[test]
fn a_chunked_body_ends_after_its_last_chunk() {
    let body: &[u8] = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nnext";
    assert_eq!(decode(Framing::Chunked, &[&body[..7], &body[7..]]), (b"abcde".to_vec(), Some(body.len() - 4)));
    let mut decoder = BodyDecoder::new(Framing::Chunked);
    assert!(decoder.feed(b"3\nabc", |_| {}).is_err());
}

#[test]
fn a_close_delimited_body_never_ends_on_bytes() {
    assert_eq!(decode(Framing::UntilClose, &[b"abc", b"", b"de"]), (b"abcde".to_vec(), None));
    assert!(BodyDecoder::new(Framing::UntilClose).ends_at_close());
    assert!(!BodyDecoder::new(Framing::Chunked).ends_at_close());
    assert!(!BodyDecoder::new(Framing::Length(3)).ends_at_close());
}

#[test]
fn only_a_length_body_knows_what_is_left() {
    let mut decoder = BodyDecoder::new(Framing::Length(10));
    decoder.feed(b"abcd", |_| {}).expect("bytes");
    assert_eq!(decoder.left(), Some(6));
    assert_eq!(BodyDecoder::new(Framing::Chunked).left(), None);
}
