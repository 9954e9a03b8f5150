//! Gateway API durations (GEP-2257, `timeouts.request` and `timeouts.backendRequest`): one to
//! four parts of one to five digits and a unit `h`, `m`, `s` or `ms`, as `10s`, `1h30m` or
//! `1s500ms`. Written by hand because the grammar is this narrow: `humantime` also takes spaces,
//! days, microseconds and larger numbers, which the specification (and the CRD's pattern) refuses.

use std::time::Duration;

/// Most parts in a duration.
const MAX_PARTS: usize = 4;
/// Most digits in one part.
const MAX_DIGITS: usize = 5;

/// The duration `written` means, or `None` when it is not one.
pub fn parse(written: &str) -> Option<Duration> {
    let (mut total, mut rest, mut parts) = (Duration::ZERO, written, 0);
    while !rest.is_empty() {
        parts += 1;
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if parts > MAX_PARTS || digits == 0 || digits > MAX_DIGITS {
            return None;
        }
        // At most five digits: no overflow below.
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = match rest.as_bytes() {
            [b'm', b's', ..] => (Duration::from_millis(number), 2),
            [b'h', ..] => (Duration::from_secs(number * 3600), 1),
            [b'm', ..] => (Duration::from_secs(number * 60), 1),
            [b's', ..] => (Duration::from_secs(number), 1),
            _ => return None,
        };
        total += unit;
        rest = &rest[len..];
    }
    (parts > 0).then_some(total)
}

/// `duration` in the form [`parse`] reads: hours, minutes, seconds and milliseconds, the parts
/// that are not zero (`0s` for zero).
pub fn format(duration: Duration) -> String {
    let (millis, seconds) = (duration.subsec_millis(), duration.as_secs());
    let parts = [(seconds / 3600, "h"), (seconds / 60 % 60, "m"), (seconds % 60, "s"), (u64::from(millis), "ms")];
    let written: String = parts.iter().filter(|(n, _)| *n > 0).map(|(n, unit)| format!("{n}{unit}")).collect();
    if written.is_empty() { "0s".to_owned() } else { written }
}

/// What the fuzz target (`fuzz/fuzz_targets/duration.rs`) and the corpus test check for any
/// input: no panic; what is accepted is ASCII of the grammar's length (at most four parts of
/// five digits and two unit letters), at most four times 99,999 hours, and reads back the same
/// from its [`format`] when that has hours below 100,000.
pub fn check(input: &[u8]) {
    let Ok(written) = std::str::from_utf8(input) else { return };
    let Some(duration) = parse(written) else { return };
    assert!(written.is_ascii() && written.len() <= MAX_PARTS * (MAX_DIGITS + 2), "{written:?}");
    assert!(duration <= Duration::from_secs(MAX_PARTS as u64 * 99_999 * 3600), "{written:?}");
    if duration.as_secs() / 3600 < 100_000 {
        assert_eq!(parse(&format(duration)), Some(duration), "{written:?} -> {}", format(duration));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_of_gep_2257() {
        assert_eq!(parse("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("1s500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("0s"), Some(Duration::ZERO));
        let largest = Duration::from_secs(99_999 * 3600 + 99_999 * 60 + 99_999) + Duration::from_millis(99_999);
        assert_eq!(parse("99999h99999m99999s99999ms"), Some(largest));
        for bad in ["", "10", "s", "1x", "1.5s", "-1s", "1 s", "1d", "100000s", "1h1m1s1ms1h", "1us", "١s"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_read_back() {
        for written in ["0s", "1h", "1h30m", "2m3s", "1s500ms", "99999h59m59s999ms"] {
            assert_eq!(format(parse(written).unwrap()), written);
        }
    }

    #[test]
    fn duration_every_seed_of_the_fuzz_corpus_passes_the_checks() {
        crate::check_fuzz_corpus("duration", check);
    }
}
