use std::time::Duration;

use super::*;

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
    frame.extend_from_slice(payload);
    frame
}

fn ping() -> Vec<u8> {
    frame(6, 0, &[0; 8])
}

/// A connection after the preface and `BURST` control frames: its credit is used up, and no time
/// passes for it (its clock starts in an hour).
fn exhausted() -> FrameBudget {
    let mut budget = FrameBudget::new();
    budget.read(PREFACE).unwrap();
    budget.read(&ping().repeat(BURST as usize)).unwrap();
    stop_the_clock(&mut budget);
    budget
}

fn stop_the_clock(budget: &mut FrameBudget) {
    budget.since = Instant::now() + Duration::from_secs(3600);
}

#[test]
fn flood_one_control_frame_past_the_burst_is_a_flood() {
    let mut budget = exhausted();
    assert!(budget.read(&frame(8, 0, &[0, 0, 0, 1])).is_err(), "WINDOW_UPDATE");
    for kind in [2, 3, 4, 7, 0xff] {
        assert!(exhausted().read(&frame(kind, 0, &[0; 4])).is_err(), "frame type {kind}");
    }
    assert!(exhausted().read(&frame(0, 0, &[])).is_err(), "empty DATA");
    assert!(exhausted().read(&frame(9, 0, &[])).is_err(), "empty CONTINUATION");
}

#[test]
fn flood_requests_and_data_are_not_control_frames() {
    let mut budget = exhausted();
    let data = frame(0, 0, &ping().repeat(100)); // a payload that looks like frames
    for piece in [frame(1, 4, b"headers"), data, frame(9, 4, b"more"), frame(0, END_STREAM, &[])] {
        // Split anywhere: the reader follows frame boundaries across reads.
        let (a, b) = piece.split_at(piece.len() / 3);
        budget.read(a).unwrap();
        budget.read(b).unwrap();
    }
    // The HEADERS frame earned one.
    budget.read(&ping()).unwrap();
    assert!(budget.read(&ping()).is_err());
}

#[test]
fn flood_credit_comes_back_with_data_sent_and_with_time() {
    let mut budget = exhausted();
    budget.wrote(CREDIT_PER_WRITTEN - 1);
    assert!(budget.read(&ping()).is_err(), "not yet");
    let mut budget = exhausted();
    budget.wrote(CREDIT_PER_WRITTEN * 2);
    budget.read(&ping().repeat(2)).unwrap();
    assert!(budget.read(&ping()).is_err());

    let mut budget = exhausted();
    budget.since = Instant::now() - Duration::from_secs(2);
    budget.read(&ping()).unwrap();
    stop_the_clock(&mut budget);
    budget.read(&ping().repeat(2 * PER_SECOND as usize - 1)).unwrap();
    assert!(budget.read(&ping()).is_err(), "two seconds' worth");
    let mut budget = exhausted();
    budget.since = Instant::now() - Duration::from_secs(3600);
    budget.read(&ping()).unwrap();
    stop_the_clock(&mut budget);
    budget.read(&ping().repeat(BURST as usize - 1)).unwrap();
    assert!(budget.read(&ping()).is_err(), "at most a burst saved up");
}

#[test]
fn flood_http1_is_not_counted() {
    let mut budget = FrameBudget::new();
    budget.read(b"PRI * HTTP/1.1\r\n").unwrap();
    budget.read(&ping().repeat(10 * BURST as usize)).unwrap();
    let mut budget = FrameBudget::new();
    budget.read(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    budget.wrote(1 << 20);
    assert!(matches!(budget.position, Position::Off));
}

#[test]
fn flood_every_seed_of_the_fuzz_corpus_passes_the_checks() {
    crate::check_fuzz_corpus("frames", check);
}
