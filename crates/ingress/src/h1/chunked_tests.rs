use super::*;

/// Decodes `body` fed in pieces split at `split`; returns the data and where the body ended.
fn decode(body: &[u8], split: usize) -> Result<(Vec<u8>, Option<usize>), BadChunk> {
    let mut dechunker = Dechunker::default();
    let mut data = Vec::new();
    let (first, second) = body.split_at(split);
    if let Some(end) = dechunker.feed(first, |run| data.extend_from_slice(run))? {
        return Ok((data, Some(end)));
    }
    let end = dechunker.feed(second, |run| data.extend_from_slice(run))?;
    Ok((data, end.map(|end| split + end)))
}

#[test]
fn chunks_decode_wherever_the_reads_split_them() {
    let body = b"5;name=value\r\nhello\r\n6 ; x\r\n world\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";
    for split in 0..=body.len() {
        let (data, end) = decode(body, split).unwrap();
        assert_eq!(data, b"hello world0123456789", "split at {split}");
        assert_eq!(end, Some(body.len() - 4), "split at {split}");
    }
    assert_eq!(decode(b"0\r\n\r\n", 0).unwrap(), (Vec::new(), Some(5)));
    assert_eq!(decode(b"5\r\nhel", 2).unwrap(), (b"hel".to_vec(), None));
}

#[test]
fn doubtful_chunks_are_refused() {
    for (body, err) in [
        (&b"\r\n"[..], BadChunk::Size),
        (b"x\r\n", BadChunk::Size),
        (b"5\nhello\r\n", BadChunk::Size),
        (b"-5\r\n", BadChunk::Size),
        (b"5 junk\r\n", BadChunk::Size),
        (b"11111111111111111\r\n", BadChunk::Size),
        (b"5;\x01\r\n", BadChunk::Size),
        (b"5\r\nhelloXX", BadChunk::DataEnd),
        (b"5\r\nhello\n0\r\n\r\n", BadChunk::DataEnd),
        (b"0\r\nX: \x00\r\n\r\n", BadChunk::Trailer),
        (b"0\r\n\n", BadChunk::Trailer),
    ] {
        assert_eq!(decode(body, 0).unwrap_err(), err, "{:?}", String::from_utf8_lossy(body));
    }
    let long = format!("5;{}\r\n", "x".repeat(MAX_LINE));
    assert_eq!(decode(long.as_bytes(), 0).unwrap_err(), BadChunk::TooLong);
    let trailers = format!("0\r\n{}", "X: y\r\n".repeat(MAX_LINE / 6 + 1));
    assert_eq!(decode(trailers.as_bytes(), 0).unwrap_err(), BadChunk::TooLong);
    // A long body of chunks has no bound: the bound is per size line.
    let many = "1\r\nx\r\n".repeat(10_000) + "0\r\n\r\n";
    assert_eq!(decode(many.as_bytes(), 7).unwrap().0.len(), 10_000);
}

#[test]
fn the_fuzz_corpus_passes() {
    crate::check_fuzz_corpus("h1", crate::h1::check);
}
